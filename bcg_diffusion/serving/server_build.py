"""The server's start-up from a :class:`~.server_plan.ServerPlan`: build the pipeline, quantize it, attach the
adapters, apply the rest of the speed stack and BCG, plan requests, set up batching, warm up, and return the
:class:`~.state.ServerState` that :func:`~.http.app.create_app` serves. One path for ``bcg-serve`` (:mod:`.server`)
and its Ray Serve replicas (:mod:`.replicas.state`). A failed build or warm-up raises
:class:`~bcg_diffusion.toolkit.options.Failure` (exit code 1, or 2 for what the options asked and the model cannot
do); the lines printed say what was built.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.model_limits import StepLimit, family_side_limit, min_steps, side_limit
from bcg_diffusion.toolkit.offload_option import build_device, stream_transformers
from bcg_diffusion.toolkit.options import Failure, offline_hint
from bcg_diffusion.toolkit.speedups import speed_up
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.toolkit.stack import apply_speed_layers, cache_reset, compiled_graphs, quantize_layer
from bcg_pipelines.calls import BATCH_KWARGS

from .adapters.options import attach_adapters
from .batching.request_batching import BatchPolicy, BatchShapes, BatchStats, RequestBatcher
from .batching.step_batching import StepBatcher
from .batching.stepping import StepError
from .errors import RequestError
from .granularity import pixel_granularity
from .requests import RequestLimits, RequestPlanner
from .runner import CallRunner
from .server_plan import ServerPlan, prog
from .startup_warmup import WarmupPlan, plan_warmup, run_warmup
from .state import ServerState
from .worker import PipelineWorker, ServerCounters

__all__ = ["CACHED_UNBATCHED", "CHECKPOINT_DEFAULT_SIZE", "CHECKPOINT_DEFAULT_STEPS", "build_server", "make_planner",
           "stack_up"]

CHECKPOINT_DEFAULT_SIZE = Size(1024, 1024)
#: Why a server with a step cache runs every request alone (``--max-batch`` > 1 notwithstanding).
CACHED_UNBATCHED = ("a step cache decides for a whole pipeline call (compute or reuse) from every row of it, so in a "
                    "batch a request's image would depend on its companions; with --cache every request runs alone, "
                    "one call each, as with --max-batch 1")
CHECKPOINT_DEFAULT_STEPS = 28


def build_server(plan: ServerPlan, replica: dict[str, Any] | None = None) -> ServerState:
    """Build, speed up and warm the pipeline of ``plan`` (printing what it does); the state of its application, made
    once (``replica``: a Ray Serve replica's identity for ``/stats``). The worker thread started here is stopped again
    when the warm-up fails; ``ServerState.stop`` stops it."""
    model = plan.model
    print(f"building {model.name} ({model.model_size if model.spec is not None else 'weights'}) on {model.device} in "
          f"{pipelines.dtype_name(model.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    compile_cache = open_compile_cache(plan)
    pipe, spec = build_pipeline(plan)
    bank, notes = stack_up(pipe, spec, plan)
    off = batching_off(pipe, plan)
    planner = make_planner(pipe, spec, plan, pixel_granularity(pipe, spec.spatial_multiple if spec else None), off)
    print_built(time.perf_counter() - t0, pipe, planner, notes)
    shapes = batching_setup(pipe, planner, plan, off)
    counters, worker = ServerCounters(), PipelineWorker()
    runner = CallRunner(pipe, model.device, counters, adapters=bank,
                        before_call=cache_reset(pipe, plan.stack))  # an image depends on its request alone
    batcher = None
    try:
        batcher = make_batcher(plan, worker, runner, shapes)
        warmup = warm_up(worker, runner, planner, warmup_plan(plan, planner), shapes, batcher)
    except BaseException:
        if batcher is not None:
            batcher.stop()
        worker.stop()
        raise
    warmup["compile_cache"] = save_compile_cache(compile_cache)
    info = server_info(plan, spec, pipe, planner, warmup, replica)
    return ServerState(planner, worker, runner, counters, info, plan.requests.max_queue, api_key=plan.api_key,
                       batcher=batcher)


def make_batcher(plan: ServerPlan, worker: PipelineWorker, runner: CallRunner, shapes: BatchShapes | None):
    """The request batcher (its batches run as calls of ``runner``), the step batcher (``--batching step``), or
    ``None`` without batching; ``Failure`` (2) for a pipeline the step scheduler cannot split."""
    if shapes is None:
        return None
    if plan.batching.step is None:
        return RequestBatcher(worker, lambda batch: runner.run(batch.call()), shapes, BatchStats(shapes.policy))
    try:
        return StepBatcher(worker, runner, shapes, plan.batching.step)
    except StepError as exc:
        raise Failure(2, f"{prog()}: error: --batching step: {exc}") from exc


def build_pipeline(plan: ServerPlan):
    """The pipeline (random weights of a family, or a checkpoint), and its family (``None`` if unknown)."""
    model = plan.model
    device = build_device(model.offload, model.device)  # --offload: the transformer stays on the CPU
    try:
        if model.spec is not None:
            pipe = pipelines.build_pipeline(model.spec.name, size=model.model_size, device=device, dtype=model.dtype,
                                            seed=0)
            return pipe, model.spec
        pipe = pipelines.load_pipeline(model.name, device=device, dtype=model.dtype)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        hint = offline_hint(model.name, exc) if model.spec is None else None
        raise Failure(1, f"error: {hint}" if hint else f"error: could not build {model.name}: {type(exc).__name__}: "
                      f"{exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    try:
        spec = pipelines.family_of(pipe)
    except ValueError:
        spec = None
    if spec is not None and spec.is_video:
        raise Failure(2, f"{prog()}: error: {model.name} is a {spec.name} pipeline, which makes videos; serve.py "
                      "serves images")
    if not plan.requests.resolution_binning and "use_resolution_binning" not in pipelines.call_parameters(pipe):
        raise Failure(2, f"{prog()}: error: --no-resolution-binning: {type(pipe).__name__} does not bin resolutions "
                      "(its __call__ takes no use_resolution_binning), so it already runs the asked size; leave the "
                      "flag out")
    return pipe, spec


def stack_up(pipe, spec, plan: ServerPlan):
    """The speed stack on the built pipeline, in order: quantization, the LoRA adapters (before BCG and compile touch
    the transformer), the attention backend, the step cache, compile, BCG; the adapter bank (``None`` without
    adapters) and the lines that say what was done, the stack's first."""
    notes = [stack_line(plan)] + quantize_layer(pipe, plan.stack) + stream_offloaded(pipe, plan)
    bank = attach_adapters(pipe, plan.adapters, plan.catalog, prog())
    if bank is not None:
        notes.append(f"LoRA adapters: {', '.join(bank.names)} (hot-swap rank {bank.target_rank}, {bank.gpu_slots} kept "
                     "on the device)")
    steps = default_steps(pipe, spec, plan.requests.steps)
    notes += apply_speed_layers(pipe, plan.stack, spec.name if spec is not None else None, steps).notes
    notes += speed_up(pipe, compile=False, bcg=plan.bcg, on_cuda=plan.model.device.type == "cuda")
    return bank, notes


def stack_line(plan: ServerPlan) -> str:
    """The start-up line that names the stack: ``stack: fp8 + cache dbcache + compile, with BCG``."""
    bcg = "with BCG" if plan.bcg else "without BCG (eager)"
    return f"stack: {plan.stack.describe()}, {bcg}"


def open_compile_cache(plan: ServerPlan):
    """``--compile-cache``: ``bcg_diffusion.use_compile_cache`` before anything compiles (``None`` without it);
    prints its status. ``Failure`` (2) for a folder it cannot use."""
    if plan.stack.compile_cache is None:
        return None
    try:
        cache = bcg_diffusion.use_compile_cache(plan.stack.compile_cache)
    except Exception as exc:  # noqa: BLE001 - e.g. a folder that cannot be written
        raise Failure(2, f"{prog()}: error: --compile-cache {plan.stack.compile_cache}: {exc}") from exc
    print(f"compile cache: {cache.status}", flush=True)
    return cache


def save_compile_cache(cache) -> str | None:
    """After the warm-up: what was compiled saved into the compile cache, so that the next start loads it; the line
    printed (and shown in ``/stats``), ``None`` without ``--compile-cache``. A failed save is said, not fatal."""
    if cache is None:
        return None
    try:
        path = cache.save()
    except Exception as exc:  # noqa: BLE001 - the server serves either way
        line = f"compile cache: saving the artifacts failed: {type(exc).__name__}: {exc}"
    else:
        line = ("compile cache: nothing was compiled, nothing saved" if path is None
                else f"compile cache: saved the warm-up's compile artifacts to {path}")
    print(line, flush=True)
    return line


def stream_offloaded(pipe, plan: ServerPlan) -> list[str]:
    """``--offload K``: the transformer streams its blocks through K device slots; the note to print."""
    offload = plan.model.offload
    if offload is None:
        return []
    try:
        return [stream_transformers(pipe, offload, plan.model.device)]
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (too many slots, no room under the cap)
        raise Failure(1, f"error: --offload {offload}: {type(exc).__name__}: {exc}") from exc


def default_steps(pipe, spec, steps: int | None) -> int:
    """A request's default step count: ``steps`` (``--steps``), else the family's, else the pipeline's own."""
    if steps is not None:
        return steps
    if spec is not None:
        return spec.default_steps
    param = pipelines.call_parameters(pipe).get("num_inference_steps")
    value = getattr(param, "default", None)
    return value if isinstance(value, int) and value > 0 else CHECKPOINT_DEFAULT_STEPS


def model_size(plan: ServerPlan) -> str:
    """The model size whose defaults apply: ``--size`` for random weights; ``full`` for a checkpoint (the published
    model)."""
    return plan.model.model_size if plan.model.random_weights else "full"


def make_planner(pipe, spec, plan: ServerPlan, granularity: int, batching_off: str | None = "") -> RequestPlanner:
    """The request planner of ``pipe`` under the plan's limits and defaults (``granularity``: the pipeline's
    :func:`~.granularity.pixel_granularity`; ``batching_off``: why nothing is batched, ``None`` where ``--max-batch``
    batches, which caps ``n`` at it); ``Failure`` (2) when the default request itself is invalid."""
    asked = plan.requests
    limits = model_limits(pipe, spec, plan, granularity, batching_off)
    preset = model_size(plan)
    default_size = asked.default_size
    if default_size is None:
        default_size = (Size(spec.size(preset).width, spec.size(preset).height) if spec is not None
                        else CHECKPOINT_DEFAULT_SIZE)
    planner = RequestPlanner(pipe, spec, preset, limits, plan.catalog, default_size,
                             default_steps(pipe, spec, asked.steps), resolution_binning=asked.resolution_binning)
    try:
        planner.default_job(default_size)
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: the default request is invalid: {exc.message}") from exc
    return planner


def model_limits(pipe, spec, plan: ServerPlan, granularity: int, batching_off: str | None = "") -> RequestLimits:
    """The request limits: the plan's (``n`` capped at ``--max-batch`` where it batches: ``batching_off`` ``None``),
    with the largest side and the fewest steps the model itself takes (read from its transformer's and scheduler's
    configs: :mod:`bcg_diffusion.toolkit.model_limits`)."""
    asked = plan.requests
    side = side_limit(spec, pipe.transformer.config, granularity) if getattr(pipe, "transformer", None) is not None \
        else family_side_limit(spec, model_size(plan))
    scheduler = getattr(pipe, "scheduler", None)
    steps = min_steps(scheduler.config, type(scheduler).__name__) if scheduler is not None else StepLimit(1)
    max_n = asked.max_n if batching_off is not None else min(asked.max_n, plan.batching.rows)
    return RequestLimits(granularity=granularity, max_pixels=asked.max_pixels, max_steps=asked.max_steps,
                         max_n=max_n, max_side=side.pixels, side_reason=side.reason, min_steps=steps.steps,
                         min_steps_reason=steps.reason)


def print_built(seconds: float, pipe, planner: RequestPlanner, notes: list[str]) -> None:
    """The lines that say what was built: time, sizes, default request, speed-up notes, resolution binning."""
    print(f"built in {seconds:.1f} s; sizes in multiples of {planner.limits.granularity} px, "
          f"default {planner.default_size} (WxH), {planner.default_steps} steps", flush=True)
    for note in notes:
        print(f"  {note}", flush=True)
    if planner.takes_binning and planner.resolution_binning:
        print(f"  note: {type(pipe).__name__} snaps sizes to its aspect-ratio bins and resizes the result "
              "(--no-resolution-binning turns that off)", flush=True)


def batching_off(pipe, plan: ServerPlan) -> str | None:
    """Why this server batches nothing (``--max-batch 1``: ``""``; a step cache; a pipeline that makes one image per
    call), ``None`` where ``--max-batch`` batches."""
    if plan.batching.rows <= 1:
        return ""
    if plan.stack.cache is not None:
        return CACHED_UNBATCHED
    if not any(k in pipelines.call_parameters(pipe) for k in BATCH_KWARGS):
        return f"{type(pipe).__name__} makes one image per call (no images-per-prompt argument)"
    return None


def batching_setup(pipe, planner: RequestPlanner, plan: ServerPlan, off: str | None) -> BatchShapes | None:
    """The batch shapes of ``--max-batch`` > 1 (``None`` when ``off`` says why not), with the lines that say, per
    warmed size (or the default size), whether its calls are batched."""
    batching, rows = plan.batching, plan.batching.rows
    if off is not None:
        if off:
            print(f"  batching: off: {off}", flush=True)
        return None
    shapes = BatchShapes(pipe, BatchPolicy(rows, batching.window_ms / 1000.0, batching.work_limit),
                         planner.limits.granularity)
    if plan.requests.max_n > rows:
        print(f"  batching: n is capped at --max-batch {rows} (was --max-n {plan.requests.max_n})", flush=True)
    if batching.step is not None:
        print(f"  batching: step level, a running batch of {rows} slots per size (policy {batching.step.policy}); "
              f"requests join at every step, every step runs {rows} rows (a lone request pays for a full batch)",
              flush=True)
    else:
        print(f"  batching: up to {rows} images per call, window {batching.window_ms:g} ms; every batched "
              f"call runs {rows} rows (a lone request pays for a full batch)", flush=True)
    for size in plan.warmup or [planner.default_size]:
        print(f"    {shapes.describe(size, planner.default_job(size).call)}", flush=True)
    return shapes


def warmup_plan(plan: ServerPlan, planner: RequestPlanner) -> WarmupPlan:
    """What the start-up warms (:func:`~.startup_warmup.plan_warmup`: ``--warmup``, and what the stack adds); prints
    what the stack changed."""
    warming = plan_warmup(plan.warmup, planner.default_size, planner.default_steps, plan.stack)
    for note in warming.notes:
        print(f"  {note}", flush=True)
    return warming


def warm_up(worker: PipelineWorker, runner: CallRunner, planner: RequestPlanner, warming: WarmupPlan,
            shapes: BatchShapes | None = None, batcher=None) -> dict[str, Any]:
    """Run the warm-up on the worker thread: the base model's, then, with adapters, the same once more with the
    first adapter in the slot (both graph keys of every warmed size captured); then the adapters count from zero.
    Its summary for ``/stats`` (the base model's pass)."""
    summary = warm_pass(worker, runner, planner, warming, shapes, batcher)
    bank = runner.adapters
    if bank is None:
        return summary
    if bank.names:
        worker.submit(lambda: bank.select(bank.names[0])).result()
        try:
            warm_pass(worker, runner, planner, warming, shapes, batcher, adapter=bank.names[0])
        finally:
            worker.submit(lambda: bank.select(None)).result()
    runner.refresh_stats()
    bank.mark_ready(runner.bcg_stats)
    runner.refresh_stats()
    return summary


def warm_pass(worker: PipelineWorker, runner: CallRunner, planner: RequestPlanner, warming: WarmupPlan,
              shapes: BatchShapes | None, batcher, adapter: str | None = None) -> dict[str, Any]:
    """One warm-up of every size (with step batching, the step-batched sizes through the step scheduler) for
    ``adapter`` (``None``: the base model); print its report; its summary."""
    sizes = list(warming.sizes)
    if not sizes:
        return {"sizes": [], "total_s": 0.0, "captures": 0, "method": None, "steps": None}
    stepped = step_sizes(planner, sizes, batcher)
    method = "bcg_diffusion.warmup"
    if stepped:
        method = "step scheduler" + (f" and {method}" if len(stepped) < len(sizes) else "")
    print(f"warming up {', '.join(map(str, sizes))} (WxH; {method}, {warming.steps} steps) ...", flush=True)
    try:
        rest = [size for size in sizes if size not in stepped]
        reports = [worker.submit(lambda: run_warmup(runner, planner, rest, shapes, warming.steps, adapter)).result()
                   ] if rest else []
        reports += [batcher.warm(planner, stepped, adapter)] if stepped else []
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: warm-up failed: {type(exc).__name__}: {exc}") from exc
    for report in reports:
        print(str(report), flush=True)
    return {"sizes": [str(size) for size in sizes], "total_s": round(sum(float(r.total_s) for r in reports), 3),
            "captures": sum(int(r.captures) for r in reports), "method": method, "steps": warming.steps,
            "compiled_graphs": compiled_graphs()}


def step_sizes(planner: RequestPlanner, sizes: list[Size], batcher) -> list[Size]:
    """The sizes of ``sizes`` that ``batcher`` step-batches (none without step batching); ``Failure`` (2) for a
    size that is not a valid request."""
    if not isinstance(batcher, StepBatcher):
        return []
    try:
        return [size for size in sizes if batcher.batches(planner.default_job(size))]
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc


def server_info(plan: ServerPlan, spec, pipe, planner: RequestPlanner, warmup: dict,
                replica: dict[str, Any] | None = None) -> dict[str, Any]:
    """The server's description in ``/stats``: model, options, limits, warm-up, versions (and ``replica`` for a Ray
    Serve replica)."""
    device, batching = plan.model.device, plan.batching
    info = {
        "model": plan.model.name, "model_ids": plan.catalog.ids(), "family": spec.name if spec is not None else None,
        "size": plan.model.model_size if plan.model.random_weights else "checkpoint",
        "pipeline": type(pipe).__name__, "device": str(device), "dtype": pipelines.dtype_name(plan.model.dtype),
        "bcg": plan.bcg and device.type == "cuda", "bcg_requested": plan.bcg, "compile": plan.stack.compile,
        "stack": {**plan.stack.as_dict(), "bcg": plan.bcg},
        "batching_off": CACHED_UNBATCHED if batching.rows > 1 and plan.stack.cache is not None else None,
        "granularity": planner.limits.granularity, "max_pixels": planner.limits.max_pixels,
        "max_side": planner.limits.max_side, "min_steps": planner.limits.min_steps,
        "max_steps": planner.limits.max_steps, "max_n": planner.limits.max_n if planner.takes_batch else 1,
        "max_queue": plan.requests.max_queue, "default_size": str(planner.default_size),
        "default_steps": planner.default_steps, "max_batch": batching.rows,
        "batching": "off" if batching.rows <= 1 else ("step" if batching.step is not None else "request"),
        "resolution_binning": plan.requests.resolution_binning if planner.takes_binning else None,
        "warmup": warmup, "api_key_required": plan.api_key is not None, "torch": torch.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }
    return info if replica is None else {**info, "replica": replica}
