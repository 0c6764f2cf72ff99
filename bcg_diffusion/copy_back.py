"""In-place copy of a fresh eager result into the output object a segment was captured against."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .boxing import _BCGBoxedTupleOutput

_LEAF_TYPES = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


class BreakOutputMismatchError(RuntimeError):
    """The result of an eager break at replay does not have the structure captured at capture time."""


def copy_into(dst: Any, src: Any, path: str = "output") -> None:
    """Write ``src`` into ``dst`` in place, recursively.

    Supports tensors, tuples, lists, dicts, dataclasses, boxed tuples and plain objects with
    tensor attributes, nested. Tensors must match in shape, dtype and device; non-tensor leaves
    (ints, strings, None, ...) must be equal, since the segments after the break were captured
    with them baked in. Raises :class:`BreakOutputMismatchError` naming the first differing
    path; nothing is silently kept stale.
    """
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor):
            _mismatch(path, "a tensor", _kind(src))
        if dst.shape != src.shape or dst.dtype != src.dtype or dst.device != src.device:
            _mismatch(
                path,
                f"tensor{tuple(dst.shape)} {dst.dtype} on {dst.device}",
                f"tensor{tuple(src.shape)} {src.dtype} on {src.device}",
            )
        if not _same_memory(dst, src):
            dst.copy_(src)
        return
    if isinstance(dst, _BCGBoxedTupleOutput):
        if isinstance(src, _BCGBoxedTupleOutput):
            src_items = src.items()
        elif isinstance(src, tuple):
            src_items = list(src)
        else:
            _mismatch(path, f"a tuple of {len(dst)}", _kind(src))
        _copy_sequence(dst.items(), src_items, path)
        return
    if isinstance(dst, (tuple, list)):
        if type(src) is not type(dst):
            _mismatch(path, f"a {type(dst).__name__} of {len(dst)}", _kind(src))
        _copy_sequence(dst, src, path)
        return
    if isinstance(dst, dict):
        if not isinstance(src, dict):
            _mismatch(path, "a dict", _kind(src))
        if list(dst.keys()) != list(src.keys()):
            _mismatch(path, f"keys {list(dst.keys())}", f"keys {list(src.keys())}")
        for key in dst:
            copy_into(dst[key], src[key], f"{path}[{key!r}]")
        return
    if isinstance(dst, _LEAF_TYPES):
        if type(src) is not type(dst) or src != dst:
            _mismatch(path, f"the value {dst!r}", f"{src!r}")
        return
    if dataclasses.is_dataclass(dst) and not isinstance(dst, type):
        if type(src) is not type(dst):
            _mismatch(path, type(dst).__name__, _kind(src))
        for field in dataclasses.fields(dst):
            copy_into(getattr(dst, field.name), getattr(src, field.name), f"{path}.{field.name}")
        return
    if hasattr(dst, "__dict__"):
        if type(src) is not type(dst):
            _mismatch(path, type(dst).__name__, _kind(src))
        dst_vars, src_vars = vars(dst), vars(src)
        if list(dst_vars) != list(src_vars):
            _mismatch(path, f"attributes {list(dst_vars)}", f"attributes {list(src_vars)}")
        for name in dst_vars:
            copy_into(dst_vars[name], src_vars[name], f"{path}.{name}")
        return
    if dst is not src and dst != src:
        _mismatch(path, f"the value {dst!r}", f"{src!r}")


def _copy_sequence(dst: Any, src: Any, path: str) -> None:
    if len(dst) != len(src):
        _mismatch(path, f"{len(dst)} elements", f"{len(src)} elements")
    for i, (d, s) in enumerate(zip(dst, src)):
        copy_into(d, s, f"{path}[{i}]")


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype} on {value.device}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, _LEAF_TYPES):
        return repr(value)
    return type(value).__name__


def _mismatch(path: str, expected: str, got: str) -> None:
    raise BreakOutputMismatchError(
        f"eager break result changed structure at {path}: captured {expected}, got {got} at replay. "
        "The segments after a break were captured against its first result, so a break function "
        "must return the same structure, shapes and dtypes on every call (recapture for new shapes)."
    )
