"""Deliberately broken acceleration, for checking that the test suite notices (test-only).

``BCG_DIFFUSION_TEST_SABOTAGE`` names one way to break replays; unset (the default, and what
every user runs), the library behaves normally and this module only forwards calls:

- ``fallback``: every capture falls back to eager (the call's output is right, nothing replays);
- ``skip_segment``: a replay skips its last graph segment (stale output buffers);
- ``stale_inputs``: a replay does not copy the live inputs into its static buffers.

The switch is read when a transformer is accelerated. See docs/testing.md.
"""

from __future__ import annotations

import os

from ..core.graph import BreakableCUDAGraph, _Segment
from ..core.replay_token import replay_token_scope

ENV_SABOTAGE = "BCG_DIFFUSION_TEST_SABOTAGE"
MODES = ("fallback", "skip_segment", "stale_inputs")
_mode: str | None = None


def read_environment() -> str | None:
    """Read the switch (called at acceleration); raises ``ValueError`` for an unknown mode."""
    global _mode
    raw = os.environ.get(ENV_SABOTAGE, "").strip()
    if raw and raw not in MODES:
        raise ValueError(f"{ENV_SABOTAGE}={raw!r}: use one of {', '.join(MODES)} (a test-only switch), or unset it")
    _mode = raw or None
    return _mode


def mode() -> str | None:
    return _mode


def captures_fail() -> bool:
    return _mode == "fallback"


def stale_inputs() -> bool:
    return _mode == "stale_inputs"


def replay(graph: BreakableCUDAGraph) -> None:
    """``graph.replay()``, or under ``skip_segment`` the same without its last segment."""
    if _mode != "skip_segment":
        graph.replay()
        return
    steps = list(graph._steps)
    last = max((i for i, s in enumerate(steps) if isinstance(s, _Segment)), default=None)
    with replay_token_scope():
        for i, step in enumerate(steps):
            if i != last:
                step.run()
