"""Smoke-test every family's FULL pipeline (random weights) on a GPU: build, run 2 steps, record.

For each family (or ``--families a,b``) this builds the published-size pipeline on ``--device`` in
``--dtype`` (default cuda, bf16), records the transformer parameter count and the build time, runs one
``pipe(...)`` call of ``--steps`` steps at the family's default full resolution (video families: a short
clip, the smallest valid frame count above 1 unless ``--frames`` is given), and records the time, the
output shape, peak GPU memory, the transformer calls per step (CFG mode check) or the error. A failing
family is recorded and the run goes on. Results go to ``--out``.json and ``--out``.md.

Examples::

    python scripts/smoke_full_pipelines.py                       # all families, full size, cuda bf16
    python scripts/smoke_full_pipelines.py --families flux,wan
    python scripts/smoke_full_pipelines.py --dry-run             # print the plan only
    python scripts/smoke_full_pipelines.py --size tiny --device cpu --families flux
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import time
import traceback
from pathlib import Path

logger = logging.getLogger("smoke_full_pipelines")

DEFAULT_OUT = "bench_results/full_pipelines"
PROMPT = "a photo of a red cat sitting on a wooden table in a sunny garden"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import bcg_pipelines as pipelines

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default="all", help="comma-separated family names, or 'all' (default)")
    p.add_argument("--size", default="full", choices=list(pipelines.SIZES), help="pipeline size (default full)")
    p.add_argument("--device", default=None, help="device (default: cuda if available else cpu)")
    p.add_argument("--dtype", default=None, choices=pipelines.DTYPE_NAMES, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--steps", type=int, default=2, help="denoising steps per call (default 2)")
    p.add_argument("--frames", type=int, default=None, help="frames for video families (default: smallest valid > 1)")
    p.add_argument("--height", type=int, default=None, help="override the family's default height")
    p.add_argument("--width", type=int, default=None, help="override the family's default width")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output path without suffix (default {DEFAULT_OUT})")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    known = pipelines.list_families()
    if args.families.strip() in ("", "all"):
        args.family_list = known
    else:
        args.family_list = [f.strip() for f in args.families.split(",") if f.strip()]
        unknown = [f for f in args.family_list if f not in known]
        if unknown:
            p.error(f"unknown families {unknown}; known families: {', '.join(known)}")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def plan_for(family: str, args: argparse.Namespace) -> dict:
    """The call this run makes for ``family`` (validated with ``pipelines.check_call``)."""
    import bcg_pipelines as pipelines

    spec = pipelines.get_family(family)
    frames = None
    if spec.is_video:
        frames = args.frames if args.frames is not None else 2 * (spec.frame_multiple or 1) + 1
    call = pipelines.plan_call(spec, args.size, prompt=PROMPT, height=args.height, width=args.width,
                               num_frames=frames, steps=args.steps)
    return {"family": family, "title": spec.title, "cfg_mode": spec.cfg_mode, "call": call}


def _transformer_counter(pipe):
    calls: list[int] = []

    def hook(module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        if isinstance(x, (list, tuple)):
            calls.append(len(x))
        elif x is not None and hasattr(x, "shape"):
            calls.append(int(x.shape[0]))
        return None

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    return calls, handle


def _output_shape(out) -> list[int] | None:
    import bcg_pipelines as pipelines

    res = pipelines.generated(out)
    if hasattr(res, "shape"):
        return [int(s) for s in res.shape]
    if isinstance(res, list) and res:
        first = res[0]
        if hasattr(first, "size") and not callable(first.size):
            return [len(res), *first.size]
        return [len(res)]
    return None


def run_family(family: str, args: argparse.Namespace, device, dtype) -> dict:
    import torch

    import bcg_pipelines as pipelines

    rec: dict = {"family": family, "ok": False}
    pipe = None
    cuda = device.type == "cuda"
    try:
        plan = plan_for(family, args)
        rec.update({"title": plan["title"], "cfg_mode": plan["cfg_mode"],
                    "call": {k: v for k, v in plan["call"].items() if k != "prompt"}})
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        pipe = pipelines.build_pipeline(family, size=args.size, device=device, dtype=dtype, seed=args.seed)
        if cuda:
            torch.cuda.synchronize(device)
        rec["build_s"] = round(time.perf_counter() - t0, 3)
        rec["transformer_params"] = sum(p.numel() for p in pipe.transformer.parameters())
        rec["text_encoder_params"] = {
            name: sum(p.numel() for p in getattr(pipe, name).parameters())
            for name in ("text_encoder", "text_encoder_2", "text_encoder_3")
            if getattr(pipe, name, None) is not None
        }
        if cuda:
            rec["memory_after_build_gb"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
        calls, handle = _transformer_counter(pipe)
        generator = torch.Generator(device="cpu").manual_seed(0)
        t0 = time.perf_counter()
        out = pipe(generator=generator, output_type="np", **plan["call"])
        if cuda:
            torch.cuda.synchronize(device)
        rec["run_s"] = round(time.perf_counter() - t0, 3)
        handle.remove()
        rec["transformer_calls"] = len(calls)
        rec["transformer_calls_per_step"] = round(len(calls) / args.steps, 2)
        rec["transformer_batch"] = sorted(set(calls))
        rec["output_shape"] = _output_shape(out)
        if cuda:
            rec["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        rec["ok"] = True
        del out
    except Exception as err:  # keep going: record and move to the next family
        rec["error"] = f"{type(err).__name__}: {err}"[:2000]
        rec["traceback"] = traceback.format_exc()[-4000:]
        logger.error("%s failed: %s", family, rec["error"])
    finally:
        del pipe
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rec


def _environment(device) -> dict:
    import diffusers
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gb"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    return env


def _fmt_params(n) -> str:
    if not isinstance(n, int):
        return "-"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def to_markdown(results: list[dict], env: dict, args: argparse.Namespace) -> str:
    lines = [
        "# Full-pipeline smoke test",
        "",
        f"size `{args.size}`, {args.steps} steps, seed {args.seed}; " + ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        "| family | ok | transformer params | build s | run s | shape (HxW, frames) | calls/step (batch) | cfg | peak GB | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        call = r.get("call", {})
        shape = f"{call.get('height', '-')}x{call.get('width', '-')}"
        if call.get("num_frames") is not None:
            shape += f", {call['num_frames']}"
        calls = "-"
        if "transformer_calls_per_step" in r:
            calls = f"{r['transformer_calls_per_step']:g} ({','.join(str(b) for b in r['transformer_batch'])})"
        err = (r.get("error") or "").replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(
            f"| {r['family']} | {'yes' if r['ok'] else 'NO'} | {_fmt_params(r.get('transformer_params'))} | "
            f"{r.get('build_s', '-')} | {r.get('run_s', '-')} | {shape} | {calls} | {r.get('cfg_mode', '-')} | "
            f"{r.get('peak_memory_gb', '-')} | {err} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    import bcg_pipelines as pipelines

    device = pipelines.resolve_device(args.device)
    dtype = pipelines.resolve_dtype(args.dtype, device)
    if args.dry_run:
        for fam in args.family_list:
            try:
                plan = plan_for(fam, args)
                call = {k: v for k, v in plan["call"].items() if k != "prompt"}
                print(f"{fam}: build size={args.size} on {device} in {dtype}; pipe(prompt, {call}) [cfg {plan['cfg_mode']}]")
            except ValueError as err:
                print(f"{fam}: invalid call: {err}")
        print(f"results -> {args.out}.json, {args.out}.md")
        return 0
    env = _environment(device)
    results = []
    for fam in args.family_list:
        logger.info("=== %s", fam)
        rec = run_family(fam, args, device, dtype)
        results.append(rec)
        logger.info("%s: %s", fam, {k: v for k, v in rec.items() if k not in ("traceback", "call")})
        _write(results, env, args)  # after each family, so a crash keeps what was done
    n_ok = sum(r["ok"] for r in results)
    logger.info("%d/%d families ok; results in %s.json / .md", n_ok, len(results), args.out)
    return 0 if n_ok == len(results) else 1


def _write(results: list[dict], env: dict, args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": env, "size": args.size, "steps": args.steps, "seed": args.seed, "results": results}
    Path(f"{out}.json").write_text(json.dumps(payload, indent=2, default=str))
    Path(f"{out}.md").write_text(to_markdown(results, env, args))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
