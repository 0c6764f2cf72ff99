"""Process-wide replacements of functions, shared by every transformer that needs them.

``owner.attr`` (a function of a Python module: diffusers' ``dispatch_attention_fn`` in a transformer's
module, ``torch.nn.functional.scaled_dot_product_attention``, a function a family names) is replaced
by ``make(original)`` at the first :func:`acquire` and put back when the last handle is removed. A
replacement that carries ``__bcg_eager_call__`` is registered with the attention custom ops
(:mod:`..attention_op`) while it is installed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .. import attention_op
from ...core.handles import RemovableHandle, SharedPatch, patch_attribute

_KINDS = {"dispatch_attention_fn": "dispatch", "scaled_dot_product_attention": "sdpa"}
_lock = threading.Lock()
_patches: dict[tuple[str, str], "_Patch"] = {}


class _Patch:
    """``owner.attr`` replaced by ``make(original)`` while any handle of it is live."""

    def __init__(self, owner: Any, attr: str, make: Callable[[Callable], Callable]) -> None:
        self.owner, self.attr, self.make = owner, attr, make
        self.replacement: Callable | None = None
        self.patch: RemovableHandle | None = None
        self.shared = SharedPatch(f"{getattr(owner, '__name__', owner)}.{attr}", self._apply, self._revert)

    def _apply(self) -> None:
        self.replacement = self.make(getattr(self.owner, self.attr))
        self.patch = patch_attribute(self.owner, self.attr, self.replacement)
        eager_call = getattr(self.replacement, "__bcg_eager_call__", None)
        if eager_call is not None:
            attention_op.register_eager_call(_KINDS[self.attr], eager_call)

    def _revert(self) -> None:
        self.patch.remove()
        eager_call = getattr(self.replacement, "__bcg_eager_call__", None)
        if eager_call is not None:
            attention_op.unregister_eager_call(_KINDS[self.attr], eager_call)
        self.patch = self.replacement = None


def acquire(owner: Any, attr: str, make: Callable[[Callable], Callable]) -> RemovableHandle:
    """A handle of the replacement of ``owner.attr`` by ``make(original)`` (one per ``(owner, attr)``,
    made by the first caller)."""
    key = (getattr(owner, "__name__", repr(owner)), attr)
    with _lock:
        patch = _patches.get(key)
        if patch is None:
            patch = _patches[key] = _Patch(owner, attr, make)
    return patch.shared.acquire()


def group(handles: list[RemovableHandle], label: str) -> RemovableHandle:
    """One handle that removes ``handles`` (last first)."""
    def remove_all() -> None:
        for handle in reversed(handles):
            handle.remove()

    return RemovableHandle(remove_all, label)


def installed_patches() -> list[tuple[str, str]]:
    """(module, attribute) pairs currently replaced (for tests and introspection)."""
    return sorted(key for key, patch in _patches.items() if patch.shared.active)
