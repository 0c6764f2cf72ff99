"""The server's start-up from a :class:`~.server_plan.ServerPlan`: build the pipeline, quantize it, attach the
adapters, apply the rest of the speed stack and BCG, plan requests, set up batching, warm up, and return the
:class:`~.app.ServerState` that :func:`~.app.create_app` serves. One path for ``bcg-serve`` (:mod:`.server`) and its
Ray Serve replicas (:mod:`.replica_state`). A failed build or warm-up raises
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
from bcg_diffusion.toolkit.offload_option import build_device, stream_transformers
from bcg_diffusion.toolkit.model_limits import StepLimit, family_side_limit, min_steps, side_limit
from bcg_diffusion.toolkit.options import Failure, offline_hint
from bcg_diffusion.toolkit.speedups import speed_up
from bcg_diffusion.toolkit.stack import apply_speed_layers, cache_reset, compiled_graphs, quantize_layer

from .adapter_options import attach_adapters, warm_adapters
from .app import ServerState
from .batching import BatchPolicy, BatchShapes, BatchStats, RequestBatcher
from .step_batching import StepBatcher
from .stepping import StepError
from .granularity import pixel_granularity
from .requests import RequestError, RequestLimits, RequestPlanner
from .server_plan import ServerPlan, prog
from .startup_warmup import WarmupPlan, plan_warmup, run_warmup
from .worker import ImageGenerator, PipelineWorker, ServerCounters

__all__ = ["CACHED_UNBATCHED", "CHECKPOINT_DEFAULT_SIZE", "CHECKPOINT_DEFAULT_STEPS", "build_server", "make_planner",
           "stack_up"]

CHECKPOINT_DEFAULT_SIZE = (1024, 1024)
#: Why a server with a step cache runs every request alone (``--max-batch`` > 1 notwithstanding).
CACHED_UNBATCHED = ("a step cache decides for a whole pipeline call (compute or reuse) from every row of it, so in a "
                    "batch a request's image would depend on its companions; with --cache every request runs alone, "
                    "one call each, as with --max-batch 1")
CHECKPOINT_DEFAULT_STEPS = 28


def build_server(plan: ServerPlan) -> ServerState:
    """Build, speed up and warm the pipeline of ``plan`` (printing what it does); the state of its application.
    The worker thread started here is stopped again when the warm-up fails; ``ServerState.stop`` stops it."""
    print(f"building {plan.model} ({plan.size if plan.spec is not None else 'weights'}) on {plan.device} in "
          f"{pipelines.dtype_name(plan.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    compile_cache = open_compile_cache(plan)
    pipe, spec = build_pipeline(plan)
    adapters, notes = stack_up(pipe, spec, plan)
    granularity = pixel_granularity(pipe, spec.spatial_multiple if spec is not None else None)
    planner = make_planner(pipe, spec, plan, granularity)
    if adapters is not None:
        planner.adapter_ids = tuple(adapters.names)
        notes.append(f"LoRA adapters: {', '.join(adapters.names)} (hot-swap rank {adapters.target_rank}, "
                     f"{adapters.gpu_slots} kept on the device)")
    print_built(time.perf_counter() - t0, pipe, planner, notes)
    shapes = batching_setup(pipe, planner, plan)
    counters, worker = ServerCounters(), PipelineWorker()
    generator = ImageGenerator(pipe, plan.device, counters, dict(plan.injections))
    generator.before_call = cache_reset(pipe, plan.stack)  # a request's image depends on the request alone
    warming = warmup_plan(plan, planner)
    batcher = None
    try:
        batcher = make_batcher(plan, worker, generator, shapes)
        warm = (lambda: warm_up(worker, generator, planner, warming, shapes, batcher))
        warmup = warm()
        warm_adapters(adapters, worker, generator, warm)
    except BaseException:
        if batcher is not None:
            batcher.stop()
        worker.stop()
        raise
    warmup["compile_cache"] = save_compile_cache(compile_cache)
    return ServerState(planner, worker, generator, counters, server_info(plan, spec, pipe, planner, warmup),
                       plan.max_queue, api_key=plan.api_key, batcher=batcher)


def make_batcher(plan: ServerPlan, worker: PipelineWorker, generator: ImageGenerator, shapes: BatchShapes | None):
    """The request batcher, the step batcher (``--batching step``), or ``None`` without batching; ``Failure`` (2)
    for a pipeline the step scheduler cannot split."""
    if shapes is None:
        return None
    if plan.step is None:
        return RequestBatcher(worker, generator.generate_batch, shapes, BatchStats(shapes.policy))
    try:
        return StepBatcher(worker, generator, shapes, plan.step)
    except StepError as exc:
        raise Failure(2, f"{prog()}: error: --batching step: {exc}") from exc


def build_pipeline(plan: ServerPlan):
    """The pipeline (random weights of a family, or a checkpoint), and its family (``None`` if unknown)."""
    device = build_device(plan.offload, plan.device)  # --offload: the transformer stays on the CPU
    try:
        if plan.spec is not None:
            pipe = pipelines.build_pipeline(plan.spec.name, size=plan.size, device=device, dtype=plan.dtype, seed=0)
            return pipe, plan.spec
        pipe = pipelines.load_pipeline(plan.model, device=device, dtype=plan.dtype)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        hint = offline_hint(plan.model, exc) if plan.spec is None else None
        raise Failure(1, f"error: {hint}" if hint else f"error: could not build {plan.model}: {type(exc).__name__}: "
                      f"{exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    try:
        spec = pipelines.family_of(pipe)
    except ValueError:
        spec = None
    if spec is not None and spec.is_video:
        raise Failure(2, f"{prog()}: error: {plan.model} is a {spec.name} pipeline, which makes videos; serve.py "
                      "serves images")
    if not plan.resolution_binning and "use_resolution_binning" not in pipelines.call_parameters(pipe):
        raise Failure(2, f"{prog()}: error: --no-resolution-binning: {type(pipe).__name__} does not bin resolutions "
                      "(its __call__ takes no use_resolution_binning), so it already runs the asked size; leave the "
                      "flag out")
    return pipe, spec


def stack_up(pipe, spec, plan: ServerPlan):
    """The speed stack on the built pipeline, in order: quantization, the LoRA adapters (before BCG and compile touch
    the transformer), the attention backend, the step cache, compile, BCG; the adapter bank (``None`` without
    adapters) and the lines that say what was done, the stack's first."""
    notes = [stack_line(plan)] + quantize_layer(pipe, plan.stack) + stream_offloaded(pipe, plan)
    adapters = attach_adapters(pipe, list(plan.adapters), plan.base_model, prog(), rank=plan.lora_rank,
                               gpu_slots=plan.lora_gpu_slots)
    steps = default_steps(pipe, spec, plan.steps)
    notes += apply_speed_layers(pipe, plan.stack, spec.name if spec is not None else None, steps).notes
    notes += speed_up(pipe, compile=False, bcg=plan.bcg, on_cuda=plan.device.type == "cuda")
    return adapters, notes


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
    if plan.offload is None:
        return []
    try:
        return [stream_transformers(pipe, plan.offload, plan.device)]
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (too many slots, no room under the cap)
        raise Failure(1, f"error: --offload {plan.offload}: {type(exc).__name__}: {exc}") from exc


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
    return plan.size if plan.random_weights else "full"


