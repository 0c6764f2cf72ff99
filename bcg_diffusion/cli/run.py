"""The run of ``bcg-generate``: build a diffusers DiT pipeline, prepare it, run it eagerly or with breakable CUDA
graphs (BCG), write and summarise the output.

With no arguments it builds the tiny random-weight Flux pipeline of ``bcg_pipelines``, runs it on the best
device present (eagerly on a CPU) and writes ``outputs/flux_tiny_seed0.png``. See ``docs/generate.md``.

Examples::

    python scripts/generate.py                                   # tiny Flux, seconds on a CPU
    python scripts/generate.py --model pixart --size full --height 512 --width 512 --bcg
    python scripts/generate.py --model sd3 --size full --compare # eager vs BCG, same seed, same pipeline
    python scripts/generate.py --model /path/to/FLUX.1-dev --bcg # real weights from a local folder
    torchrun --nproc_per_node 2 scripts/generate.py --model flux --size full --cp ulysses --bcg --compare

Per-step times come from the pipeline's step-end callback (CUDA is synchronised at each time stamp), so
they cover one whole denoising step: every transformer call of the step plus the scheduler update.

The command starts in :func:`bcg_diffusion.cli.generate.main`, which parses the arguments before torch is
imported (``--help`` answers at once) and calls :func:`run_command` here. One run, in the order of this module:
:func:`run_command` reads the arguments into a plan (:mod:`.plan`, every check before any work), :func:`generate`
builds the pipeline, quantizes and prepares it (attention backend, context parallelism, compile), :func:`run`
makes the timed runs (step cache, warm-up, acceleration), then the outputs are compared, written and summarised
(:mod:`.report`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import time
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.cache_option import apply_cache, cache_passes, check_cache, reset_cache_state
from bcg_diffusion.toolkit.media import save_output
from bcg_diffusion.toolkit.offload_option import build_device, stream_transformers
from bcg_diffusion.toolkit.options import Failure, offline_hint
from bcg_diffusion.toolkit.stack import quantize_layer
from bcg_diffusion.toolkit.model_limits import family_side_limit, min_steps, side_limit
from bcg_diffusion.toolkit.speedups import (enable_context_parallel, has_cp_plan, quiet_library_warnings,
                                            regional_compile, set_attention_backend)
from bcg_diffusion.toolkit.timed_run import RunResult, compare_outputs, run_pipeline

from .args import SHAPE_KEYS, prog
from .plan import Plan, Ranks, make_plan, negative_prompt_problem
from .report import SetUp, fmt_size, print_summary

__all__ = ["generate", "list_models", "run", "run_command"]

NO_CUDA_NOTE = "note: BCG needs a CUDA GPU and none is in use here, so everything runs eagerly."


def run_command(args, parser) -> int:
    """Parsed arguments to an exit code: ``--list-models``, or the plan (every check, exit code 2) and the run."""
    try:
        if args.list_models:
            return list_models()
        plan = make_plan(args, parser)
    except SystemExit as exc:  # a bad argument (2)
        return int(exc.code or 0)
    return generate(plan, args) if plan.ranks is None else generate_on_ranks(plan, args)


def size_text(width: int, height: int, frames: int | None = None) -> str:
    """``WxH`` (width first, as ``--warmup``, the summary and serve.py write sizes), ``, F frames`` for videos."""
    return f"{width}x{height}" + (f", {frames} frames" if frames else "")


def list_models() -> int:
    """The families: kind, CFG mode, the default size of each model size (width x height) and the largest side
    ``--height``/``--width`` take at each model size (tiny/full)."""
    rows = [("family", "title", "kind", "CFG", "tiny (WxH)", "full (WxH)", "max side px (tiny/full)")]
    for name in pipelines.list_families():
        spec = pipelines.get_family(name)
        rows.append((name, spec.title, "video" if spec.is_video else "image", spec.cfg_mode,
                     size_text(spec.tiny.width, spec.tiny.height, spec.tiny.num_frames),
                     size_text(spec.full.width, spec.full.height, spec.full.num_frames),
                     "/".join(str(family_side_limit(spec, size).pixels) for size in ("tiny", "full"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print("The largest side is the smaller of 4x the published size's (at least 4096 px) and what the transformer's "
          "position table holds (SD3.5's pos_embed_max_size, Wan's rope_max_seq_len), per model size.")
    print("Sizes are width x height in pixels, as --warmup, serve.py and the OpenAI images API take them; "
          "pass them as --width W --height H.")
    return 0


def generate_on_ranks(plan: Plan, args) -> int:
    """``--cp``: one NCCL process group over the torchrun launch around :func:`generate`, destroyed at the end."""
    import torch.distributed as dist

    try:
        torch.cuda.set_device(plan.device)
        dist.init_process_group(backend="nccl", device_id=plan.device)
    except Exception as exc:  # noqa: BLE001
        print(f"{plan.error_prefix}error: --cp: the NCCL process group could not start: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    try:
        with only_rank0_speaks(plan):
            return generate(plan, args)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def only_rank0_speaks(plan: Plan):
    """Under ``--cp``, ranks other than 0 print nothing but errors (stdout and library warnings off)."""
    if plan.is_rank0:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), quiet_library_warnings():
        yield


def generate(plan: Plan, args) -> int:
    """Build, prepare, run, write and summarise (on every rank under ``--cp``; only rank 0 writes and prints)."""
    err = plan.error_prefix
    if not plan.cuda:
        print(NO_CUDA_NOTE if plan.use_bcg else "note: running eagerly on the CPU (BCG needs a CUDA GPU).")
    if plan.is_rank0:
        for note in plan.notes:
            print(note)
    try:
        compile_cache = open_compile_cache(plan, args)
    except Failure as failure:
        print(f"{err}{failure}", file=sys.stderr)
        return failure.code
    print(f"building {plan.model} ({plan.model_size}) on {build_device(args.offload, plan.device)} in "
          f"{pipelines.dtype_name(plan.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    try:
        pipe = build(plan, args)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        hint = None if plan.is_family else offline_hint(plan.model, exc)
        print(f"{err}error: {hint}" if hint else f"{err}error: could not build {plan.model}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    build_s = time.perf_counter() - t0
    try:
        quantized = quantize_layer(pipe, plan.stack) + offload_transformer(pipe, plan, args)
        call, notes = prepare(pipe, plan, args)
        notes = quantized + notes
        print(f"built in {build_s:.1f} s; {', '.join(f'{k}={v!r}' for k, v in call.items() if k != 'prompt')}")
        for note in notes:
            print(f"  {note}")
        results, setup = run(pipe, plan, args, call)
        verdict = check_outputs(plan, results)
    except Failure as failure:
        print(f"{err}{failure}", file=sys.stderr)
        return failure.code
    code, saved = save_compile_cache(compile_cache)
    if code:
        print(f"{err}{saved}", file=sys.stderr)
    if not plan.is_rank0:
        return code
    write_notes: list[str] = []
    try:
        written = save_output(results[0].output, plan.out, plan.is_video, args.fps, notes=write_notes)
        if args.compare:
            written += save_output(results[1].output, plan.out, plan.is_video, args.fps, tag="_bcg", notes=write_notes)
    except OSError as exc:
        print(f"{err}error: writing {plan.out} failed: {exc}", file=sys.stderr)
        return 1
    print_summary(pipe, plan, args, call, results, setup, verdict, build_s, compile_cache)
    if saved and not code:
        print(saved)
    for note in write_notes:
        print(note)
    for path in written:
        print(f"wrote {path}")
    return code


def open_compile_cache(plan: Plan, args):
    """``--compile-cache``: ``bcg_diffusion.use_compile_cache`` before anything compiles (under ``--cp`` one
    sub-folder per rank, so that no two processes write one file); prints its status."""
    if plan.stack.compile_cache is None:
        return None
    folder = plan.stack.compile_cache
    directory = folder if plan.ranks is None else folder / f"rank{plan.ranks.rank}"
    try:
        cache = bcg_diffusion.use_compile_cache(directory)
    except Exception as exc:  # noqa: BLE001 - e.g. a folder that cannot be written
        raise Failure(2, f"{prog()}: error: --compile-cache {directory}: {exc}") from exc
    print(f"compile cache: {cache.status}", flush=True)
    return cache


def build(plan: Plan, args):
    """The pipeline with random weights (a family) or real weights (a checkpoint), progress bar on."""
    device = build_device(args.offload, plan.device)  # --offload: the transformer stays on the CPU
    if plan.is_family:
        pipe = pipelines.build_pipeline(plan.model, size=args.size, device=device, dtype=plan.dtype, seed=args.seed)
    else:
        pipe = pipelines.load_pipeline(plan.model, device=device, dtype=plan.dtype)
        with contextlib.suppress(ValueError):
            plan.spec = pipelines.family_of(pipe)
    pipe.set_progress_bar_config(disable=not plan.is_rank0, desc="denoising")  # --cp: rank 0's bar only
    return pipe


def offload_transformer(pipe, plan: Plan, args) -> list[str]:
    """``--offload K``: the other components on the device, the transformer streaming its blocks; the note to print."""
    if args.offload is None:
        return []
    try:
        return [stream_transformers(pipe, args.offload, plan.device)]
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (too many slots, no room under the cap)
        raise Failure(1, f"error: --offload {args.offload}: {type(exc).__name__}: {exc}") from exc


def prepare(pipe, plan: Plan, args) -> tuple[dict[str, Any], list[str]]:
    """The call fitted to the pipeline, and notes on the attention backend and compilation set on it."""
    if args.no_resolution_binning and "use_resolution_binning" not in pipelines.call_parameters(pipe):
        raise Failure(2, f"{prog()}: error: --no-resolution-binning: {type(pipe).__name__} does not bin "
                      "resolutions (its __call__ takes no use_resolution_binning), so it already runs the asked size; "
                      "leave the flag out")
    try:
        call, dropped = pipelines.fit_call(pipe, plan.call, batch=args.batch, exact_shape=args.no_resolution_binning)
    except ValueError as exc:
        raise Failure(2, f"{prog()}: error: {exc}") from exc
    if not plan.is_family:  # a family was checked before the build
        check_loaded_limits(pipe, plan, call)
    if args.negative_prompt is not None and not plan.is_family:  # a family was checked before the build
        problem = negative_prompt_problem(pipe, call, plan.model, "guidance_scale")
        if problem:
            raise Failure(2, f"{prog()}: error: {problem}")
    notes = [f"note: {type(pipe).__name__} takes no {key!r} argument; ignored" for key in dropped]
    transformer = getattr(pipe, "transformer", None)
    stack = plan.stack
    if (stack.attention_backend or stack.compile or args.cp) and transformer is None:
        raise Failure(2, "error: --attention-backend, --compile and --cp need a pipeline with a transformer")
    if stack.attention_backend:
        try:
            notes.append(set_attention_backend(transformer, stack.attention_backend))
        except Exception as exc:  # noqa: BLE001 - e.g. the backend's package is not installed
            raise Failure(2, f"error: --attention-backend {stack.attention_backend}: {exc}") from exc
    if plan.ranks is not None:  # after the attention backend (diffusers checks it), before compile and BCG
        notes.append(split_over_ranks(transformer, plan.ranks))
    if stack.compile:
        try:
            notes.append(regional_compile(transformer))
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
    return call, notes


def check_loaded_limits(pipe, plan: Plan, call: dict[str, Any]) -> None:
    """A checkpoint's limits, known once it is loaded: the steps its scheduler takes and the side its transformer's
    position table covers (a checkpoint of a known family, whose granularity the registry gives); ``Failure`` (2)."""
    scheduler = getattr(pipe, "scheduler", None)
    steps = call.get("num_inference_steps")
    if scheduler is not None and steps is not None:
        fewest = min_steps(scheduler.config, type(scheduler).__name__)
        if steps < fewest.steps:
            raise Failure(2, f"{prog()}: error: --steps {steps}: {plan.model}'s scheduler {fewest.reason}; give --steps "
                          f"{fewest.steps} or more")
    transformer = getattr(pipe, "transformer", None)
    if plan.spec is None or transformer is None:
        return
    limit = side_limit(plan.spec, transformer.config, plan.spec.spatial_multiple)
    for name in ("height", "width"):
        if call.get(name) is not None and call[name] > limit.pixels:
            raise Failure(2, f"{prog()}: error: --{name} {call[name]} is above the limit of {limit.pixels} px for "
                          f"{plan.model}: {limit.reason}")


def split_over_ranks(transformer, ranks: Ranks) -> str:
    """``--cp``: diffusers context parallelism on the transformer; the note to print."""
    if not has_cp_plan(type(transformer)):  # a checkpoint (a family was checked before building)
        raise Failure(2, f"{prog()}: error: --cp {ranks.mode}: {type(transformer).__name__} has no _cp_plan, so "
                      "diffusers cannot split it over GPUs")
    try:
        return enable_context_parallel(transformer, ranks.mode, ranks.world_size)
    except Exception as exc:  # noqa: BLE001 - e.g. heads not divisible by the degree, a backend without CP
        raise Failure(1, f"error: --cp {ranks.mode}: {type(exc).__name__}: {exc}") from exc


def run(pipe, plan: Plan, args, call: dict[str, Any]) -> tuple[list[RunResult], SetUp]:
    """The eager run (with ``--compare``), then the run asked for, each after its ``--warmup``; BCG
    statistics on the last."""
    stack = plan.stack
    tag = " + compile" if stack.compile else ""
    tag += f" + {stack.cache}" if stack.cache else ""
    bcg_label = "bcg-debug" if args.debug_cuda_graph else "bcg"
    results, setup = [], SetUp()
    try:
        if args.compare and plan.cuda and plan.warmup is None:  # one-off CUDA initialisation must not count
            print("warm-up: one untimed 1-step eager call", flush=True)
            first = run_pipeline(pipe, {**call, "num_inference_steps": 1}, args.seed, plan.device, "warm-up")
            if stack.compile:
                seconds = first.step_times[0] if first.step_times else first.total_s
                setup.compiled_in(f"the untimed 1-step eager call took {seconds:.2f} s in its step")
        if stack.cache:  # after the CUDA warm-up call, before --warmup and acceleration
            enable_step_cache(pipe, plan, args, call)
        if args.compare:
            label = "eager" + tag
            if plan.warmup is not None:
                warm_up(pipe, plan, call, label, setup, args)
            results.append(counted_run(pipe, plan, args, call, label))
            label = bcg_label + tag + ("" if plan.cuda else " (inactive: no CUDA)")
        else:
            label = (bcg_label if plan.use_bcg and plan.cuda else "eager") + tag
        if plan.use_bcg:
            accelerate(pipe, plan, args)
        if plan.warmup is not None:
            warm_up(pipe, plan, call, label, setup, args)
        results.append(counted_run(pipe, plan, args, call, label))
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: generation failed: {type(exc).__name__}: {exc}") from exc
    results[-1].bcg_stats = bcg_diffusion.get_stats(pipe) if plan.use_bcg else None
    return results, setup


def enable_step_cache(pipe, plan: Plan, args, call: dict[str, Any]) -> None:
    """``--cache``: enable the step cache on the transformer (a checkpoint's family is checked here)."""
    if plan.spec is None:
        raise Failure(2, f"error: --cache needs a known family; {plan.model} is none of {', '.join(pipelines.list_families())}")
    try:
        if not plan.is_family:
            check_cache(plan.stack.cache, plan.spec.name)
        print(f"  {apply_cache(pipe, plan.stack.cache, plan.spec.name, call['num_inference_steps'])}", flush=True)
    except ValueError as exc:
        raise Failure(2, f"{prog()}: error: --cache: {exc}") from exc


def warm_up(pipe, plan: Plan, call: dict[str, Any], before: str, setup: SetUp, args) -> None:
    """``--warmup``: ``bcg_diffusion.warmup`` at the planned shapes with the run's other call settings."""
    settings = {k: v for k, v in call.items() if k not in (*SHAPE_KEYS, "num_inference_steps")}
    sizes = ", ".join(fmt_size(s) for s in plan.warmup)
    print(f"warm-up before the {before} run: bcg_diffusion.warmup at {sizes} "
          f"({'WxHxframes' if plan.is_video else 'WxH'}) ...", flush=True)
    try:
        with torch.inference_mode():  # as the timed runs (timed_run.run_pipeline): grad mode is part of a graph key
            report = bcg_diffusion.warmup(pipe, plan.warmup, **settings)
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: --warmup: {type(exc).__name__}: {exc}") from exc
    print(textwrap.indent(str(report), "  "), flush=True)
    setup.warmups[before] = report
    if plan.stack.compile:
        setup.compiled_in(f"bcg_diffusion.warmup before the {before} run took {report.total_s:.2f} s in all")


def accelerate(pipe, plan: Plan, args) -> None:
    """``--bcg``: ``bcg_diffusion.accelerate_pipeline`` with ``--debug-cuda-graph`` as ``BCGConfig(debug=...)``."""
    config = bcg_diffusion.BCGConfig(debug=args.debug_cuda_graph)
    try:
        with contextlib.nullcontext() if plan.cuda else quiet_library_warnings():  # CPU no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, config)
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (offload hooks, unknown transformer)
        raise Failure(1, f"error: BCG could not be applied: {type(exc).__name__}: {exc}") from exc


def counted_run(pipe, plan: Plan, args, call: dict[str, Any], label: str) -> RunResult:
    """One timed run; with ``--cache`` from a fresh cache state, counting the module passes it computed and reused."""
    cached = plan.stack.cache is not None
    if cached:
        reset_cache_state(pipe.transformer)
    with cache_passes(pipe.transformer, cached) as passes:
        result = run_pipeline(pipe, call, args.seed, plan.device, label)
    result.cache_passes = passes
    return result


def check_outputs(plan: Plan, results: list[RunResult]) -> tuple[bool, str] | None:
    """``--compare``: whether the two runs' outputs are bitwise identical, and the sentence saying so.
    Under ``--cp`` every rank compares its own and all must agree (a collective: every rank calls it)."""
    if len(results) < 2:
        return None
    same, detail = compare_outputs(*results)
    if plan.ranks is not None:
        import torch.distributed as dist

        flag = torch.tensor([int(same)], device=plan.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        same = bool(flag.item())
        detail = f"{'on' if same else 'not on'} all {plan.ranks.world_size} ranks; rank 0: {detail}"
    return same, detail


def save_compile_cache(cache) -> tuple[int, str | None]:
    """``cache.save()`` after the run: (exit code, the line to print)."""
    if cache is None:
        return 0, None
    try:
        path = cache.save()
    except Exception as exc:  # noqa: BLE001 - the output is written either way; the exit code says it
        return 1, f"error: --compile-cache: saving the artifacts failed: {type(exc).__name__}: {exc}"
    if path is None:
        return 0, "compile cache: nothing was compiled, nothing saved"
    return 0, f"compile cache: saved this process's compile artifacts to {path}"

