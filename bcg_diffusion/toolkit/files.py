"""Writing the commands' files safely: whole or not at all, and a folder checked before the work that fills it.

A file written in place and interrupted (a full disk, a killed process) is left empty or cut short, and a previous
version of it is lost. :func:`atomic_target` writes to a temporary file beside the target and renames it onto the
target only once it is complete (a rename within one folder is atomic on POSIX and Windows): a reader sees the old
file or the new one, never a part, and a failure leaves nothing behind. :func:`folder_problem` says why a folder
cannot take the files of a run (a file in the way, a read-only or virtual filesystem, no permission, names too long)
before hours of measuring, not after. Imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["VIRTUAL_FILESYSTEMS", "atomic_target", "folder_problem", "is_folder", "missing_folder", "why_not_writable",
           "write_text_atomically"]

#: Filesystems whose files are the kernel's, not the user's: ``--out`` there is refused up front.
VIRTUAL_FILESYSTEMS = frozenset({
    "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts", "efivarfs", "fusectl",
    "hugetlbfs", "mqueue", "nsfs", "proc", "pstore", "securityfs", "sysfs", "tracefs",
})


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same folder, same suffix, so writers that pick a format by suffix still
    do) for the ``with`` block to write; renamed onto ``path`` when the block ends, removed when it raises."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:64]}.", suffix=f".partial{path.suffix}")
    os.close(fd)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    """``path.write_text(text)`` through :func:`atomic_target`: the old file or the whole new one, never a part."""
    with atomic_target(path) as temporary:
        temporary.write_text(text)


def folder_problem(folder: Path, longest_name: str = "x" * 48) -> str | None:
    """Why a file named ``longest_name`` cannot be written in ``folder`` (created if missing), or ``None``: a file
    in the way, a virtual or read-only filesystem, no permission, a name too long (see
    :func:`why_not_writable`)."""
    folder = Path(folder)
    if _exists(folder) and not is_folder(folder):
        return f"{folder} is a file, not a folder"
    return why_not_writable(folder / longest_name)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a name too long to look up
        return False


def _existing_folder(path: Path) -> Path:
    folder = path.parent
    while not _exists(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def missing_folder(path: Path) -> Path | None:
    """The folder of ``path`` when it does not exist yet (it is created when the output is written)."""
    return None if _exists(path.parent) else path.parent


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


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer: the common limit
        return 255


def _long_name(path: Path, folder: Path, name_extra: int) -> str | None:
    """Why a name of ``path`` below ``folder`` (the last one ``name_extra`` bytes longer) is too long, or ``None``."""
    limit = _name_max(folder)
    parts = path.relative_to(folder).parts if path.is_relative_to(folder) else (path.name,)
    for index, part in enumerate(parts):
        size = len(os.fsencode(part)) + (name_extra if index == len(parts) - 1 else 0)
        if size > limit:
            grown = f" with the {name_extra} characters this run adds" if index == len(parts) - 1 and name_extra else ""
            return f"the name {part[:40]!r}... has {size} bytes{grown}; {folder} takes names of at most {limit} bytes"
    return None


def is_folder(path: Path) -> bool:
    """``path.is_dir()``, false where the path cannot even be looked up (a name too long raises on Python 3.11)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def why_not_writable(path: Path, name_extra: int = 0) -> str | None:
    """Why a file cannot be written at ``path``, or ``None`` if it can: a folder in the way, a virtual or
    read-only filesystem, no permission, a name longer than the filesystem takes (``name_extra``: characters the
    caller adds to the file name, such as ``_bcg`` or ``_3``). Its folder may not exist yet: then the nearest
    existing folder must let it be created. A probe file (or folder) is made and removed, so root's permissions on
    /proc and /sys, which ``os.access`` reports as writable, are tested for real."""
    if is_folder(path):
        return f"{path} is a folder"
    folder = _existing_folder(path)
    if not folder.is_dir():
        return f"{folder} is not a folder"
    too_long = _long_name(path, folder, name_extra)
    if too_long:
        return too_long
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
