"""The one replay path of a graph runner: a transformer call's and, in module mode, a unit call's.

A call of a captured key fills the entry's static inputs from the call and replays the graph; the
outputs are the graph's own buffers (the caller copies them where it must). Two things make the call
run eagerly instead, and both are the same for the transformer and its units:

- a static input read in place (a unit's input that is an earlier unit's output) is not where the call's
  input is: nothing was replayed, the call runs eagerly, the key stays;
- a break returned another structure or shape than at capture
  (:class:`~bcg_diffusion.core.BreakOutputMismatchError`): its output depends on values the key does not
  hold, and the replay stopped part-way. The runner's watchers are told (under context parallelism this
  raises: the other ranks ran part of the call), one warning names what stopped, the key falls back to
  eager from now on (counted as a failed capture), and this call runs eagerly: a partial replay is never
  returned.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..core.copy_back import BreakOutputMismatchError
from .events import RunnerEvents
from .keys import Call
from .slots import Slot


class Replayer:
    """Replays the captured keys of one runner (see the module docstring). ``warn`` warns once per message."""

    def __init__(self, events: RunnerEvents, warn: Callable[[str], None], attention_policy: str) -> None:
        self.events = events
        self.warn = warn
        self.attention_policy = attention_policy

    def replay(self, slot: Slot, call: Call, counters: Any, what: str) -> tuple[Any, bool]:
        """Replay ``slot``'s captured entry for ``call``: ``(the graph's outputs, True)``, or ``(the eager
        result, False)`` when the call had to run eagerly. ``counters`` (a runner's or module mode's) count
        the hit, the eager call and a replay that stopped; ``what`` names the replayed module in the warning."""
        entry = slot.entry
        first, started = entry.hits == 0, time.perf_counter()
        try:
            if not entry.fill(call.tensors):
                counters.eager_calls += 1
                return call.run(), False
            outputs = entry.replay(call.forward, self.attention_policy)
        except BreakOutputMismatchError as exc:
            self._stopped(slot, exc, what)
            counters.failed_captures += 1
            counters.eager_calls += 1
            return call.run(), False
        if first:
            entry.phases["first_replay"] = time.perf_counter() - started
        entry.hits += 1
        counters.hits += 1
        return outputs, True

    def _stopped(self, slot: Slot, exc: BreakOutputMismatchError, what: str) -> None:
        self.events.replay_failed(exc)  # context parallelism: raises (the other ranks ran part of the call)
        self.warn(f"bcg: replay of {what} stopped: {exc}. This input shape now runs eagerly.")
        slot.entry = slot.entry.fall_back(f"break output changed shape: {str(exc).splitlines()[0][:200]}")
