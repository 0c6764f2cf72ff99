"""Where a step's time goes (:class:`StepClock`): the host's time to queue it and, on CUDA, the device's time for
its two parts, ``predict`` (the batch's inputs, the transformer call, the guidance) and ``advance`` (every row's own
scheduler step).

The device times come from timing events recorded on the steps' stream at the start of a step, after ``predict``
and after ``advance``; they are read once the device has passed them (``Event.query``), never waited for, so a
step's device times reach the stats a step or two after the step. An event runs when the stream reaches it: if the
host queues more slowly than the device runs, the stream waits for the host and the device times include that wait
(they are then close to the host's queueing time; a device-bound step shows device times well above it).
Off CUDA there are no events: only the host's time is measured.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["DeviceSpans", "StepClock", "StepMarks", "recorded_event"]


def recorded_event(device: torch.device, timing: bool = False):
    """A CUDA event recorded now on ``device``'s current stream (``timing``: one that can time a span)."""
    event = torch.cuda.Event(enable_timing=timing)
    event.record(torch.cuda.current_stream(device))
    return event


@dataclass
class StepMarks:
    """The marks of one step: host times (the clock's seconds) and device events (empty off CUDA), one per mark."""

    host: list[float] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceSpans:
    """The device's seconds of one step's ``predict`` and ``advance``."""

    predict_s: float
    advance_s: float


class StepClock:
    """Marks a step three times (:meth:`begin`, after ``predict`` and after ``advance``: :meth:`mark`), then
    :meth:`end` gives the host's queueing time and the device spans of the steps the device has finished.

    ``make_event()`` records an event on the steps' stream (CUDA timing events on a CUDA device; ``None``: no
    device times)."""

    #: Steps whose events are kept unread at most (older ones are dropped: the stats lose them, nothing waits).
    MAX_PENDING = 64

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter,
                 make_event: Callable[[], Any] | None = None):
        if make_event is None and device.type == "cuda":
            make_event = lambda: recorded_event(device, timing=True)  # noqa: E731
        self._clock, self._make = clock, make_event
        self._pending: deque[StepMarks] = deque(maxlen=self.MAX_PENDING)

    def begin(self) -> StepMarks:
        marks = StepMarks()
        self.mark(marks)
        return marks

    def mark(self, marks: StepMarks) -> None:
        marks.host.append(self._clock())
        if self._make is not None:
            marks.events.append(self._make())

    def end(self, marks: StepMarks) -> tuple[float, list[DeviceSpans]]:
        """The host's seconds from :meth:`begin` to the last mark (the step queued), and the device spans of every
        marked step whose events the device has passed, oldest first (this one too, once passed)."""
        if marks.events:
            self._pending.append(marks)
        return marks.host[-1] - marks.host[0], self._passed()

    def _passed(self) -> list[DeviceSpans]:
        spans = []
        while self._pending and self._pending[0].events[-1].query():
            start, predicted, advanced = self._pending.popleft().events
            spans.append(DeviceSpans(start.elapsed_time(predicted) / 1000.0, predicted.elapsed_time(advanced) / 1000.0))
        return spans
