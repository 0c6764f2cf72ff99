"""Which commit a result was made at, for the tools' reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["COMMIT_VARIABLE", "checkout_commit"]

#: Names the commit of a copy whose git metadata is missing or stale (a copy sent to another machine, say).
COMMIT_VARIABLE = "BENCH_GIT_COMMIT"


def checkout_commit(short: bool = False) -> str | None:
    """The checkout's commit: :data:`COMMIT_VARIABLE` where set, else git's (``short``: abbreviated); ``None`` where
    neither says."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    command = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
