"""bcg-diffusion's own diffusers ``ModelHook``s, placed at the bottom of a module's hook chain.

diffusers' ``HookRegistry.register_hook`` puts a new hook outermost. Our hooks must be innermost
(below every other hook, whenever it was registered), so that the other hooks' Python runs on every
call while what is below them replays: :func:`insert_innermost` does that, and
:func:`remove_exactly` takes one hook out wherever it sits, relinking the chain correctly for
neighbours that use ``new_forward`` (diffusers' own removal rewrites the next hook's ``forward``,
which drops a ``new_forward`` there). Hooks registered later stay in place when ours is removed.

Our hooks refuse ``copy.deepcopy``: the chain's closures would keep calling the original's graphs.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import HookFunctionReference

from ..errors import AccelerationError

_REGISTRY_ATTR = "_diffusers_hook"
_CREATED_MARK = "_bcg_created_registry"

DEEPCOPY_MESSAGE = (
    "an accelerated model cannot be deep-copied: its forward chain and captured CUDA graphs belong to "
    "the original module. Call bcg_diffusion.remove_acceleration() first, deep-copy, then accelerate the "
    "original and the copy separately (or share components with Pipeline.from_pipe, which is supported)."
)


class BCGHook(ModelHook):
    """Base of our hooks: ``new_forward`` calls ``self.target`` (set by the subclass)."""

    def __deepcopy__(self, memo: dict) -> Any:
        raise AccelerationError(DEEPCOPY_MESSAGE)


class ForwardHook(BCGHook):
    """Runs ``function(*args, **kwargs)`` in place of the forward below it (which it is given)."""

    def __init__(self, make_function: Callable[[Callable], Callable], stateful_reset: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._make_function = make_function
        self._reset = stateful_reset
        self.function: Callable | None = None
        self._is_stateful = stateful_reset is not None

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def reset_state(self, module: torch.nn.Module) -> torch.nn.Module:
        # Called by diffusers at the end of every pipeline call (maybe_free_model_hooks ->
        # _reset_stateful_cache), for every pipeline sharing this module (from_pipe).
        if self._reset is not None:
            self._reset()
        return module


def _calling(hook: BCGHook) -> Callable:
    def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return hook.new_forward(module, *args, **kwargs)

    forward.__qualname__ = f"{type(hook).__name__}.new_forward"
    return forward


def registry_of(module: torch.nn.Module) -> HookRegistry | None:
    return module.__dict__.get(_REGISTRY_ATTR)


def insert_innermost(module: torch.nn.Module, hook: ForwardHook, name: str) -> None:
    """Register ``hook`` under ``name`` below every hook ``module`` has; ``hook.function`` becomes
    ``make_function(forward_below)``."""
    created = registry_of(module) is None
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if created:
        setattr(registry, _CREATED_MARK, True)
    if name in registry.hooks:
        raise ValueError(f"{type(module).__name__} already has a hook named {name!r}")
    hook.initialize_hook(module)
    if registry._fn_refs:
        holder, attr = _slot_below(registry._fn_refs[0])
        below = getattr(holder, attr)
    else:
        holder, attr, below = None, "forward", module.forward
    fn_ref = HookFunctionReference()
    fn_ref.pre_forward = hook.pre_forward
    fn_ref.post_forward = hook.post_forward
    fn_ref.original_forward = below
    # A bound method, as ``module.forward = fn`` leaves it: code that saves it and later puts it back
    # with ``saved.__get__(module)`` (cache-dit's disable_cache) gets this very object again.
    fn_ref.forward = types.MethodType(_calling(hook), module)
    hook.function = hook._make_function(below)
    hook.fn_ref = fn_ref
    if holder is None:
        module.forward = fn_ref.forward
    else:
        setattr(holder, attr, fn_ref.forward)
    registry.hooks[name] = hook
    registry._hook_order.insert(0, name)
    registry._fn_refs.insert(0, fn_ref)


def remove_exactly(module: torch.nn.Module, name: str) -> bool:
    """Remove hook ``name`` from ``module``'s chain wherever it sits; False if it is not there."""
    registry = registry_of(module)
    if registry is None or name not in registry.hooks:
        return False
    index = registry._hook_order.index(name)
    fn_ref = registry._fn_refs[index]
    below = fn_ref.original_forward if fn_ref.original_forward is not None else fn_ref.forward
    if index == len(registry._hook_order) - 1:
        if _is_class_forward(module, below):
            module.__dict__.pop("forward", None)
        else:
            module.forward = below
    else:
        holder, attr = _slot_below(registry._fn_refs[index + 1])
        setattr(holder, attr, below)
    hook = registry.hooks.pop(name)
    registry._hook_order.pop(index)
    registry._fn_refs.pop(index)
    hook.deinitalize_hook(module)
    if not registry.hooks and getattr(registry, _CREATED_MARK, False):
        module.__dict__.pop(_REGISTRY_ATTR, None)
    return True


def hooks_of(module: torch.nn.Module) -> list[tuple[str, ModelHook]]:
    """``(name, hook)`` of ``module``'s diffusers hooks, innermost first."""
    registry = registry_of(module)
    if registry is None:
        return []
    return [(n, registry.hooks[n]) for n in registry._hook_order]


def _slot_below(fn_ref: HookFunctionReference) -> tuple[Any, str]:
    """Where a hook keeps the forward it wraps: ``original_forward`` for ``new_forward`` hooks."""
    return fn_ref, "original_forward" if fn_ref.original_forward is not None else "forward"


def _is_class_forward(module: torch.nn.Module, fn: Any) -> bool:
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is type(module).forward


def call_attribute(module: torch.nn.Module) -> str:
    """The instance attribute through which ``module``'s calls go, where an interceptor goes: its
    compiled call (``module.compile()``) or torch's ``_call_impl``."""
    return "_compiled_call_impl" if module.__dict__.get("_compiled_call_impl") is not None else "_call_impl"


def invalidate_registry_caches(root: torch.nn.Module) -> None:
    """Drop diffusers' cached lists of child registries under ``root`` (cache_context() walks them);
    call after adding or removing registries below ``root``."""
    for sub in root.modules():
        registry = registry_of(sub)
        if registry is not None:
            registry._child_registries_cache = None