def make_planner(pipe, spec, plan: ServerPlan, granularity: int) -> RequestPlanner:
    """The request planner of ``pipe`` under the plan's limits and defaults (``granularity``: the pipeline's
    :func:`~.granularity.pixel_granularity`); ``Failure`` (2) when the default request itself is invalid."""
    limits = model_limits(pipe, spec, plan, granularity)
    size = model_size(plan)
    default_size = plan.default_size
    if default_size is None:
        default_size = ((spec.size(size).width, spec.size(size).height) if spec is not None
                        else CHECKPOINT_DEFAULT_SIZE)
    planner = RequestPlanner(pipe, spec, size, limits,
                             default_width=default_size[0], default_height=default_size[1],
                             default_steps=default_steps(pipe, spec, plan.steps),
                             resolution_binning=plan.resolution_binning, model_id=plan.base_model)
    try:
        planner.default_job(*default_size)
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: the default request is invalid: {exc.message}") from exc
    return planner


def model_limits(pipe, spec, plan: ServerPlan, granularity: int) -> RequestLimits:
    """The request limits: the plan's, with the largest side and the fewest steps the model itself takes (read
    from its transformer's and scheduler's configs: :mod:`bcg_diffusion.toolkit.model_limits`)."""
    side = side_limit(spec, pipe.transformer.config, granularity) if getattr(pipe, "transformer", None) is not None \
        else family_side_limit(spec, model_size(plan))
    scheduler = getattr(pipe, "scheduler", None)
    steps = min_steps(scheduler.config, type(scheduler).__name__) if scheduler is not None else StepLimit(1)
    return RequestLimits(granularity=granularity, max_pixels=plan.max_pixels, max_steps=plan.max_steps,
                         max_n=plan.max_n, max_side=side.pixels, side_reason=side.reason, min_steps=steps.steps,
                         min_steps_reason=steps.reason)


