"""The copies of weight streaming: a CUDA copy stream ordered by events, or plain CPU copies.

CUDA: a load waits (on the copy stream) for an event recorded on the compute stream when it was decided
(``mark``: all compute that could read the slot is enqueued before it), copies the block's bytes from its
page-locked host copy with ``non_blocking=True`` and records the slot's ready event; the compute stream
waits for that event before the block's kernels (``wait``). All of it runs in the eager break at each
block's entry, between graph segments, on the current stream, at capture and at every replay. With
``measure`` an event is recorded where the compute stream reaches each wait, and the time to the copy's
end is summed once both have completed (read without synchronising).
"""

from __future__ import annotations

from typing import Any

import torch


class PlainCopies:
    """CPU: loads are synchronous copies; nothing to order or wait for."""

    wait_s: float | None = None

    def follow_stream(self) -> None:
        pass

    def mark(self) -> None:
        pass

    def load(self, src: torch.Tensor, dst: torch.Tensor, slot: int) -> None:
        dst.copy_(src)

    def wait(self, slot: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def drain(self) -> None:
        pass


class CudaCopies:
    """Loads on one copy stream of ``device``, ordered against the compute stream by events (module docstring)."""

    def __init__(self, device: torch.device, slots: int, measure: bool) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.ready: list[Any] = [None] * slots
        self.measure = measure
        self.wait_s: float | None = 0.0 if measure else None
        self._mark: Any = None
        self._last_stream: Any = None
        self._pending: list[tuple[Any, Any]] = []

    def follow_stream(self) -> None:
        """A call on another stream than the last one waits for the last (slots are shared)."""
        current = torch.cuda.current_stream(self.device)
        if self._last_stream is not None and current != self._last_stream:
            current.wait_stream(self._last_stream)
        self._last_stream = current

    def mark(self) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._mark = event

    def load(self, src: torch.Tensor, dst: torch.Tensor, slot: int) -> None:
        with torch.cuda.stream(self.stream):
            if self._mark is not None:
                self.stream.wait_event(self._mark)
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event(enable_timing=self.measure)
            event.record(self.stream)
        self.ready[slot] = event

    def wait(self, slot: int) -> None:
        event = self.ready[slot]
        if event is None:
            return
        current = torch.cuda.current_stream(self.device)
        if self.measure:
            reached = torch.cuda.Event(enable_timing=True)
            reached.record(current)
            self._pending.append((reached, event))
        current.wait_event(event)

    def finish(self) -> None:
        """At the end of a call: the loads are done before the host copies can be written again."""
        self.stream.synchronize()
        self.drain()

    def drain(self) -> None:
        """Sum the waits whose events have completed (no synchronisation)."""
        if not self._pending:
            return
        kept = []
        for reached, ready in self._pending:
            if reached.query() and ready.query():
                self.wait_s += max(0.0, reached.elapsed_time(ready)) / 1e3
            else:
                kept.append((reached, ready))
        self._pending = kept
