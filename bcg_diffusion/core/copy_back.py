"""In-place copy of a fresh eager result into the output object a segment was captured against."""

from __future__ import annotations

from typing import Any

import torch

from .tree import node_of


class BreakOutputMismatchError(RuntimeError):
    """The result of an eager break at replay does not have the structure captured at capture time."""


def copy_into(dst: Any, src: Any, path: str = "output") -> None:
    """Write ``src`` into ``dst`` in place, recursively.

    Supports tensors, tuples, lists, dicts, dataclasses, boxed tuples and plain objects with
    tensor attributes, nested (the containers of :mod:`.tree`). Tensors must match in shape,
    dtype and device; non-tensor leaves (ints, strings, None, ...) must be equal, since the
    segments after the break were captured with them baked in. Raises
    :class:`BreakOutputMismatchError` naming the first differing path; nothing is silently kept
    stale.
    """
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor):
            _mismatch(path, "a tensor", _kind(src))
        if dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device:
            _mismatch(path, _kind(dst), _kind(src))
        if not _same_memory(dst, src):
            dst.copy_(src)
        return
    dst_node = node_of(dst, objects=True)
    if dst_node is None:
        if type(src) is not type(dst) or (dst is not src and dst != src):
            _mismatch(path, f"the value {dst!r}", _kind(src))
        return
    src_node = node_of(src, objects=True)
    if src_node is None or src_node[0] != dst_node[0]:
        _mismatch(path, _describe(dst_node[0]), _describe(src_node[0]) if src_node else _kind(src))
    for (label, d), (_, s) in zip(dst_node[1], src_node[1]):
        copy_into(d, s, path + label)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()


def _describe(descriptor: tuple) -> str:
    kind, detail = descriptor
    if isinstance(detail, int):
        return f"a {kind} of {detail} elements"
    if kind == "dict":
        return f"a dict with keys {list(detail)}"
    return f"{kind} with fields {list(detail)}"


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype} on {value.device}"
    node = node_of(value, objects=True)
    if node is not None:
        return _describe(node[0])
    return repr(value) if isinstance(value, (int, float, complex, bool, str, bytes, type(None))) else type(value).__name__


def _mismatch(path: str, expected: str, got: str) -> None:
    raise BreakOutputMismatchError(
        f"eager break result changed structure at {path}: captured {expected}, got {got} at replay. "
        "The segments after a break were captured against its first result, so a break function "
        "must return the same structure, shapes and dtypes on every call (recapture for new shapes)."
    )
