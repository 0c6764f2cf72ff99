"""Fault rules for the tests (``KIND:PROMPT``, :mod:`bcg_diffusion.serving.load.fault_rules`): installed in this process
through the server's fault seam, or handed to the servers a test starts.

- :func:`installed` installs rules in this process (in-process servers and runners) and removes them after;
- a single spawned server gets rules through ``spawn.start_server(..., faults=...)`` (its launcher installs them);
- :func:`in_started_processes` sets what a server whose pipelines run in other processes (Ray's replicas) reads:
  ``tests/fault_site`` on its ``PYTHONPATH`` and ``BCG_DIFFUSION_TEST_FAULTS`` (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Sequence

from bcg_diffusion.serving.load.fault_rules import PromptFaults
from bcg_diffusion.serving.faults import install_fault_hook

ENV_FAULTS = "BCG_DIFFUSION_TEST_FAULTS"
SITE = Path(__file__).resolve().parent / "fault_site"


@contextlib.contextmanager
def installed(rules: Sequence[str]) -> Iterator[PromptFaults]:
    """The rules installed in this process while the block runs."""
    faults = PromptFaults.from_texts(rules)
    remove = install_fault_hook(faults)
    try:
        yield faults
    finally:
        remove()


@contextlib.contextmanager
def in_started_processes(rules: Sequence[str]) -> Iterator[None]:
    """While the block runs, the processes started from this one install ``rules`` once they import the server."""
    saved = {k: os.environ.get(k) for k in (ENV_FAULTS, "PYTHONPATH")}
    os.environ[ENV_FAULTS] = ",".join(rules)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), saved["PYTHONPATH"]) if p)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
