"""Running chosen submodules as eager breaks of their own (and undoing it)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..core.capture import eager_on_graph

_MISSING = object()


class EagerModules:
    """Submodules of one transformer whose forward runs as an eager break.

    ``add`` wraps ``module.forward`` (an instance attribute, so nn.Module and diffusers hooks keep
    working) with :func:`eager_on_graph`; tuple results are boxed for the copy-back and unboxed
    for the caller. ``restore`` puts every forward back exactly.
    """

    def __init__(self, root: torch.nn.Module) -> None:
        self._root = root
        self._saved: dict[str, tuple[torch.nn.Module, Any]] = {}

    @property
    def names(self) -> list[str]:
        return list(self._saved)

    def add(self, name: str) -> None:
        if name in self._saved:
            return
        module = self._root.get_submodule(name) if name else self._root
        previous = module.__dict__.get("forward", _MISSING)
        self._saved[name] = (module, previous)
        module.forward = eager_on_graph(_bound_forward(module))

    def resolve(self, patterns: tuple[str, ...]) -> list[str]:
        """Qualified names of submodules matching ``patterns`` (a qualified name or a class name).

        Raises ``ValueError`` naming patterns that match nothing.
        """
        found, unmatched = [], []
        named = dict(self._root.named_modules())
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
                f"eager_modules: no submodule of {type(self._root).__name__} is named or of class {unmatched}; "
                "use qualified names from transformer.named_modules() (e.g. 'transformer_blocks.3') or class names"
            )
        return found

    def restore(self) -> None:
        for module, previous in self._saved.values():
            if previous is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self._saved.clear()


def _bound_forward(module: torch.nn.Module) -> Callable:
    forward = module.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    run.__qualname__ = f"{type(module).__name__}.forward"
    return run
