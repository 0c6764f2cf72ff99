"""Removable handles: what installed a patch owns a handle and removes it.

:func:`patch_attribute` is the one way the library replaces an attribute (a function of a Python
module, a method of a class, an instance attribute of a module such as ``forward`` or
``_call_impl``): its handle puts back exactly what was there. Patches shared by everything that
needs them (the attention breaks of a Python module, the global module-registration hooks, the
hooked ``Stream.wait_stream``) are a :class:`SharedPatch`: applied by the first handle and undone
when the last live handle is removed, like torch's ``RemovableHandle`` for hooks.
:func:`live_handles` lists the handles of shared patches not yet removed: a test fixture removes
leftovers in one place. Handles of one object's own patches are not listed: their owner removes them.
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable

_lock = threading.Lock()
_live: dict[int, "RemovableHandle"] = {}


class RemovableHandle:
    """Undoes one installation when :meth:`remove` is called (once; later calls do nothing).
    Also a context manager that removes on exit."""

    def __init__(self, undo: Callable[[], None], label: str, *, listed: bool = True) -> None:
        self.label = label
        self._undo: Callable[[], None] | None = undo
        if listed:
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
    """Listed handles installed and not yet removed, oldest first."""
    with _lock:
        return list(_live.values())


_ABSENT = object()


def patch_attribute(owner: Any, name: str, value: Any, label: str | None = None) -> RemovableHandle:
    """Set ``owner``'s own attribute ``name`` to ``value`` and return the handle that undoes it.

    ``owner`` is a class (set with ``setattr``), a Python module or an object with a ``__dict__``
    (written there directly, never through a ``__setattr__``: for a ``torch.nn.Module`` an instance
    attribute that shadows the class's). Removing the handle puts back what ``owner`` itself held
    before, or deletes the attribute when it held none (a class attribute shows through again).
    The handle is not listed by :func:`live_handles`: whoever patched removes it.
    """
    own = vars(owner)
    previous = own.get(name, _ABSENT)
    _write(owner, name, value)

    def undo() -> None:
        if previous is not _ABSENT:
            _write(owner, name, previous)
        elif isinstance(owner, type):
            if name in vars(owner):
                delattr(owner, name)
        else:
            vars(owner).pop(name, None)

    return RemovableHandle(undo, label or f"{_name_of(owner)}.{name}", listed=False)


def _write(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, type):
        setattr(owner, name, value)
    else:
        vars(owner)[name] = value


def _name_of(owner: Any) -> str:
    if isinstance(owner, (type, types.ModuleType)):
        return owner.__name__
    return type(owner).__name__


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
