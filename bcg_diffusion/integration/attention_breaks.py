"""Attention kernels as eager breaks.

Two routes reach the attention kernel in diffusers: ``dispatch_attention_fn`` (imported by name
into each transformer module; Flux, Wan, QwenImage, HunyuanVideo, ...) and
``torch.nn.functional.scaled_dot_product_attention`` called directly by processors (SD3,
PixArt). Both are replaced, while at least one transformer is accelerated (reference-counted
patches), by wrappers that are plain calls outside a capture and, inside one, eager breaks, or,
under the ``"capture_safe"`` policy, captured inline where the backend is a torch SDPA kernel
(:data:`CAPTURE_SAFE_BACKENDS`). Everything around the kernel (QKV projections, norms, RoPE) stays
in the segments; the user's attention backend keeps running in the break, as it reads its choice
at call time. Traced by torch.compile, a wrapper becomes a custom op (:mod:`.attention_op`).

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
import threading
from typing import Any, Callable, Iterator

import torch

from . import attention_layouts, attention_op
from ..core.capture import eager_on_graph, is_capturing_breakable
from ..core.handles import RemovableHandle, SharedPatch

_DISPATCH_NAME = "dispatch_attention_fn"
_SDPA_NAME = "scaled_dot_product_attention"
_KINDS = {_DISPATCH_NAME: "dispatch", _SDPA_NAME: "sdpa"}
# diffusers backends that run torch SDPA kernels at a fixed shape without host reads, and the
# functions diffusers registers for them (a backend replaced in the registry is not trusted)
CAPTURE_SAFE_BACKENDS = {
    "native": "_native_attention",
    "_native_flash": "_native_flash_attention",
    "_native_efficient": "_native_efficient_attention",
    "_native_cudnn": "_native_cudnn_attention",
    "_native_math": "_native_math_attention",
}
_lock = threading.Lock()
_patches: dict[tuple[str, str], "_Patch"] = {}

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


def _make_function_break(original: Callable) -> Callable:
    wrapped = torch._dynamo.disable(eager_on_graph(original))
    wrapped.__bcg_original__ = original  # type: ignore[attr-defined]
    return wrapped


class _Patch:
    """``owner.attr`` replaced by ``make(original)`` while any handle of it is live."""

    def __init__(self, owner: Any, attr: str, make: Callable[[Callable], Callable]) -> None:
        self.owner, self.attr, self.make = owner, attr, make
        self.original: Callable | None = None
        self.replacement: Callable | None = None
        self.shared = SharedPatch(f"{getattr(owner, '__name__', owner)}.{attr}", self._apply, self._revert)

    def _apply(self) -> None:
        self.original = getattr(self.owner, self.attr)
        self.replacement = self.make(self.original)
        setattr(self.owner, self.attr, self.replacement)
        eager_call = getattr(self.replacement, "__bcg_eager_call__", None)
        if eager_call is not None:
            attention_op.register_eager_call(_KINDS[self.attr], eager_call)

    def _revert(self) -> None:
        setattr(self.owner, self.attr, self.original)
        eager_call = getattr(self.replacement, "__bcg_eager_call__", None)
        if eager_call is not None:
            attention_op.unregister_eager_call(_KINDS[self.attr], eager_call)
        self.original = self.replacement = None


def _acquire(owner: Any, attr: str, make: Callable[[Callable], Callable]) -> RemovableHandle:
    key = (getattr(owner, "__name__", repr(owner)), attr)
    with _lock:
        patch = _patches.get(key)
        if patch is None:
            patch = _patches[key] = _Patch(owner, attr, make)
    return patch.shared.acquire()


def _group(handles: list[RemovableHandle], label: str) -> RemovableHandle:
    def remove_all() -> None:
        for handle in reversed(handles):
            handle.remove()

    return RemovableHandle(remove_all, label)


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


def install(transformer: torch.nn.Module, eager_functions: tuple[str, ...] = ()) -> RemovableHandle:
    """Install the attention breaks this transformer needs, and make ``eager_functions`` (names of
    functions in the transformer's own module) eager breaks; the handle removes them (a patch
    shared with other transformers stays until its last handle is removed)."""
    modules, direct_sdpa = attention_modules(transformer)
    home = sys.modules[type(transformer).__module__]
    handles = [_acquire(mod, _DISPATCH_NAME, _make_dispatch_break) for mod in modules]
    if direct_sdpa or not modules:
        handles.append(_acquire(torch.nn.functional, _SDPA_NAME, _make_sdpa_break))
    handles += [_acquire(home, name, _make_function_break) for name in eager_functions if callable(getattr(home, name, None))]
    return _group(handles, f"attention breaks of {type(transformer).__name__}")


def installed_patches() -> list[tuple[str, str]]:
    """(module, attribute) pairs currently patched (for tests and introspection)."""
    return sorted(key for key, patch in _patches.items() if patch.shared.active)
