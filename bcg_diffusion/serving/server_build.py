"""The server assembled once from a :class:`~.server_plan.ServerPlan`, one part after the other, each built by one
function of :mod:`.assembly` from the plan and the parts before it: the model, its speed stack, the worker thread and
the call runner, batching, the request planner, the warm-up; then the :class:`~.state.ServerState` that
:func:`~.http.app.create_app` serves. One path for ``bcg-serve`` (:mod:`.server`) and its Ray Serve replicas
(:mod:`.replicas.state`). A failed build or warm-up raises :class:`~bcg_diffusion.toolkit.options.Failure` (exit code
1, or 2 for what the options asked and the model cannot do); the lines printed say what was built.
"""

from __future__ import annotations

import time
from typing import Any

import bcg_pipelines as pipelines

from .assembly.batching import set_up_batching
from .assembly.model import build_model
from .assembly.planner import make_planner
from .assembly.report import print_built, server_info
from .assembly.speed import speed_up_model
from .assembly.warm import warm_server
from .runner import CallRunner
from .server_plan import ServerPlan
from .state import ServerState
from .worker import PipelineWorker, ServerCounters

__all__ = ["build_server"]


def build_server(plan: ServerPlan, replica: dict[str, Any] | None = None) -> ServerState:
    """Build, speed up and warm the pipeline of ``plan`` (printing what it does); the state of its application, made
    once (``replica``: a Ray Serve replica's identity for ``/stats``). The threads started here (the worker's, the
    batcher's) are stopped again when a later part fails; ``ServerState.stop`` stops them."""
    model = plan.model
    print(f"building {model.name} ({model.model_size if model.spec is not None else 'weights'}) on {model.device} in "
          f"{pipelines.dtype_name(model.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    built = build_model(plan)
    sped = speed_up_model(built, plan)
    counters, worker = ServerCounters(), PipelineWorker()
    runner = CallRunner(built.pipe, model.device, counters, adapters=sped.bank, before_call=sped.before_call)
    batching = None
    try:
        batching = set_up_batching(built, plan, worker, runner)
        planner = make_planner(built, plan, batching.off)
        print_built(time.perf_counter() - t0, built, planner, sped.notes + batching.notes)
        warmup = warm_server(plan, planner, worker, runner, batching, built.compile_cache)
    except BaseException:
        if batching is not None:
            batching.stop()
        worker.stop()
        raise
    return ServerState(planner, worker, runner, counters, server_info(plan, built, planner, batching, warmup, replica),
                       plan.requests.max_queue, api_key=plan.api_key, batcher=batching.batcher)
