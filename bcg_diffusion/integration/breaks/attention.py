"""Attention kernels as eager breaks.

Two routes reach the attention kernel in diffusers: ``dispatch_attention_fn`` (imported by name
into each transformer module; Flux, Wan, QwenImage, HunyuanVideo, ...) and
``torch.nn.functional.scaled_dot_product_attention`` called directly by processors (SD3,
PixArt). Both are replaced, while at least one transformer is accelerated (reference-counted
patches), by wrappers that are plain calls outside a capture and, inside one, eager breaks, or,
under the ``"capture_safe"`` policy, captured inline where the backend is a torch SDPA kernel
(:data:`CAPTURE_SAFE_BACKENDS`). Everything around the kernel (QKV projections, norms, RoPE) stays
in the segments; the user's attention backend keeps running in the break, as it reads its choice
at call time. Traced by torch.compile, a wrapper becomes a custom op (:mod:`..attention_op`).

At capture, the break does not run the real kernel on the placeholder data that capture feeds
it (a varlen backend would read garbage lengths): it allocates the output, from the graph pool,
with the exact shape and strides recorded for the same call during warm-up (so later segments see
the same layout as eager and pick the same kernels, and the pool reuses the memory).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import Any, Callable, Iterator

import torch

from .. import attention_layouts, attention_op
from ...core.capture import eager_on_graph, is_capturing_breakable
from ...core.handles import RemovableHandle
from .shared import acquire, group

_DISPATCH_NAME = "dispatch_attention_fn"
_SDPA_NAME = "scaled_dot_product_attention"
# diffusers backends that run torch SDPA kernels at a fixed shape without host reads, and the
# functions diffusers registers for them (a backend replaced in the registry is not trusted)
CAPTURE_SAFE_BACKENDS = {
    "native": "_native_attention",
    "_native_flash": "_native_flash_attention",
    "_native_efficient": "_native_efficient_attention",
    "_native_cudnn": "_native_cudnn_attention",
    "_native_math": "_native_math_attention",
}
_IN_ATTENTION: contextvars.ContextVar[bool] = contextvars.ContextVar("bcg_in_attention", default=False)
_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar("bcg_attention_policy", default="break")


def _make_break(original: Callable, kind: str) -> Callable:
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
    eager_break = eager_on_graph(capture_allocator=capture_allocator)(run)

    def call(*args: Any, **kwargs: Any) -> Any:
        if _POLICY.get() == "capture_safe" and not _IN_ATTENTION.get() and is_capturing_breakable() and _capture_safe(kind, kwargs):
            attention_layouts.skip_planned()
            return run(*args, **kwargs)  # captured inline: the backend and mask layout are in the key
        return eager_break(*args, **kwargs)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced: one custom-op node instead of a graph break
            return attention_op.traced_call(kind, call, args, kwargs)
        return call(*args, **kwargs)

    functools.update_wrapper(wrapper, original)
    wrapper.__bcg_original__ = original  # type: ignore[attr-defined]
    wrapper.__bcg_eager_call__ = call  # type: ignore[attr-defined]
    return wrapper


def _capture_safe(kind: str, kwargs: dict) -> bool:
    """Whether this attention call may be captured: torch SDPA, or diffusers' dispatch with a native
    SDPA backend (its registered function still diffusers' own) and no context-parallel config."""
    if kind == "sdpa":
        return True
    if kwargs.get("parallel_config") is not None:
        return False
    from diffusers.models import attention_dispatch as ad

    backend = kwargs.get("backend")
    if backend is None:
        backend = ad._AttentionBackendRegistry._active_backend
    name = str(getattr(backend, "value", backend))
    function_name = CAPTURE_SAFE_BACKENDS.get(name)
    if function_name is None:
        return False
    registered = ad._AttentionBackendRegistry._backends.get(ad.AttentionBackendName(name))
    return registered is not None and registered is getattr(ad, function_name, None)


@contextlib.contextmanager
def policy(name: str) -> Iterator[None]:
    """Attention policy for captures in the block: ``"break"`` or ``"capture_safe"``."""
    token = _POLICY.set(name)
    try:
        yield
    finally:
        _POLICY.reset(token)


def _make_dispatch_break(original: Callable) -> Callable:
    return _make_break(original, "dispatch")


def _make_sdpa_break(original: Callable) -> Callable:
    return _make_break(original, "sdpa")


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


def install(transformer: torch.nn.Module) -> RemovableHandle:
    """Install the attention breaks this transformer needs; the handle removes them (a patch shared
    with other transformers stays until its last handle is removed)."""
    modules, direct_sdpa = attention_modules(transformer)
    handles = [acquire(mod, _DISPATCH_NAME, _make_dispatch_break) for mod in modules]
    if direct_sdpa or not modules:
        handles.append(acquire(torch.nn.functional, _SDPA_NAME, _make_sdpa_break))
    return group(handles, f"attention breaks of {type(transformer).__name__}")
