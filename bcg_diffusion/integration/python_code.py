"""Python around and inside the model that a graph key cannot see: replaced forwards, reassigned
class forwards, closures and partials set as ``forward``, custom attention processors.

A capture records the kernels that one call's Python chose. Code shipped with a module's class
(diffusers' and torch's own) decides on the host only from what the key holds (shapes, dtypes,
flags, weights, processors, hooks). Code put there by a user or a library (a TeaCache-style
forward, cache-dit's patched forward, a counter in a closure) may decide differently on every
call: replaying one captured decision would be silently wrong. Such code is *opaque*: the runner
runs it eagerly on every call, and replays the modules it calls (module mode).

Known pure replacements (cache-dit's patch functors, which re-implement diffusers' forwards
without host decisions) and what the user names in ``BCGConfig.pure_forwards`` are captured
like class code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Replacement forwards known to decide nothing per call on the host (module prefixes of their code).
KNOWN_PURE_PREFIXES = (
    "cache_dit.caching.patch_functors.",  # cache-dit's re-implementations of diffusers forwards
)
# Modules whose classes are trusted as they are (their forwards are class code).
_TRUSTED_PROCESSOR_PREFIXES = ("diffusers.", "torch.")  # this library ships no processor
_UNWRAP_DEPTH = 16


@dataclass(frozen=True)
class OpaqueCode:
    """A piece of opaque Python: where it is and what it is (shown in logs and stats)."""

    path: str  # module path in the transformer ("" for the transformer itself)
    what: str  # "forward replaced on the instance", "class forward reassigned", "custom attention processor",
    # "processor __call__ reassigned"
    code: str  # qualified name of the function or class

    def describe(self, root_name: str) -> str:
        where = f"{root_name}.{self.path}" if self.path else root_name
        return f"{where}: {self.what} ({self.code})"


def innermost_function(fn: Any) -> Any:
    """The plain function behind bound methods, ``functools.partial`` and ``functools.wraps``
    wrappers (bcg-diffusion's own eager-break wrappers included)."""
    for _ in range(_UNWRAP_DEPTH):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        else:
            return fn
    return fn


def qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}"


def is_pure(fn: Any, pure_names: tuple[str, ...]) -> bool:
    """True when ``fn``'s code is known or declared pure: its qualified name starts with one of
    :data:`KNOWN_PURE_PREFIXES` or equals / starts with (for entries ending in ``.``) an entry
    of ``pure_names``."""
    name = qualified_name(innermost_function(fn))
    if name.startswith(KNOWN_PURE_PREFIXES):
        return True
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in pure_names)


def _defining_class(cls: type, attr: str) -> type | None:
    for klass in cls.__mro__:
        if attr in klass.__dict__:
            return klass
    return None


@functools.lru_cache(maxsize=512)
def _class_forward_reassigned(cls: type, fn: Any) -> str | None:
    """The qualified name of ``cls.forward`` (the function ``fn``) when it is not the function
    written in the body of the class that holds it (``Model.forward = my_forward``)."""
    owner = _defining_class(cls, "forward")
    if owner is None or owner is torch.nn.Module:
        return None
    code = innermost_function(fn)
    expected = f"{owner.__qualname__}.forward"
    if getattr(code, "__qualname__", None) == expected and getattr(code, "__module__", None) == owner.__module__:
        return None
    return qualified_name(code)


def class_forward_reassigned(module: torch.nn.Module, pure_names: tuple[str, ...]) -> str | None:
    """Qualified name of the opaque function that ``type(module).forward`` was reassigned to, or ``None``."""
    cls = type(module)
    fn = _defining_class(cls, "forward")
    if fn is None:
        return None
    function = fn.__dict__["forward"]
    try:
        name = _class_forward_reassigned(cls, function)
    except TypeError:  # unhashable descriptor: look without the cache
        name = _class_forward_reassigned.__wrapped__(cls, function)
    if name is None or is_pure(function, pure_names):
        return None
    return name


def is_class_forward(module: torch.nn.Module, fn: Any) -> bool:
    """True when ``fn`` is ``module``'s own class forward, bound to it (what ``module.forward``
    is when nothing replaced it)."""
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is type(module).forward


def _is_class_code(module: torch.nn.Module, fn: Any) -> bool:
    """``fn``'s code is the forward written in the body of one of ``module``'s classes (a bound
    method kept from before a class forward was reassigned, say)."""
    code = innermost_function(fn)
    name, where = getattr(code, "__qualname__", None), getattr(code, "__module__", None)
    return any(name == f"{klass.__qualname__}.forward" and where == klass.__module__ for klass in type(module).__mro__)


def classify_forward(module: torch.nn.Module, fn: Callable, path: str, pure_names: tuple[str, ...]) -> OpaqueCode | None:
    """Whether running ``fn`` as ``module``'s forward is opaque Python (see the module docstring)."""
    if is_class_forward(module, fn):
        reassigned = class_forward_reassigned(module, pure_names)
        return OpaqueCode(path, "class forward reassigned", reassigned) if reassigned else None
    if _is_class_code(module, fn) or is_pure(fn, pure_names):
        return None
    return OpaqueCode(path, "forward replaced on the instance", qualified_name(innermost_function(fn)))


def _call_reassigned(cls: type) -> Any:
    """The function that ``cls.__call__`` was reassigned to (``Processor.__call__ = my_call``), or
    ``None`` when it is the ``__call__`` written in the body of the class that holds it."""
    owner = _defining_class(cls, "__call__")
    if owner is None or owner is object:
        return None
    function = owner.__dict__["__call__"]
    try:
        return _foreign_call(owner, function)
    except TypeError:  # unhashable descriptor: look without the cache
        return _foreign_call.__wrapped__(owner, function)


@functools.lru_cache(maxsize=512)
def _foreign_call(owner: type, function: Any) -> Any:
    code = innermost_function(function)
    expected = f"{owner.__qualname__}.__call__"
    if getattr(code, "__qualname__", None) == expected and getattr(code, "__module__", None) == owner.__module__:
        return None
    return function


def custom_processor(processor: Any, path: str, pure_names: tuple[str, ...]) -> OpaqueCode | None:
    """An attention processor whose class does not come from diffusers (or torch, or this library),
    or whose class ``__call__`` was reassigned, and is not declared pure: its ``__call__`` is Python
    the key cannot see."""
    if processor is None:
        return None
    cls = type(processor)
    if cls.__module__.startswith(_TRUSTED_PROCESSOR_PREFIXES):
        reassigned = _call_reassigned(cls)
        if reassigned is None or is_pure(reassigned, pure_names):
            return None
        return OpaqueCode(path, "processor __call__ reassigned", qualified_name(innermost_function(reassigned)))
    call = getattr(cls, "__call__", None)
    if is_pure(cls, pure_names) or (call is not None and is_pure(call, pure_names)):
        return None
    return OpaqueCode(path, "custom attention processor", qualified_name(cls))
