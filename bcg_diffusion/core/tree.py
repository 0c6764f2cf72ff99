"""The one walker over nested inputs and outputs.

Containers it descends into: tuples (namedtuples rebuilt as namedtuples), lists, dicts (and dict
subclasses), dataclass instances (their ``init`` fields; checked before dicts, because diffusers'
``BaseOutput`` is both) and boxed tuples. With ``objects=True`` :func:`walk` also descends into
the ``vars()`` of plain objects (break results may be such objects). Everything else is a leaf.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import torch

from .boxing import _BCGBoxedTupleOutput


def is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def node_of(value: Any, objects: bool = False) -> tuple[Any, list[tuple[str, Any]]] | None:
    """``(descriptor, [(label, child), ...])`` for a container, ``None`` for a leaf.

    The descriptor is hashable and equal for containers of the same kind and shape (a boxed
    tuple and the tuple it boxes compare equal); labels are path suffixes (``[0]``, ``['k']``,
    ``.name``).
    """
    if isinstance(value, (tuple, _BCGBoxedTupleOutput)):
        cls, items = (value._tuple_type, value.items()) if isinstance(value, _BCGBoxedTupleOutput) else (type(value), value)
        kind = cls.__qualname__ if hasattr(cls, "_fields") else "tuple"
        return (kind, len(items)), [(f"[{i}]", v) for i, v in enumerate(items)]
    if isinstance(value, list):
        return ("list", len(value)), [(f"[{i}]", v) for i, v in enumerate(value)]
    if _is_dataclass_instance(value):
        fields = [f.name for f in dataclasses.fields(value) if f.init]
        return (type(value).__qualname__, tuple(fields)), [(f".{n}", getattr(value, n)) for n in fields]
    if isinstance(value, dict):
        return ("dict", tuple(value.keys())), [(f"[{k!r}]", v) for k, v in value.items()]
    if objects and hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)) and not callable(value):
        names = list(vars(value))
        return (type(value).__qualname__, tuple(names)), [(f".{n}", getattr(value, n)) for n in names]
    return None


def walk(value: Any, path: str = "", objects: bool = False) -> Iterator[tuple[str, Any, Any]]:
    """Pre-order ``(path, descriptor, value)``; ``descriptor`` is ``None`` for leaves."""
    node = node_of(value, objects)
    if node is None:
        yield path, None, value
        return
    descriptor, children = node
    yield path, descriptor, value
    for label, child in children:
        yield from walk(child, path + label, objects)


def tree_map(fn: Callable[[Any], Any], value: Any, is_leaf: Callable[[Any], bool] = is_tensor) -> Any:
    """``value`` rebuilt with every leaf for which ``is_leaf`` holds replaced by ``fn(leaf)``.

    Containers are rebuilt (new tuples, lists, dicts, dataclass instances; a boxed tuple becomes
    a plain tuple of its type); other leaves and plain objects are kept as they are.
    """
    if is_leaf(value):
        return fn(value)
    if isinstance(value, _BCGBoxedTupleOutput):
        return tree_map(fn, value.astuple(), is_leaf)
    if isinstance(value, tuple):
        items = [tree_map(fn, v, is_leaf) for v in value]
        return type(value)(*items) if hasattr(type(value), "_fields") else type(value)(items)
    if isinstance(value, list):
        return [tree_map(fn, v, is_leaf) for v in value]
    if _is_dataclass_instance(value):
        changes = {f.name: tree_map(fn, getattr(value, f.name), is_leaf) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, dict):
        return type(value)((k, tree_map(fn, v, is_leaf)) for k, v in value.items())
    return value

