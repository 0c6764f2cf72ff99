"""The step scheduler: requests join running batches at step boundaries and leave when their last step is done.

One :class:`RunningBatch` per key (a family loop's shape key: size, guidance mode, ...) and group (an adapter):
``rows`` slots, each holding a request's image or an inert filler row. :meth:`StepScheduler.run_once` is one step
boundary: the policy picks a batch with work (:data:`~.config.POLICIES`), waiting requests of its key whose
preparation is done take free slots in arrival order (a request of ``n`` images takes ``n`` slots at once; the first
that does not fit, or is not prepared yet, stops the rest, so a large request is not overtaken forever), the batch
takes one step (one transformer call over all slots), and requests whose last step is done leave and are decoded and
answered. With nothing waiting and no row running it does nothing (:meth:`StepScheduler.has_work` is false): no
device work while idle.

Host work (:mod:`.host_work`, ``StepConfig.host_threads``): a request is prepared on the preparing thread from the
moment it is submitted, and finished on the finishing thread, so the thread of the boundaries does not wait for
either; when no row runs anywhere, a boundary waits for the preparation of the oldest waiting request instead of
idling. Inline (``host_threads=False``) a request is prepared when it joins and finished after its last step, on
the thread of the boundaries.

Threads: :meth:`~StepScheduler.submit`, :meth:`~StepScheduler.cancel` and the read-only methods may be called from
any thread; :meth:`~StepScheduler.run_once` (and :meth:`~StepScheduler.run_until_idle`,
:meth:`~StepScheduler.run`) from one thread at a time, the one that runs the pipeline. A failure while preparing
or finishing a request fails that request; a failure inside a step fails every request of that batch (out of
memory: a :class:`torch.OutOfMemoryError` without the traceback's tensors, and the CUDA cache is emptied); the
scheduler goes on with the next boundary.
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Mapping

import torch

from bcg_diffusion.toolkit.failed_calls import without_traceback

from .config import StepConfig, StepError
from .host_work import HostWork
from .loops import loop_for
from .rows import Plan, Row, RunningBatch
from .stats import StepStats
from .step_clock import StepClock

__all__ = ["IDLE_BATCHES", "StepRequest", "StepResult", "StepScheduler", "StepTicket"]

#: Running batches kept while they have nothing to do (a key's next request then needs no new filler row).
IDLE_BATCHES = 16


@dataclass(frozen=True)
class StepRequest:
    """One request: ``call`` is the stock pipeline's keyword arguments (one prompt, no generator), ``seed`` its
    seed (image ``i`` from ``seed + i``), ``group`` what its batch must share besides the shapes (an adapter and
    scale; ``None``: the base model), ``on_step(steps_done)`` an optional call after each of its steps on the
    scheduler's thread (raising fails this request only)."""

    call: Mapping[str, Any]
    seed: int = 0
    group: Hashable = None
    on_step: Callable[[int], None] | None = None


@dataclass(frozen=True)
class StepResult:
    """A request's images (one per image, as its ``output_type`` gives them), its wait from arrival to joining a
    running batch, its time from joining to its answer, its steps, the most requests that shared one of its steps
    (itself included), the batch's rows, and when it joined (the scheduler's clock)."""

    images: list
    queue_s: float
    run_s: float
    steps: int
    companions: int
    rows: int
    joined: float


class StepTicket:
    """A submitted request: ``future`` resolves to its :class:`StepResult` (or its failure; cancelled by
    :meth:`StepScheduler.cancel`); ``state`` is ``waiting``, ``running`` (also while it is finished), ``done``,
    ``failed`` or ``cancelled``; ``prepared`` the future of its preparation on the preparing thread (its rows and
    the seconds it took; ``None`` inline)."""

    def __init__(self, request: StepRequest, plan: Plan, key: Hashable, arrived: float):
        self.request, self.plan, self.key, self.arrived = request, plan, key, arrived
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.state = "waiting"
        self.admitted: float | None = None
        self.rows: list[Row] = []
        self.slots: list[int] = []
        self.steps = 0
        self.companions = 1
        self.prepared: concurrent.futures.Future | None = None

    def ready(self) -> bool:
        """Whether it may join now: prepared (inline: always, it is prepared as it joins)."""
        return self.prepared is None or self.prepared.done()


