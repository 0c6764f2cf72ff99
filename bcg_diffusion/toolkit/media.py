"""Writing generated images (PNG/JPEG/WebP) and videos (MP4, else GIF), and checking ``--out`` before any work.

MP4 needs a writer: imageio with imageio-ffmpeg (the ``video`` extra, ``pip install -e ".[video]"``) or OpenCV.
Without one, a video asked for as ``x.mp4`` is written as the GIF ``x.gif`` and the command says so before it
builds anything (:func:`video_target`); a writer that fails at the end also falls back to the GIF, so a
finished generation is never lost. numpy and PIL are imported when something is written.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .choices import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from .files import VIRTUAL_FILESYSTEMS, atomic_target, missing_folder, why_not_writable

__all__ = ["IMAGE_SUFFIXES", "MP4_INSTALL_HINT", "VIDEO_SUFFIXES", "VIRTUAL_FILESYSTEMS", "can_write_mp4",
           "missing_folder", "save_output", "video_target", "why_not_writable"]

MP4_INSTALL_HINT = 'pip install -e ".[video]" adds imageio + imageio-ffmpeg for MP4'


def can_write_mp4() -> bool:
    has = importlib.util.find_spec
    return (has("imageio") is not None and has("imageio_ffmpeg") is not None) or has("cv2") is not None


def video_target(path: Path) -> tuple[Path, str | None]:
    """The file a video asked for as ``path`` is written to, and the note to print when that is another file
    (``x.mp4`` without an MP4 writer: ``x.gif``)."""
    if path.suffix.lower() != ".mp4" or can_write_mp4():
        return path, None
    gif = path.with_suffix(".gif")
    return gif, (f"note: --out {path}: no MP4 writer is installed, so the video is written as the GIF {gif} "
                 f"({MP4_INSTALL_HINT})")


def _to_uint8(array):
    import numpy as np

    array = np.asarray(array)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    return array


def _numbered(path: Path, index: int, count: int, tag: str = "") -> Path:
    stem = path.stem + tag + (f"_{index}" if count > 1 else "")
    return path.with_name(stem + path.suffix)


def _write_gif(frames, target: Path, fps: int) -> None:
    from PIL import Image

    pil = [Image.fromarray(f) for f in frames]
    pil[0].save(target, save_all=True, append_images=pil[1:], duration=max(1, round(1000 / fps)), loop=0)


def _write_mp4(frames, target: Path, fps: int) -> None:
    import numpy as np
    from diffusers.utils import export_to_video

    export_to_video([f.astype(np.float32) / 255.0 for f in frames], str(target), fps=fps)
    if not target.is_file() or target.stat().st_size == 0:
        raise OSError(f"the MP4 writer left no file at {target}")


def save_output(output, path: Path, is_video: bool, fps: int, tag: str = "",
                notes: list[str] | None = None) -> list[Path]:
    """Write each image or video of the batch (``_0``, ``_1``, ... when there are several; ``tag`` before
    the number); return the paths written. Each file is written whole or not at all (a full disk leaves no empty
    or cut file: :func:`~.files.atomic_target`). A video whose MP4 writer fails is written as a GIF beside it, with
    a sentence appended to ``notes`` (printed by the caller)."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    batch = list(output) if isinstance(output, (list, tuple)) else [output[i] for i in range(len(output))]
    written = []
    for i, item in enumerate(batch):
        target = _numbered(path, i, len(batch), tag)
        if not is_video:
            with atomic_target(target) as partial:
                Image.fromarray(_to_uint8(item)).save(partial)
        else:
            frames = [_to_uint8(f) for f in (item if isinstance(item, (list, tuple)) else np.asarray(item))]
            target = _write_video(frames, target, fps, notes)
        written.append(target)
    return written


def _write_video(frames, target: Path, fps: int, notes: list[str] | None) -> Path:
    """``target`` as an MP4 or a GIF (by its suffix), each written whole; an MP4 whose writer fails becomes the GIF
    beside it (the generation is done: it is kept). Returns the path written."""
    if target.suffix.lower() == ".mp4":
        try:
            with atomic_target(target) as partial:
                _write_mp4(frames, partial, fps)
            return target
        except Exception as exc:  # noqa: BLE001 - the generation is done: keep it as a GIF
            gif = target.with_suffix(".gif")
            if notes is not None:
                notes.append(f"note: writing the MP4 {target} failed ({type(exc).__name__}: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); "
                             f"wrote the GIF {gif} instead")
            target = gif
    with atomic_target(target) as partial:
        _write_gif(frames, partial, fps)
    return target
