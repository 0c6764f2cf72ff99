"""Writing generated images (PNG/JPEG/WebP) and videos (MP4, else GIF)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4", ".gif")


def can_write_mp4() -> bool:
    has = importlib.util.find_spec
    return (has("imageio") is not None and has("imageio_ffmpeg") is not None) or has("cv2") is not None


def why_not_writable(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (its folder may not exist yet), or ``None`` if it can."""
    if path.is_dir():
        return f"{path} is a folder"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"no permission to write in {folder}"
    if path.exists() and not os.access(path, os.W_OK):
        return f"no permission to overwrite {path}"
    return None


def _to_uint8(array) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    return array


def _numbered(path: Path, index: int, count: int, tag: str = "") -> Path:
    stem = path.stem + tag + (f"_{index}" if count > 1 else "")
    return path.with_name(stem + path.suffix)


def save_output(output, path: Path, is_video: bool, fps: int, tag: str = "") -> list[Path]:
    """Write each image or video of the batch (``_0``, ``_1``, ... when there are several; ``tag`` before
    the number); return the paths written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = list(output) if isinstance(output, (list, tuple)) else [output[i] for i in range(len(output))]
    written = []
    for i, item in enumerate(batch):
        target = _numbered(path, i, len(batch), tag)
        if not is_video:
            Image.fromarray(_to_uint8(item)).save(target)
        else:
            frames = [_to_uint8(f) for f in (item if isinstance(item, (list, tuple)) else np.asarray(item))]
            if target.suffix.lower() == ".mp4":
                from diffusers.utils import export_to_video

                export_to_video([f.astype(np.float32) / 255.0 for f in frames], str(target), fps=fps)
            else:
                pil = [Image.fromarray(f) for f in frames]
                pil[0].save(target, save_all=True, append_images=pil[1:], duration=max(1, round(1000 / fps)), loop=0)
        written.append(target)
    return written
