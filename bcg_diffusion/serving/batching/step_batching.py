"""The server's step batching (``--batching step``): its batchable requests go through one
:class:`~.stepping.StepScheduler`, whose step boundaries run on the :class:`~..worker.PipelineWorker`.

:class:`StepBatcher` has the request batcher's small interface (``batches``, ``submit``, ``pending``, ``alive``,
``stop``, ``stats.snapshot()``), so the application serves either. The scheduler is driven by a job on the worker
that runs boundaries until nothing is left, and yields between two boundaries whenever other work waits for the
worker (an unbatched request, a warm-up): it is submitted again behind that work. A request's adapter is selected
through the server's :class:`~..runner.CallRunner` before each step of its batch. A request's answer is its
images, the seconds from arrival to joining a running batch (the queue), from joining to its answer (the
pipeline), the most requests that shared one of its steps and the batch's rows.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from bcg_diffusion.toolkit.sizes import Size

from ..calls import GenerationResult
from ..faults import fault_for
from ..requests import GenerationJob, RequestPlanner
from ..runner import QUIET_FAILURES, CallRunner, to_pil_images
from ..startup_warmup import WARMUP_STEPS
from ..worker import PipelineWorker, request_grad_mode
from .request_batching import BatchShapes
from .stepping import StepConfig, StepError, StepRequest, StepScheduler

logger = logging.getLogger(__name__)

#: Failures logged without their traceback: the runner's quiet ones, a call the step scheduler refuses or a scheduler
#: closed.
EXPECTED_FAILURES = (*QUIET_FAILURES, StepError)

__all__ = ["StepBatcher", "StepWarmupReport"]

#: The BCG stats in ``/stats`` are refreshed at most this often while the scheduler runs (and whenever it idles).
STATS_REFRESH_S = 2.0


@dataclass
class StepWarmupReport:
    """The step-batching warm-up: one request of ``WARMUP_STEPS`` steps per size, all at once through the
    scheduler (their first step runs eagerly, the second captures): ``total_s``, ``captures``, ``str()``."""

    sizes: list[str]
    total_s: float
    captures: int

    def __str__(self) -> str:
        return (f"step batching warm-up: {', '.join(self.sizes)} ({WARMUP_STEPS} steps each, through the step "
                f"scheduler): {self.total_s:.2f} s, {self.captures} captures")


class _Stats:
    def __init__(self, batcher: "StepBatcher"):
        self._batcher = batcher

    def snapshot(self) -> dict[str, Any]:
        snap = self._batcher.scheduler.snapshot()
        snap["max_batch"] = self._batcher.scheduler.config.rows
        return snap


class StepBatcher:
    """Step batching for the server (see the module's docstring). ``config.rows`` is ``--max-batch``."""

    def __init__(self, worker: PipelineWorker, runner: CallRunner, shapes: BatchShapes, config: StepConfig):
        self.worker, self.runner, self.shapes = worker, runner, shapes
        self.scheduler = StepScheduler(runner.pipe, config, before_step=self._select_adapter)
        self.stats = _Stats(self)
        self._lock = threading.Lock()
        self._driving = False
        self._stopping = False
        self._outstanding = 0
        self._refreshed = 0.0

    def batches(self, job: GenerationJob) -> bool:
        """Whether this job is step-batched (its size is batched: ``--batch-work-limit``)."""
        return self.shapes.rows_of(job) > 1

    def submit(self, job: GenerationJob, counted: bool = True) -> concurrent.futures.Future:
        """A future of ``(joined, GenerationResult)`` for this job alone; its failure is the pipeline's.
        ``counted``: the job counts in the server's pipeline calls and failures (the warm-up's do not)."""
        answer: concurrent.futures.Future = concurrent.futures.Future()
        request = StepRequest(job.call, job.seed, group=(job.adapter, job.adapter_scale),
                              on_step=self._on_step(job, counted))
        try:
            ticket = self.scheduler.submit(request)
        except Exception as exc:  # noqa: BLE001 - a call the step scheduler cannot run: answered as a failure
            answer.set_exception(exc)
            return answer
        with self._lock:
            self._outstanding += 1
        ticket.future.add_done_callback(lambda done: self._answer(done, answer, job, counted))
        self._kick()
        return answer

    @property
    def pending(self) -> int:
        """Requests submitted and not answered yet (waiting to join, or running)."""
        with self._lock:
            return self._outstanding

    @property
    def alive(self) -> bool:
        return self.worker.alive and not self._stopping

    def stop(self, timeout: float = 5.0) -> None:
        """Stop driving (after the boundary running now), then fail every request still waiting or running."""
        self._stopping = True
        try:
            self.worker.submit(lambda: None).result(timeout)
        except concurrent.futures.TimeoutError:
            logger.warning("step batching: the worker did not come back within %.0f s", timeout)
        self.scheduler.close("the server is stopping")

    def warm(self, planner: RequestPlanner, sizes: list[Size], adapter: str | None = None) -> StepWarmupReport:
        """Run one ``WARMUP_STEPS``-step request per size (for ``adapter``; ``None``: the base model) through the
        scheduler (all at once, as they would run) and wait for them; sizes that are not step-batched are the
        caller's."""
        self.runner.refresh_stats()
        before = self._captures()
        started = time.perf_counter()
        futures = []
        for size in sizes:
            job = planner.default_job(size, model=adapter)
            job = dataclasses.replace(job, steps=WARMUP_STEPS, call={**job.call, "num_inference_steps": WARMUP_STEPS})
            futures.append(self.submit(job, counted=False))
        for future in futures:
            future.result()
        self.runner.refresh_stats()
        return StepWarmupReport([str(size) for size in sizes], time.perf_counter() - started,
                                self._captures() - before)

    # -- the worker's side ------------------------------------------------------------------------------------
    def _kick(self) -> None:
        with self._lock:
            if self._driving or self._stopping:
                return
            self._driving = True
        self.worker.submit(self._drive)

    def _drive(self) -> None:
        """Step boundaries until idle, or until other work waits for the worker (then this job comes back after
        it)."""
        try:
            with request_grad_mode():
                while not self._stopping and self.scheduler.run_once():
                    self._maybe_refresh()
                    if self.worker.waiting:
                        break
        finally:
            with self._lock:
                self._driving = False
            if not self.scheduler.has_work():
                self.runner.refresh_stats()
            elif not self._stopping:
                self._kick()

    def _maybe_refresh(self) -> None:
        now = time.perf_counter()
        if now - self._refreshed >= STATS_REFRESH_S:
            self._refreshed = now
            self.runner.refresh_stats()

    def _select_adapter(self, group, admitted: int) -> None:
        self.runner.select(group[0], group[1], admitted)

    def _on_step(self, job: GenerationJob, counted: bool) -> Callable[[int], None]:
        """After each of the job's steps: count its pipeline call at the first; a fault a test installed
        (:mod:`..faults`) runs there."""
        fault = fault_for([job.prompt])
        counters = self.runner.counters

        def on_step(done: int) -> None:
            if done != 1:
                return
            if counted:
                counters.add("pipeline_calls")
            if fault is not None:
                fault()

        return on_step

    def _answer(self, done: concurrent.futures.Future, answer: concurrent.futures.Future, job: GenerationJob,
                counted: bool) -> None:
        with self._lock:
            self._outstanding -= 1
        if done.cancelled():
            answer.cancel()
            return
        exc = done.exception()
        if exc is not None:
            if counted:
                self.runner.counters.add("pipeline_failures")
            logger.error("step-batched request failed (%s, %d steps, seed %d): %s: %s", job.size, job.steps, job.seed,
                         type(exc).__name__, exc, exc_info=None if isinstance(exc, EXPECTED_FAILURES) else exc)
            answer.set_exception(exc)
            return
        result = done.result()  # its clock is perf_counter, as the application's
        answer.set_result((result.joined, GenerationResult(to_pil_images(result.images), result.run_s, result.companions,
                                                    result.rows)))

    def _captures(self) -> int:
        stats = self.runner.bcg_stats
        return int(stats["captures"]) if stats else 0
