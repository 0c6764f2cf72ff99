"""Removable handles: what installed a process-wide patch owns a handle and removes it.

Patches shared by everything that needs them (the attention breaks of a Python module, the global
module-registration hooks, the hooked ``Stream.wait_stream``) are applied by the first handle and
undone when the last live handle is removed, like torch's ``RemovableHandle`` for hooks.
:func:`live_handles` lists handles not yet removed: a test fixture removes leftovers in one place.
"""

from __future__ import annotations

import threading
from typing import Callable

_lock = threading.Lock()
_live: dict[int, "RemovableHandle"] = {}


class RemovableHandle:
    """Undoes one installation when :meth:`remove` is called (once; later calls do nothing).
    Also a context manager that removes on exit."""

    def __init__(self, undo: Callable[[], None], label: str) -> None:
        self.label = label
        self._undo: Callable[[], None] | None = undo
        with _lock:
            _live[id(self)] = self

    @property
    def removed(self) -> bool:
        return self._undo is None

    def remove(self) -> None:
        with _lock:
            undo, self._undo = self._undo, None
            _live.pop(id(self), None)
        if undo is not None:
            undo()

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"RemovableHandle({self.label!r}{', removed' if self.removed else ''})"


def live_handles() -> list[RemovableHandle]:
    """Handles installed and not yet removed, oldest first."""
    with _lock:
        return list(_live.values())


class SharedPatch:
    """A patch applied while at least one handle of it is live: ``apply()`` runs at the first
    :meth:`acquire`, ``revert()`` when the last handle is removed. Thread-safe."""

    def __init__(self, label: str, apply: Callable[[], None], revert: Callable[[], None]) -> None:
        self.label = label
        self._apply = apply
        self._revert = revert
        self._users = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._users > 0

    def acquire(self) -> RemovableHandle:
        with self._lock:
            if self._users == 0:
                self._apply()
            self._users += 1
        return RemovableHandle(self._release, self.label)

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._revert()
