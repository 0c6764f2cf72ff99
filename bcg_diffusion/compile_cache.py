"""``use_compile_cache``: torch.compile artifacts that survive a restart.

With regional compile + BCG, a restarted process compiles every block again (seconds per case, minutes
with fp8). torch has two mechanisms to avoid it, and this module points both at one
folder the user names:

- Inductor's on-disk caches (FX graphs, AOTAutograd, Triton kernels, autotuning) live under
  ``TORCHINDUCTOR_CACHE_DIR``; a second process with the same folder skips code generation and
  compilation (dynamo still traces, which is cheap next to Inductor).
- ``torch.compiler.save_cache_artifacts()`` / ``load_cache_artifacts()`` ("mega-cache"): one file
  with everything compiled so far, to copy to another machine of the same kind.

Artifacts are only valid for the torch and Triton versions, CUDA version and GPU that made them, so
each combination gets its own sub-folder with a manifest; a folder made elsewhere is ignored with a
message that says why, and nothing stale is ever loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger("bcg_diffusion")

MANIFEST = "bcg_compile_cache.json"
ARTIFACTS = "mega_cache.bin"
_ENV = "TORCHINDUCTOR_CACHE_DIR"


def environment() -> dict[str, str]:
    """What compile artifacts depend on: torch, Triton, CUDA and the GPU (name and compute capability)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} sm{major}{minor}"
    else:
        gpu = "cpu"
    return {"torch": torch.__version__, "triton": triton_version, "cuda": str(torch.version.cuda), "gpu": gpu}


def environment_tag(env: dict[str, str]) -> str:
    """A folder name for ``env``: ``torch-2.11.0-triton-3.5.0-cuda-13.0-NVIDIA-H200-sm90``."""
    raw = f"torch-{env['torch']}-triton-{env['triton']}-cuda-{env['cuda']}-{env['gpu']}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-")


@dataclass
class CompileCache:
    """The compile cache in use (from :func:`use_compile_cache`).

    ``directory``: the folder the user named; ``folder``: this environment's sub-folder, which is
    Inductor's cache folder for the process; ``status``: ``"cold: ..."``, ``"warm: ..."`` or a
    sentence on what was ignored and why; ``loaded``: whether saved mega-cache artifacts were loaded.
    """

    directory: Path
    folder: Path
    status: str
    loaded: bool = False
    ignored: list[str] = field(default_factory=list)

    def save(self) -> Path | None:
        """Write the mega-cache of everything compiled in this process so far into :attr:`folder`
        (``mega_cache.bin``); returns its path, or ``None`` when nothing was compiled."""
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return None
        data, _info = saved
        if not data:
            return None
        path = self.folder / ARTIFACTS
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        _write_manifest(self.folder, environment())
        logger.info("bcg: saved %d bytes of compile artifacts to %s", len(data), path)
        return path


def use_compile_cache(directory: str | os.PathLike) -> CompileCache:
    """Keep torch.compile's artifacts in ``directory`` so that a later process reuses them.

    Call it once, before anything is compiled (it sets ``TORCHINDUCTOR_CACHE_DIR`` for this
    process to ``directory/<torch-triton-cuda-gpu>/``, and loads that folder's saved mega-cache if
    any). Sub-folders of other torch versions or GPUs are left alone and named in ``status``. Call
    :meth:`CompileCache.save` after compiling to also write the portable mega-cache file.
    Raises ``ValueError`` when ``directory`` exists and is not a folder, or cannot be written.
    """
    root = Path(directory).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ValueError(f"compile cache {root} exists and is not a folder; name a folder")
    env = environment()
    tag = environment_tag(env)
    folder = root / tag
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"compile cache {root} cannot be written: {exc}") from exc
    if not os.access(folder, os.W_OK):
        raise ValueError(f"compile cache {folder} is not writable")
    ignored = [p.name for p in root.iterdir() if p.is_dir() and p.name != tag and (p / MANIFEST).exists()]
    problem = _manifest_problem(folder, env)
    if problem is not None:
        # A folder of this name whose manifest disagrees (copied or renamed by hand): never load it.
        stale = folder.with_name(f"{tag}.stale")
        if stale.exists():
            shutil.rmtree(stale)
        folder.rename(stale)
        folder.mkdir(parents=True)
        ignored.append(f"{tag} ({problem}; moved to {stale.name})")
    had_files = any(p.name != MANIFEST for p in folder.iterdir())
    os.environ[_ENV] = str(folder)
    _clear_inductor_caches()
    loaded = _load_artifacts(folder)
    _write_manifest(folder, env)
    if loaded:
        status = f"warm: loaded saved compile artifacts from {folder / ARTIFACTS}"
    elif had_files:
        status = f"warm: Inductor's on-disk cache in {folder}"
    else:
        status = f"cold: nothing compiled yet for this environment; artifacts go to {folder}"
    if ignored:
        status += (
            f"; ignored artifacts made for another environment ({', '.join(ignored)}): this process is {tag}, "
            "and artifacts of other torch, Triton or CUDA versions or GPUs are never loaded"
        )
    logger.info("bcg: compile cache %s", status)
    return CompileCache(root, folder, status, loaded, ignored)


def _manifest_problem(folder: Path, env: dict[str, str]) -> str | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable manifest: {exc}"
    different = [f"{k} {written.get(k)!r} != {v!r}" for k, v in env.items() if written.get(k) != v]
    return f"written for {', '.join(different)}" if different else None


def _write_manifest(folder: Path, env: dict[str, str]) -> None:
    (folder / MANIFEST).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")


def _load_artifacts(folder: Path) -> bool:
    path = folder / ARTIFACTS
    if not path.exists():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
        problem = None if info is not None else "torch rejected the file (damaged or of another torch build)"
    except Exception as exc:  # noqa: BLE001 - a damaged file must not stop the process: it recompiles
        info, problem = None, f"{type(exc).__name__}: {exc}"
    if problem is not None:
        logger.warning("bcg: compile artifacts in %s could not be loaded (%s); compiling anew", path, problem)
    return info is not None


def _clear_inductor_caches() -> None:
    """Inductor keeps some lookups of the cache folder in memory: drop them after moving it."""
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:
        return
    clear_caches()

