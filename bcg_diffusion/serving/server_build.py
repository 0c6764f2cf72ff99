"""The server's start-up from a :class:`~.server_plan.ServerPlan`: build the pipeline, attach the adapters, speed it
up, plan requests, set up batching, warm up, and return the :class:`~.app.ServerState` that
:func:`~.app.create_app` serves. One path for ``bcg-serve`` (:mod:`.server`) and its Ray Serve replicas
(:mod:`.replica_state`). A failed build or warm-up raises :class:`~bcg_diffusion.toolkit.options.Failure` (exit
code 1, or 2 for what the options asked and the model cannot do); the lines printed say what was built.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.model_limits import StepLimit, family_side_limit, min_steps, side_limit
from bcg_diffusion.toolkit.options import Failure, offline_hint
from bcg_diffusion.toolkit.speedups import speed_up

from .adapter_options import attach_adapters, warm_adapters
from .app import ServerState
from .batching import BatchPolicy, BatchShapes, BatchStats, RequestBatcher
from .granularity import pixel_granularity
from .requests import RequestError, RequestLimits, RequestPlanner
from .server_plan import ServerPlan, prog
from .startup_warmup import run_warmup
from .worker import ImageGenerator, PipelineWorker, ServerCounters

__all__ = ["CHECKPOINT_DEFAULT_SIZE", "CHECKPOINT_DEFAULT_STEPS", "build_server", "make_planner"]

CHECKPOINT_DEFAULT_SIZE = (1024, 1024)
CHECKPOINT_DEFAULT_STEPS = 28


def build_server(plan: ServerPlan) -> ServerState:
    """Build, speed up and warm the pipeline of ``plan`` (printing what it does); the state of its application.
    The worker thread started here is stopped again when the warm-up fails; ``ServerState.stop`` stops it."""
    print(f"building {plan.model} ({plan.size if plan.spec is not None else 'weights'}) on {plan.device} in "
          f"{pipelines.dtype_name(plan.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    pipe, spec = build_pipeline(plan)
    adapters = attach_adapters(pipe, list(plan.adapters), plan.base_model, prog(), rank=plan.lora_rank,
                               gpu_slots=plan.lora_gpu_slots)  # before BCG
    notes = speed_up(pipe, compile=plan.compile, bcg=plan.bcg, on_cuda=plan.device.type == "cuda")
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
    try:
        warmup = warm_up(worker, generator, planner, list(plan.warmup), shapes)
        warm_adapters(adapters, worker, generator, lambda: warm_up(worker, generator, planner, list(plan.warmup), shapes))
    except BaseException:
        worker.stop()
        raise
    batcher = (RequestBatcher(worker, generator.generate_batch, shapes, BatchStats(shapes.policy))
               if shapes is not None else None)
    return ServerState(planner, worker, generator, counters, server_info(plan, spec, pipe, planner, warmup),
                       plan.max_queue, api_key=plan.api_key, batcher=batcher)


def build_pipeline(plan: ServerPlan):
    """The pipeline (random weights of a family, or a checkpoint), and its family (``None`` if unknown)."""
    try:
        if plan.spec is not None:
            pipe = pipelines.build_pipeline(plan.spec.name, size=plan.size, device=plan.device, dtype=plan.dtype, seed=0)
            return pipe, plan.spec
        pipe = pipelines.load_pipeline(plan.model, device=plan.device, dtype=plan.dtype)
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
    if not planner.takes_batch:
        print(f"  batching: off: {type(pipe).__name__} makes one image per call (no images-per-prompt argument)",
              flush=True)
        return None
    shapes = BatchShapes(pipe, BatchPolicy(rows, plan.batch_window_ms / 1000.0, plan.batch_work_limit),
                         planner.limits.granularity)
    if planner.limits.max_n > rows:
        print(f"  batching: n is capped at --max-batch {rows} (was --max-n {planner.limits.max_n})", flush=True)
        planner.limits = dataclasses.replace(planner.limits, max_n=rows)
    print(f"  batching: up to {rows} images per call, window {plan.batch_window_ms:g} ms; every batched "
          f"call runs {rows} rows (a lone request pays for a full batch)", flush=True)
    for width, height in plan.warmup or [(planner.default_width, planner.default_height)]:
        print(f"    {shapes.describe(width, height, planner.default_job(width, height).call)}", flush=True)
    return shapes


def warm_up(worker: PipelineWorker, generator: ImageGenerator, planner: RequestPlanner,
            sizes: list[tuple[int, int]], shapes: BatchShapes | None = None) -> dict[str, Any]:
    """Run the warm-up on the worker thread; print its report; its summary for ``/stats``."""
    if not sizes:
        return {"sizes": [], "total_s": 0.0, "captures": 0, "method": None}
    method = "bcg_diffusion.warmup" if hasattr(bcg_diffusion, "warmup") else "server (2-step calls)"
    print(f"warming up {', '.join(f'{w}x{h}' for w, h in sizes)} (WxH; {method}) ...", flush=True)
    try:
        report = worker.submit(lambda: run_warmup(generator, planner, sizes, shapes)).result()
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: warm-up failed: {type(exc).__name__}: {exc}") from exc
    print(str(report), flush=True)
    return {"sizes": [f"{w}x{h}" for w, h in sizes], "total_s": round(float(report.total_s), 3),
            "captures": int(report.captures), "method": method}


def server_info(plan: ServerPlan, spec, pipe, planner: RequestPlanner, warmup: dict) -> dict[str, Any]:
    """The server's description in ``/stats``: model, options, limits, warm-up, versions."""
    device = plan.device
    return {
        "model": plan.model, "model_ids": planner.model_ids(), "family": spec.name if spec is not None else None,
        "size": plan.size if plan.random_weights else "checkpoint",
        "pipeline": type(pipe).__name__, "device": str(device), "dtype": pipelines.dtype_name(plan.dtype),
        "bcg": plan.bcg and device.type == "cuda", "bcg_requested": plan.bcg, "compile": plan.compile,
        "granularity": planner.limits.granularity, "max_pixels": planner.limits.max_pixels,
        "max_side": planner.limits.max_side, "min_steps": planner.limits.min_steps,
        "max_steps": planner.limits.max_steps, "max_n": planner.limits.max_n if planner.takes_batch else 1,
        "max_queue": plan.max_queue, "default_size": f"{planner.default_width}x{planner.default_height}",
        "default_steps": planner.default_steps, "max_batch": plan.max_batch,
        "resolution_binning": plan.resolution_binning if planner.takes_binning else None,
        "warmup": warmup, "api_key_required": plan.api_key is not None, "torch": torch.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }
