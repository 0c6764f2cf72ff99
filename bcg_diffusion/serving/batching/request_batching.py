"""Request batching: requests that can share a pipeline call are gathered for a short window and run as one call.

What may share a call (:func:`batch_key`): everything of the pipeline call but the prompt and the number of
images, i.e. the same size, steps, guidance, negative prompt and every other setting, and the same adapter and
adapter scale. Each request keeps its own prompt, seed and ``n``: the batcher forms a :class:`~..calls.Batch`, whose
call gets a list of prompts (one per image) and a list of generators (one per image: image ``i`` of a request with
seed ``s`` draws its noise from ``torch.Generator().manual_seed(s + i)``, modulo 2**64; :mod:`..calls`).

**Reproducibility rule**: a request's images do not depend on what it was batched with, nor where in the batch
it sat. Kernels may compute a row differently when the batch has another size (another GEMM tiling, another
attention split), so every batched call of a key runs the same, fixed number of rows, ``--max-batch``: the rows
the requests leave free are filled with filler rows (the first row's prompt, seed :data:`..calls.FILLER_SEED`) whose
images are dropped. Every kernel then sees the same shapes whatever the batch holds, and no kernel mixes rows,
so a row's result depends on that row alone. The cost: a lone request pays for a full batch (``--max-batch``
rows of work), so batching pays only while the server is loaded; with ``--max-batch 1`` nothing is batched and
the server behaves as without batching (one call per request, one generator for all its images).

**Where batching cannot pay** the server keeps those calls unbatched: a size whose work per row, latent tokens x
the transformer's hidden size x the rows classifier-free guidance adds, is above ``--batch-work-limit`` is
compute-bound already at one row (a batch then takes about as long as its rows one after the other), so
requests of that size run alone as without batching; the server says so at start for the sizes it warms. The
default limit comes from one H200 run (:data:`DEFAULT_WORK_LIMIT`): PixArt-Sigma and Flux.1 at 512x512 are above
it; smaller work was not measured.

**When a batch runs**: see :class:`RequestBatcher` (full, every client of the previous call back, or the window).

A failure inside a batched call fails every request of that batch (500, or 503 for out of memory); since no
image depends on its batch, a request sent again gets exactly the image it would have had.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.sizes import Size
from bcg_pipelines.calls import BATCH_KWARGS

from ..calls import Batch
from ..requests import GenerationJob
from ..serve_defaults import DEFAULT_WINDOW_MS, DEFAULT_WORK_LIMIT

logger = logging.getLogger(__name__)

__all__ = ["CLOSE_REASONS", "DEFAULT_WINDOW_MS", "DEFAULT_WORK_LIMIT", "BatchPolicy", "BatchShapes", "BatchStats",
           "RequestBatcher", "batch_key"]

#: Why a batch closed (``/stats`` ``batching.closed_by``): see :class:`RequestBatcher`.
CLOSE_REASONS = ("full", "returns", "window")
#: Keys of a pipeline call that differ between the rows of a batch (everything else must be equal).
ROW_KEYS = ("prompt", *BATCH_KWARGS)


@dataclass(frozen=True)
class BatchPolicy:
    """The batching options. ``max_batch``: rows (images) of every batched call, 1 for no batching;
    ``window_s``: the longest a request waits for others to join; ``work_limit``: the work per row above which a
    size is not batched (0: every size is)."""

    max_batch: int = 1
    window_s: float = DEFAULT_WINDOW_MS / 1000.0
    work_limit: int = DEFAULT_WORK_LIMIT

    def __post_init__(self):
        if self.max_batch < 1 or self.window_s < 0 or self.work_limit < 0:
            raise ValueError(f"max_batch must be >= 1 and the window and work limit >= 0 (got {self})")

    @property
    def enabled(self) -> bool:
        return self.max_batch > 1


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def batch_key(job: GenerationJob) -> tuple:
    """What requests must share to be batched: the whole pipeline call but its :data:`ROW_KEYS`, the adapter
    and its scale."""
    settings = tuple(sorted((k, _hashable(v)) for k, v in job.call.items() if k not in ROW_KEYS))
    return settings, job.adapter, job.adapter_scale


def _hidden_size(pipe) -> int | None:
    config = getattr(getattr(pipe, "transformer", None), "config", None) or {}
    heads, head_dim = config.get("num_attention_heads"), config.get("attention_head_dim")
    if isinstance(heads, int) and isinstance(head_dim, int):
        return heads * head_dim
    for name in ("hidden_size", "inner_dim", "dim"):
        if isinstance(config.get(name), int):
            return config[name]
    return None


@dataclass
class BatchShapes:
    """Which calls are batched, and at how many rows: :meth:`rows` is ``max_batch`` for a call whose work per row
    (:meth:`work`) is within the policy's limit, else 1 (run alone, as without batching)."""

    pipe: Any
    policy: BatchPolicy
    granularity: int
    hidden: int | None = field(init=False)
    #: Sizes that run alone whatever their work, with the reason (:mod:`.slot_check`).
    unbatched: dict[Size, str] = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.hidden = _hidden_size(self.pipe)

    def unbatch(self, size: Size, reason: str) -> None:
        """Run the calls of ``size`` alone from now on (``reason`` is shown in :meth:`describe`)."""
        self.unbatched[size] = reason

    def cfg_rows(self, call: dict[str, Any]) -> int:
        """2 where this call runs classifier-free guidance (a negative prompt would count), else 1."""
        probe = {**call, "negative_prompt": "-"}
        return 1 if "negative_prompt" in pipelines.ignored_call_fields(self.pipe, probe) else 2

    def work(self, size: Size, call: dict[str, Any]) -> int | None:
        """Latent tokens x hidden size x CFG rows of one row; ``None`` where the hidden size is unknown."""
        if self.hidden is None:
            return None
        tokens = (size.width // self.granularity) * (size.height // self.granularity)
        return tokens * self.hidden * self.cfg_rows(call)

    def pays(self, size: Size, call: dict[str, Any]) -> bool:
        work = self.work(size, call)
        return self.policy.work_limit == 0 or work is None or work <= self.policy.work_limit

    def rows(self, size: Size, call: dict[str, Any]) -> int:
        if not self.policy.enabled or size in self.unbatched or not self.pays(size, call):
            return 1
        return self.policy.max_batch

    def rows_of(self, job: GenerationJob) -> int:
        return self.rows(job.size, job.call)

    def describe(self, size: Size, call: dict[str, Any]) -> str:
        """One start-up line: whether this size is batched, and why."""
        if size in self.unbatched:
            return f"{size}: NOT batched: {self.unbatched[size]}; these requests run alone"
        work = self.work(size, call)
        if work is None:
            return (f"{size}: batched, {self.policy.max_batch} rows per call (the transformer's hidden size is "
                    "unknown, so --batch-work-limit cannot judge it)")
        what = (f"latent tokens x hidden x CFG rows = {work:,}" + ("" if self.policy.work_limit == 0 else
                                                                   f", limit {self.policy.work_limit:,}"))
        if self.pays(size, call):
            return f"{size}: batched, {self.policy.max_batch} rows per call ({what})"
        return (f"{size}: NOT batched: compute-bound at one row ({what}), so a batch would take about as long as "
                "its requests one after the other; these requests run alone (raise --batch-work-limit, or 0, to "
                "batch them anyway)")


class BatchStats:
    """What batching did: batched calls, requests and real images per call (histograms), filler rows, the time
    requests waited to be batched (from arrival until their batch was closed), why each batch closed
    (``closed_by``: full, returns, window) and how long after a call's answer its returns arrived (``return_s``:
    the round trip of a closed-loop client, what ``window_s`` must cover)."""

    def __init__(self, policy: BatchPolicy):
        self.policy = policy
        self._lock = threading.Lock()
        self.batches = 0
        self.requests = 0
        self.requests_per_batch: dict[int, int] = {}
        self.images_per_batch: dict[int, int] = {}
        self.filler_rows = 0
        self.wait_count = 0
        self.wait_sum = 0.0
        self.wait_max = 0.0
        self.closed_by = {reason: 0 for reason in CLOSE_REASONS}
        self.return_count = 0
        self.return_sum = 0.0
        self.return_max = 0.0

    def record(self, requests: int, images: int, rows: int, waits: list[float], reason: str = "full") -> None:
        with self._lock:
            self.batches += 1
            self.closed_by[reason] += 1
            self.requests += requests
            self.requests_per_batch[requests] = self.requests_per_batch.get(requests, 0) + 1
            self.images_per_batch[images] = self.images_per_batch.get(images, 0) + 1
            self.filler_rows += rows - images
            self.wait_count += len(waits)
            self.wait_sum += sum(waits)
            self.wait_max = max([self.wait_max, *waits])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.policy.enabled, "max_batch": self.policy.max_batch,
                "window_ms": round(self.policy.window_s * 1000.0, 3), "work_limit": self.policy.work_limit,
                "batches": self.batches, "batched_requests": self.requests,
                "requests_per_batch": {str(k): v for k, v in sorted(self.requests_per_batch.items())},
                "images_per_batch": {str(k): v for k, v in sorted(self.images_per_batch.items())},
                "filler_rows": self.filler_rows,
                "wait_s": {"count": self.wait_count, "sum": round(self.wait_sum, 6),
                           "mean": round(self.wait_sum / self.wait_count, 6) if self.wait_count else None,
                           "max": round(self.wait_max, 6)},
                "closed_by": dict(self.closed_by),
                "return_s": {"count": self.return_count, "sum": round(self.return_sum, 6),
                             "mean": round(self.return_sum / self.return_count, 6) if self.return_count else None,
                             "max": round(self.return_max, 6)},
            }

    def record_return(self, after_s: float) -> None:
        """A request counted as a return arrived ``after_s`` after the previous call was answered."""
        with self._lock:
            self.return_count += 1
            self.return_sum += after_s
            self.return_max = max(self.return_max, after_s)


