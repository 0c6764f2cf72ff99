"""The speed stack, layer by layer, per image: eager -> graphs -> + compile -> + float8 -> + step cache, whole
``pipe(...)`` calls on one pipeline per case, in one process.

For each mode: the time per image and per step, the first image (compilation and capture included), the peak CUDA
memory, and the deviation of the output from the bf16 eager output (the largest absolute difference of the final
latents, the PSNR of the decoded images), measured on random weights. Each stack runs eagerly (its twin) and with
graphs (BCG) on top, and the graphs mode is compared bitwise with its twin. The step cache is cache-dit's DBCache set
to cache a stated number of steps (:class:`~.layers.CacheSetting`). See docs/benchmarks.md, "The speed stack".

    python scripts/bench_stack.py                                    # the three cases below, all layers
    python scripts/bench_stack.py --cases flux:full:1024x1024:12 --reps 1 --time-budget 200   # a short run
    python scripts/bench_stack.py --device cpu --cases flux:tiny:64x64:8 --layers graphs,cache --cache-warmup 2

Writes ``bench_stack_<date>_<time>.json`` and ``.md`` into ``--out-dir`` after every mode, and the ``.png`` chart at
the end. Exit code 0 when every mode ran and every graphs mode equalled its twin bitwise, 1 otherwise, 2 for bad
options.
"""

from __future__ import annotations

from bcg_diffusion.toolkit.numbers import finite_float
import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.benchmarks.environment import environment, output_base
from bcg_diffusion.benchmarks.stack.layers import LAYERS, CacheSetting, Mode, StackedPipeline, layer_modes
from bcg_diffusion.benchmarks.stack.measure import (
    ModeRun, bitwise, cached_calls, deviation, graph_counts, measure_mode)
from bcg_diffusion.benchmarks.stack.report import write_report
from bcg_diffusion.toolkit.options import quiet_known_messages
from bcg_diffusion.toolkit.quant_option import QUANT_NAMES, device_problem, torchao_problem
from bcg_diffusion.toolkit.timed_run import run_pipeline

__all__ = ["DEFAULT_CASES", "Case", "build_parser", "main", "parse_case"]

DEFAULT_CASES = ("flux:full:1024x1024:28", "pixart:full:512x512:20", "wan:full:832x480x33:30")
PROMPT = "a red fox resting in a snowy birch forest at golden hour, soft light, highly detailed"
DEFAULT_CACHE_WARMUP = 4


@dataclass(frozen=True)
class Case:
    """``FAMILY:SIZE:WxH[xFRAMES]:STEPS``, read."""

    text: str
    family: str
    size: str
    width: int
    height: int
    frames: int | None
    steps: int


def parse_case(text: str) -> Case:
    """``flux:full:1024x1024:28`` -> a :class:`Case`; ``ValueError`` saying the form."""
    try:
        family, size, shape, steps = text.strip().split(":")
        dims = [int(v) for v in shape.lower().split("x")]
        if len(dims) not in (2, 3) or min(dims) < 1 or int(steps) < 1:
            raise ValueError("sizes and steps must be positive")
        pipelines.get_family(family).size(size)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"case {text!r}: want FAMILY:SIZE:WxH[xFRAMES]:STEPS, e.g. flux:full:1024x1024:28 "
                         f"({exc})") from None
    return Case(text.strip(), family, size, dims[0], dims[1], dims[2] if len(dims) == 3 else None, int(steps))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_stack.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated FAMILY:SIZE:WxH[xFRAMES]:STEPS (default: {','.join(DEFAULT_CASES)})")
    p.add_argument("--layers", default=",".join(LAYERS),
                   help=f"the layers to add, a subset of {','.join(LAYERS)} (default: all; eager always runs)")
    p.add_argument("--quant", choices=QUANT_NAMES, default="fp8", help="the quant layer's torchao config (default fp8)")
    p.add_argument("--cached-steps", type=int, default=None, metavar="K",
                   help="steps the cache layer reuses (default: the most --cache-max-continuous allows after "
                   "--cache-warmup: half of the rest with 1)")
    p.add_argument("--cache-front-blocks", type=int, default=8, metavar="F",
                   help="first blocks a cached step still computes (cache-dit's Fn; default 8)")
    p.add_argument("--cache-max-continuous", type=int, default=1, metavar="C",
                   help="most cached steps in a row (default 1: never two)")
    p.add_argument("--cache-warmup", type=int, default=DEFAULT_CACHE_WARMUP, metavar="W",
                   help=f"first steps the cache layer always computes (default {DEFAULT_CACHE_WARMUP})")
    p.add_argument("--reps", type=int, default=2, help="timed images per mode after its first (default 2)")
    p.add_argument("--time-budget", type=finite_float, default=None, metavar="SECONDS",
                   help="start no new mode or case after this many seconds (eager always runs); results are written "
                   "after every mode")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a check of the code path on tiny models (BCG in debug mode; no timing means anything)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=Path("bench_results"), help="default: bench_results/")
    return p


