"""What the start-up says about the server it built: the lines printed once it is built (:func:`print_built`) and
its description in ``/stats`` (:func:`server_info`)."""

from __future__ import annotations

from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

from ..requests import RequestPlanner
from ..server_plan import ServerPlan
from .batching import Batching
from .model import BuiltModel

__all__ = ["print_built", "server_info"]


def print_built(seconds: float, built: BuiltModel, planner: RequestPlanner, notes: list[str]) -> None:
    """The lines that say what was built: time, sizes, default request, the notes (stack, batching), resolution
    binning."""
    print(f"built in {seconds:.1f} s; sizes in multiples of {planner.limits.granularity} px, "
          f"default {planner.default_size} (WxH), {planner.default_steps} steps", flush=True)
    for note in notes:
        print(f"  {note}", flush=True)
    if planner.takes_binning and planner.resolution_binning:
        print(f"  note: {type(built.pipe).__name__} snaps sizes to its aspect-ratio bins and resizes the result "
              "(--no-resolution-binning turns that off)", flush=True)


def server_info(plan: ServerPlan, built: BuiltModel, planner: RequestPlanner, batching: Batching, warmup: dict,
                replica: dict[str, Any] | None = None) -> dict[str, Any]:
    """The server's description in ``/stats``: model, options, limits, warm-up, versions (and ``replica`` for a Ray
    Serve replica)."""
    device, rows, limits = plan.model.device, plan.batching.rows, planner.limits
    info = {
        "model": plan.model.name, "model_ids": plan.catalog.ids(),
        "family": built.spec.name if built.spec is not None else None,
        "size": plan.model.model_size if plan.model.random_weights else "checkpoint",
        "pipeline": type(built.pipe).__name__, "device": str(device), "dtype": pipelines.dtype_name(plan.model.dtype),
        "bcg": plan.bcg and device.type == "cuda", "bcg_requested": plan.bcg, "compile": plan.stack.compile,
        "stack": {**plan.stack.as_dict(), "bcg": plan.bcg},
        "batching_off": batching.off if rows > 1 and plan.stack.cache is not None else None,
        "granularity": limits.granularity, "max_pixels": limits.max_pixels, "max_side": limits.max_side,
        "min_steps": limits.min_steps, "max_steps": limits.max_steps,
        "max_n": limits.max_n if planner.takes_batch else 1, "max_queue": plan.requests.max_queue,
        "default_size": str(planner.default_size), "default_steps": planner.default_steps, "max_batch": rows,
        "batching": "off" if rows <= 1 else ("step" if plan.batching.step is not None else "request"),
        "resolution_binning": plan.requests.resolution_binning if planner.takes_binning else None,
        "warmup": warmup, "api_key_required": plan.api_key is not None, "torch": torch.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }
    return info if replica is None else {**info, "replica": replica}
