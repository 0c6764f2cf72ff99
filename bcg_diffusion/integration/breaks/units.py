"""Module mode's unit calls: each call of a replay unit goes to the key's unit graphs.

For the duration of one transformer call in module mode (:mod:`..module_mode`), the call of every
replay unit (a block, a position embedder, ...) is intercepted below torch's ``__call__`` (its
instance ``_call_impl``, or ``_compiled_call_impl`` for a compiled module), so the unit's hooks and
what it calls run as they would; the handle puts every unit back.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...core.handles import RemovableHandle, patch_attribute
from ..model_hooks import call_attribute


def intercept(units: dict[str, torch.nn.Module], route: Callable[[str, Callable], Callable]) -> RemovableHandle:
    """Send every call of each unit (by path) to ``route(path, chain)``'s function, where ``chain``
    is what the call ran before; the handle undoes it (also undone here if installing fails)."""
    patches: list[RemovableHandle] = []

    def undo() -> None:
        for patch in reversed(patches):
            patch.remove()

    try:
        for path, module in units.items():
            attr = call_attribute(module)
            patches.append(patch_attribute(module, attr, route(path, getattr(module, attr))))
    except BaseException:
        undo()
        raise
    return RemovableHandle(undo, "module mode's unit calls", listed=False)
