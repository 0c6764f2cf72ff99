"""One mode of the stack benchmark measured: its first image, then timed images, peak memory, and how its output
compares with the bf16 eager output (deviation) and with the same stack run eagerly (bitwise)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import bcg_diffusion
from bcg_diffusion.toolkit.cache_option import cache_dit_steps
from bcg_diffusion.toolkit.timed_run import RunResult, run_pipeline

__all__ = ["ModeRun", "bitwise", "cached_calls", "deviation", "graph_counts", "measure_mode", "psnr"]


@dataclass
class ModeRun:
    """A mode's calls: the first (set-up included: compilation, capture) and the timed ones after it."""

    first: RunResult
    timed: list[RunResult]
    peak_bytes: int | None

    @property
    def last(self) -> RunResult:
        return self.timed[-1] if self.timed else self.first

    def repeatable(self) -> bool:
        """Whether every call of the mode gave the same output (the first included)."""
        runs = [self.first, *self.timed]
        return all(bitwise(runs[0], r) for r in runs[1:])

    def summary(self) -> dict[str, Any]:
        timed = self.timed or [self.first]
        steps = [r.steady_median_step for r in timed if r.steady_median_step is not None]
        first_steps = self.first.step_times[:1]
        return {"image_s": statistics.median(r.total_s for r in timed), "images_s": [r.total_s for r in timed],
                "step_ms": 1000 * statistics.median(steps) if steps else None,
                "first_image_s": self.first.total_s,
                "first_step_ms": 1000 * first_steps[0] if first_steps else None,
                "peak_mib": None if self.peak_bytes is None else self.peak_bytes / 2**20,
                "repeatable": self.repeatable()}


def measure_mode(pipe: Any, call: dict[str, Any], seed: int, device: torch.device, reps: int, label: str) -> ModeRun:
    """The first call, then ``reps`` timed calls, each with a generator seeded ``seed``; the peak memory allocated
    over all of them (``None`` off CUDA)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    first = run_pipeline(pipe, call, seed, device, label)
    timed = [run_pipeline(pipe, call, seed, device, label) for _ in range(reps)]
    return ModeRun(first, timed, torch.cuda.max_memory_allocated(device) if cuda else None)


def bitwise(a: RunResult, b: RunResult) -> bool:
    """Whether two runs' final latents and decoded outputs are bitwise equal."""
    same_latents = a.latents is None or b.latents is None or (
        a.latents.shape == b.latents.shape and torch.equal(a.latents, b.latents))
    oa, ob = np.asarray(a.output), np.asarray(b.output)
    return bool(same_latents and oa.shape == ob.shape and np.array_equal(oa, ob))


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """PSNR in dB of two decoded outputs in [0, 1]; ``None`` where they are equal (infinite)."""
    mse = float(np.mean((np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2))
    return None if mse == 0 else 10 * math.log10(1.0 / mse)


def deviation(run: RunResult, reference: RunResult) -> dict[str, Any]:
    """How far ``run``'s output is from ``reference`` (the bf16 eager output): the largest absolute difference of the
    final latents and the PSNR of the decoded outputs (``None``: identical)."""
    out: dict[str, Any] = {"latents_max_abs_diff": None, "psnr_db": None, "identical": bitwise(run, reference)}
    if run.latents is not None and reference.latents is not None and run.latents.shape == reference.latents.shape:
        out["latents_max_abs_diff"] = float((run.latents.float() - reference.latents.float()).abs().max())
    a, b = np.asarray(run.output), np.asarray(reference.output)
    if a.shape == b.shape:
        out["psnr_db"] = psnr(a, b)
    return out


def graph_counts(pipe: Any) -> dict[str, Any] | None:
    """BCG's counters of an accelerated pipeline (``None`` when it is not accelerated)."""
    stats = bcg_diffusion.get_stats(pipe)
    if not stats.active:
        return None
    return {"captures": stats.captures, "failed_captures": stats.failed_captures, "hits": stats.hits,
            "warmup_calls": stats.warmup_calls, "eager_calls": stats.eager_calls, "child_hits": stats.child_hits,
            "child_eager_calls": stats.child_eager_calls, "graph_memory_mib": stats.graph_memory_bytes / 2**20,
            "debug": stats.debug}


def cached_calls(pipe: Any) -> dict[str, int] | None:
    """cache-dit's count of the last call: transformer calls, and those that reused cached residuals (``None``
    without cache-dit)."""
    transformer = pipe.transformer
    if not (getattr(transformer, "_is_cached", False) and hasattr(transformer, "_context_manager")):
        return None
    calls, cached = cache_dit_steps(transformer)
    return {"calls": calls, "cached": cached}
