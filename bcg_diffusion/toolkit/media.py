"""Writing generated images (PNG/JPEG/WebP) and videos (MP4, else GIF), and checking ``--out`` before any work.

MP4 needs a writer: imageio with imageio-ffmpeg (the ``video`` extra, ``pip install -e ".[video]"``) or OpenCV.
Without one, a video asked for as ``x.mp4`` is written as the GIF ``x.gif`` and the command says so before it
builds anything (:func:`video_target`); a writer that fails at the end also falls back to the GIF, so a
finished generation is never lost. numpy and PIL are imported when something is written.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

from .choices import IMAGE_SUFFIXES, VIDEO_SUFFIXES

__all__ = ["IMAGE_SUFFIXES", "MP4_INSTALL_HINT", "VIDEO_SUFFIXES", "VIRTUAL_FILESYSTEMS", "can_write_mp4",
           "missing_folder", "save_output", "video_target", "why_not_writable"]

MP4_INSTALL_HINT = 'pip install -e ".[video]" adds imageio + imageio-ffmpeg for MP4'
#: Filesystems whose files are the kernel's, not the user's: ``--out`` there is refused up front.
VIRTUAL_FILESYSTEMS = frozenset({
    "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts", "efivarfs", "fusectl",
    "hugetlbfs", "mqueue", "nsfs", "proc", "pstore", "securityfs", "sysfs", "tracefs",
})


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


def _existing_folder(path: Path) -> Path:
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def missing_folder(path: Path) -> Path | None:
    """The folder of ``path`` when it does not exist yet (it is created when the output is written)."""
    return None if path.parent.exists() else path.parent


def _mount_type(folder: Path) -> str | None:
    """The filesystem type of the mount that holds ``folder`` (Linux: /proc/self/mounts), or ``None``."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    resolved, best, kind = str(folder.resolve()), "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def why_not_writable(path: Path) -> str | None:
    """Why a file cannot be written at ``path``, or ``None`` if it can: a folder in the way, a virtual or
    read-only filesystem, no permission. Its folder may not exist yet: then the nearest existing folder must
    let it be created. A probe file (or folder) is made and removed, so root's permissions on /proc and /sys,
    which ``os.access`` reports as writable, are tested for real."""
    if path.is_dir():
        return f"{path} is a folder"
    folder = _existing_folder(path)
    if not folder.is_dir():
        return f"{folder} is not a folder"
    kind = _mount_type(folder)
    if kind in VIRTUAL_FILESYSTEMS:
        return f"{folder} is on a {kind} filesystem, whose files are the kernel's; write the output elsewhere"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only filesystem"
    except OSError:
        pass
    if path.exists():
        if not os.access(path, os.W_OK):
            return f"no permission to overwrite {path}"
        return None
    try:
        if folder == path.parent:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".bcg-write-check-")
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".bcg-write-check-"))
    except OSError as exc:
        return f"{'a file' if folder == path.parent else 'a folder'} cannot be made in {folder} ({exc.strerror or exc})"
    return None


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
    the number); return the paths written. A video whose MP4 writer fails is written as a GIF beside it, with
    a sentence appended to ``notes`` (printed by the caller)."""
    import numpy as np
    from PIL import Image

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
                try:
                    _write_mp4(frames, target, fps)
                except Exception as exc:  # noqa: BLE001 - the generation is done: keep it as a GIF
                    gif = target.with_suffix(".gif")
                    if notes is not None:
                        notes.append(f"note: writing the MP4 {target} failed ({type(exc).__name__}: "
                                     f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); "
                                     f"wrote the GIF {gif} instead")
                    target.unlink(missing_ok=True)
                    _write_gif(frames, gif, fps)
                    target = gif
            else:
                _write_gif(frames, target, fps)
        written.append(target)
    return written