def check_options(opts, parser: argparse.ArgumentParser) -> tuple[list[Case], tuple[str, ...]]:
    """``parser.error`` (exit 2) for a bad case, layer or number; the cases and layers."""
    try:
        cases = [parse_case(t) for t in opts.cases.split(",") if t.strip()]
    except ValueError as exc:
        parser.error(f"--cases: {exc}")
    layers = tuple(x.strip() for x in opts.layers.split(",") if x.strip())
    unknown = [x for x in layers if x not in LAYERS]
    if unknown or not cases:
        parser.error(f"--layers: unknown {', '.join(unknown)}; choose from {', '.join(LAYERS)}" if unknown
                     else "--cases names no case")
    for name in ("reps", "cache_warmup", "cache_front_blocks", "cache_max_continuous"):
        if getattr(opts, name) < (0 if name == "reps" else 1):
            parser.error(f"--{name.replace('_', '-')} is too small (got {getattr(opts, name)})")
    if opts.cached_steps is not None and opts.cached_steps < 1:
        parser.error(f"--cached-steps must be >= 1 (got {opts.cached_steps})")
    if opts.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device; --device cpu checks the code path on tiny models")
    if "quant" in layers and (problem := torchao_problem() or device_problem(opts.quant, torch.device(opts.device))):
        parser.error(f"--quant {opts.quant}: {problem}")
    if "cache" in layers and _missing_cache_dit():
        parser.error("the cache layer is cache-dit's: pip install 'bcg-diffusion[cache-dit]'")
    return cases, layers


def _missing_cache_dit() -> bool:
    import importlib.util

    return importlib.util.find_spec("cache_dit") is None


@dataclass
class Budget:
    """``--time-budget``: whether it is spent (never without one)."""

    seconds: float | None
    start: float

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.start > self.seconds


def case_call(pipe, case: Case) -> dict[str, Any]:
    """The call of ``case``: the family's defaults at its size, the case's size and steps, resolution binning off."""
    call = pipelines.get_family(case.family).default_call(case.size)
    call.update(prompt=PROMPT, height=case.height, width=case.width, num_inference_steps=case.steps)
    if case.frames is not None:
        call["num_frames"] = case.frames
    if "use_resolution_binning" in pipelines.call_parameters(pipe):
        call["use_resolution_binning"] = False
    return call


def mode_row(mode: Mode, run: ModeRun, runs: dict[str, ModeRun], pipe, quant: str) -> dict[str, Any]:
    """One mode's results, with its deviation from bf16 eager and (graphs modes) its bitwise check."""
    row: dict[str, Any] = {"status": "ok", "stack": list(mode.stack), "graphs": mode.graphs, **run.summary()}
    eager = runs.get("eager")
    if eager is not None:
        row["deviation"] = deviation(run.last, eager.last)
        eager_summary = eager.summary()
        row["image_vs_eager"] = row["image_s"] / eager_summary["image_s"]
        if row["step_ms"] and eager_summary["step_ms"]:
            row["step_vs_eager"] = row["step_ms"] / eager_summary["step_ms"]
    if mode.twin is not None:
        row["twin"] = mode.twin.name(quant)
        twin = runs.get(row["twin"])
        row["bitwise_vs_twin"] = None if twin is None else (bitwise(run.first, twin.last) and bitwise(run.last, twin.last))
        row["graph_counts"] = graph_counts(pipe)
    row["cached_calls"] = cached_calls(pipe)
    return row


def _log_row(name: str, row: dict[str, Any], log: Callable[[str], None]) -> None:
    ratio = row.get("image_vs_eager")
    twin = row.get("bitwise_vs_twin")
    log(f"  {name}: {row['image_s']:.3f} s/image" + (f" ({ratio:.2f}x eager)" if ratio else "")
        + (f", step {row['step_ms']:.1f} ms" if row["step_ms"] else "") + f", first image {row['first_image_s']:.2f} s"
        + (f", peak {row['peak_mib']:.0f} MiB" if row["peak_mib"] is not None else "")
        + ("" if twin is None else f", bitwise = {row['twin']}: {'YES' if twin else 'NO'}")
        + ("" if not row.get("cached_calls") else f", cached {row['cached_calls']['cached']} of "
           f"{row['cached_calls']['calls']} calls"))


