"""What a running server is: :class:`ServerState`, made once by the start-up (:func:`~.server_build.build_server`)
and read by the routes (:mod:`.http.app`, :mod:`.http.routes`), the same in the one process and in every Ray Serve
replica. :meth:`ServerState.submit` is the one way of a request's job to the pipeline."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

from .calls import Batch
from .requests import RequestPlanner
from .runner import CallRunner
from .worker import PipelineWorker, ServerCounters

__all__ = ["ServerState"]


@dataclass
class ServerState:
    """Everything the routes use. ``planner`` turns bodies into jobs (its ``catalog``: the served model ids);
    ``worker`` is the pipeline's thread and ``runner`` runs the calls on it; ``info`` describes the server (model,
    options, warm-up) for ``/stats``; ``max_queue`` bounds the requests waiting or running (more get a 503);
    ``api_key``, when set, is required on every route but ``/health`` (a 401 otherwise); ``batcher``, when set,
    gathers the requests it batches (:mod:`.batching`; the others run alone)."""

    planner: RequestPlanner
    worker: PipelineWorker
    runner: CallRunner
    counters: ServerCounters
    info: dict[str, Any]
    max_queue: int
    started: float = field(default_factory=time.time)
    api_key: str | None = None
    batcher: Any = None

    def submit(self, job) -> concurrent.futures.Future:
        """Send a request's job to the pipeline: through the batcher when it batches the job, else alone as one call
        on the worker. A future of ``(started, GenerationResult)``: when its call (or its batch) started, and its
        images."""
        if self.batcher is not None and self.batcher.batches(job):
            return self.batcher.submit(job)
        call = Batch.alone(job).call()
        return self.worker.submit(lambda: (time.perf_counter(), self.runner.run(call)[0]))

    def depth(self) -> int:
        """Requests waiting to be batched, waiting for the worker, or running."""
        return self.worker.depth + (self.batcher.pending if self.batcher is not None else 0)

    @property
    def alive(self) -> bool:
        return self.worker.alive and (self.batcher is None or self.batcher.alive)

    def stop(self) -> None:
        """Stop the batcher (if any), then the worker thread."""
        if self.batcher is not None:
            self.batcher.stop()
        self.worker.stop()

    def batching_stats(self) -> dict[str, Any]:
        """``/stats`` ``batching``: the batcher's numbers, or ``{"enabled": false, "max_batch": 1}``."""
        if self.batcher is None:
            return {"enabled": False, "max_batch": 1}
        return self.batcher.stats.snapshot()

    def model_ids(self) -> list[str]:
        """The ids ``GET /v1/models`` lists (the base model first, then the adapters): the planner's catalog, which
        it resolves a request's ``model`` field against."""
        return self.planner.catalog.ids()
