"""The slots of one transformer's keys: those with a capture, and those seen but not captured yet.

Keys with a capture (kept, failed, or in module mode) are at most ``BCGConfig.max_graphs``; with
``memory_budget_bytes`` they hold at most that much graph memory (the newest always stays). The
least recently used goes first. An evicted key that had replayed is seen again: its next call
captures anew; a failed or module-mode key is forgotten (its next call is a new key). Keys seen
but not captured (their warm-up calls, or their calls change their own inputs) are kept for their
next call, the last :data:`SEEN_LIMIT` of them.
"""

from __future__ import annotations

import collections
import functools

import torch

from ..config import BCGConfig
from ..stats import UnitCounters
from .entries import capture_lock
from .entry_kinds import CapturedGraph
from .keys import GraphKey
from .slots import Slot

SEEN_LIMIT = 64


class GraphCache:
    """The slots of one transformer's keys (see the module docstring)."""

    def __init__(self, config: BCGConfig) -> None:
        self.config = config
        self.captured: collections.OrderedDict[GraphKey, Slot] = collections.OrderedDict()
        self.seen: collections.OrderedDict[GraphKey, Slot] = collections.OrderedDict()
        self.retired = UnitCounters()  # unit calls of module-mode keys no longer kept
        self.last_new: GraphKey | None = None  # the last key met for the first time

    def find(self, key: GraphKey) -> Slot | None:
        """The slot of ``key``, now the most recently used, or ``None`` for a key never seen (or forgotten)."""
        for table in (self.captured, self.seen):
            slot = table.get(key)
            if slot is not None:
                table.move_to_end(key)
                return slot
        return None

    def closest(self) -> GraphKey | None:
        """The key a new key is best compared with (in the log of misses): the last new one, or the
        most recently used; ``None`` while no key is kept or seen."""
        table = self.captured or self.seen
        if not table:
            return None
        return self.last_new if self.last_new is not None else next(reversed(table))

    def new(self, key: GraphKey) -> Slot:
        """A slot for a key met for the first time (it warms up)."""
        self.last_new = key
        slot = self.seen[key] = Slot(key)
        while len(self.seen) > SEEN_LIMIT:
            self.seen.popitem(last=False)
        return slot

    def make_room(self) -> None:
        """Evict so that one more key can be kept within ``max_graphs``."""
        self.evict(keep=self.config.max_graphs - 1)

    def keep(self, slot: Slot, *, within_budget: bool = True) -> None:
        """Keep ``slot`` (with its entry) as the most recently used; then evict what the memory
        budget does not hold (unless ``within_budget`` is False)."""
        self.seen.pop(slot.key, None)
        self.captured[slot.key] = slot
        if within_budget and self.config.memory_budget_bytes is not None:
            self.evict(keep=len(self.captured), over_budget=self.config.memory_budget_bytes)

    def slots(self) -> list[Slot]:
        """The kept slots, least recently used first."""
        return list(self.captured.values())

    def unit_counters(self) -> UnitCounters:
        """Unit calls of module mode over every key, kept and evicted."""
        return functools.reduce(lambda total, slot: total + slot.unit_counters(), self.captured.values(), self.retired)

    def evict_all(self) -> bool:
        """Release every kept graph (a capture ran out of memory); False when there was none."""
        had = bool(self.captured)
        self.evict(keep=0)
        return had

    def clear(self) -> None:
        """Forget every key: each runs eagerly once more, then is captured again."""
        self.evict(keep=0, forget=True)
        self.seen.clear()

    def evict(self, keep: int, over_budget: int | None = None, forget: bool = False) -> None:
        """Release least recently used slots while more than ``keep`` are kept, and, with a budget,
        while the kept ones hold more than ``over_budget`` bytes (the newest always stays). A slot
        that replayed is seen again (captured at its next call) unless ``forget``."""
        evicted = False
        while len(self.captured) > keep or (
            over_budget is not None and len(self.captured) > 1 and sum(s.memory_bytes for s in self.captured.values()) > over_budget
        ):
            key, slot = self.captured.popitem(last=False)
            self.retired = self.retired + slot.unit_counters()
            replayed = isinstance(slot.entry, CapturedGraph)
            slot.release()
            if forget:
                self.seen.pop(key, None)
            elif replayed:
                self.seen[key] = slot
            evicted = True
        if evicted and torch.cuda.is_available():
            with capture_lock:  # emptying the cache synchronises the device, which breaks captures
                torch.cuda.empty_cache()
