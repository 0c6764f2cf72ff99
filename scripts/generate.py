#!/usr/bin/env python
"""Generate an image or a video with a diffusers DiT pipeline, eagerly or with breakable CUDA graphs (BCG).

With no arguments it builds the tiny random-weight Flux pipeline of ``pipelines``, runs it on the best
device present (eagerly on a CPU) and writes ``outputs/flux_tiny_seed0.png``. See ``docs/generate.md``.

Examples::

    python scripts/generate.py                                   # tiny Flux, seconds on a CPU
    python scripts/generate.py --model pixart --size full --height 512 --width 512 --bcg
    python scripts/generate.py --model sd3 --size full --compare # eager vs BCG, same seed, same pipeline
    python scripts/generate.py --model /path/to/FLUX.1-dev --bcg # real weights from a local folder

Per-step times come from the pipeline's step-end callback (CUDA is synchronised at each time stamp), so
they cover one whole denoising step: every transformer call of the step plus the scheduler update.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: media, speedups, timed_run

import torch  # noqa: E402

import bcg_diffusion  # noqa: E402
import pipelines  # noqa: E402
from cache_quant import apply_cache, apply_quant, cache_passes, check_cache_option, torchao_problem  # noqa: E402
from pipelines.caches import CACHE_HELP, reset_cache_state  # noqa: E402
from pipelines.quant import QUANT_HELP, QUANT_NAMES  # noqa: E402
from media import IMAGE_SUFFIXES, VIDEO_SUFFIXES, can_write_mp4, save_output, why_not_writable  # noqa: E402
from speedups import (  # noqa: E402
    attention_backend_names, quiet_library_warnings, regional_compile, set_attention_backend)
from timed_run import RunResult, compare_outputs, run_pipeline  # noqa: E402,F401  (run_pipeline: tests)

DEFAULT_MODEL = "flux"  # the tiny Flux pipeline builds and runs fastest on a CPU (a few seconds)
DEFAULT_PROMPT = "a red fox resting in a snowy birch forest at golden hour, soft light, highly detailed"
DEFAULT_OUT_DIR = Path("outputs")
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 0 <= seed < 2**64
NO_CUDA_NOTE = "note: BCG needs a CUDA GPU and none is in use here, so everything runs eagerly."


class Failure(Exception):
    """A run that stops with ``message`` on stderr and exit code ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="generate.py",
        description="Generate an image or video with a diffusers DiT pipeline, eagerly or with breakable CUDA "
        "graphs (BCG). With no arguments: the tiny random-weight Flux pipeline, a few seconds on a CPU.",
        epilog="See docs/generate.md for examples.",
    )
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="a family of the pipelines registry (random weights; --list-models shows them), or a local "
                   f"pipeline folder / hub id (org/name) for real weights (default: {DEFAULT_MODEL})")
    g.add_argument("--size", choices=pipelines.SIZES, default="tiny",
                   help="tiny: a few-layer model for CPUs and tests; full: the published architecture (default: tiny)")
    g.add_argument("--yes", action="store_true", help="build --size full even without CUDA (needs tens of GiB)")
    g.add_argument("--list-models", action="store_true", help="list the families and exit")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=pipelines.DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt")
    g.add_argument("--negative-prompt", default=None, help="negative prompt (used by CFG families)")
    g.add_argument("--height", type=int, default=None, help="image height in pixels (default: the family's for --size)")
    g.add_argument("--width", type=int, default=None, help="image width in pixels (default: the family's for --size)")
    g.add_argument("--frames", type=int, default=None, help="number of frames (video families only)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (default: the family's)")
    g.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the family's)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the initial noise, 0 <= seed < 2**64 (default: 0)")
    g.add_argument("--batch", type=int, default=1, help="images or videos per prompt (default: 1)")
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    g.add_argument("--debug-cuda-graph", action="store_true",
                   help="BCG with every segment run eagerly (BCGConfig(debug=True)); implies --bcg")
    g.add_argument("--compile", action="store_true",
                   help="regional torch.compile of the transformer's repeated blocks (combines with --bcg)")
    g.add_argument("--attention-backend", default=None, metavar="NAME",
                   help="diffusers attention backend, e.g. native, flash, _native_cudnn (set_attention_backend)")
    g.add_argument("--cache", default=None, metavar="SPEC",
                   help=f"a diffusers step cache on the transformer: {CACHE_HELP}; each run prints the module passes "
                   "the cache computed and reused")
    g.add_argument("--quant", choices=QUANT_NAMES, default=None,
                   help=f"torchao quantization of the transformer, applied right after the build: {QUANT_HELP} "
                   "(needs torchao: pip install -e \".[quant]\")")
    g.add_argument("--compare", action="store_true",
                   help="run eagerly, then with BCG on the same pipeline and seed; report the per-step speedup "
                   "and whether the outputs are bitwise identical")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=None,
                   help="output file: .png/.jpg/.webp for images, .mp4 or .gif for videos (MP4 needs imageio + "
                   "imageio-ffmpeg or opencv; otherwise a GIF is written). Default: outputs/<model>_<size>_seed<seed>.png")
    g.add_argument("--fps", type=int, default=16, help="frames per second of a saved video (default: 16)")
    return p


