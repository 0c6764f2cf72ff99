"""Tracking of side streams forked from a capturing stream.

Code under capture may fork work onto another stream (``side.wait_stream(capturing)``). A segment
cannot end while a forked stream is still part of the capture, so the capture joins every forked,
not-yet-joined stream before a segment ends and forks it again when the next segment begins.
``torch.cuda.Stream.wait_stream`` is hooked only while at least one capture is active (one
removable handle per capture, thread-safe); each capture sees only its own forks through a
context variable.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable

import torch

from .handles import RemovableHandle, SharedPatch, patch_attribute

_original_wait_stream: Callable[[Any, Any], None] | None = None
_patch: RemovableHandle | None = None
_TRACKER: contextvars.ContextVar["ForkTracker | None"] = contextvars.ContextVar(
    "bcg_fork_tracker", default=None
)


def original_wait_stream(waiter: Any, waited: Any) -> None:
    """Call the unhooked ``wait_stream``."""
    (_original_wait_stream or torch.cuda.Stream.wait_stream)(waiter, waited)


class ForkTracker:
    """Streams forked from one capture stream and not yet joined back."""

    def __init__(self, capture_stream: torch.cuda.Stream) -> None:
        self.capture_stream = capture_stream
        self._forked: dict[int, torch.cuda.Stream] = {}

    @property
    def forked(self) -> list[torch.cuda.Stream]:
        return list(self._forked.values())

    def on_wait(self, waiter: Any, waited: Any) -> None:
        capture_handle = self.capture_stream.cuda_stream
        waiter_handle, waited_handle = waiter.cuda_stream, waited.cuda_stream
        if waiter_handle == capture_handle:
            self._forked.pop(waited_handle, None)
        elif waited_handle == capture_handle or waited_handle in self._forked:
            self._forked[waiter_handle] = waiter

    def join_all(self) -> list[torch.cuda.Stream]:
        """Make the capture stream wait for every forked stream; returns the streams joined."""
        joined = self.forked
        for stream in joined:
            original_wait_stream(self.capture_stream, stream)
        self._forked.clear()
        return joined

    def refork(self, streams: list[torch.cuda.Stream]) -> None:
        """Fork ``streams`` from the capture stream again (at the start of a new segment)."""
        for stream in streams:
            original_wait_stream(stream, self.capture_stream)
            self._forked[stream.cuda_stream] = stream


def _hooked_wait_stream(self: Any, stream: Any) -> None:
    original_wait_stream(self, stream)
    tracker = _TRACKER.get()
    if tracker is not None:
        tracker.on_wait(self, stream)


def _hook() -> None:
    global _original_wait_stream, _patch
    _original_wait_stream = torch.cuda.Stream.wait_stream
    _patch = patch_attribute(torch.cuda.Stream, "wait_stream", _hooked_wait_stream)


def _unhook() -> None:
    global _original_wait_stream, _patch
    patch, _patch = _patch, None
    if patch is not None:
        patch.remove()
    _original_wait_stream = None


_wait_stream_patch = SharedPatch("torch.cuda.Stream.wait_stream", _hook, _unhook)


def install(tracker: ForkTracker) -> RemovableHandle:
    """Hook ``wait_stream`` (shared by the active captures) and make ``tracker`` this context's
    tracker until the handle is removed (in the same context)."""
    shared = _wait_stream_patch.acquire()
    token = _TRACKER.set(tracker)

    def undo() -> None:
        _TRACKER.reset(token)
        shared.remove()

    return RemovableHandle(undo, "fork tracker of a capture")


def is_hook_installed() -> bool:
    """True while ``torch.cuda.Stream.wait_stream`` is hooked."""
    return torch.cuda.Stream.wait_stream is _hooked_wait_stream
