"""One key's life, the same for a transformer call and for a unit call in module mode.

A :class:`Slot` holds what is known of one graph key. Its first ``warmup_iters`` calls run eagerly
(they are the real calls: lazy initialisation and compiled code warm up, and the attention output
layouts a capture allocates from are recorded); the next call captures, and later calls replay the
captured graph, or run eagerly when the capture failed (``fallback``). A key whose calls change
their own inputs is never captured (``eager``). A transformer key whose capture found host work in
the transformer's own forward runs in module mode (``module``): its units replay graphs of their own
(:mod:`.module_mode`). :meth:`Slot.path` names where a slot stands; :data:`PATHS` lists the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import attention_layouts
from .entry_kinds import EagerFallback, GraphEntry, ModuleModeEntry
from .keys import GraphKey
from ..stats import GraphEntryStats, UnitCounters

WARMUP, CAPTURE, REPLAY, FALLBACK, EAGER, MODULE = "warmup", "capture", "replay", "fallback", "eager", "module"
PATHS = (WARMUP, CAPTURE, REPLAY, FALLBACK, EAGER, MODULE)


@dataclass(eq=False)
class Slot:
    """One graph key and where it stands (see the module docstring).

    ``calls`` counts its eager warm-up calls and ``layouts`` holds the attention layouts the last one
    recorded; ``entry`` is its capture once made (a :class:`~.entry_kinds.GraphEntry` of one kind; dropped
    on eviction: the next call captures again); ``refused`` why it is never captured.
    """

    key: GraphKey
    calls: int = 0
    layouts: list | None = None
    entry: GraphEntry | None = None
    refused: str | None = None

    def path(self, warmup_iters: int) -> str:
        """Where this slot's next call goes: one of :data:`PATHS`."""
        if isinstance(self.entry, EagerFallback):
            return FALLBACK
        if isinstance(self.entry, ModuleModeEntry):
            return MODULE
        if self.entry is not None:
            return REPLAY
        if self.refused is not None:
            return EAGER
        return WARMUP if self.calls < warmup_iters else CAPTURE

    def warm_up(self, run: Callable[[], Any]) -> Any:
        """``run()`` (an eager call), recording its attention layouts for the capture."""
        with attention_layouts.recording_layouts() as layouts:
            out = run()
        self.calls += 1
        self.layouts = layouts
        return out

    def release(self) -> None:
        """Free the graphs; the slot stands where it did before its capture."""
        if self.entry is not None:
            self.entry.release()
        self.entry = None

    @property
    def units(self) -> Any:
        """The unit graphs of a key in module mode (:class:`~.module_mode.UnitGraphs`), else ``None``."""
        return self.entry.units if isinstance(self.entry, ModuleModeEntry) else None

    @property
    def memory_bytes(self) -> int:
        """Graph memory of this key (its unit graphs' in module mode), as counted at capture."""
        own = self.entry.memory_bytes if self.entry is not None else 0
        return own + (self.units.memory_bytes if self.units is not None else 0)

    def unit_counters(self) -> UnitCounters:
        return self.units.counters if self.units is not None else UnitCounters()

    def stats(self) -> GraphEntryStats:
        """This key as ``get_stats`` reports it (a kept slot: its entry is there)."""
        entry, units = self.entry, self.units
        counters = self.unit_counters()
        return GraphEntryStats(
            key=self.key.summary(),
            segments=entry.segments,
            breaks=entry.breaks,
            capture_time_s=entry.capture_time_s + (units.capture_time_s if units is not None else 0.0),
            memory_bytes=self.memory_bytes,
            hits=entry.hits,
            fallback=entry.reason if isinstance(entry, EagerFallback) else None,
            eager_modules=tuple(entry.eager_modules),
            capture_phases=tuple(entry.phases.items()),
            module_mode=isinstance(entry, ModuleModeEntry),
            eager_reason=units.reason if units is not None else None,
            child_graphs=len(units.entries()) if units is not None else 0,
            child_hits=counters.hits,
            child_warmup_calls=counters.warmup_calls,
            child_eager_calls=counters.eager_calls,
            child_failed_captures=counters.failed_captures,
        )
