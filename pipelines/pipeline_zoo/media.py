"""Seeded inputs of pipeline calls: images, masks, control images, video frames, audio.

Pixels are drawn on the CPU from one ``numpy`` generator, so a case's call gets the same inputs on every
machine for the same seed; tensors go to ``device`` only where a pipeline takes tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

__all__ = ["Media"]


class Media:
    """Makers of call inputs for one case call (``seed``); ``device`` for the inputs pipelines take as tensors."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self._rng = np.random.default_rng(seed)
        self.device = torch.device(device)
        self.dtype = dtype

    def image(self, height: int, width: int) -> Image.Image:
        """An RGB image of smooth random colours (a blurred grid, so a VAE sees structure, not pure noise)."""
        grid = self._rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        small = Image.fromarray(grid, "RGB")
        return small.resize((width, height), Image.BILINEAR)

    def images(self, count: int, height: int, width: int) -> list[Image.Image]:
        return [self.image(height, width) for _ in range(count)]

    def video(self, frames: int, height: int, width: int) -> list[Image.Image]:
        """Video frames as a list of RGB images."""
        return self.images(frames, height, width)

    @staticmethod
    def mask(height: int, width: int) -> Image.Image:
        """A mask image (white: repaint) covering the right half and the lower quarter: the masked and the kept
        parts both reach the transformer."""
        mask = np.zeros((height, width), dtype=np.uint8)
        mask[:, width // 2:] = 255
        mask[3 * height // 4:, :] = 255
        return Image.fromarray(mask, "L")

    def control(self, height: int, width: int) -> Image.Image:
        """A control image (edges or depth in real use): here a random image like :meth:`image`."""
        return self.image(height, width)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A standard-normal tensor on ``device`` (embeddings, audio)."""
        values = torch.from_numpy(self._rng.standard_normal(shape).astype(np.float32))
        return values.to(self.device, dtype or self.dtype)

    def video_tensor(self, frames: int, height: int, width: int) -> torch.Tensor:
        """A video as one ``(1, 3, frames, height, width)`` float tensor in [0, 1] (pipelines that take tensors)."""
        frames_list = [torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
                       for img in self.video(frames, height, width)]
        return torch.stack(frames_list, dim=1).unsqueeze(0)

    def mask_tensor(self, frames: int, height: int, width: int, high: float = 255.0) -> torch.Tensor:
        """The :meth:`mask` of every frame as a ``(1, 1, frames, height, width)`` tensor of 0 and ``high``."""
        mask = torch.from_numpy(np.asarray(self.mask(height, width), dtype=np.float32) / 255.0 * high)
        return mask.expand(frames, height, width).unsqueeze(0).unsqueeze(0).contiguous()