def print_built(seconds: float, pipe, planner: RequestPlanner, notes: list[str]) -> None:
    """The lines that say what was built: time, sizes, default request, speed-up notes, resolution binning."""
    print(f"built in {seconds:.1f} s; sizes in multiples of {planner.limits.granularity} px, "
          f"default {planner.default_width}x{planner.default_height} (WxH), {planner.default_steps} steps", flush=True)
    for note in notes:
        print(f"  {note}", flush=True)
    if planner.takes_binning and planner.resolution_binning:
        print(f"  note: {type(pipe).__name__} snaps sizes to its aspect-ratio bins and resizes the result "
              "(--no-resolution-binning turns that off)", flush=True)


def batching_setup(pipe, planner: RequestPlanner, plan: ServerPlan) -> BatchShapes | None:
    """The batch shapes of ``--max-batch`` > 1 (``None`` for 1), with the lines that say, per warmed size (or the
    default size), whether its calls are batched; ``n`` is capped at ``--max-batch`` (a request must fit a batch)."""
    rows = plan.max_batch
    if rows <= 1:
        return None
    if plan.stack.cache is not None:
        print(f"  batching: off: {CACHED_UNBATCHED}", flush=True)
        return None
    if not planner.takes_batch:
        print(f"  batching: off: {type(pipe).__name__} makes one image per call (no images-per-prompt argument)",
              flush=True)
        return None
    shapes = BatchShapes(pipe, BatchPolicy(rows, plan.batch_window_ms / 1000.0, plan.batch_work_limit),
                         planner.limits.granularity)
    if planner.limits.max_n > rows:
        print(f"  batching: n is capped at --max-batch {rows} (was --max-n {planner.limits.max_n})", flush=True)
        planner.limits = dataclasses.replace(planner.limits, max_n=rows)
    if plan.step is not None:
        print(f"  batching: step level, a running batch of {rows} slots per size (policy {plan.step.policy}); "
              f"requests join at every step, every step runs {rows} rows (a lone request pays for a full batch)",
              flush=True)
    else:
        print(f"  batching: up to {rows} images per call, window {plan.batch_window_ms:g} ms; every batched "
              f"call runs {rows} rows (a lone request pays for a full batch)", flush=True)
    for width, height in plan.warmup or [(planner.default_width, planner.default_height)]:
        print(f"    {shapes.describe(width, height, planner.default_job(width, height).call)}", flush=True)
    return shapes


def warmup_plan(plan: ServerPlan, planner: RequestPlanner) -> WarmupPlan:
    """What the start-up warms (:func:`~.startup_warmup.plan_warmup`: ``--warmup``, and what the stack adds); prints
    what the stack changed."""
    warming = plan_warmup(tuple(plan.warmup), (planner.default_width, planner.default_height), planner.default_steps,
                          plan.stack)
    for note in warming.notes:
        print(f"  {note}", flush=True)
    return warming