@dataclass
class Plan:
    """What to build and how to call it, after validation."""

    model: str
    spec: Any  # FamilySpec, or None (real weights of a family not known yet)
    is_family: bool
    size: str  # the --size of a family; "checkpoint" for real weights
    device: torch.device
    dtype: torch.dtype
    call: dict[str, Any]
    out: Path
    is_video: bool
    use_bcg: bool

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def check_arguments(args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` (exit 2) for numbers out of range and unknown attention backends."""
    for name in ("steps", "batch", "height", "width", "frames", "fps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1 (got {value})")
    if not 0 <= args.seed < SEED_LIMIT:
        parser.error(f"--seed must be in 0 .. 2**64 - 1 (got {args.seed})")
    if args.attention_backend is not None and args.attention_backend.lower() not in attention_backend_names():
        parser.error(f"--attention-backend {args.attention_backend!r} is not a diffusers backend; "
                     f"choose one of: {', '.join(attention_backend_names())}")


def choose_device(args, parser: argparse.ArgumentParser) -> torch.device:
    try:
        device = pipelines.resolve_device(args.device)
    except RuntimeError as exc:
        parser.error(f"--device {args.device!r}: {exc}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} asks for CUDA, but torch sees no CUDA device")
    return device


def family_or_checkpoint(model: str, parser: argparse.ArgumentParser):
    """The family spec of ``model``, or ``None`` for a local folder or hub id (``parser.error`` otherwise)."""
    if model in pipelines.list_families():
        return pipelines.get_family(model)
    if Path(model).expanduser().exists() or "/" in model or "\\" in model:
        return None
    parser.error(f"--model: unknown family {model!r}; known families: {', '.join(pipelines.list_families())} "
                 "(or give a local pipeline folder or a hub id such as org/name)")


def output_path(args, parser, model_name: str, size: str, is_video: bool) -> Path:
    """``--out`` checked for its suffix and that it can be written, or the default path."""
    if args.out is None:
        suffix = (".mp4" if can_write_mp4() else ".gif") if is_video else ".png"
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
        return DEFAULT_OUT_DIR / f"{name}_{size if size != 'checkpoint' else 'weights'}_seed{args.seed}{suffix}"
    allowed = VIDEO_SUFFIXES if is_video else IMAGE_SUFFIXES
    if args.out.suffix.lower() not in allowed:
        kind = "a video" if is_video else "an image"
        parser.error(f"--out {str(args.out)!r}: {args.model} makes {kind}; use one of {', '.join(allowed)}")
    problem = why_not_writable(args.out)
    if problem:
        parser.error(f"--out {str(args.out)!r} cannot be written: {problem}")
    return args.out


def check_full_size_on_cpu(spec, dtype: torch.dtype, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` with the memory a full-size build needs (from the family's parameter counts)."""
    d = pipelines.describe(spec, "full")
    params = d.transformer_params + sum(te[3] for te in d.text_encoders)
    gib = params * torch.empty((), dtype=dtype).element_size() / 2**30
    parser.error(f"--size full without CUDA builds {spec.name} on the CPU: {d.transformer_params / 1e9:.1f}B "
                 f"transformer and {(params - d.transformer_params) / 1e9:.1f}B text-encoder parameters, about "
                 f"{gib:.0f} GiB of memory in {pipelines.dtype_name(dtype)} for the weights alone (VAE and "
                 "activations on top), and minutes per step. Pass --yes to build it anyway.")


def make_plan(args, parser: argparse.ArgumentParser) -> Plan:
    """Validate the arguments (``parser.error`` -> exit 2) and work out the pipeline call, before any work."""
    check_arguments(args, parser)
    device = choose_device(args, parser)
    dtype = pipelines.resolve_dtype(args.dtype, device)
    spec = family_or_checkpoint(args.model, parser)
    if args.cache is not None:
        try:  # a checkpoint's family is known after loading: checked again then
            check_cache_option(args.cache, spec.name if spec is not None else None)
        except ValueError as exc:
            parser.error(f"--cache: {exc}")
    if args.quant is not None and (problem := torchao_problem()):
        parser.error(f"--quant {args.quant}: {problem}")
    size = args.size if spec is not None else "checkpoint"
    try:
        call = pipelines.plan_call(spec, args.size, prompt=args.prompt, height=args.height, width=args.width,
                                   num_frames=args.frames, steps=args.steps, guidance=args.guidance,
                                   negative_prompt=args.negative_prompt)
    except ValueError as exc:
        parser.error(str(exc))
    is_video = spec.is_video if spec is not None else (args.frames or 1) > 1
    model_name = args.model if spec is not None else Path(args.model).name
    out = output_path(args, parser, model_name, size, is_video)
    if spec is not None and size == "full" and device.type != "cuda" and not args.yes:
        check_full_size_on_cpu(spec, dtype, parser)
    use_bcg = args.bcg or args.debug_cuda_graph or args.compare
    return Plan(args.model, spec, spec is not None, size, device, dtype, call, out, is_video, use_bcg)


def list_models() -> int:
    def shape(sz):
        return f"{sz.height}x{sz.width}" + (f"x{sz.num_frames}f" if sz.num_frames else "")

    print(f"{'family':<14} {'title':<28} {'kind':<6} {'CFG':<10} {'tiny':<14} full")
    for name in pipelines.list_families():
        spec = pipelines.get_family(name)
        print(f"{name:<14} {spec.title:<28} {'video' if spec.is_video else 'image':<6} {spec.cfg_mode:<10} "
              f"{shape(spec.tiny):<14} {shape(spec.full)}")
    return 0


def fmt_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def format_bcg_stats(stats, indent: str = "  ") -> str:
    """``str(stats)`` of a ``BCGStats`` indented, plus a line on eager fallbacks."""
    first, *rest = str(stats).splitlines()
    lines = [f"{indent}BCG: {first}"] + [indent + line for line in rest]
    if stats.eager_calls:
        lines.append(f"{indent}  note: {stats.eager_calls} transformer call(s) ran eagerly (a fallback key or "
                     "non-CUDA inputs); see the BCGCaptureWarning above, if any")
    return "\n".join(lines)


def build(plan: Plan, args):
    """The pipeline with random weights (a family) or real weights (a checkpoint), progress bar on."""
    if plan.is_family:
        pipe = pipelines.build_pipeline(plan.model, size=args.size, device=plan.device, dtype=plan.dtype, seed=args.seed)
    else:
        pipe = pipelines.load_pipeline(plan.model, device=plan.device, dtype=plan.dtype)
        with contextlib.suppress(ValueError):
            plan.spec = pipelines.family_of(pipe)
    pipe.set_progress_bar_config(disable=False, desc="denoising")
    return pipe


def quantize_transformer(pipe, args) -> list[str]:
    """``--quant``: quantize the transformer with torchao right after the build; the note to print."""
    if not args.quant:
        return []
    try:
        return [apply_quant(pipe, args.quant)]
    except Exception as exc:  # noqa: BLE001 - e.g. a config the device does not support
        raise Failure(1, f"error: --quant {args.quant}: {type(exc).__name__}: {exc}") from exc


def prepare(pipe, plan: Plan, args) -> tuple[dict[str, Any], list[str]]:
    """The call fitted to the pipeline, and notes on the attention backend and compilation set on it."""
    try:
        call, dropped = pipelines.fit_call(pipe, plan.call, batch=args.batch)
    except ValueError as exc:
        raise Failure(2, f"generate.py: error: {exc}") from exc
    notes = [f"note: {type(pipe).__name__} takes no {key!r} argument; ignored" for key in dropped]
    transformer = getattr(pipe, "transformer", None)
    if (args.attention_backend or args.compile) and transformer is None:
        raise Failure(2, "error: --attention-backend and --compile need a pipeline with a transformer")
    if args.attention_backend:
        try:
            notes.append(set_attention_backend(transformer, args.attention_backend.lower()))
        except Exception as exc:  # noqa: BLE001 - e.g. the backend's package is not installed
            raise Failure(2, f"error: --attention-backend {args.attention_backend}: {exc}") from exc
    if args.compile:
        try:
            notes.append(regional_compile(transformer))
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
    return call, notes


def accelerate(pipe, plan: Plan, args) -> None:
    config = bcg_diffusion.BCGConfig(debug=args.debug_cuda_graph)
    try:
        with contextlib.nullcontext() if plan.cuda else quiet_library_warnings():  # CPU no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, config)
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (offload hooks, unknown transformer)
        raise Failure(1, f"error: BCG could not be applied: {type(exc).__name__}: {exc}") from exc


def enable_step_cache(pipe, plan: Plan, args, call: dict[str, Any]) -> None:
    """``--cache``: enable the step cache on the transformer (a checkpoint's family is checked here)."""
    if plan.spec is None:
        raise Failure(2, f"error: --cache needs a known family; {plan.model} is none of {', '.join(pipelines.list_families())}")
    try:
        if not plan.is_family:
            check_cache_option(args.cache, plan.spec.name)
        print(f"  {apply_cache(pipe, args.cache, plan.spec.name, call['num_inference_steps'])}", flush=True)
    except ValueError as exc:
        raise Failure(2, f"generate.py: error: --cache: {exc}") from exc


def counted_run(pipe, plan: Plan, args, call: dict[str, Any], label: str) -> RunResult:
    """One timed run; with ``--cache`` from a fresh cache state, counting the module passes it computed and reused."""
    if args.cache:
        reset_cache_state(pipe.transformer)
    with cache_passes(pipe.transformer, bool(args.cache)) as passes:
        result = run_pipeline(pipe, call, args.seed, plan.device, label)
    result.cache_passes = passes
    return result


def run(pipe, plan: Plan, args, call: dict[str, Any]) -> list[RunResult]:
    """The eager run (with ``--compare``), then the run asked for; BCG statistics on the last."""
    tag = " + compile" if args.compile else ""
    tag += f" + {args.cache}" if args.cache else ""
    bcg_label = "bcg-debug" if args.debug_cuda_graph else "bcg"
    results = []
    try:
        if args.compare and plan.cuda:  # one-off CUDA initialisation (cuBLAS, cuDNN, allocator) must not count
            print("warm-up: one untimed 1-step eager call", flush=True)
            run_pipeline(pipe, {**call, "num_inference_steps": 1}, args.seed, plan.device, "warm-up")
        if args.cache:  # after the warm-up, before acceleration
            enable_step_cache(pipe, plan, args, call)
        if args.compare:
            results.append(counted_run(pipe, plan, args, call, "eager" + tag))
            label = bcg_label + tag + ("" if plan.cuda else " (inactive: no CUDA)")
        else:
            label = (bcg_label if plan.use_bcg and plan.cuda else "eager") + tag
        if plan.use_bcg:
            accelerate(pipe, plan, args)
        results.append(counted_run(pipe, plan, args, call, label))
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: generation failed: {type(exc).__name__}: {exc}") from exc
    results[-1].bcg_stats = bcg_diffusion.get_stats(pipe) if plan.use_bcg else None
    return results


def print_run(result: RunResult) -> None:
    times = result.step_times
    if times:
        print(f"  {result.label}: {len(times)} steps, median step {fmt_ms(result.median_step)} "
              f"(first {fmt_ms(times[0])}, later steps median {fmt_ms(result.steady_median_step)}), "
              f"total {result.total_s:.2f} s")
    else:
        print(f"  {result.label}: total {result.total_s:.2f} s (no per-step times)")
    if result.cache_passes is not None:
        print(f"    step cache: {result.cache_passes}")
    for note in result.notes:
        print(f"    {note}")


def print_summary(plan: Plan, args, results: list[RunResult], build_s: float) -> None:
    label = plan.model if plan.is_family else f"{plan.model} (real weights)"
    print(f"summary: {label}, {plan.size}, {plan.device}, {pipelines.dtype_name(plan.dtype)}, batch {args.batch}, "
          f"build {build_s:.1f} s")
    for result in results:
        print_run(result)
    last = results[-1]
    if last.bcg_stats is not None:
        print(format_bcg_stats(last.bcg_stats, indent="    "))
    elif plan.use_bcg and plan.cuda:
        print("    BCG: get_stats returned nothing (acceleration not active)")
    if args.compare:
        eager, accel = results
        a, b = eager.steady_median_step, accel.steady_median_step
        if a and b:
            print(f"  per-step speedup (median of steps after the first): {a / b:.2f}x "
                  f"({fmt_ms(a)} eager -> {fmt_ms(b)} {accel.label})")
        same, detail = compare_outputs(eager, accel)
        print(f"  outputs bitwise identical: {'YES' if same else 'NO'} ({detail})")
        if not plan.cuda:
            print("  (no speed-up to expect: both runs were eager on this machine)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.list_models:
            return list_models()
        plan = make_plan(args, parser)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    if not plan.cuda:
        print(NO_CUDA_NOTE if plan.use_bcg else "note: running eagerly on the CPU (BCG needs a CUDA GPU).")
    print(f"building {plan.model} ({plan.size}) on {plan.device} in {pipelines.dtype_name(plan.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    try:
        pipe = build(plan, args)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        print(f"error: could not build {plan.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    build_s = time.perf_counter() - t0
    try:
        quantized = quantize_transformer(pipe, args)
        call, notes = prepare(pipe, plan, args)
        notes = quantized + notes
        print(f"built in {build_s:.1f} s; {', '.join(f'{k}={v!r}' for k, v in call.items() if k != 'prompt')}")
        for note in notes:
            print(f"  {note}")
        results = run(pipe, plan, args, call)
    except Failure as failure:
        print(failure, file=sys.stderr)
        return failure.code
    written = save_output(results[0].output, plan.out, plan.is_video, args.fps)
    if args.compare:
        written += save_output(results[1].output, plan.out, plan.is_video, args.fps, tag="_bcg")
    print_summary(plan, args, results, build_s)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
