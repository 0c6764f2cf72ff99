"""The way of every request to the pipeline, as values: a :class:`~.requests.GenerationJob` (one checked request),
a :class:`Batch` (the jobs that share one pipeline call, and its rows), the :class:`PipelineCall` a batch becomes
(its keyword arguments and generators, built here and nowhere else), and the :class:`GenerationResult` each job gets
back. The warm-up's calls are batches of default jobs, made the same way (:mod:`.startup_warmup`).

A job alone (``Batch.rows`` ``None``, no batching) is its own call: ``pipe(**job.call)`` with one generator seeded
``job.seed`` for its ``n`` images. A batch of ``rows`` rows (:mod:`.batching`) is one call of exactly ``rows``
images: one prompt and one generator per image (image ``i`` of a job seeded ``s`` from seed ``s + i``, modulo
2**64), filler rows up to ``rows`` (the first prompt, seed :data:`FILLER_SEED`), whose images are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bcg_pipelines.calls import BATCH_KWARGS

from .requests import GenerationJob

__all__ = ["FILLER_SEED", "SEED_MODULUS", "Batch", "GenerationResult", "PipelineCall", "row_seeds"]

#: The seed of every filler row (its image is dropped).
FILLER_SEED = 0
SEED_MODULUS = 2**64


def row_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a job's ``n`` rows in a batched call: ``seed``, ``seed + 1``, ... modulo 2**64."""
    return [(seed + i) % SEED_MODULUS for i in range(n)]


@dataclass
class GenerationResult:
    """The images of one job (PIL, RGB), how long its pipeline call took, and that call's batch: requests and rows
    (filler rows included; 1 and ``n`` for a job alone)."""

    images: list
    pipeline_s: float
    batch_requests: int = 1
    batch_rows: int | None = None


@dataclass(frozen=True)
class PipelineCall:
    """One pipeline call: ``kwargs`` (everything but the generator), the generators' ``seeds`` (one per row, or one
    for the whole call with ``one_generator``), the adapter and scale it serves, the ``prompts`` of its jobs (what a
    fault hook is asked about), ``what`` it is (a log line) and the ``batch`` it was made of."""

    kwargs: Mapping[str, Any]
    seeds: tuple[int, ...]
    one_generator: bool
    adapter: str | None
    adapter_scale: float | None
    prompts: tuple[str, ...]
    what: str
    batch: "Batch"


@dataclass(frozen=True)
class Batch:
    """``jobs`` that share one pipeline call: one key of :func:`.batching.batch_key` (one adapter and scale), at
    most ``rows`` images in all; ``rows`` ``None``: one job alone, as without batching."""

    jobs: tuple[GenerationJob, ...]
    rows: int | None = None

    @classmethod
    def alone(cls, job: GenerationJob) -> "Batch":
        return cls((job,))

    def call(self) -> PipelineCall:
        """The pipeline call of this batch; ``ValueError`` for jobs that do not fit its rows or do not share an
        adapter and scale."""
        first = self.jobs[0]
        if len({(j.adapter, j.adapter_scale) for j in self.jobs}) != 1:
            raise ValueError("requests for different adapters or scales cannot share a pipeline call")
        prompts = tuple(j.prompt for j in self.jobs)
        if self.rows is None:
            what = f"{first.size}, n={first.n}, {first.steps} steps, seed {first.seed}"
            return PipelineCall(first.call, (first.seed,), True, first.adapter, first.adapter_scale, prompts, what,
                                self)
        real = sum(j.n for j in self.jobs)
        if not 0 < real <= self.rows:
            raise ValueError(f"a batch of {real} images does not fit {self.rows} rows")
        rows = [p for j in self.jobs for p in [j.prompt] * j.n]
        seeds = [s for j in self.jobs for s in row_seeds(j.seed, j.n)] + [FILLER_SEED] * (self.rows - real)
        kwargs = {**first.call, "prompt": rows + [rows[0]] * (self.rows - real)}
        kwargs.update({key: 1 for key in BATCH_KWARGS if key in kwargs})
        what = (f"batch of {len(self.jobs)} request(s), {real} image(s) in {self.rows} rows, {first.size}, "
                f"{first.steps} steps")
        return PipelineCall(kwargs, tuple(seeds), False, first.adapter, first.adapter_scale, prompts, what, self)

    def results(self, images: list, seconds: float) -> list[GenerationResult]:
        """Each job's images of the call's ``images`` (filler rows dropped), with the call's seconds and batch."""
        if self.rows is None:
            (job,) = self.jobs
            return [GenerationResult(images, seconds, 1, job.n)]
        results, start = [], 0
        for job in self.jobs:
            results.append(GenerationResult(images[start:start + job.n], seconds, len(self.jobs), self.rows))
            start += job.n
        return results