def warm_up(worker: PipelineWorker, generator: ImageGenerator, planner: RequestPlanner, warming: WarmupPlan,
            shapes: BatchShapes | None = None, batcher=None) -> dict[str, Any]:
    """Run the warm-up on the worker thread (with step batching, the step-batched sizes through the step
    scheduler); print its report; its summary for ``/stats``."""
    sizes = list(warming.sizes)
    if not sizes:
        return {"sizes": [], "total_s": 0.0, "captures": 0, "method": None, "steps": None}
    stepped = step_sizes(planner, sizes, batcher)
    method = "bcg_diffusion.warmup" if hasattr(bcg_diffusion, "warmup") else f"server ({warming.steps}-step calls)"
    if stepped:
        method = "step scheduler" + (f" and {method}" if len(stepped) < len(sizes) else "")
    print(f"warming up {', '.join(f'{w}x{h}' for w, h in sizes)} (WxH; {method}, {warming.steps} steps) ...",
          flush=True)
    try:
        reports = warm_reports(worker, generator, planner, sizes, stepped, shapes, batcher, warming.steps)
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: warm-up failed: {type(exc).__name__}: {exc}") from exc
    for report in reports:
        print(str(report), flush=True)
    return {"sizes": [f"{w}x{h}" for w, h in sizes], "total_s": round(sum(float(r.total_s) for r in reports), 3),
            "captures": sum(int(r.captures) for r in reports), "method": method, "steps": warming.steps,
            "compiled_graphs": compiled_graphs()}


def warm_reports(worker: PipelineWorker, generator: ImageGenerator, planner: RequestPlanner, sizes: list,
                 stepped: list, shapes: BatchShapes | None, batcher, steps: int) -> list:
    """The warm-up reports: the sizes the step scheduler batches warmed through it, the rest by warm-up calls."""
    reports = []
    rest = [size for size in sizes if size not in stepped]
    if rest:
        reports.append(worker.submit(lambda: run_warmup(generator, planner, rest, shapes, steps)).result())
    if stepped:
        reports.append(batcher.warm(planner, stepped))
    return reports


def batching_off(plan: ServerPlan) -> str | None:
    """Why ``--max-batch`` > 1 batches nothing on this server (``None`` where it may batch, or was not asked to)."""
    if plan.max_batch > 1 and plan.stack.cache is not None:
        return CACHED_UNBATCHED
    return None


def step_sizes(planner: RequestPlanner, sizes: list[tuple[int, int]], batcher) -> list[tuple[int, int]]:
    """The sizes of ``sizes`` that ``batcher`` step-batches (none without step batching); ``Failure`` (2) for a
    size that is not a valid request."""
    if not isinstance(batcher, StepBatcher):
        return []
    try:
        return [size for size in sizes if batcher.batches(planner.default_job(*size))]
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc


def server_info(plan: ServerPlan, spec, pipe, planner: RequestPlanner, warmup: dict) -> dict[str, Any]:
    """The server's description in ``/stats``: model, options, limits, warm-up, versions."""
    device = plan.device
    return {
        "model": plan.model, "model_ids": planner.model_ids(), "family": spec.name if spec is not None else None,
        "size": plan.size if plan.random_weights else "checkpoint",
        "pipeline": type(pipe).__name__, "device": str(device), "dtype": pipelines.dtype_name(plan.dtype),
        "bcg": plan.bcg and device.type == "cuda", "bcg_requested": plan.bcg, "compile": plan.compile,
        "stack": {**plan.stack.as_dict(), "bcg": plan.bcg}, "batching_off": batching_off(plan),
        "granularity": planner.limits.granularity, "max_pixels": planner.limits.max_pixels,
        "max_side": planner.limits.max_side, "min_steps": planner.limits.min_steps,
        "max_steps": planner.limits.max_steps, "max_n": planner.limits.max_n if planner.takes_batch else 1,
        "max_queue": plan.max_queue, "default_size": f"{planner.default_width}x{planner.default_height}",
        "default_steps": planner.default_steps, "max_batch": plan.max_batch,
        "batching": "off" if plan.max_batch <= 1 else ("step" if plan.step is not None else "request"),
        "resolution_binning": plan.resolution_binning if planner.takes_binning else None,
        "warmup": warmup, "api_key_required": plan.api_key is not None, "torch": torch.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }
