"""The server's request planner (:class:`~..requests.RequestPlanner`): the plan's limits and defaults on the built
model, with the largest side and the fewest steps the model itself takes (read from its transformer's and
scheduler's configs: :mod:`bcg_diffusion.toolkit.model_limits`)."""

from __future__ import annotations

from bcg_diffusion.toolkit.model_limits import StepLimit, family_side_limit, min_steps, side_limit
from bcg_diffusion.toolkit.options import Failure
from bcg_diffusion.toolkit.sizes import Size

from ..errors import RequestError
from ..requests import RequestLimits, RequestPlanner
from ..server_plan import ServerPlan, prog
from .model import BuiltModel

__all__ = ["CHECKPOINT_DEFAULT_SIZE", "make_planner", "request_limits"]

#: A checkpoint's default image size (a family's comes from its preset).
CHECKPOINT_DEFAULT_SIZE = Size(1024, 1024)


def make_planner(built: BuiltModel, plan: ServerPlan, batching_off: str | None = "") -> RequestPlanner:
    """The request planner of ``built`` under the plan's limits and defaults (``batching_off``: why nothing is
    batched, ``None`` where ``--max-batch`` batches, which caps ``n`` at it); ``Failure`` (2) when the default
    request itself is invalid."""
    asked, spec = plan.requests, built.spec
    default_size = asked.default_size
    if default_size is None:
        default_size = (Size(spec.size(built.preset).width, spec.size(built.preset).height) if spec is not None
                        else CHECKPOINT_DEFAULT_SIZE)
    planner = RequestPlanner(built.pipe, spec, built.preset, request_limits(built, plan, batching_off), plan.catalog,
                             default_size, built.default_steps, resolution_binning=asked.resolution_binning)
    try:
        planner.default_job(default_size)
    except RequestError as exc:
        size_from = f"--default-size {default_size}" if asked.default_size is not None else f"size {default_size}"
        raise Failure(2, f"{prog()}: error: the default request (what a body with only a prompt gets: {size_from}, "
                         f"{built.default_steps} steps) is invalid: {exc.message}. Give --default-size WxH (and "
                         "--steps N) that this server allows") from exc
    return planner


def request_limits(built: BuiltModel, plan: ServerPlan, batching_off: str | None = "") -> RequestLimits:
    """The request limits: the plan's (``n`` capped at ``--max-batch`` where it batches: ``batching_off`` ``None``),
    with the largest side and the fewest steps the model itself takes."""
    asked, pipe, spec = plan.requests, built.pipe, built.spec
    side = side_limit(spec, pipe.transformer.config, built.granularity) if getattr(pipe, "transformer", None) \
        is not None else family_side_limit(spec, built.preset)
    scheduler = getattr(pipe, "scheduler", None)
    steps = min_steps(scheduler.config, type(scheduler).__name__) if scheduler is not None else StepLimit(1)
    max_n = asked.max_n if batching_off is not None else min(asked.max_n, plan.batching.rows)
    return RequestLimits(granularity=built.granularity, max_pixels=asked.max_pixels, max_steps=asked.max_steps,
                         max_n=max_n, max_side=side.pixels, side_reason=side.reason, min_steps=steps.steps,
                         min_steps_reason=steps.reason)
