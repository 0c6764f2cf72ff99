"""Which breakable capture is active in this context (thread or task).

A leaf of the core: :mod:`.capture` sets it, and code that must behave differently under a
capture (hooked calls, attention breaks) reads it without importing the capture machinery.
"""

from __future__ import annotations

import contextvars
from typing import Any

# The active capture's state (``capture._CaptureState``), or None outside a breakable capture.
ACTIVE_CAPTURE: contextvars.ContextVar[Any] = contextvars.ContextVar("bcg_capture", default=None)


def is_capturing_breakable() -> bool:
    """True while a :class:`BreakableCUDAGraphCapture` is active in this context (thread/task)."""
    return ACTIVE_CAPTURE.get() is not None


def is_recording_segment() -> bool:
    """True where code runs into a segment of a breakable capture in this context (in debug mode:
    where it would): a capture is active and this is not inside one of its breaks or hooked calls.
    A host read here (``.item()``, a synchronisation) makes a real capture fail."""
    state = ACTIVE_CAPTURE.get()
    return state is not None and not state.in_break