def run_modes(stacked: StackedPipeline, call, case: Case, opts, budget: Budget, log, save) -> dict[str, Any]:
    """Every mode of the case in order, each recorded as it ends (``save()``); a layer that fails leaves the modes
    above it not run."""
    rows: dict[str, Any] = {}
    runs: dict[str, ModeRun] = {}
    broken = None
    for mode in layer_modes(opts.layers_chosen):
        name = mode.name(opts.quant)
        if broken or (budget.spent() and runs):
            rows[name] = {"status": "not run", "reason": broken or "--time-budget spent"}
            continue
        try:
            stacked.reach(mode)
            runs[name] = measure_mode(stacked.pipe, call, opts.seed, stacked.device, opts.reps, name)
            rows[name] = mode_row(mode, runs[name], runs, stacked.pipe, opts.quant)
            _log_row(name, rows[name], log)
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
            rows[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            log(f"  {name}: FAILED: {type(exc).__name__}: {exc}")
            broken = None if mode.graphs else f"{name} failed"
        finally:
            stacked.leave()
        save(rows)
    return rows


def run_case(case: Case, opts, device: torch.device, dtype, budget: Budget, log, save) -> dict[str, Any]:
    """Build the case's pipeline and run its modes; the case's results (``save(result)`` after every mode). A build
    or set-up that fails is the case's ``error``; a mode that fails is that mode's."""
    spec = pipelines.get_family(case.family)
    result: dict[str, Any] = {"case": case.text, "title": spec.title, "steps": case.steps, "modes": {}, "notes": []}
    start = time.perf_counter()
    try:
        pipe = pipelines.build_pipeline(case.family, size=case.size, device=device, dtype=dtype, seed=opts.seed)
        pipe.set_progress_bar_config(disable=True)
        result["build_s"] = time.perf_counter() - start
        call = case_call(pipe, case)
        run_pipeline(pipe, {**call, "num_inference_steps": 1}, opts.seed, device, "warm-up")  # one-off set-up
    except Exception as exc:  # noqa: BLE001 - recorded; the next case still runs
        result["error"] = f"build or set-up failed: {type(exc).__name__}: {exc}"
        return result
    result["notes"].append("an untimed 1-step eager call ran first, so one-off set-up (CUDA, cuBLAS, the VAE) is in "
                           "no mode's first image")
    log(f"{case.text}: built in {result['build_s']:.1f} s; {len(layer_modes(opts.layers_chosen))} modes")
    try:
        run_stack(pipe, call, case, opts, device, budget, log, save, result)
    finally:
        del pipe
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def run_stack(pipe, call: dict[str, Any], case: Case, opts, device, budget: Budget, log, save,
              result: dict[str, Any]) -> None:
    """The modes of ``case`` on its built pipeline, into ``result``; every layer undone at the end."""
    cached = opts.cached_steps or CacheSetting.most_cached(case.steps, opts.cache_warmup, opts.cache_max_continuous)
    setting = CacheSetting(opts.cache_warmup, cached, opts.cache_front_blocks, opts.cache_max_continuous)
    stacked = StackedPipeline(pipe, opts.quant, setting, opts.bcg_config, device)
    result.update(call={k: v for k, v in call.items() if k != "prompt"},
                  cache=setting.describe(pipe.transformer) if "cache" in opts.layers_chosen else None)
    try:
        result["modes"] = run_modes(stacked, call, case, opts, budget, log,
                                    lambda rows: save({**result, "modes": rows, "notes": result["notes"] + stacked.notes}))
    finally:
        stacked.close()
        result["notes"] += stacked.notes


def layer_text(opts) -> str:
    parts = {"graphs": "graphs = BCG (accelerate_pipeline" + (", debug mode on the CPU)" if opts.device == "cpu"
                                                                else ")"),
             "compile": "compile = regional torch.compile, attention as the library's op (bcg-serve --compile)",
             "quant": f"{opts.quant} = torchao quantize_ of the transformer (bcg-serve --quant {opts.quant})",
             "cache": "cache = cache-dit DBCache with a threshold every step passes: the first --cache-warmup steps "
                      "compute, then at most --cached-steps steps reuse (never two in a row)"}
    return "; ".join(parts[x] for x in LAYERS if x in opts.layers_chosen) or "none (eager only)"


def main(argv: list[str] | None = None) -> int:
    quiet_known_messages()
    parser = build_parser()
    try:
        opts = parser.parse_args(argv)
        cases, opts.layers_chosen = check_options(opts, parser)
    except SystemExit as exc:
        return int(exc.code or 0)
    device = torch.device(opts.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    opts.bcg_config = bcg_diffusion.BCGConfig(debug=device.type == "cpu")
    if "compile" in opts.layers_chosen:
        torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)  # one per block
    budget = Budget(opts.time_budget, time.perf_counter())
    report: dict[str, Any] = {"environment": environment(device, dtype, device.type == "cuda"), "cases": [],
                              "not_run": [], "settings": {**{k: v for k, v in vars(opts).items() if k not in (
                                  "bcg_config", "out_dir")}, "layer_text": layer_text(opts)}}
    base = output_base(opts.out_dir, "bench_stack")
    log = lambda text: print(text, flush=True)  # noqa: E731
    for case in cases:
        if budget.spent() and report["cases"]:
            report["not_run"].append(case.text)
            continue
        report["cases"].append({"case": case.text, "modes": {}})
        save = lambda partial: (report["cases"].__setitem__(-1, partial), write_report(report, base, chart=False))  # noqa: E731
        save(run_case(case, opts, device, dtype, budget, log, save))
    for path in write_report(report, base, chart=True):
        print(f"wrote {path}")
    return 0 if passed(report) else 1


def passed(report: dict[str, Any]) -> bool:
    """Every case built, every mode that ran ended, and every graphs mode equalled its twin bitwise."""
    for case in report["cases"]:
        if case.get("error"):
            return False
        for row in case["modes"].values():
            if row.get("status") == "failed" or row.get("bitwise_vs_twin") is False:
                return False
    return True


if __name__ == "__main__":
    sys.exit(main())
