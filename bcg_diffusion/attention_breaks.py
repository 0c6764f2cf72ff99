"""Attention kernels as eager breaks.

Two routes reach the attention kernel in diffusers: ``dispatch_attention_fn`` (imported by name
into each transformer module; Flux, Wan, QwenImage, HunyuanVideo, ...) and
``torch.nn.functional.scaled_dot_product_attention`` called directly by processors (SD3,
PixArt). Both are replaced, while at least one transformer is accelerated, by wrappers that are
plain calls outside a capture and eager breaks inside one. Everything around the kernel (QKV
projections, norms, RoPE) stays in the segments; the user's attention backend keeps running in
the break, as it reads its choice at call time.

At capture, the break does not run the real kernel on the placeholder data that capture feeds
it (a varlen backend would read garbage lengths): it allocates the output, from the graph pool,
with the exact shape and strides recorded for the same call during warm-up (so later segments see
the same layout as eager and pick the same kernels, and the pool reuses the memory).
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import attention_layouts
from .core.capture import eager_on_graph

_DISPATCH_NAME = "dispatch_attention_fn"
_lock = threading.Lock()
_patches: dict[tuple[str, str], "_Patch"] = {}

_IN_ATTENTION: contextvars.ContextVar[bool] = contextvars.ContextVar("bcg_in_attention", default=False)


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Callable
    refcount: int


def _make_break(original: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        if _IN_ATTENTION.get():
            return original(*args, **kwargs)
        token = _IN_ATTENTION.set(True)
        try:
            out = original(*args, **kwargs)
        finally:
            _IN_ATTENTION.reset(token)
        attention_layouts.record(args[0] if args else kwargs.get("query"), out)
        return out

    def capture_allocator(*args: Any, **kwargs: Any) -> Any:
        return attention_layouts.allocate_planned(args[0] if args else kwargs.get("query"))

    functools.update_wrapper(run, original)
    wrapped = eager_on_graph(capture_allocator=capture_allocator)(run)
    wrapped = torch._dynamo.disable(wrapped)  # compiled blocks graph-break here: attention stays eager
    wrapped.__bcg_original__ = original  # type: ignore[attr-defined]
    return wrapped


def _make_function_break(original: Callable) -> Callable:
    wrapped = torch._dynamo.disable(eager_on_graph(original))
    wrapped.__bcg_original__ = original  # type: ignore[attr-defined]
    return wrapped


def _acquire(owner: Any, attr: str, make: Callable[[Callable], Callable] = _make_break) -> tuple[str, str]:
    key = (getattr(owner, "__name__", repr(owner)), attr)
    patch = _patches.get(key)
    if patch is not None:
        patch.refcount += 1
        return key
    original = getattr(owner, attr)
    _patches[key] = _Patch(owner, attr, original, 1)
    setattr(owner, attr, make(original))
    return key


def _release(key: tuple[str, str]) -> None:
    patch = _patches.get(key)
    if patch is None:
        return
    patch.refcount -= 1
    if patch.refcount == 0:
        setattr(patch.owner, patch.attr, patch.original)
        del _patches[key]


def attention_modules(transformer: torch.nn.Module) -> tuple[list[Any], bool]:
    """Python modules whose ``dispatch_attention_fn`` this transformer's attention goes through,
    and whether some processor calls ``scaled_dot_product_attention`` directly."""
    candidates = {type(transformer).__module__}
    for module in transformer.modules():
        candidates.add(type(module).__module__)
        processor = getattr(module, "processor", None)
        if processor is not None:
            candidates.add(type(processor).__module__)
    with_dispatch, direct_sdpa = [], False
    for name in sorted(candidates):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        if callable(getattr(mod, _DISPATCH_NAME, None)):
            with_dispatch.append(mod)
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None:
            mod = sys.modules.get(type(processor).__module__)
            if mod is not None and getattr(mod, _DISPATCH_NAME, None) is None:
                direct_sdpa = True
    return with_dispatch, direct_sdpa


def install(transformer: torch.nn.Module, eager_functions: tuple[str, ...] = ()) -> Callable[[], None]:
    """Install the attention breaks this transformer needs, and make ``eager_functions`` (names of
    functions in the transformer's own module) eager breaks; returns the undo function."""
    modules, direct_sdpa = attention_modules(transformer)
    home = sys.modules[type(transformer).__module__]
    with _lock:
        keys = [_acquire(mod, _DISPATCH_NAME) for mod in modules]
        if direct_sdpa or not modules:
            keys.append(_acquire(torch.nn.functional, "scaled_dot_product_attention"))
        keys += [_acquire(home, name, _make_function_break) for name in eager_functions if callable(getattr(home, name, None))]

    def undo() -> None:
        with _lock:
            for key in keys:
                _release(key)

    return undo


def installed_patches() -> list[tuple[str, str]]:
    """(module, attribute) pairs currently patched (for tests and introspection)."""
    return sorted(_patches)
