"""Deliberately broken acceleration, for checking that the test suite notices (test-only).

``BCG_DIFFUSION_TEST_SABOTAGE`` names one way to break replays:

- ``fallback``: every capture falls back to eager (the call's output is right, nothing replays);
- ``skip_segment``: a replay skips its last graph segment (stale output buffers);
- ``stale_inputs``: a replay does not copy the live inputs into its static buffers.

The library knows nothing of it. :class:`Sabotage` is a watcher of every graph runner
(``bcg_diffusion.integration.events``) that breaks each capture as it is made. ``tests/conftest.py``
installs it for a test session when the variable is set, and puts ``tests/sabotage_site`` on the
``PYTHONPATH`` of the processes the tests start (servers, torchrun workers), whose
``sitecustomize`` installs it there as soon as the library's runner events are imported. See
docs/testing.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator

from bcg_diffusion.core.graph import _Segment
from bcg_diffusion.core.replay_token import replay_token_scope
from bcg_diffusion.integration.entry_kinds import CapturedGraph, DebugRun
from bcg_diffusion.integration.events import RunnerWatcher, watch_every_runner

ENV_SABOTAGE = "BCG_DIFFUSION_TEST_SABOTAGE"
MODES = ("fallback", "skip_segment", "stale_inputs")
_session: tuple[str, Any] | None = None  # the session's sabotage (conftest): its mode and handle


def mode_from_environment() -> str | None:
    """The mode the variable names (``None`` when unset); ``ValueError`` for an unknown one."""
    raw = os.environ.get(ENV_SABOTAGE, "").strip()
    if raw and raw not in MODES:
        raise ValueError(f"{ENV_SABOTAGE}={raw!r}: use one of {', '.join(MODES)} (a test-only switch), or unset it")
    return raw or None


class Sabotage(RunnerWatcher):
    """Breaks every capture of every runner in ``mode`` (see the module docstring)."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"sabotage mode {mode!r}: use one of {', '.join(MODES)}")
        self.mode = mode

    def captured(self, entry: Any) -> Any:
        if self.mode == "fallback":
            return entry.fall_back(f"{ENV_SABOTAGE}=fallback (test-only)")
        if self.mode == "skip_segment" and isinstance(entry, CapturedGraph) and not isinstance(entry, DebugRun):
            entry.graph.replay = functools.partial(_replay_without_last_segment, entry.graph)
        elif self.mode == "stale_inputs" and isinstance(entry, CapturedGraph):
            entry.fill = functools.partial(_fill_without_copying, entry)
        return entry


def _replay_without_last_segment(graph: Any) -> None:
    steps = list(graph._steps)
    last = max((i for i, s in enumerate(steps) if isinstance(s, _Segment)), default=None)
    with replay_token_scope():
        for i, step in enumerate(steps):
            if i != last:
                step.run()


def _fill_without_copying(entry: Any, live: list) -> bool:
    """``CapturedGraph.fill`` that copies nothing (a borrowed input that moved still makes the call eager)."""
    for i, (static, tensor) in enumerate(zip(entry.static_inputs, live)):
        same = static is tensor or (static.data_ptr() == tensor.data_ptr() and static.shape == tensor.shape
                                    and static.stride() == tensor.stride())
        if not same and i in entry.borrowed:
            return False
    return True


def install(mode: str) -> Any:
    """Sabotage every runner of the process in ``mode`` until the handle is removed."""
    return watch_every_runner(Sabotage(mode))


def install_for_session(mode: str) -> None:
    """The session's sabotage (conftest, a started process), kept until the process ends."""
    global _session
    if _session is None:
        _session = (mode, install(mode))


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No session sabotage inside the block (tests of the sabotage itself)."""
    global _session
    session, _session = _session, None
    if session is not None:
        session[1].remove()
    try:
        yield
    finally:
        if session is not None:
            install_for_session(session[0])
