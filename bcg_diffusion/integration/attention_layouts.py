"""Attention output layouts: recorded during warm-up, allocated from the graph pool at capture.

At capture an attention break does not run the kernel on placeholder data (a varlen backend would
read garbage lengths): it allocates the output with the exact shape and strides recorded for the
same call (by call order) during warm-up, so later segments see the same layout as eager and pick
the same kernels, and the pool can reuse the memory.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..core.tree import tree_map

_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("bcg_attn_record", default=None)
_PLAN: contextvars.ContextVar["_LayoutPlan | None"] = contextvars.ContextVar("bcg_attn_plan", default=None)


@dataclass(frozen=True)
class _TensorLayout:
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class _Layout:
    query_shape: tuple
    out: Any  # the output structure with _TensorLayout leaves


class _LayoutPlan:
    """Recorded output layouts, handed out in call order during capture."""

    def __init__(self, layouts: list[_Layout]) -> None:
        self._layouts = layouts
        self._cursor = 0

    def next_for(self, query: Any) -> _Layout | None:
        if self._cursor >= len(self._layouts):
            return None
        layout = self._layouts[self._cursor]
        self._cursor += 1
        if not isinstance(query, torch.Tensor) or tuple(query.shape) != layout.query_shape:
            return None
        return layout


def record(query: Any, out: Any) -> None:
    """Record the layout of one attention call's output (no-op outside :func:`recording_layouts`)."""
    layouts = _RECORD.get()
    if layouts is None:
        return
    shape = tuple(query.shape) if isinstance(query, torch.Tensor) else ()
    if isinstance(out, torch.Tensor) or (isinstance(out, tuple) and all(isinstance(o, torch.Tensor) for o in out)):
        described = tree_map(lambda t: _TensorLayout(tuple(t.shape), t.stride(), t.dtype, t.device), out)
    else:
        described = None
    layouts.append(_Layout(shape, described))


def skip_planned() -> None:
    """Consume the next planned layout (an attention call captured inline, not a break)."""
    plan = _PLAN.get()
    if plan is not None:
        plan._cursor += 1


def allocate_planned(query: Any) -> Any:
    """The next planned output, freshly allocated (in the pool during capture), or ``None`` when
    nothing was recorded for this call (the kernel then runs once at capture, a normal break)."""
    plan = _PLAN.get()
    layout = plan.next_for(query) if plan is not None else None
    if layout is None or layout.out is None:
        return None
    return tree_map(
        lambda t: torch.empty_strided(t.shape, t.stride, dtype=t.dtype, device=t.device),
        layout.out,
        is_leaf=lambda v: isinstance(v, _TensorLayout),
    )


@contextlib.contextmanager
def recording_layouts() -> Iterator[list]:
    """Record the output layout of every attention call made in the block (warm-up)."""
    layouts: list = []
    token = _RECORD.set(layouts)
    try:
        yield layouts
    finally:
        _RECORD.reset(token)


@contextlib.contextmanager
def using_layouts(layouts: list | None) -> Iterator[None]:
    """During capture, allocate attention outputs from ``layouts`` instead of running the kernel."""
    token = _PLAN.set(_LayoutPlan(layouts) if layouts else None)
    try:
        yield
    finally:
        _PLAN.reset(token)
