"""A failed call's error, handed on without the call's tensors.

An exception keeps its traceback, and the traceback keeps every frame it passed through with their local variables:
a failed pipeline call's latents, text embeddings and activations, on the GPU. Where the error is handed to a
waiting request (a future), the frames often end in a reference cycle (an asyncio task's frame holds the future
that holds the error), which only the cyclic garbage collector frees, at a time of its choosing: a long-lived
server then holds a failed call's memory for a while after every failure (the server soak saw 100 MiB more
allocated at an idle checkpoint after injected failures). :func:`without_frame_locals` clears the local variables
of the frames that have finished, so that memory is freed as soon as the call's own references go; the traceback
still says where the error came from (file, line, function), and whoever logs it with its locals does so before.

``frame.clear()`` alone is not enough before Python 3.13: a function that called ``locals()`` (every diffusers
pipeline does, to build its step callback's ``callback_kwargs``) keeps a snapshot dict of its locals on its frame,
which ``clear()`` leaves; the snapshot is emptied too. Found by the server soak of 2026-12-08 (73 MiB more allocated
at an idle checkpoint right after an injected failure) and reproduced on the CPU: with the snapshot left, a failed
call's text embeddings and latents waited in reference cycles for the cyclic collector.
"""

from __future__ import annotations

import sys
from types import TracebackType

__all__ = ["without_frame_locals"]


def without_frame_locals(exc: BaseException) -> BaseException:
    """``exc``, with the local variables of its traceback's finished frames cleared, and those of the exceptions it
    was raised from or during (``__cause__``, ``__context__``). Frames still running (the caller's) are left alone."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        _clear_finished_frames(error.__traceback__)
        pending.extend((error.__cause__, error.__context__))
    return exc


def _clear_finished_frames(tb: TracebackType | None) -> None:
    """Clear the local variables of ``tb``'s frames that have finished, and their ``locals()`` snapshots (before
    Python 3.13 a frame keeps the dict that ``locals()`` returned; from 3.13 ``locals()`` returns a fresh dict and
    ``f_locals`` a view of the frame, which ``clear()`` empties)."""
    while tb is not None:
        frame = tb.tb_frame
        snapshot = frame.f_locals if sys.version_info < (3, 13) else None
        try:
            frame.clear()
        except RuntimeError:  # still running: the caller's frame, left alone
            pass
        else:
            if isinstance(snapshot, dict):
                snapshot.clear()
        tb = tb.tb_next
