"""Where a capture's time goes, and the first image: per case, on the GPU.

For each case (``family:HxW[:fFRAMES]``, full size, bf16) it measures, in one process:

1. the first image: a steady eager image (after one untimed eager image), then right after
   ``accelerate_pipeline`` the first accelerated image (nothing captured yet) and the second;
2. the capture breakdown of the transformer call: eager call time, then the key's first call
   (eager, records layouts) and the capturing call, with ``get_stats`` phases; the extra time of
   the capturing call over an eager call is the capture cost; then a second capture after
   ``clear_graphs`` (what is one-time set-up in the process); output bitwise equal to eager;
3. after ``warmup``: a fresh acceleration, ``warmup`` of the case's shape, then an image with
   per-step times: the first step against the median step.

Writes ``capture_profile.json`` (and a cProfile listing of the first capture) under ``--out``.

    python scripts/capture_profile.py --cases flux:512x512,pixart:512x512,wan:240x416:f5 --out /tmp/cp
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

PROMPT = "a red fox resting in a snowy birch forest at golden hour"


def parse_case(text: str) -> dict:
    family, *rest = text.split(":")
    case = {"family": family, "height": None, "width": None, "frames": None}
    for tok in rest:
        if "x" in tok:
            case["height"], case["width"] = map(int, tok.split("x"))
        elif tok.startswith("f"):
            case["frames"] = int(tok[1:])
    return case


DEVICE = "cuda"
SIZE = "full"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def image_call(pipe, case: dict, steps: int) -> dict:
    call = pipelines.plan_call(case["family"], SIZE, prompt=PROMPT, height=case["height"], width=case["width"],
                               num_frames=case["frames"], steps=steps)
    return pipelines.fit_call(pipe, call, batch=1, exact_shape=True, clean_caption=False)[0]


def run_image(pipe, call: dict, step_times: list | None = None):
    """One image (latents); ``step_times`` gets the wall time of each transformer call (from one call's
    start to the next one's, the last to the end of the loop: every pipeline calls its transformer)."""
    marks = []

    def on_call(_module, _args, _kwargs):
        sync()
        marks.append(time.perf_counter())

    handle = pipe.transformer.register_forward_pre_hook(on_call, with_kwargs=True)
    gen = torch.Generator(DEVICE).manual_seed(0)
    sync()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = pipe(**call, generator=gen, output_type="latent")
    finally:
        handle.remove()
    sync()
    total = time.perf_counter() - t0
    if step_times is not None and marks:
        step_times.extend(b - a for a, b in zip(marks, marks[1:]))
    return out[0].clone(), total


def transformer_inputs(pipe, call: dict):
    seen = {}

    def hook(_m, args, kwargs):
        if not seen:
            seen["args"] = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            seen["kwargs"] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run_image(pipe, {**call, "num_inference_steps": 1})
    finally:
        handle.remove()
    return seen["args"], seen["kwargs"]


def entry_phases(pipe) -> list[dict]:
    stats = bcg_diffusion.get_stats(pipe)
    if not stats.active:
        return []
    return [dict(key=e.key, capture_s=e.capture_time_s, phases=dict(e.capture_phases), segments=e.segments,
                 breaks=e.breaks, memory_mib=e.memory_bytes / 2**20, fallback=e.fallback) for e in stats.entries]


def profile_case(case: dict, out_dir: Path, steps: int, log) -> dict:
    res: dict = {"case": case}
    t0 = time.perf_counter()
    pipe = pipelines.build_pipeline(case["family"], size=SIZE, device=DEVICE,
                                   dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32, seed=0)
    pipe.set_progress_bar_config(disable=True)
    res["build_s"] = time.perf_counter() - t0
    call = image_call(pipe, case, steps)
    # 1. first image
    run_image(pipe, call)
    eager_steps: list = []
    eager_image, res["eager_image_s"] = run_image(pipe, call, eager_steps)
    res["eager_step_median_s"] = statistics.median(eager_steps[1:])
    res["eager_first_step_ratio"] = eager_steps[0] / statistics.median(eager_steps)
    bcg_diffusion.accelerate_pipeline(pipe)
    res["entries_before_first_image"] = len(bcg_diffusion.get_stats(pipe).entries) if DEVICE == "cuda" else 0
    first_steps: list = []
    first_image, res["bcg_first_image_s"] = run_image(pipe, call, first_steps)
    res["bcg_first_image_steps_s"] = first_steps[:3]
    bcg_steps: list = []
    _, res["bcg_second_image_s"] = run_image(pipe, call, bcg_steps)
    res["bcg_step_median_s"] = statistics.median(bcg_steps[1:])
    res["first_image_ratio"] = res["bcg_first_image_s"] / res["eager_image_s"]
    res["first_image_bitwise"] = bool(torch.equal(first_image, eager_image))
    res["first_image_entries"] = entry_phases(pipe)
    log(f"  first image: eager {res['eager_image_s']:.2f} s, bcg first {res['bcg_first_image_s']:.2f} s "
        f"({res['first_image_ratio']:.2f}x), second {res['bcg_second_image_s']:.2f} s; bitwise {res['first_image_bitwise']}")
    # 2. capture breakdown on the bare transformer call
    bcg_diffusion.remove_acceleration(pipe)
    args, kwargs = transformer_inputs(pipe, call)
    model = pipe.transformer
    with torch.inference_mode():
        eager_out = model(*args, **kwargs)[0].clone()
        eager_times = [timed(lambda: model(*args, **kwargs))[1] for _ in range(5)]
    res["eager_call_s"] = statistics.median(eager_times)
    bcg_diffusion.accelerate_pipeline(pipe)
    with torch.inference_mode():
        _, res["first_call_s"] = timed(lambda: model(*args, **kwargs))
        profiler = cProfile.Profile()
        profiler.enable()
        out, res["capture_call_s"] = timed(lambda: model(*args, **kwargs))
        profiler.disable()
        res["bitwise"] = bool(torch.equal(out[0], eager_out))
        replays = [timed(lambda: model(*args, **kwargs))[1] for _ in range(5)]
    res["replay_s"] = statistics.median(replays)
    res["capture_cost_s"] = res["capture_call_s"] - res["eager_call_s"]
    res["entries"] = entry_phases(pipe)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
    (out_dir / f"cprofile_{case['family']}.txt").write_text(text.getvalue())
    bcg_diffusion.clear_graphs(pipe)
    with torch.inference_mode():
        timed(lambda: model(*args, **kwargs))
        _, res["second_capture_call_s"] = timed(lambda: model(*args, **kwargs))
    res["second_capture_cost_s"] = res["second_capture_call_s"] - res["eager_call_s"]
    res["second_entries"] = entry_phases(pipe)
    log(f"  transformer call: eager {res['eager_call_s'] * 1e3:.1f} ms, capture call {res['capture_call_s'] * 1e3:.1f} ms "
        f"(cost {res['capture_cost_s'] * 1e3:.0f} ms), replay {res['replay_s'] * 1e3:.1f} ms, second capture cost "
        f"{res['second_capture_cost_s'] * 1e3:.0f} ms, bitwise {res['bitwise']}")
    log(f"  phases: {res['entries'][0]['phases'] if res['entries'] else None}")
    # 3. after warmup
    bcg_diffusion.remove_acceleration(pipe)
    bcg_diffusion.accelerate_pipeline(pipe)
    shape = {k: call[k] for k in ("height", "width", "num_frames") if k in call}
    rest = {k: v for k, v in call.items() if k not in shape and k != "num_inference_steps"}
    with torch.inference_mode():  # the mode of run_image's calls: grad mode is part of a graph key
        report = bcg_diffusion.warmup(pipe, [shape], output_type="latent", **{k: v for k, v in rest.items() if k != "output_type"})
    res["warmup_s"], res["warmup_captures"] = report.total_s, report.captures
    warm_steps: list = []
    profiler = cProfile.Profile()
    profiler.enable()
    warm_image, res["warm_image_s"] = run_image(pipe, call, warm_steps)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    (out_dir / f"cprofile_warm_{case['family']}.txt").write_text(text.getvalue())
    res["warm_stats"] = str(bcg_diffusion.get_stats(pipe))
    res["warm_first_step_s"], res["warm_step_median_s"] = warm_steps[0], statistics.median(warm_steps)
    res["warm_first_step_ratio"] = warm_steps[0] / statistics.median(warm_steps)
    res["warm_image_bitwise"] = bool(torch.equal(warm_image, eager_image))
    log(f"  after warmup ({report.total_s:.2f} s, {report.captures} captured): image {res['warm_image_s']:.2f} s, "
        f"first step {res['warm_first_step_ratio']:.2f}x median (eager's first step "
        f"{res['eager_first_step_ratio']:.2f}x); bitwise {res['warm_image_bitwise']}; steps ms "
        f"{[round(t * 1e3, 1) for t in warm_steps[:4]]}")
    bcg_diffusion.remove_acceleration(pipe)
    pipe = model = None  # drop the references before emptying the cache (the lambdas above hold model)
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="flux:512x512,pixart:512x512,wan:240x416:f5")
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--out", type=Path, default=Path("bench_results/tmp"))
    p.add_argument("--size", default="full", help="full (default) or tiny (a CPU dry run of the script)")
    args = p.parse_args(argv)
    global DEVICE, SIZE
    SIZE = args.size
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    if DEVICE == "cpu" and SIZE != "tiny":
        print("capture_profile.py needs a CUDA GPU for --size full (--size tiny runs on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for text in args.cases.split(","):
        case = parse_case(text)
        print(f"case {text}", flush=True)
        try:
            results.append(profile_case(case, args.out, args.steps, lambda m: print(m, flush=True)))
        except Exception as exc:  # noqa: BLE001 - record and go on
            import traceback

            traceback.print_exc()
            results.append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
        (args.out / "capture_profile.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
