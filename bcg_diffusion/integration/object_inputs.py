"""Plain Python objects among a call's inputs (a KV cache, a settings object): keyed by their structure, their
tensors read like any other tensor input.

Pipelines pass objects they make per call: Flux.2 Klein KV and Qwen-Image 2.1 make a new KV-cache object in each
pipeline call, holding the prefix tokens' keys and values. An object is keyed by its class, its attribute names and
the values of its other attributes (nested objects, lists, tuples and dicts down to :data:`OBJECT_DEPTH` levels;
anything else, a module or a function say, by identity: :class:`Opaque`); its tensors join the call's tensors, so a
capture reads static copies of them and a replay copies the live object's tensors in first. A new object of the same
structure therefore replays the graph with its own values. The capture runs on a copy of the object
(:func:`copy_with`) that holds the static copies.

A call that changes an object it was given (assigns an attribute, writes one of its tensors in place) cannot be
replayed, since a replay runs none of its Python: :func:`witness` records what such a change alters (identities,
addresses and version counters), and the runner compares it before and after a warm-up call
(:meth:`~.keys.Call.changes`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

__all__ = ["OBJECT_DEPTH", "OBJECT_ITEMS", "ObjectLayout", "Opaque", "copy_with", "copyable", "is_plain_object",
           "object_leaves", "witness"]

#: Levels of nesting below an input object that are keyed by value; deeper containers are :class:`Opaque`.
OBJECT_DEPTH = 4
#: Longer lists, tuples and dicts inside an object are :class:`Opaque`.
OBJECT_ITEMS = 512


@dataclass(frozen=True)
class ObjectLayout:
    """The key field of a plain object: its class (module and qualified name) and attribute names (the attributes
    follow as fields of their own, ``path.name``)."""

    type_name: str
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.type_name} object ({', '.join(self.names)})"


@dataclass(frozen=True)
class Opaque:
    """A value inside an input object that is keyed by identity (a module, a function, nesting too deep)."""

    type_name: str
    identity: int

    def __str__(self) -> str:
        return f"{self.type_name} at {self.identity:#x}"


def is_plain_object(value: Any) -> bool:
    """An instance with a ``__dict__`` that is not a class, a module, a tensor or a callable."""
    return (hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module, torch.Tensor))
            and not callable(value))


def copyable(value: Any) -> bool:
    """Whether :func:`copy_with` can copy the plain object ``value``: its class makes instances with
    ``object.__new__`` (no arguments), so a copy is an empty instance with its ``__dict__`` filled."""
    return type(value).__new__ is object.__new__


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _children(value: Any, depth: int) -> tuple[Any, list[tuple[str, Any]]] | None:
    """``(descriptor, [(label, child), ...])`` of a node below an input object, ``None`` for a leaf."""
    if depth > OBJECT_DEPTH or isinstance(value, (torch.Tensor, enum.Enum)):
        return None
    if isinstance(value, (list, tuple, dict)):
        if len(value) > OBJECT_ITEMS:
            return None
        if isinstance(value, dict):
            return ("dict", tuple(repr(k) for k in value)), [(f"[{k!r}]", v) for k, v in value.items()]
        return (type(value).__name__, len(value)), [(f"[{i}]", v) for i, v in enumerate(value)]
    if is_plain_object(value) and copyable(value):
        names = tuple(vars(value))
        return ObjectLayout(_class_name(type(value)), names), [(f".{n}", getattr(value, n)) for n in names]
    return None


def object_leaves(obj: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any, Any]]:
    """Pre-order ``(path, descriptor, value)`` of ``obj`` and what it holds; ``descriptor`` is ``None`` for leaves."""
    node = _children(obj, depth)
    if node is None:
        yield path, None, obj
        return
    descriptor, children = node
    yield path, descriptor, obj
    for label, child in children:
        yield from object_leaves(child, path + label, depth + 1)


def copy_with(obj: Any, replace: Callable[[torch.Tensor], torch.Tensor],
              is_replaced: Callable[[torch.Tensor], bool], depth: int = 0) -> Any:
    """``obj`` with each tensor for which ``is_replaced`` holds replaced by ``replace(tensor)``, in
    :func:`object_leaves`' order: the objects, lists, tuples and dicts on the way to a replaced tensor are copied
    (an object without ``__init__``: its ``__dict__`` is filled), everything else is shared."""
    if isinstance(obj, torch.Tensor):
        return replace(obj) if is_replaced(obj) else obj
    node = _children(obj, depth)
    if node is None:
        return obj
    _, children = node
    items = [copy_with(child, replace, is_replaced, depth + 1) for _, child in children]
    if all(new is old for new, (_, old) in zip(items, children)):
        return obj
    if isinstance(obj, list):
        return items
    if isinstance(obj, tuple):
        return type(obj)(*items) if hasattr(type(obj), "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return type(obj)(zip(obj.keys(), items))
    copied = object.__new__(type(obj))
    copied.__dict__.update(zip(vars(obj), items))
    return copied


def witness(obj: Any, path: str = "") -> tuple:
    """What a change of ``obj`` by a call alters: the identity of every object and container in it, and the
    identity, address and version counter of every tensor."""
    seen = []
    for where, descriptor, value in object_leaves(obj, path):
        if isinstance(value, torch.Tensor):
            seen.append((where, id(value), value.data_ptr(), value._version))
        elif descriptor is not None or not isinstance(value, (int, float, bool, str, bytes, type(None))):
            seen.append((where, id(value)))
        else:
            seen.append((where, value))
    return tuple(seen)
