"""Position-id tensors as pipelines build them (Flux-style 3-axis ids, n-axis grids)."""

from __future__ import annotations

import torch

from .case import InputMaker

__all__ = ["flux_image_ids", "flux_text_ids", "grid_ids"]


def flux_image_ids(m: InputMaker, height: int, width: int, frame: float = 0.0) -> torch.Tensor:
    """``(height * width, 3)`` ids ``(frame, row, column)`` of packed image tokens, in ``m.dtype``."""
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    ids = torch.stack([torch.full_like(rows, 0), rows, cols], dim=-1).to(torch.float32)
    ids[:, 0] = frame
    return ids.to(m.device, m.dtype)


def flux_text_ids(m: InputMaker, length: int) -> torch.Tensor:
    """``(length, 3)`` zero ids of text tokens, in ``m.dtype``."""
    return torch.zeros(length, 3, device=m.device, dtype=m.dtype)


def grid_ids(
    m: InputMaker, sizes: tuple[int, ...], batch: int | None = None, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """Cartesian-product ids of ``arange(n)`` per axis (``(prod(sizes), len(sizes))``), with a batch
    dimension in front when ``batch`` is given (Flux.2's 4-axis ids)."""
    ids = torch.cartesian_prod(*(torch.arange(n) for n in sizes)).reshape(-1, len(sizes))
    if batch is not None:
        ids = ids.unsqueeze(0).expand(batch, -1, -1).contiguous()
    return ids.to(m.device, dtype)
