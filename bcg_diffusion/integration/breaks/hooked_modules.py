"""Hooked submodules: their hooks run eagerly on every call while their own kernels replay.

For each submodule with hooks (a step cache's hooks on blocks or attention modules, a user's
``ModelHook``, torch forward hooks), :class:`HookedModules` installs:

- an *outer* interceptor of the module's call (an instance ``_call_impl``, or
  ``_compiled_call_impl`` for a compiled module), which makes each call a hooked call of the
  enclosing capture (:func:`bcg_diffusion.core.hooked_calls.hooked_call`): the whole call, torch
  and diffusers hooks included, is the eager part, and the module's body becomes a sub-graph;
- where the rule allows the body to replay (diffusers' step-cache hooks), a ``bcg_body`` hook at the
  bottom of the module's diffusers hook chain: the :class:`CapturedBody` the hooks call.

Every change is undone by :meth:`HookedModules.clear`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...core.handles import RemovableHandle, patch_attribute
from ...core.hooked_calls import CapturedBody, hooked_call
from ..model_hooks import ForwardHook, call_attribute, insert_innermost, invalidate_registry_caches, registry_of, remove_exactly
from ..model_state import HookedModule, HookRule

BODY_HOOK = "bcg_body"


@dataclass
class _Installed:
    module: torch.nn.Module
    spec: HookedModule
    body: CapturedBody
    interceptor: RemovableHandle
    has_body_hook: bool


class HookedModules:
    """The interceptors of one transformer's hooked submodules (see the module docstring)."""

    def __init__(self) -> None:
        self._installed: dict[str, _Installed] = {}

    @property
    def bodies(self) -> list[CapturedBody]:
        return [i.body for i in self._installed.values() if i.spec.rule.replay_body]

    def apply(self, root: torch.nn.Module, hooked: tuple[HookedModule, ...]) -> None:
        """Make the installed interceptors in ``root`` (the transformer, owned by its runner) match ``hooked``."""
        wanted = {h.path: h for h in hooked}
        for path in list(self._installed):
            if wanted.get(path) != self._installed[path].spec:
                self._uninstall(path)
        for path, spec in wanted.items():
            if path not in self._installed:
                self._install(root, spec)
        invalidate_registry_caches(root)

    def clear(self, root: torch.nn.Module) -> None:
        for path in list(self._installed):
            self._uninstall(path)
        invalidate_registry_caches(root)

    def _install(self, root: torch.nn.Module, spec: HookedModule) -> None:
        module = root.get_submodule(spec.path)
        name = f"{spec.path} ({type(module).__name__})"
        rule: HookRule = spec.rule
        if rule.replay_body:
            hook = ForwardHook(lambda below: CapturedBody(below, name))
            insert_innermost(module, hook, BODY_HOOK)
            body = hook.function
        else:
            body = CapturedBody(_forward_below_hooks(module), name)  # captured for its outputs' layout only
        attr = call_attribute(module)
        interceptor = patch_attribute(module, attr, _interceptor(getattr(module, attr), body, rule))
        self._installed[spec.path] = _Installed(module, spec, body, interceptor, rule.replay_body)

    def _uninstall(self, path: str) -> None:
        installed = self._installed.pop(path)
        installed.interceptor.remove()
        if installed.has_body_hook:
            remove_exactly(installed.module, BODY_HOOK)


def _interceptor(chain: Callable, body: CapturedBody, rule: HookRule) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return hooked_call(
            chain,
            body,
            args,
            kwargs,
            fresh_outputs=rule.fresh_outputs,
            retain_args=rule.retain_args,
            replay_body=rule.replay_body,
        )

    call.__bcg_interceptor__ = True  # type: ignore[attr-defined]
    return call


def _forward_below_hooks(module: torch.nn.Module) -> Callable:
    """The forward at the bottom of ``module``'s diffusers hook chain (its own forward)."""
    registry = registry_of(module)
    if registry is not None and registry._fn_refs:
        ref = registry._fn_refs[0]
        return ref.original_forward if ref.original_forward is not None else ref.forward
    return module.forward
