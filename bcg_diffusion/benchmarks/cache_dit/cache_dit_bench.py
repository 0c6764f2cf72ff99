"""cache-dit under BCG, per image: eager + cache-dit, BCG + cache-dit, and (``--compile``) regional
compile + cache-dit, compile + BCG + cache-dit, side by side in one process on one pipeline, with
cache-dit's cached-step count beside each time and every BCG output checked bitwise against its
un-accelerated mode.

    python -m bcg_diffusion.benchmarks.cache_dit.cache_dit_bench --case flux:full:512x512:28 --compile --out r.json
    (or scripts/bench_cache_dit.py)

A case is ``FAMILY:SIZE:WxH[xFRAMES]:STEPS``; several cases of one family (``--case`` repeated) share
one pipeline. cache-dit runs DBCache with its defaults (``Fn_compute_blocks=8``, ``Bn=0``) and
``max_warmup_steps=4``; ``--threshold`` sets the residual-difference threshold, or by default a
calibration call (caching nothing) measures the residual differences of the case and takes their
median, which caches about half the steps after the warm-up steps. Random weights decide nothing
about image quality here: only the timing and the exactness are measured.

Each mode: one untimed call (warm-up: capture, compilation), then ``--reps`` timed calls (wall clock
around ``pipe(...)`` with the device synchronised, decoded output); the median is reported. The
compile modes come last (the compiled blocks stay compiled); the attention custom op is installed
before compiling, so compile + cache-dit and compile + BCG + cache-dit trace the same attention.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.numbers import finite_float

PROMPT = "a red fox jumping over a frozen river at dawn"
WARMUP_STEPS = 4


def parse_case(text: str) -> dict[str, Any]:
    """``flux:full:512x512:28`` / ``wan:full:416x240x17:30`` -> family, size, width, height, frames, steps."""
    try:
        family, size, shape, steps = text.split(":")
        dims = [int(v) for v in shape.lower().split("x")]
        width, height, frames = dims[0], dims[1], (dims[2] if len(dims) > 2 else None)
        pipelines.get_family(family).size(size)
        return dict(family=family, size=size, width=width, height=height, frames=frames, steps=int(steps), name=text)
    except (ValueError, IndexError) as exc:
        raise argparse.ArgumentTypeError(f"--case {text!r}: want FAMILY:SIZE:WxH[xFRAMES]:STEPS ({exc})") from None


def _call(case: dict[str, Any]) -> dict[str, Any]:
    spec = pipelines.get_family(case["family"])
    call = spec.default_call(case["size"])
    call.update(prompt=PROMPT, height=case["height"], width=case["width"], num_inference_steps=case["steps"])
    if case["frames"] is not None:
        call["num_frames"] = case["frames"]
    return call


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _image(pipe, call: dict[str, Any], seed: int) -> tuple[float, np.ndarray]:
    _sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = pipe(**call, generator=torch.Generator(pipe.device.type).manual_seed(seed), output_type="np")
    _sync()
    return time.perf_counter() - start, np.asarray(pipelines.generated(out))


def _cached(pipe) -> list:
    import cache_dit

    return [(s.cached_steps, s.cfg_cached_steps) for s in cache_dit.summary(pipe, details=False, logging=False)]


def _count(steps: list) -> int:
    return max((len(a) + len(b) for a, b in steps), default=0)


def _calibrate(pipe, call: dict[str, Any], seed: int) -> float:
    """The median residual difference cache-dit measures on this case, caching nothing."""
    import cache_dit

    cache_dit.enable_cache(pipe, cache_config=_config(1e-9, pipe))
    _image(pipe, call, seed)
    diffs = sorted(v for s in cache_dit.summary(pipe, details=False, logging=False)
                   for d in (s.residual_diffs, s.cfg_residual_diffs) for v in (d or {}).values())
    cache_dit.disable_cache(pipe)
    return float(diffs[len(diffs) // 2]) if diffs else 0.08


def _config(threshold: float, pipe):
    import cache_dit

    blocks = min((len(c) for c in pipe.transformer.children() if isinstance(c, torch.nn.ModuleList) and len(c)), default=8)
    return cache_dit.DBCacheConfig(Fn_compute_blocks=min(8, blocks), Bn_compute_blocks=0,
                                   max_warmup_steps=WARMUP_STEPS, residual_diff_threshold=threshold)


def _mode(name: str, pipe, call: dict[str, Any], seed: int, reps: int, log) -> dict[str, Any]:
    first_s, _ = _image(pipe, call, seed)
    times, out = [], None
    for _ in range(reps):
        seconds, out = _image(pipe, call, seed)
        times.append(seconds)
    steps = _cached(pipe)
    row = {"mode": name, "first_s": first_s, "times_s": times, "median_s": statistics.median(times),
           "cached_steps": steps, "cached": _count(steps)}
    stats = bcg_diffusion.get_stats(pipe)
    if stats.active:
        row.update(hits=stats.hits, eager_calls=stats.eager_calls, failed_captures=stats.failed_captures,
                   child_hits=stats.child_hits, child_eager_calls=stats.child_eager_calls,
                   graph_memory_mib=stats.graph_memory_bytes / 2**20)
    log(f"  {name}: median {row['median_s']:.3f} s (first {first_s:.2f} s), cached {row['cached']} calls")
    return row, out


def run_case(pipe, case: dict[str, Any], args, log, compile_modes: bool) -> dict[str, Any]:
    import cache_dit

    call = _call(case)
    seed = args.seed
    threshold = args.threshold if args.threshold is not None else _calibrate(pipe, call, seed)
    log(f"{case['name']}: residual-difference threshold {threshold:.4g}")
    cache_dit.enable_cache(pipe, cache_config=_config(threshold, pipe))
    result: dict[str, Any] = {"case": case["name"], "threshold": threshold, "steps": case["steps"], "modes": []}
    try:
        eager_row, eager = _mode("eager+cache_dit", pipe, call, seed, args.reps, log)
        bcg_diffusion.accelerate_pipeline(pipe, args.bcg_config)
        bcg_row, bcg = _mode("bcg+cache_dit", pipe, call, seed, args.reps, log)
        bcg_row["bitwise_equal"] = bool(np.array_equal(bcg, eager))
        bcg_row["same_decisions"] = bcg_row["cached_steps"] == eager_row["cached_steps"]
        bcg_diffusion.remove_acceleration(pipe)
        result["modes"] += [eager_row, bcg_row]
        if compile_modes:
            handle = bcg_diffusion.install_attention_breaks(pipe.transformer)
            try:
                torch._dynamo.reset()
                pipe.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
                compiled_row, compiled = _mode("compile+cache_dit", pipe, call, seed, args.reps, log)
                bcg_diffusion.accelerate_pipeline(pipe, args.bcg_config)
                both_row, both = _mode("compile+bcg+cache_dit", pipe, call, seed, args.reps, log)
                both_row["bitwise_equal"] = bool(np.array_equal(both, compiled))
                both_row["same_decisions"] = both_row["cached_steps"] == compiled_row["cached_steps"]
                bcg_diffusion.remove_acceleration(pipe)
                result["modes"] += [compiled_row, both_row]
            finally:
                handle.remove()
    finally:
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)
        cache_dit.disable_cache(pipe)
    base = {m["mode"]: m["median_s"] for m in result["modes"]}
    for m in result["modes"]:
        reference = "compile+cache_dit" if m["mode"].startswith("compile") else "eager+cache_dit"
        m["ratio"] = m["median_s"] / base[reference]
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| case | threshold | mode | image s (median) | ratio | cached calls | bitwise | same decisions |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for m in r["modes"]:
            lines.append(f"| {r['case']} | {r['threshold']:.3g} | {m['mode']} | {m['median_s']:.3f} | {m['ratio']:.3f} | "
                         f"{m['cached']} | {m.get('bitwise_equal', '-')} | {m.get('same_decisions', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cache_dit_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", type=parse_case, required=True,
                        help="FAMILY:SIZE:WxH[xFRAMES]:STEPS, e.g. flux:full:512x512:28 (repeatable; one family)")
    parser.add_argument("--compile", action="append", default=[], metavar="CASE",
                        help="also the compile modes for this case (repeatable; the compile modes run last)")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per mode (default 3)")
    parser.add_argument("--threshold", type=finite_float, default=None, help="residual-difference threshold (default: calibrated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON (rewritten after every case)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a plumbing check in debug mode (nothing captured, times mean nothing)")
    args = parser.parse_args(argv)
    args.bcg_config = bcg_diffusion.BCGConfig(debug=args.device == "cpu")
    families = {c["family"] for c in args.case}
    if len(families) != 1:
        parser.error(f"--case: one family per run, got {sorted(families)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cache_dit_bench: needs a CUDA GPU (it times BCG against eager); --device cpu checks the plumbing only",
              file=sys.stderr)
        return 2
    if args.device == "cpu" and args.compile:
        parser.error("--compile needs --device cuda")
    try:
        import cache_dit  # noqa: F401
    except ImportError:
        print("cache_dit_bench: needs cache-dit: pip install 'bcg-diffusion[cache-dit]'", file=sys.stderr)
        return 2
    case0 = args.case[0]
    log = lambda text: print(text, flush=True)  # noqa: E731
    start = time.perf_counter()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    pipe = pipelines.build_pipeline(case0["family"], case0["size"], device=args.device, dtype=dtype, seed=args.seed)
    log(f"built {case0['family']} ({case0['size']}) in {time.perf_counter() - start:.1f} s")
    order = [c for c in args.case if c["name"] not in args.compile] + [c for c in args.case if c["name"] in args.compile]
    results = []
    for case in order:
        results.append(run_case(pipe, case, args, log, compile_modes=case["name"] in args.compile))
        if args.out is not None:
            args.out.write_text(json.dumps({"results": results, "torch": torch.__version__,
                                            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}, indent=1))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
