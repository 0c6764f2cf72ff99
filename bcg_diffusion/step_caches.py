"""Counting what a diffusers step cache computed and reused, with or without acceleration.

Under :func:`~bcg_diffusion.accelerate_pipeline` a step cache's hooks run on every call and the
modules they guard (blocks, attention modules) replay captured sub-graphs when the hooks compute
them (see :mod:`bcg_diffusion.integration.breaks.hooked_modules`). :func:`count_cache_passes` reports, for a block of
code, how many calls the cached modules received and in how many the cache computed the module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .accelerate import get_stats, is_accelerated
from .integration.model_hooks import ForwardHook, insert_innermost, remove_exactly
from .integration.model_state import STEP_CACHE_HOOKS, diffusers_hook_names

_COUNTER_HOOK = "bcg_pass_counter"

#: The class names of diffusers' step-cache hooks (FirstBlockCache, MagCache, TaylorSeer, PyramidAttentionBroadcast,
#: FasterCache): their Python runs on every call while the modules they guard replay. The one list, kept with
#: what the library does with each (``integration/model_state.py``); the toolkit removes and resets these hooks.
STEP_CACHE_HOOK_NAMES: tuple[str, ...] = tuple(STEP_CACHE_HOOKS)


@dataclass
class CachePasses:
    """Module passes of the cached modules: ``calls`` received, ``computed`` by the cache."""

    calls: int = 0
    computed: int = 0

    @property
    def reused(self) -> int:
        return self.calls - self.computed

    def __str__(self) -> str:
        return f"{self.computed} module passes computed, {self.reused} reused (of {self.calls})"


def cached_modules(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    """Submodules carrying a diffusers step-cache hook."""
    return [
        m for name, m in transformer.named_modules()
        if name and any(h in STEP_CACHE_HOOK_NAMES for h in diffusers_hook_names(m))
    ]


@contextlib.contextmanager
def count_cache_passes(transformer: torch.nn.Module) -> Iterator[CachePasses]:
    """Count the passes of ``transformer``'s cached modules made inside the block.

    Accelerated: read from the graph runner (replayed calls). Eager: counting hooks are put at
    both ends of each cached module's hook chain for the duration of the block.
    """
    counts = CachePasses()
    if is_accelerated(transformer):
        before = get_stats(transformer)
        try:
            yield counts
        finally:
            after = get_stats(transformer)
            counts.calls = after.hooked_module_calls - before.hooked_module_calls
            counts.computed = after.hooked_module_computed - before.hooked_module_computed
        return
    undo: list[Callable[[], None]] = []
    try:
        for module in cached_modules(transformer):
            undo.append(_count_calls(module, counts))
            insert_innermost(module, ForwardHook(lambda below: _counting(below, counts)), _COUNTER_HOOK)
            undo.append(lambda m=module: remove_exactly(m, _COUNTER_HOOK))
        yield counts
    finally:
        while undo:
            undo.pop()()


def _counting(below: Callable, counts: CachePasses) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        counts.computed += 1
        return below(*args, **kwargs)

    return run


def _count_calls(module: torch.nn.Module, counts: CachePasses) -> Callable[[], None]:
    had = "_call_impl" in module.__dict__
    previous = module.__dict__.get("_call_impl")
    chain = module._call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        counts.calls += 1
        return chain(*args, **kwargs)

    module.__dict__["_call_impl"] = call

    def restore() -> None:
        if had:
            module.__dict__["_call_impl"] = previous
        else:
            module.__dict__.pop("_call_impl", None)

    return restore
