"""Clocks, per-round call counts, summaries and the kernel profile of one call."""

from __future__ import annotations

import math
import statistics
import time
import warnings
from typing import Any, Callable

import torch

from .timing_defaults import AUTO_ROUND_S, DEFAULT_ITERS, DEFAULT_ROUNDS, DEFAULT_WARMUP, MIN_AUTO_ITERS  # noqa: F401


class Clock:
    """Times calls with CUDA events (GPU timeline) or, without CUDA, with ``perf_counter``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wall(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Seconds of one call, synchronised on both sides, and its result."""
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def calls(self, fn: Callable[[], Any], n: int) -> list[float]:
        """Seconds of each of ``n`` back-to-back calls."""
        if not self.cuda:
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return times
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]


def auto_iters(call_s: float) -> int:
    """Calls per round for a mode whose steady call takes ``call_s`` seconds (``--iters`` not given)."""
    if call_s <= 0:
        return DEFAULT_ITERS
    return max(MIN_AUTO_ITERS, min(DEFAULT_ITERS, math.ceil(AUTO_ROUND_S / call_s)))


def summarize(times: list[float]) -> dict[str, float]:
    """Count, median, mean, p10, p90 and minimum of ``times`` (seconds), in milliseconds."""
    s = sorted(times)

    def pct(p):
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"n": len(s), "median_ms": 1e3 * statistics.median(s), "mean_ms": 1e3 * statistics.fmean(s),
            "p10_ms": 1e3 * pct(0.10), "p90_ms": 1e3 * pct(0.90), "min_ms": 1e3 * s[0]}


def busy_time(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (device work on several streams may overlap)."""
    busy, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start >= end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy


def kernel_summary(device_events: list[tuple[str, float, float]]) -> dict[str, Any]:
    """Counts and times (ms) of device events ``(name, start_us, end_us)``: kernels, memory ops, GPU busy."""
    kernels = [e for e in device_events if not e[0].startswith(("Memcpy", "Memset"))]
    return {"kernels": len(kernels), "memory_ops": len(device_events) - len(kernels),
            "kernel_time_ms": sum(end - start for _, start, end in kernels) / 1e3,
            "gpu_busy_ms": busy_time([(start, end) for _, start, end in device_events]) / 1e3}


def profile_kernels(fn: Callable[[], Any], calls: int = 1) -> dict[str, Any]:
    """Kernel count and GPU time per call, from ``torch.profiler``'s CUDA events over ``calls`` calls."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle" and the like
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return per_call(kernel_summary(events), calls)


def per_call(summary: dict[str, Any], calls: int) -> dict[str, Any]:
    """A :func:`kernel_summary` of ``calls`` calls as the figures of one call (``profiled_calls`` added)."""
    if calls == 1:
        return dict(summary, profiled_calls=1)
    return {"kernels": round(summary["kernels"] / calls), "memory_ops": round(summary["memory_ops"] / calls),
            "kernel_time_ms": summary["kernel_time_ms"] / calls, "gpu_busy_ms": summary["gpu_busy_ms"] / calls,
            "profiled_calls": calls}
