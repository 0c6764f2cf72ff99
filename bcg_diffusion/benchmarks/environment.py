"""What every benchmark writes about its run: the environment (versions, GPU, commit) and a fresh result path."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any

import diffusers
import torch
import transformers

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.provenance import checkout_commit

__all__ = ["SUFFIXES", "environment", "git_commit", "output_base"]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The files a result is written as (a fresh base has none of them).
SUFFIXES = (".json", ".md", ".png")


def environment(device, dtype, cuda: bool) -> dict[str, Any]:
    """Versions, GPU and commit of this run; ``BENCH_GIT_COMMIT`` names the commit of a copy without .git."""
    env: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "device": str(device),
        "dtype": pipelines.dtype_name(dtype),
        "cpu_count": os.cpu_count(),
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }
    env["git_commit"] = git_commit()
    return env


def git_commit() -> str | None:
    """The checkout's short commit (:func:`~bcg_diffusion.toolkit.provenance.checkout_commit`: ``BENCH_GIT_COMMIT``
    where set, else git's); ``None`` where neither says."""
    return checkout_commit(short=True)


def output_base(out_dir: Path, prefix: str = "bench_step") -> Path:
    """A fresh ``out_dir/<prefix>_<date>_<time>[_N]`` (no result file of that name exists yet)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}_{_dt.datetime.now().strftime('%Y-%m-%d_%H%M%S')}"
    base, n = out_dir / stem, 1
    while any(base.with_suffix(s).exists() for s in SUFFIXES):
        n += 1
        base = out_dir / f"{stem}_{n}"
    return base
