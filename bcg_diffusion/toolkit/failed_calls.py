"""A failed call's error, handed on without the call's tensors.

An exception keeps its traceback, the traceback keeps every frame it passed through with their local variables (a
failed pipeline call's latents, text embeddings and activations, on the GPU), and each of those frames keeps its
caller (``f_back``), up to the frames that caught the error and hand it to a waiting request (a future). Those
frames hold the request, which holds the error: a reference cycle, which only the cyclic garbage collector frees, at
a time of its choosing. A long-lived server then holds a failed call's memory for a while after a failure: the
server soaks saw 73-104 MiB more allocated at an idle checkpoint right after an injected failure (2026-12-07 13:26
and 15:42, 2026-12-08 01:07).

:func:`without_traceback` is what a waiting request gets: the error without its traceback (nor those of the
exceptions it was raised from or during), where it came from kept as text in a note, which a log of the error with
``exc_info`` shows. Clearing the frames' locals is not enough: before Python 3.13 a function that called
``locals()`` (every diffusers pipeline does, for its step callback's ``callback_kwargs``) keeps that snapshot dict
on its frame, which ``frame.clear()`` leaves, and the frames still running when the error is handed on (the step
scheduler's) cannot be cleared and later finish with their locals. So the traceback goes, and with it every frame.
Whoever logs the error with its traceback object does so before handing it on.
"""

from __future__ import annotations

import traceback

__all__ = ["without_traceback"]

#: The note that keeps where a handed-on error came from.
TRACEBACK_NOTE = "Traceback of the failed call (frames released when it was handed on):\n"


def without_traceback(exc: BaseException) -> BaseException:
    """``exc``, with ``__traceback__`` dropped from it and from the exceptions it was raised from or during
    (``__cause__``, ``__context__``), each traceback kept as text in a note (``__notes__``) first; the same object.
    Its frames are released when the caller's references to them go (the end of its ``except`` block)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if error.__traceback__ is not None:
            _add_note(error, TRACEBACK_NOTE + "".join(traceback.format_tb(error.__traceback__)).rstrip())
            error.__traceback__ = None
        pending.extend((error.__cause__, error.__context__))
    return exc


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11+: a log with ``exc_info`` shows it); on 3.10 the same ``__notes__`` list,
    which only readers of the attribute see."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]
