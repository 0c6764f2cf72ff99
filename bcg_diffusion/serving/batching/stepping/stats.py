"""What the step scheduler did (:class:`StepStats`): steps and their time, slot occupancy, queue wait, requests
by outcome, the time spent preparing and finishing requests. Thread-safe; :meth:`StepStats.snapshot` is JSON-ready."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

__all__ = ["StepStats", "summary"]

#: Samples kept for the percentiles of step time and queue wait (the most recent ones).
WINDOW = 4096


def _percentile(data: list[float], q: float) -> float | None:
    if not data:
        return None
    ordered = sorted(data)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(samples: deque, total: float, count: int, peak: float) -> dict[str, Any]:
    """Count, sum, mean, max since start, and p50 / p99 of the recent samples (seconds)."""
    data = list(samples)
    rounded = (lambda v: None if v is None else round(v, 6))
    return {"count": count, "sum": rounded(total), "mean": rounded(total / count) if count else None,
            "max": rounded(peak), "p50": rounded(_percentile(data, 50)), "p99": rounded(_percentile(data, 99))}


class _Timing:
    def __init__(self):
        self.samples: deque = deque(maxlen=WINDOW)
        self.total, self.count, self.peak = 0.0, 0, 0.0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.total += seconds
        self.count += 1
        self.peak = max(self.peak, seconds)

    def snapshot(self) -> dict[str, Any]:
        return summary(self.samples, self.total, self.count, self.peak)


class StepStats:
    """Counters and timings of one :class:`~.scheduler.StepScheduler` (see :meth:`snapshot`)."""

    OUTCOMES = ("submitted", "admitted", "finished", "failed", "cancelled")

    def __init__(self, rows: int, policy: str):
        self.rows, self.policy = rows, policy
        self._lock = threading.Lock()
        self.requests = {name: 0 for name in self.OUTCOMES}
        self.steps = 0
        self.occupied_rows = 0
        self.active_per_step: dict[int, int] = {}
        self.steps_per_key: dict[str, int] = {}
        self.step_s, self.wait_s, self.prepare_s, self.finish_s = _Timing(), _Timing(), _Timing(), _Timing()
        self.launch_s, self.predict_device_s, self.advance_device_s = _Timing(), _Timing(), _Timing()

    def count(self, outcome: str, amount: int = 1) -> None:
        with self._lock:
            self.requests[outcome] += amount

    def admitted(self, wait_s: float, prepare_s: float) -> None:
        with self._lock:
            self.requests["admitted"] += 1
            self.wait_s.add(wait_s)
            self.prepare_s.add(prepare_s)

    def step(self, key: str, active: int, seconds: float, launch_s: float) -> None:
        with self._lock:
            self.steps += 1
            self.occupied_rows += active
            self.active_per_step[active] = self.active_per_step.get(active, 0) + 1
            self.steps_per_key[key] = self.steps_per_key.get(key, 0) + 1
            self.step_s.add(seconds)
            self.launch_s.add(launch_s)

    def device_spans(self, spans) -> None:
        """The device's seconds of finished steps (:class:`~.step_clock.DeviceSpans`)."""
        with self._lock:
            for span in spans:
                self.predict_device_s.add(span.predict_s)
                self.advance_device_s.add(span.advance_s)

    def finished(self, seconds: float) -> None:
        with self._lock:
            self.finish_s.add(seconds)

    def snapshot(self, waiting: int = 0, running_rows: int = 0) -> dict[str, Any]:
        """``occupancy``: occupied slots / slots over all steps so far; ``active_rows_per_step``: a histogram;
        ``step_s``: each step's wall time (on CUDA the host waits for the previous step to end on the device
        before it goes on, so in a busy run this is the device's time per step); ``step_launch_s``: the host's time
        to queue a step (its inputs, the transformer call, the guidance and every row's scheduler step);
        ``predict_device_s`` / ``advance_device_s``: on CUDA, the device's time for the model part of a step and for
        the rows' scheduler steps (:mod:`.step_clock`; empty elsewhere); ``queue_wait_s``: from arrival to
        joining a running batch; ``prepare_s`` / ``finish_s``: encoding and drawing a request / decoding it."""
        with self._lock:
            slots = self.steps * self.rows
            return {"enabled": True, "mode": "step", "rows": self.rows, "policy": self.policy,
                    "requests": dict(self.requests), "waiting": waiting, "running_rows": running_rows,
                    "steps": self.steps, "occupied_rows": self.occupied_rows,
                    "occupancy": round(self.occupied_rows / slots, 4) if slots else None,
                    "active_rows_per_step": {str(k): v for k, v in sorted(self.active_per_step.items())},
                    "steps_per_key": dict(self.steps_per_key),
                    "step_s": self.step_s.snapshot(), "step_launch_s": self.launch_s.snapshot(),
                    "predict_device_s": self.predict_device_s.snapshot(),
                    "advance_device_s": self.advance_device_s.snapshot(), "queue_wait_s": self.wait_s.snapshot(),
                    "prepare_s": self.prepare_s.snapshot(), "finish_s": self.finish_s.snapshot()}
