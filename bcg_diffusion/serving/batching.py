"""Request batching: requests that can share a pipeline call are gathered for a short window and run as one call.

What may share a call (:func:`batch_key`): everything of the pipeline call but the prompt and the number of
images, i.e. the same size, steps, guidance, negative prompt and every other setting, and the same adapter and
adapter scale. Each request keeps its own prompt, seed and ``n``: a batched call gets a list of prompts (one per
image) and a list of generators (one per image: image ``i`` of a request with seed ``s`` draws its noise from
``torch.Generator().manual_seed(s + i)``, modulo 2**64).

**Reproducibility rule**: a request's images do not depend on what it was batched with, nor where in the batch
it sat. Kernels may compute a row differently when the batch has another size (another GEMM tiling, another
attention split), so every batched call of a key runs the same, fixed number of rows, ``--max-batch``: the rows
the requests leave free are filled with filler rows (the first row's prompt, seed :data:`FILLER_SEED`) whose
images are dropped. Every kernel then sees the same shapes whatever the batch holds, and no kernel mixes rows,
so a row's result depends on that row alone. The cost: a lone request pays for a full batch (``--max-batch``
rows of work), so batching pays only while the server is loaded; with ``--max-batch 1`` nothing is batched and
the server behaves as without batching (one call per request, one generator for all its images).

**Where batching cannot pay** the server keeps those calls unbatched: a size whose work per row, latent tokens x
the transformer's hidden size x the rows classifier-free guidance adds, is above ``--batch-work-limit`` is
compute-bound already at one row (a batch then takes about as long as its rows one after the other), so
requests of that size run alone as without batching; the server says so at start for the sizes it warms.

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
from bcg_pipelines.calls import BATCH_KWARGS

from .requests import GenerationJob

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_WINDOW_MS", "DEFAULT_WORK_LIMIT", "FILLER_SEED", "SEED_MODULUS", "BatchPolicy", "BatchShapes",
           "BatchStats", "RequestBatcher", "batch_key", "row_seeds"]

#: ``--batch-window-ms``: how long the oldest waiting request may wait for others to join its batch.
DEFAULT_WINDOW_MS = 20.0
#: ``--batch-work-limit``: latent tokens x hidden size x CFG rows per row above which a size is not batched
#: (PixArt-Sigma at 512x512: 1024 x 1152 x 2 = 2.4M; Flux.1 at 512x512: 1024 x 3072 = 3.1M, at 1024x1024 12.6M).
DEFAULT_WORK_LIMIT = 1 << 22
#: The seed of every filler row (its image is dropped).
FILLER_SEED = 0
SEED_MODULUS = 2**64
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


def row_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a request's ``n`` rows in a batched call: ``seed``, ``seed + 1``, ... modulo 2**64."""
    return [(seed + i) % SEED_MODULUS for i in range(n)]


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

    def __post_init__(self):
        self.hidden = _hidden_size(self.pipe)

    def cfg_rows(self, call: dict[str, Any]) -> int:
        """2 where this call runs classifier-free guidance (a negative prompt would count), else 1."""
        probe = {**call, "negative_prompt": "-"}
        return 1 if "negative_prompt" in pipelines.ignored_call_fields(self.pipe, probe) else 2

    def work(self, width: int, height: int, call: dict[str, Any]) -> int | None:
        """Latent tokens x hidden size x CFG rows of one row; ``None`` where the hidden size is unknown."""
        if self.hidden is None:
            return None
        tokens = (width // self.granularity) * (height // self.granularity)
        return tokens * self.hidden * self.cfg_rows(call)

    def pays(self, width: int, height: int, call: dict[str, Any]) -> bool:
        work = self.work(width, height, call)
        return self.policy.work_limit == 0 or work is None or work <= self.policy.work_limit

    def rows(self, width: int, height: int, call: dict[str, Any]) -> int:
        if not self.policy.enabled or not self.pays(width, height, call):
            return 1
        return self.policy.max_batch

    def rows_of(self, job: GenerationJob) -> int:
        return self.rows(job.width, job.height, job.call)

    def describe(self, width: int, height: int, call: dict[str, Any]) -> str:
        """One start-up line: whether this size is batched, and why."""
        work = self.work(width, height, call)
        size = f"{width}x{height}"
        if work is None:
            return (f"{size}: batched, {self.policy.max_batch} rows per call (the transformer's hidden size is "
                    "unknown, so --batch-work-limit cannot judge it)")
        what = (f"latent tokens x hidden x CFG rows = {work:,}" + ("" if self.policy.work_limit == 0 else
                                                                   f", limit {self.policy.work_limit:,}"))
        if self.pays(width, height, call):
            return f"{size}: batched, {self.policy.max_batch} rows per call ({what})"
        return (f"{size}: NOT batched: compute-bound at one row ({what}), so a batch would take about as long as "
                "its requests one after the other; these requests run alone (raise --batch-work-limit, or 0, to "
                "batch them anyway)")


class BatchStats:
    """What batching did: batched calls, requests and real images per call (histograms), filler rows, and the
    time requests waited to be batched (from arrival until their batch was closed)."""

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

    def record(self, requests: int, images: int, rows: int, waits: list[float]) -> None:
        with self._lock:
            self.batches += 1
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
            }


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
    gives). One thread forms batches: it takes the oldest waiting request, waits until its key has
    ``rows`` images waiting or ``window_s`` has passed since that request arrived or since the previous batch
    was answered, whichever is later (the clients of the previous batch send their next requests then, and they
    join this batch instead of forming a small one of their own), takes every waiting request of that key that
    fits (in arrival order), and runs the batch through ``run_batch(jobs, rows)`` on the worker, waiting for it
    before forming the next (requests that arrive meanwhile join the next batch).
    """

    def __init__(self, worker, run_batch: Callable[[list[GenerationJob], int], list], shapes: BatchShapes,
                 stats: BatchStats, name: str = "request-batcher"):
        self.worker = worker
        self.run_batch = run_batch
        self.shapes = shapes
        self.stats = stats
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._free_since = 0.0  # when the previous batch was answered
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

    def _next_batch(self) -> list[_Pending] | None:
        with self._cond:
            while True:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                chosen, full = self._select()
                opened = max(self._pending[0].arrived, self._free_since)
                remaining = opened + self.shapes.policy.window_s - time.perf_counter()
                if full or remaining <= 0:
                    for item in chosen:
                        self._pending.remove(item)
                    return chosen
                self._cond.wait(remaining)

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            closed = time.perf_counter()
            jobs = [item.job for item in batch]
            rows = batch[0].rows
            self.stats.record(len(jobs), sum(j.n for j in jobs), rows, [closed - item.arrived for item in batch])
            try:
                started, results = self.worker.submit(lambda: (time.perf_counter(), self.run_batch(jobs, rows))).result()
            except BaseException as exc:  # noqa: BLE001 - the whole batch failed: every request gets the error
                for item in batch:
                    item.future.set_exception(exc)
            else:
                for item, result in zip(batch, results):
                    item.future.set_result((started, result))
            with self._cond:
                self._free_since = time.perf_counter()
        with self._cond:  # stopped: the requests still waiting are refused
            for item in self._pending:
                item.future.set_exception(RuntimeError("the server is stopping"))
            self._pending.clear()
