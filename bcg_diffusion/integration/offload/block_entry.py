"""Each streamed block's *entry*: what runs first in the block's forward, below every hook it has.

The entry is a wrapper put at the bottom of the block's forward chain: the block's ``forward`` where no
diffusers hook is on it, else the slot below its innermost hook. Hooks registered later go above it
(diffusers' own, and the graph runner's ``bcg_body`` of a hooked block), so a step cache's hook decides
first and the entry runs only where the block really computes; under capture the entry is a break inside
the block's captured body. The wrapper's ``__wrapped__`` is the forward it wraps, so the runner sees the
block's own class code (not opaque Python). :func:`install_entry`'s handle takes it out wherever it sits.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from ...core.handles import RemovableHandle
from ..model_hooks import registry_of
from ..python_code import is_class_forward

logger = logging.getLogger("bcg_diffusion")


def _slot_below_hooks(block: torch.nn.Module) -> tuple[Any, str]:
    """Where the forward below ``block``'s innermost diffusers hook is kept, or ``(None, "forward")``."""
    registry = registry_of(block)
    if registry is None or not registry._fn_refs:
        return None, "forward"
    ref = registry._fn_refs[0]
    return ref, "original_forward" if ref.original_forward is not None else "forward"


def _entry(enter: Callable[[int], None], index: int, below: Callable) -> Callable:
    def forward(*args: Any, **kwargs: Any) -> Any:
        enter(index)
        return below(*args, **kwargs)

    forward.__wrapped__ = below  # type: ignore[attr-defined]  # the block's own code, for python_code
    forward.__bcg_streaming_entry__ = index  # type: ignore[attr-defined]
    return forward


def install_entry(block: torch.nn.Module, index: int, enter: Callable[[int], None], label: str) -> RemovableHandle:
    """Put the entry ``enter(index)`` at the bottom of ``block``'s forward chain; the handle removes it."""
    holder, attr = _slot_below_hooks(block)
    below = getattr(holder, attr) if holder is not None else block.forward
    wrapper = _entry(enter, index, below)
    if holder is None:
        block.__dict__["forward"] = wrapper
    else:
        setattr(holder, attr, wrapper)
    return RemovableHandle(lambda: _take_out(block, wrapper), label)


def _take_out(block: torch.nn.Module, wrapper: Callable) -> None:
    below = wrapper.__wrapped__  # type: ignore[attr-defined]
    registry = registry_of(block)
    for ref in (registry._fn_refs if registry is not None else []):
        for attr in ("original_forward", "forward"):
            if getattr(ref, attr, None) is wrapper:
                setattr(ref, attr, below)
                return
    if block.__dict__.get("forward") is wrapper:
        if is_class_forward(block, below):
            del block.__dict__["forward"]
        else:
            block.__dict__["forward"] = below
        return
    logger.warning("bcg: weight streaming: the entry of %s was replaced by other code; it was left where it is",
                   type(block).__name__)
