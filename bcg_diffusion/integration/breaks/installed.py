"""The breaks installed on one accelerated transformer, planned with its structure."""

from __future__ import annotations

import torch

from ...core.handles import RemovableHandle
from ..model_state import Structure
from . import attention, eager_functions
from .eager_modules import EagerModules
from .hooked_modules import HookedModules


class InstalledBreaks:
    """What one transformer runs as eager breaks: its ``eager`` modules and methods
    (``BCGConfig.eager_modules``, then what narrowing adds), its ``hooked`` modules (from its
    structure) and, shared with other transformers, the attention breaks and its family's eager
    functions. :meth:`apply` follows a new structure; :meth:`remove` undoes everything."""

    def __init__(self, root: torch.nn.Module, eager_module_patterns: tuple[str, ...], eager_function_names: tuple[str, ...]) -> None:
        self.eager = EagerModules()
        self.hooked = HookedModules()
        self._function_names = eager_function_names
        self._shared: list[RemovableHandle] = []
        for name in EagerModules.resolve(root, eager_module_patterns):  # raises for names that match nothing
            self.eager.add(root, name)

    def apply(self, root: torch.nn.Module, structure: Structure) -> None:
        """Install what ``structure`` needs: its hooked modules, and the shared breaks anew (installed
        before the old ones are removed, so a shared patch stays in place)."""
        self.hooked.apply(root, structure.hooked)
        old = self._shared
        self._shared = [attention.install(root), eager_functions.install(root, self._function_names)]
        for handle in old:
            handle.remove()

    def remove(self, root: torch.nn.Module) -> None:
        self.hooked.clear(root)
        self.eager.restore()
        for handle in self._shared:
            handle.remove()
        self._shared = []
