"""Host random numbers drawn by a capture: what a replay would repeat.

A CUDA graph replays the device's random numbers correctly (torch's CUDA generator hands each replay
a new offset), but random numbers drawn on the host while the captured code runs (a dropout on a CPU
tensor, ``torch.rand`` of a CPU table that is then copied to the device) are drawn once, at capture,
and every replay reuses them, where an eager call draws new ones. Those calls cannot be replayed.

:class:`HostRandomWatch` reads torch's default CPU generator before a capture attempt and compares it
after (``torch.get_rng_state()``: a copy of a few kilobytes, microseconds). An attempt that moved it
drew host random numbers: the generator is put back where it was, so that the call's eager run draws
exactly what an eager call would have drawn (the process's random stream stays the eager one), and the
key runs eagerly (:mod:`.entries`). Eager breaks do not move it: the capture runs them under
``torch.random.fork_rng`` and their replays draw anew.

Limits: only torch's default CPU generator is watched (a ``torch.Generator`` of the model's own and
Python's ``random`` are not: docs/accelerate.md, What a replay assumes). That generator is
process-wide: numbers another thread draws from it while a capture runs are taken for the step's (the
key then runs eagerly) and are drawn again. Debug mode is not watched: it replays by running the
forward again, which draws anew, and on a machine without CUDA the CPU generator is also the device's.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ..config import BCGConfig

REASON = "host random numbers in the step"


def watched(config: BCGConfig) -> bool:
    """Whether a capture under ``config`` watches the CPU generator: real captures, not debug mode."""
    return not config.debug


class HostRandomWatch:
    """torch's CPU generator state at creation. Each capture attempt runs under :meth:`attempt`, which on
    the way out (a return or an exception) puts the generator back there; ``drew`` says whether the last
    attempt had moved it."""

    def __init__(self) -> None:
        self._before = torch.get_rng_state()
        self.drew = False

    def moved(self) -> bool:
        """Whether host random numbers were drawn since the watch began."""
        return not torch.equal(torch.get_rng_state(), self._before)

    def rewind(self) -> bool:
        """Put the CPU generator back where the watch began; True when it had moved."""
        if not self.moved():
            return False
        torch.set_rng_state(self._before)
        return True

    @contextlib.contextmanager
    def attempt(self) -> Iterator["HostRandomWatch"]:
        """One capture attempt (see the class docstring)."""
        self.drew = False
        try:
            yield self
        finally:
            self.drew = self.rewind()


class NoWatch:
    """What an unwatched capture uses: ``drew`` stays False."""

    drew = False

    @contextlib.contextmanager
    def attempt(self) -> Iterator["NoWatch"]:
        yield self


def watch(config: BCGConfig) -> HostRandomWatch | NoWatch:
    """A watch of the CPU generator from now on, or a :class:`NoWatch` where ``config`` is not watched."""
    return HostRandomWatch() if watched(config) else NoWatch()