@dataclass
class _Pending:
    job: GenerationJob
    key: tuple
    rows: int
    arrived: float
    future: concurrent.futures.Future


class RequestBatcher:
    """Gathers batchable requests and hands each batch to the pipeline worker as one call.

    ``submit(job)`` returns a future of ``(started, GenerationResult)`` for that job alone (as an unbatched call
    gives). One thread forms :class:`~..calls.Batch` and runs each through ``run(batch)`` (one result per job) on the
    worker, waiting for it before forming the next: no batch starts while a call runs, and requests that arrive meanwhile queue for the
    next one. **The filling rule**: the batch of the oldest waiting request's key closes as soon as

    - ``full``: its key has ``rows`` images waiting (or a waiting request of the key does not fit), or
    - ``returns``: every request the previous call answered has come back, i.e. as many requests have arrived
      since that answer as it answered (closed-loop clients send their next request once answered; once all of
      them are here, nobody else is expected), or
    - ``window``: ``window_s`` has passed since the oldest waiting request arrived or since the previous call was
      answered, whichever is later;

    it then takes every waiting request of that key that fits, in arrival order. Why returns: the clients of the
    answered call send their next requests only after their PNGs are encoded and sent (tens of ms or more), while
    the requests that queued during the call are already waiting; closing on a short window alone ran those
    queued requests as a partial batch and left the returning ones to form the next partial batch (8 clients,
    ``rows`` 8: calls of 3 and 5 requests, alternating, for good). Counting returns lets the window be long
    enough for a round trip without costing a lone client: its next request is the one return expected, so it
    runs at once; only a request with no return expected (the first after idle, or a client that does not come
    back) waits, and never more than ``window_s``. Returns are counted over all keys and clients (the batcher
    does not know which client sent what), so a newcomer can stand in for a client that stays away.
    """

    def __init__(self, worker, run: Callable[[Batch], list], shapes: BatchShapes, stats: BatchStats,
                 name: str = "request-batcher"):
        self.worker = worker
        self.run = run
        self.shapes = shapes
        self.stats = stats
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._answered_at = 0.0  # when the previous call was answered
        self._expected = 0  # requests it answered: the returns the next batch may wait for
        self._returned = 0  # requests that arrived since it was answered
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def batches(self, job: GenerationJob) -> bool:
        """Whether this job goes through batching (its call is batched at more than one row)."""
        return self.shapes.rows_of(job) > 1

    def submit(self, job: GenerationJob) -> concurrent.futures.Future:
        rows = self.shapes.rows_of(job)
        if job.n > rows:
            raise ValueError(f"n={job.n} does not fit a batch of {rows} rows")
        item = _Pending(job, batch_key(job), rows, time.perf_counter(), concurrent.futures.Future())
        with self._cond:
            self._pending.append(item)
            if self._returned < self._expected:
                self._returned += 1
                self.stats.record_return(item.arrived - self._answered_at)
            self._cond.notify()
        return item.future

    @property
    def pending(self) -> int:
        """Requests waiting to be batched (not yet handed to the worker)."""
        with self._cond:
            return len(self._pending)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- forming batches --------------------------------------------------------------------------------
    def _select(self) -> tuple[list[_Pending], bool]:
        """The waiting requests of the oldest request's key that fit its rows (in arrival order), and whether
        the batch is full (no more rows free, or a request of the key waits that does not fit)."""
        first = self._pending[0]
        chosen, used, left_out = [], 0, False
        for item in self._pending:
            if item.key != first.key:
                continue
            if used + item.job.n <= first.rows:
                chosen.append(item)
                used += item.job.n
            else:
                left_out = True
        return chosen, used == first.rows or left_out

    def _close_reason(self, full: bool, remaining: float) -> str | None:
        """Why the batch closes now (one of :data:`CLOSE_REASONS`), or ``None`` to keep waiting."""
        if full:
            return "full"
        if self._expected and self._returned >= self._expected:
            return "returns"
        return "window" if remaining <= 0 else None

    def _next_batch(self) -> tuple[list[_Pending], str] | None:
        with self._cond:
            while True:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                chosen, full = self._select()
                opened = max(self._pending[0].arrived, self._answered_at)
                remaining = opened + self.shapes.policy.window_s - time.perf_counter()
                reason = self._close_reason(full, remaining)
                if reason is not None:
                    for item in chosen:
                        self._pending.remove(item)
                    return chosen, reason
                self._cond.wait(remaining)

    def _answered(self, requests: int) -> None:
        """A call is over: the next batch may wait for its ``requests`` to come back (set before their futures
        resolve, so no return arrives uncounted)."""
        with self._cond:
            self._answered_at = time.perf_counter()
            self._expected, self._returned = requests, 0

    def _loop(self) -> None:
        while (formed := self._next_batch()) is not None:
            items, reason = formed
            closed = time.perf_counter()
            batch = Batch(tuple(item.job for item in items), items[0].rows)
            self.stats.record(len(items), sum(j.n for j in batch.jobs), batch.rows,
                              [closed - item.arrived for item in items], reason)
            try:
                started, results = self.worker.submit(lambda: (time.perf_counter(), self.run(batch))).result()
            except BaseException as exc:  # noqa: BLE001 - the whole batch failed: every request gets the error
                self._answered(len(items))
                for item in items:
                    item.future.set_exception(exc)
            else:
                self._answered(len(items))
                for item, result in zip(items, results):
                    item.future.set_result((started, result))
        with self._cond:  # stopped: the requests still waiting are refused
            for item in self._pending:
                item.future.set_exception(RuntimeError("the server is stopping"))
            self._pending.clear()