class StepScheduler:
    """Step-level batching of one pipeline (see the module's docstring). ``before_step(group, admitted)`` runs
    before each step of a batch (to select the group's adapter; ``admitted``: requests that joined at this
    boundary)."""

    def __init__(self, pipe, config: StepConfig | None = None, *,
                 before_step: Callable[[Hashable, int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config or StepConfig()
        self.loop = loop_for(pipe, self.config)
        self.stats = StepStats(self.config.rows, self.config.policy)
        self._host = HostWork(self.config.host_threads, self.config.switch_interval_s,
                              cuda=self.loop.device.type == "cuda", stream_priority=self.config.host_stream_priority)
        self.before_step, self._clock = before_step, clock
        self._step_clock = StepClock(self.loop.device, clock)
        self._cond = threading.Condition()
        self._waiting: dict[Hashable, deque[StepTicket]] = {}
        self._batches: dict[Hashable, RunningBatch] = {}
        self._order: list[Hashable] = []
        self._turn = 0
        self._closed: str | None = None
        self._release = False

    # -- any thread -------------------------------------------------------------------------------------------
    def submit(self, request: StepRequest) -> StepTicket:
        """Queue ``request`` for the next boundary of its batch; :class:`StepError` (before queueing) for a call
        the family loop cannot run, or a closed scheduler."""
        plan = self.loop.plan(dict(request.call))
        ticket = StepTicket(request, plan, (plan.key, request.group), self._clock())
        with self._cond:
            if self._closed is not None:
                raise StepError(self._closed)
            self._waiting.setdefault(ticket.key, deque()).append(ticket)
            if ticket.key not in self._order:
                self._order.append(ticket.key)
            ticket.prepared = self._host.prepare(self._prepare, ticket)
            self._cond.notify_all()
        self.stats.count("submitted")
        return ticket

    def cancel(self, ticket: StepTicket) -> bool:
        """Withdraw a request that has not joined a batch yet (its future is cancelled); ``False`` once it runs
        or is over (a running request finishes its steps)."""
        with self._cond:
            queue = self._waiting.get(ticket.key)
            if ticket.state != "waiting" or queue is None or ticket not in queue:
                return False
            queue.remove(ticket)
            ticket.state = "cancelled"
        if ticket.prepared is not None:
            ticket.prepared.cancel()  # a preparation already running ends unused
        ticket.future.cancel()
        self.stats.count("cancelled")
        return True

    def waiting(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._waiting.values())

    def running_rows(self) -> int:
        return sum(len(b.active()) for b in list(self._batches.values()))

    def has_work(self) -> bool:
        return self.waiting() > 0 or self.running_rows() > 0

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until a request waits (or the scheduler closes), at most ``timeout`` seconds; whether work is there."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed is not None or any(self._waiting.values()), timeout)
        return self.has_work()

    def snapshot(self) -> dict[str, Any]:
        """:meth:`StepStats.snapshot` with the requests waiting and the rows running now, and how often a negative
        prompt's encoding was reused (:mod:`.text_reuse`)."""
        return {**self.stats.snapshot(self.waiting(), self.running_rows()),
                "negative_encodings": self.loop.unconds.counts()}

    # -- the pipeline's thread --------------------------------------------------------------------------------
    def run_once(self) -> bool:
        """One step boundary (see the module's docstring); ``False`` when there was nothing to do."""
        key = self._choose()
        if key is None:
            return False
        with torch.no_grad():
            batch = self._batch(key)
            if batch is not None:
                admitted = self._admit(batch)
                if batch.active():
                    self._step(batch, admitted)
                self._drop_idle()
        if self._release:
            self._release = False
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return True

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """:meth:`run_once` until there is nothing to do (or ``max_steps`` boundaries), then wait for the finishing
        thread to answer what finished; the boundaries run."""
        done = 0
        while (max_steps is None or done < max_steps) and self.run_once():
            done += 1
        self._host.drain()
        return done

    def run(self, stop: threading.Event, idle_wait_s: float = 0.1) -> None:
        """Serve until ``stop`` is set: :meth:`run_once`, waiting for work while idle."""
        while not stop.is_set():
            if not self.run_once():
                self.wait_for_work(idle_wait_s)

    def close(self, reason: str = "the step scheduler is stopping") -> None:
        """Refuse new requests, stop the host workers and fail every waiting, running and finishing one with
        :class:`StepError` (``reason``; a request being decoded right now is answered). Call it once the pipeline's
        thread no longer runs boundaries."""
        with self._cond:
            self._closed = reason
            waiting = [t for q in self._waiting.values() for t in q]
            self._waiting.clear()
            self._cond.notify_all()
        self._host.close()
        self._fail(waiting, StepError(reason))
        for batch in list(self._batches.values()):
            self._fail(batch.owners_active(), StepError(reason), batch)

    # -- one boundary -----------------------------------------------------------------------------------------
    def _choose(self) -> Hashable | None:
        """The key whose batch takes this boundary, by the policy; ``None`` when no batch has work. A key has work
        when a row of it runs or its first waiting request is prepared; when none has but requests wait (no row runs
        anywhere), the key of the oldest waiting request (its boundary waits for that preparation)."""
        with self._cond:
            ready = [k for k in self._order if (self._waiting.get(k) and self._waiting[k][0].ready())
                     or (k in self._batches and self._batches[k].active())]
            if not ready:
                waiting = [k for k in self._order if self._waiting.get(k)]
                return min(waiting, key=self._oldest) if waiting else None
            if self.config.policy == "oldest_first":
                return min(ready, key=self._oldest)
            count = len(self._order)
            for offset in range(count):
                key = self._order[(self._turn + offset) % count]
                if key in ready:
                    self._turn = (self._order.index(key) + 1) % count
                    return key
        return None

    def _oldest(self, key: Hashable) -> float:
        """The arrival of the oldest request of ``key``, waiting or running."""
        queue = self._waiting.get(key)
        times = [queue[0].arrived] if queue else []
        batch = self._batches.get(key)
        times += [t.arrived for t in batch.owners_active()] if batch is not None else []
        return min(times)

    def _batch(self, key: Hashable) -> RunningBatch | None:
        """The running batch of ``key`` (the most recently used now), made with its filler row from the plan of its
        first request; ``None`` when none waits any more, or making the filler failed (that request fails)."""
        batch = self._batches.pop(key, None)
        if batch is None:
            with self._cond:
                queue = self._waiting.get(key)
                head = queue[0] if queue else None
            if head is None:
                return None
            try:
                filler = self._host.on_preparer(self.loop.filler, head.plan)
                batch = RunningBatch(key, key[1], self.config.rows, filler)
            except BaseException as exc:  # noqa: BLE001 - the request whose plan it was fails; the rest may
                with self._cond:
                    if head in queue:
                        queue.remove(head)
                self._fail([head], exc)
                return None
        self._batches[key] = batch
        return batch

    def _drop_idle(self) -> None:
        """Keep at most :data:`IDLE_BATCHES` batches without rows or waiting requests (their filler rows hold
        encoded prompts), the least recently used dropped first; a dropped key's next request makes a new one."""
        with self._cond:
            idle = [k for k, b in self._batches.items() if not b.active() and not self._waiting.get(k)]
            for key in idle[:max(0, len(idle) - IDLE_BATCHES)]:
                del self._batches[key]
                self._waiting.pop(key, None)
                self._order.remove(key)

    def _admit(self, batch: RunningBatch) -> list[StepTicket]:
        """Waiting requests of the batch's key that are prepared and fit its free slots, in arrival order (the first
        that does not fit or is not prepared stops the rest; with no row running anywhere, the first is waited for),
        joined; those that joined."""
        joined = []
        while (ticket := self._next(batch)) is not None:
            if self._start(batch, ticket):
                joined.append(ticket)
        return joined

    def _next(self, batch: RunningBatch) -> StepTicket | None:
        """The first waiting request of the batch's key, taken off the queue (``running``), if it fits and is
        prepared; ``None`` otherwise."""
        while True:
            with self._cond:
                queue = self._waiting.get(batch.key)
                head = queue[0] if queue else None
            if head is None or head.plan.n > batch.free():
                return None
            if not head.ready() and self.running_rows() == 0:
                concurrent.futures.wait([head.prepared])
            if not head.ready():
                return None
            with self._cond:
                if queue and queue[0] is head:  # not cancelled meanwhile
                    queue.popleft()
                    head.state = "running"
                    return head

    def _prepare(self, ticket: StepTicket) -> tuple[list[Row], float]:
        """The request's rows and the seconds they took (on the preparing thread, or inline as it joins)."""
        started = self._clock()
        rows = self.loop.prepare(ticket.plan, ticket.request.seed)
        return rows, self._clock() - started

    def _start(self, batch: RunningBatch, ticket: StepTicket) -> bool:
        joined = self._clock()
        try:
            rows, prepare_s = self._prepare(ticket) if ticket.prepared is None else self._host.take(ticket.prepared)
        except BaseException as exc:  # noqa: BLE001 - this request fails, the batch goes on
            self._fail([ticket], exc)
            return False
        ticket.admitted, ticket.rows = joined, rows
        ticket.slots = batch.join(rows, ticket)
        self.stats.admitted(joined - ticket.arrived, prepare_s)
        return True

    def _step(self, batch: RunningBatch, admitted: list[StepTicket]) -> None:
        active, started = batch.active(), self._clock()
        try:
            if self.before_step is not None:
                self.before_step(batch.group, len(admitted))
            marks = self._step_clock.begin()
            preds = self.loop.predict(batch)
            self._step_clock.mark(marks)
            for slot in active:
                self.loop.advance(batch.slots[slot], preds[slot])
            self._step_clock.mark(marks)
            self.loop.end_step()
        except BaseException as exc:  # noqa: BLE001 - every request of this batch fails
            self._fail(batch.owners_active(), exc, batch)
            return
        launch_s, spans = self._step_clock.end(marks)
        self.stats.step(str(batch.key), len(active), self._clock() - started, launch_s)
        self.stats.device_spans(spans)
        self._after_step(batch)

    def _after_step(self, batch: RunningBatch) -> None:
        owners = batch.owners_active()
        for ticket in owners:
            ticket.steps += 1
            ticket.companions = max(ticket.companions, len(owners))
            if ticket.request.on_step is not None:
                try:
                    ticket.request.on_step(ticket.steps)
                except BaseException as exc:  # noqa: BLE001 - this request fails
                    self._fail([ticket], exc, batch)
        done = [t for t in owners if t.state == "running" and all(row.done for row in t.rows)]
        if done:
            batch.leave([slot for t in done for slot in t.slots])
            self._host.finish(self._finish, done)

    def _finish(self, tickets: list[StepTicket]) -> None:
        """Decode the images of ``tickets`` (their last step is done, their slots free) ``decode_rows`` at a time
        (requests finishing together share decode calls) and answer each as soon as its rows are decoded; on the
        finishing thread (inline: the boundary's). A failure fails the requests not answered yet. Once the scheduler
        is closed, fail them instead."""
        if self._closed is not None:
            self._fail(tickets, StepError(self._closed))
            return
        started = self._clock()
        try:
            for ticket, decoded in self._decoded(tickets):
                self._answer(ticket, self.loop.images(ticket.plan, decoded), started)
                started = self._clock()
        except BaseException as exc:  # noqa: BLE001 - the requests not answered yet fail
            self._fail(tickets, exc)

    def _answer(self, ticket: StepTicket, images: list, started: float) -> None:
        finished = self._clock()
        self.stats.finished(finished - started)
        ticket.state = "done"
        ticket.future.set_result(StepResult(images, ticket.admitted - ticket.arrived, finished - ticket.admitted,
                                            ticket.steps, ticket.companions, self.config.rows, ticket.admitted))
        self.stats.count("finished")

    def _decoded(self, tickets: list[StepTicket]) -> Iterator[tuple[StepTicket, torch.Tensor]]:
        """Per ticket, in order, its decoded rows (its latents where it asked for latents), as soon as the decode
        calls that hold them are done."""
        rows = [(k, row.latents) for k, t in enumerate(tickets) for row in t.rows
                if t.plan.args["output_type"] != "latent"]
        parts: list[list[torch.Tensor]] = [[] for _ in tickets]
        wanted = [sum(1 for k, _ in rows if k == index) for index in range(len(tickets))]
        size, handed = self.config.decode_rows, 0
        for start in range(0, len(rows) + size, size):
            chunk = rows[start:start + size]
            if chunk:
                decoded = self.loop.decoded(tickets[chunk[0][0]].plan, torch.cat([latents for _, latents in chunk]))
                for (k, _), row in zip(chunk, decoded.split(1)):
                    parts[k].append(row)
            while handed < len(tickets) and len(parts[handed]) == wanted[handed]:
                ticket = tickets[handed]
                yield ticket, torch.cat(parts[handed]) if parts[handed] else torch.cat([r.latents for r in ticket.rows])
                handed += 1

    def _fail(self, tickets: list[StepTicket], exc: BaseException, batch: RunningBatch | None = None) -> None:
        """Fail ``tickets`` with ``exc`` (out of memory: a fresh :class:`torch.OutOfMemoryError`, and the cache is
        emptied after the boundary; otherwise ``exc`` without its traceback, whose frames hold the failed step's
        tensors and this scheduler's own), freeing their slots in ``batch``."""
        oom = isinstance(exc, torch.OutOfMemoryError)
        error = torch.OutOfMemoryError(str(exc)) if oom else without_traceback(exc)
        self._release = self._release or oom
        for ticket in tickets:
            if batch is not None and ticket.state == "running" and ticket.slots:
                batch.leave(ticket.slots)
            if ticket.state in ("done", "failed", "cancelled"):
                continue
            ticket.state = "failed"
            ticket.future.set_exception(error)
            self.stats.count("failed")
