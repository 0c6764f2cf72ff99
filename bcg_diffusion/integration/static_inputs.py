"""The static input buffers a capture reads: copies of the live inputs with their exact layout.

A captured graph reads its inputs from fixed buffers, and the kernels it recorded were chosen for
their layout (``torch.nn.functional.linear`` takes a fused path for contiguous 3-D inputs and
another for strided ones, which round differently in bf16). So a buffer keeps the live tensor's
strides wherever they do not overlap: a gapped view (diffusers' context-parallel split of a batch
of 2 along the sequence, a slice) gets a gapped buffer. Only tensors whose elements overlap
(expanded inputs, stride 0) get dense buffers, since one element cannot be copied into twice.
"""

from __future__ import annotations

import torch


def _may_overlap(t: torch.Tensor) -> bool:
    """False when no two elements of ``t`` share memory, shown by sorting its dimensions by
    stride: each must step past the whole extent of the smaller ones (a sufficient test)."""
    dims = sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * size
    return False


def static_copy(t: torch.Tensor) -> torch.Tensor:
    """A new tensor equal to ``t`` with ``t``'s shape, dtype, device and, unless its elements may
    overlap, its strides (then a dense buffer, as ``empty_like`` gives)."""
    if _may_overlap(t):
        return torch.empty_like(t).copy_(t)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
