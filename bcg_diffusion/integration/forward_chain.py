"""Which forward an accelerated transformer's call runs, whatever is assigned to its ``forward``.

Libraries and users replace a transformer's ``forward`` before or after acceleration: cache-dit's
``enable_cache`` sets a ``functools.partial`` that swaps the block lists for its cached blocks and
calls the forward it found; TeaCache-style scripts set a function that keeps counters and skips
the blocks on some steps; ``disable_cache`` puts back what was there. Eager PyTorch runs whatever
``module.forward`` is at call time; so must a replay.

:class:`ForwardChain` keeps *levels* of forwards. Level 0 is what ran below bcg-diffusion's
diffusers hook at acceleration (the class forward, looked up anew on every call so that a
reassigned class forward is seen, or a replacement made before acceleration). A forward assigned
to ``module.forward`` after acceleration becomes the next level: the chain puts a *link* of its
own in ``module.forward`` (a bound method, as Python assigns it) that enters the graph runner at
that level, and keeps the foreign forward as the level's code. A foreign forward that calls the
forward it replaced (its saved ``module.forward``) calls a link of a lower level, which the runner
runs as a nested, eager call. Assigning back a link (``disable_cache`` restoring what it saved),
the class forward, or deleting the instance attribute drops the levels above.

A guard in the module's instance ``_call_impl`` (below torch's own ``__call__``, above its forward
hooks) checks on every call that ``module.forward`` is still what the chain expects (one identity
comparison) and re-links otherwise. Everything is undone by :meth:`ForwardChain.remove`.
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any, Callable

import torch

from ..core.handles import patch_attribute
from .python_code import is_class_forward, qualified_name

logger = logging.getLogger("bcg_diffusion")

_DIFFUSERS_OUTER = "HookRegistry.register_hook.<locals>.create_new_forward.<locals>.new_forward"


def _is_diffusers_hook_forward(fn: Any) -> bool:
    """``module.forward`` as diffusers' HookRegistry sets it for its outermost hook."""
    return isinstance(fn, functools.partial) and getattr(fn.func, "__qualname__", "") == _DIFFUSERS_OUTER


class ClassForward:
    """Level 0 when nothing replaced the forward: ``type(module).forward`` bound anew each call."""

    def __repr__(self) -> str:
        return "<class forward>"


CLASS_FORWARD = ClassForward()


class ForwardChain:
    """The forward levels of one transformer (see the module docstring).

    ``enter(level, args, kwargs)`` is what a link calls; the runner provides it. ``on_change()`` is
    called after the levels changed (the runner drops its graphs and re-plans).
    """

    def __init__(
        self, module: torch.nn.Module, base: Any, base_link: Callable, hook_ref: Any, enter: Callable,
        on_change: Callable[[], None],
    ) -> None:
        self.module = module
        self._hook_ref = hook_ref  # the bcg_graphs hook's diffusers function reference (its original_forward is level 0)
        self._enter = enter
        self._on_change = on_change
        self.forwards: list[Any] = [CLASS_FORWARD if is_class_forward(module, base) else base]
        self.links: list[Callable] = [base_link]
        self._expected: Any = module.__dict__.get("forward")  # None: no instance forward
        self._chained_call_impl = module._call_impl
        self._guard = patch_attribute(module, "_call_impl", self._guarded_call)

    # -- what runs ------------------------------------------------------------------------------
    @property
    def top(self) -> int:
        return len(self.forwards) - 1

    def forward_at(self, level: int) -> Callable:
        """The callable that level ``level`` runs (the class forward bound now, for level 0)."""
        fn = self.forwards[level]
        if fn is CLASS_FORWARD:
            return type(self.module).forward.__get__(self.module)
        return fn

    def describe(self, level: int) -> str:
        fn = self.forwards[level]
        return "class forward" if fn is CLASS_FORWARD else qualified_name(fn)

    # -- the guard ------------------------------------------------------------------------------
    def _guarded_call(self, *args: Any, **kwargs: Any) -> Any:
        if self.module.__dict__.get("forward") is not self._expected:
            self.relink()
        return self._chained_call_impl(*args, **kwargs)

    def relink(self) -> None:
        """Bring the levels in line with what ``module.forward`` is now."""
        current = self.module.__dict__.get("forward")
        name = type(self.module).__name__
        if current is None or is_class_forward(self.module, current):
            logger.info("bcg: %s's forward was set back to its class forward; the graphs follow it", name)
            self.forwards, self.links = [CLASS_FORWARD], self.links[:1]
            self._hook_ref.original_forward = type(self.module).forward.__get__(self.module)
            self._set_forward(self.links[0])
        elif any(current is link for link in self.links):
            level = next(i for i, link in enumerate(self.links) if current is link)
            logger.info("bcg: %s's forward was set back to %s; the graphs follow it", name, self.describe(level))
            del self.forwards[level + 1:], self.links[level + 1:]
            self._expected = current
        elif _is_diffusers_hook_forward(current):
            self._expected = current  # a diffusers hook registered above the chain: it calls down into it
            return
        else:
            level = len(self.forwards)
            logger.debug("bcg: %s's forward was replaced by %s after acceleration", name, qualified_name(current))
            self.forwards.append(current)
            self.links.append(types.MethodType(_make_link(self._enter, level), self.module))
            self._set_forward(self.links[-1])
        self._on_change()

    def _set_forward(self, fn: Callable) -> None:
        self.module.__dict__["forward"] = fn
        self._expected = fn

    def remove(self) -> None:
        """Put back the instance ``_call_impl``, and in ``module.forward`` the forward last assigned
        (a foreign forward stays where its owner put it). Links left in foreign code still work:
        after removal they run their level's forward eagerly (the runner passes them through)."""
        self._guard.remove()
        if self.top > 0:
            self.module.__dict__["forward"] = self.forwards[-1]
        elif self.module.__dict__.get("forward") is self.links[0] or "forward" not in self.module.__dict__:
            if self.forwards[0] is CLASS_FORWARD:
                self.module.__dict__.pop("forward", None)
            else:
                self.module.__dict__["forward"] = self.forwards[0]


def _make_link(enter: Callable, level: int) -> Callable:
    def link(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return enter(level, args, kwargs)

    link.__qualname__ = f"bcg_forward_link_{level}"
    return link
