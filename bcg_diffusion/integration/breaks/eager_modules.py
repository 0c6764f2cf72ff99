"""Running chosen submodules as eager breaks of their own (and undoing it)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ...core.capture import eager_on_graph
from ...core.handles import RemovableHandle, patch_attribute


class EagerModules:
    """Parts of one transformer that run as eager breaks: submodules and methods of submodules.

    ``add`` wraps ``module.forward`` (an instance attribute, so nn.Module and diffusers hooks keep
    working) with :func:`eager_on_graph`; tuple results are boxed for the copy-back and unboxed
    for the caller. ``add_method`` does the same for another method of one module instance
    (``"patchify()"``). ``restore`` puts everything back exactly. The transformer is not kept here:
    the methods that look a submodule up take it as ``root`` (its runner owns it).
    """

    def __init__(self) -> None:
        self._modules: dict[str, tuple[torch.nn.Module, RemovableHandle]] = {}  # path -> module, its patch
        self._methods: dict[str, tuple[str, torch.nn.Module, str, RemovableHandle]] = {}  # label -> path, module, name, patch

    @property
    def names(self) -> list[str]:
        return list(self._modules) + list(self._methods)

    def add_method(self, root: torch.nn.Module, path: str, name: str) -> str:
        """Make method ``name`` of the submodule at ``path`` ("" for the root) an eager break."""
        label = f"{path + '.' if path else ''}{name}()"
        if label in self._methods:
            return label
        module = root.get_submodule(path) if path else root
        bound = getattr(module, name, None)
        if not callable(bound):
            raise ValueError(f"{type(module).__name__} at {path or 'the root'!r} has no method {name!r}")
        wrapped = torch._dynamo.disable(eager_on_graph(_named(bound, f"{type(module).__name__}.{name}")))
        self._methods[label] = (path, module, name, patch_attribute(module, name, wrapped))
        return label

    def method_paths(self, cls: type, name: str) -> list[str]:
        """Paths of the modules of class ``cls`` (exactly) whose method ``name`` already is an eager break."""
        return [path for path, module, method, _ in self._methods.values() if method == name and type(module) is cls]

    def module_paths(self, cls: type) -> list[str]:
        """Paths of the modules of class ``cls`` (exactly) that already run as eager breaks."""
        return [path for path, (module, _) in self._modules.items() if type(module) is cls]

    def add(self, root: torch.nn.Module, name: str) -> None:
        """Make the submodule of ``root`` at ``name`` ("" for ``root``) an eager break."""
        if name in self._modules:
            return
        module = root.get_submodule(name) if name else root
        wrapped = eager_on_graph(_named(module.forward, f"{type(module).__name__}.forward"))
        self._modules[name] = (module, patch_attribute(module, "forward", wrapped))

    @staticmethod
    def resolve(root: torch.nn.Module, patterns: tuple[str, ...]) -> list[str]:
        """Qualified names of the submodules of ``root`` matching ``patterns`` (a qualified name or a class name).

        Raises ``ValueError`` naming patterns that match nothing.
        """
        found, unmatched = [], []
        named = dict(root.named_modules())
        for pattern in patterns:
            if pattern in named and pattern:
                found.append(pattern)
                continue
            hits = [n for n, m in named.items() if n and type(m).__name__ == pattern]
            if not hits:
                unmatched.append(pattern)
            found.extend(hits)
        if unmatched:
            raise ValueError(
                f"eager_modules: no submodule of {type(root).__name__} is named or of class {unmatched}; "
                "use qualified names from transformer.named_modules() (e.g. 'transformer_blocks.3') or class names"
            )
        return found

    def restore(self) -> None:
        """Put every module's forward and every method back as it was."""
        for _, patch in self._modules.values():
            patch.remove()
        self._modules.clear()
        for _, _, _, patch in self._methods.values():
            patch.remove()
        self._methods.clear()


def _named(fn: Callable, qualname: str) -> Callable:
    """``fn`` behind a wrapper whose ``__qualname__`` is ``qualname`` (what logs and profiles show)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    run.__qualname__ = qualname
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # what python_code.innermost_function follows
    return run
