"""Where a benchmark process keeps its compile caches, and whether a compile found them cold or warm.

Inductor keeps its on-disk caches (FX graphs, AOTAutograd, Triton kernels, autotuning) under
``TORCHINDUCTOR_CACHE_DIR`` (Triton's under ``TRITON_CACHE_DIR``); a second process pointed at the same
folder skips code generation and compilation (dynamo still traces). ``--compile-cache WHERE`` chooses the
process's folder (:func:`open_process_cache`):

- not given: Inductor's own setting for the per-step modes (``TORCHINDUCTOR_CACHE_DIR`` or
  ``/tmp/torchinductor_<user>``, possibly warm from earlier runs; its state is recorded); the first-image
  row's compiled modes each get a new empty folder (cold), removed at the end;
- ``fresh``: one new empty folder for the process, removed at the end: every compile is cold;
- a folder path: kept; the per-step modes use ``DIR/inductor``, each compiled mode of the first-image row
  ``DIR/first_image/<case>/<mode>``, so a second process pointed at the same folder finds them warm
  (``--processes K --compile-cache shared`` passes one new folder to all K processes).

:func:`mode_cache` points Inductor at one mode's folder (clearing the in-memory caches on the way in and
out, so an earlier mode of the same process cannot warm it) and, where the library has it, calls
``bcg_diffusion.use_compile_cache(folder)`` before the mode compiles and ``.save()`` after.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

import bcg_diffusion

ENV_KEYS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
LIBRARY_API = "use_compile_cache"  # bcg_diffusion.use_compile_cache(directory) -> CompileCache (.status, .save())


def folder_state(path: Path) -> str:
    """``"warm"`` when ``path`` holds any file (an earlier compile wrote there), else ``"cold"``."""
    path = Path(path)
    if path.is_dir() and any(p.is_file() for p in path.rglob("*")):
        return "warm"
    return "cold"


def clear_in_memory_caches() -> None:
    """Inductor's in-process caches (compiled modules, kernels), so the next compile reads the disk caches."""
    clear = getattr(getattr(torch._inductor, "utils", None), "clear_caches", None)
    if clear is not None:
        clear()


def point_inductor_at(folder: Path) -> str:
    """Inductor's (and Triton's) on-disk caches in ``folder`` from now on; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    clear_in_memory_caches()
    return str(folder)


def _inductor_default_folder() -> Path:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


@dataclass
class ProcessCompileCache:
    """The compile-cache folders of this process (see the module docstring)."""

    where: str  # "inductor default", "fresh" or the folder given
    inductor_folder: str  # what the per-step modes compile into
    state: str  # "cold" / "warm": what this process found in inductor_folder at its start
    first_image_root: Path  # the first-image row's per-mode folders live under it
    temporary: list[Path]  # folders this process made and removes in close()

    def first_image_folder(self, case_label: str, mode: str) -> Path:
        return self.first_image_root / _slug(case_label) / mode

    def describe(self) -> dict[str, Any]:
        return {"where": self.where, "inductor_folder": self.inductor_folder, "state_at_start": self.state,
                "first_image_root": str(self.first_image_root), "temporary": bool(self.temporary)}

    def close(self) -> None:
        while self.temporary:
            shutil.rmtree(self.temporary.pop(), ignore_errors=True)


def open_process_cache(where: str | None) -> ProcessCompileCache:
    """The process's compile caches for ``--compile-cache WHERE`` (``None``: not given). Call before any
    compile; ``fresh`` and a folder change ``TORCHINDUCTOR_CACHE_DIR`` for the rest of the process."""
    if where is None:
        inductor = _inductor_default_folder()
        first_image = Path(tempfile.mkdtemp(prefix="bench_first_image_"))
        return ProcessCompileCache("inductor default", str(inductor), folder_state(inductor), first_image, [first_image])
    temporary: list[Path] = []
    if where in ("fresh", "shared"):  # "shared" means something only across processes: here it is fresh
        root = Path(tempfile.mkdtemp(prefix="bench_compile_cache_"))
        temporary.append(root)
    else:
        root = Path(where).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
    inductor = root / "inductor"
    state = folder_state(inductor)
    point_inductor_at(inductor)
    return ProcessCompileCache("fresh" if temporary else str(root), str(inductor), state, root / "first_image",
                               temporary)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


@contextlib.contextmanager
def mode_cache(folder: Path) -> Iterator[dict[str, Any]]:
    """Compile caches in ``folder`` while one mode sets up and runs; yields its record (``folder``,
    ``state`` cold/warm as found, ``library``: what ``bcg_diffusion.use_compile_cache`` said, or that the
    library has none). The previous folders are restored afterwards."""
    folder = Path(folder)
    record: dict[str, Any] = {"folder": str(folder), "state": folder_state(folder)}
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    point_inductor_at(folder / "inductor")
    api = getattr(bcg_diffusion, LIBRARY_API, None)
    handle = None
    if api is None:
        record["library"] = f"bcg_diffusion has no {LIBRARY_API}(): Inductor's on-disk caches only"
    else:
        try:
            handle = api(str(folder / "artifacts"))
            record["library"] = str(getattr(handle, "status", handle))
        except Exception as exc:  # noqa: BLE001 - the mode still runs, with Inductor's caches only
            record["library_error"] = _error(exc)
    try:
        yield record
    finally:
        if handle is not None and callable(getattr(handle, "save", None)):
            try:
                saved_what = handle.save()
                record["library_saved"] = True if saved_what is None else str(saved_what)
            except Exception as exc:  # noqa: BLE001 - the timings stand
                record["library_save_error"] = _error(exc)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        clear_in_memory_caches()
