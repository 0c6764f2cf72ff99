"""The server's first part: its pipeline built from the plan (random weights of a family, or a checkpoint), and what
the model itself says about requests: its family, the preset whose defaults apply, the default step count, the pixel
granularity and whether a call makes several images (:class:`BuiltModel`). ``--compile-cache`` is opened first, before
anything compiles. A failed build raises :class:`~bcg_diffusion.toolkit.options.Failure` (exit code 1, or 2 for
what the options asked and the model cannot do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.offload_option import build_device
from bcg_diffusion.toolkit.options import Failure, offline_hint
from bcg_pipelines.calls import BATCH_KWARGS

from ..granularity import pixel_granularity
from ..server_plan import ServerPlan, prog

__all__ = ["CHECKPOINT_DEFAULT_STEPS", "BuiltModel", "build_model", "build_pipeline"]

#: A checkpoint's default step count when its pipeline's ``__call__`` names none.
CHECKPOINT_DEFAULT_STEPS = 28


@dataclass(frozen=True)
class BuiltModel:
    """The built ``pipe`` and its family ``spec`` (``None`` if unknown); ``preset``: the model size whose defaults
    apply (``--size`` for random weights, ``full`` for a checkpoint); ``default_steps``: a request's step count
    (``--steps``, else the family's, else the pipeline's own); ``granularity``: the pixel multiple of a side;
    ``takes_batch``: whether one call makes several images; ``compile_cache``: the open ``--compile-cache``
    (``None`` without it)."""

    pipe: Any
    spec: Any
    preset: str
    default_steps: int
    granularity: int
    takes_batch: bool
    compile_cache: Any = None


def build_model(plan: ServerPlan) -> BuiltModel:
    """Open the compile cache, build the pipeline of ``plan``, and read what it says about requests (the default step
    count: ``--steps``, else the family's, else the pipeline's own, else :data:`CHECKPOINT_DEFAULT_STEPS`)."""
    cache = open_compile_cache(plan)
    pipe, spec = build_pipeline(plan)
    params = pipelines.call_parameters(pipe)
    own = getattr(params.get("num_inference_steps"), "default", None)  # the pipeline's own default
    steps = plan.requests.steps if plan.requests.steps is not None else spec.default_steps if spec is not None \
        else own if isinstance(own, int) and own > 0 else CHECKPOINT_DEFAULT_STEPS
    return BuiltModel(pipe, spec, plan.model.model_size if plan.model.random_weights else "full", steps,
                      pixel_granularity(pipe, spec.spatial_multiple if spec is not None else None),
                      any(k in params for k in BATCH_KWARGS), cache)


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

