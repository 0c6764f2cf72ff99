"""Which block each device slot holds, and what to load next: the host logic of weight streaming.

Blocks are numbered in registration order; block ``i`` always computes from slot ``i % K`` (its tensors'
device views are fixed, so a captured graph reads them at the same addresses on every replay). The work is
done by :class:`SlotOps` (a CUDA copy stream, or plain CPU copies); this class only decides, the same way on
every machine, so the CPU tests check the decisions the GPU runs.

Per transformer call (:meth:`Residency.begin_call` ... :meth:`Residency.end_call`): the slots are taken as
empty (the host copies may have been written between calls), the block predicted to run first is loaded,
and each block's entry (:meth:`Residency.enter`) makes it resident (a load on demand, counted, when the block
asked for is not the one loaded), points its tensors at its slot, and loads the blocks predicted to follow
into the other slots. The prediction follows the real order of block calls: the block that followed each block
last time (registration order until seen), and the first block of the last call. A block entered twice in one
call starts a new pass over the blocks (the call that captures runs its blocks' entries at capture, then
again in the replay that makes its output): the last block's successor stays unknown, nothing wraps around.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ...errors import AccelerationError


class SlotOps(Protocol):
    """The work behind the decisions: ``mark`` notes the compute enqueued so far (a load into a slot waits for
    it), ``load`` starts copying a block into its slot, ``wait`` makes the compute wait for a slot's last load,
    ``attach`` / ``detach`` point a block's tensors at its slot / its host copy."""

    def mark(self) -> None: ...
    def load(self, block: int, slot: int) -> None: ...
    def wait(self, slot: int) -> None: ...
    def attach(self, block: int) -> None: ...
    def detach(self, block: int) -> None: ...


@dataclass
class LoadCounters:
    """What was loaded: per call and since the start (see :class:`~bcg_diffusion.OffloadStats`)."""

    calls: int = 0
    bytes_this_call: int = 0
    bytes_last_call: int = 0
    bytes_streamed: int = 0
    prefetched: int = 0
    sync_loads: int = 0


class Residency:
    """The slot holders and the predicted block order of one streamed transformer (module docstring)."""

    def __init__(self, sizes: list[int], slots: int, ops: SlotOps, owner: str = "transformer") -> None:
        self.sizes = list(sizes)
        self.slots = slots
        self.ops = ops
        self.owner = owner
        self.counters = LoadCounters()
        self.holders: list[int | None] = [None] * slots
        self.attached: set[int] = set()
        self.successors: list[int | None] = [i + 1 for i in range(len(sizes) - 1)] + [None]
        self.first = 0
        self.previous: int | None = None
        self.entered: set[int] = set()  # blocks entered in this pass over the blocks
        self.in_call = False

    def slot_of(self, block: int) -> int:
        return block % self.slots

    # -- a transformer call -------------------------------------------------------------------
    def begin_call(self) -> None:
        """Slots taken as empty; the block predicted first starts loading."""
        self._detach_all()
        self.holders = [None] * self.slots
        self.previous = None
        self.entered = set()
        self.counters.bytes_this_call = 0
        self.in_call = True
        self.ops.mark()
        self._load(self.first, prefetched=True)

    def enter(self, block: int) -> None:
        """Block ``block`` is about to compute: resident, pointed at its slot, the next ones loading."""
        if not self.in_call:
            raise AccelerationError(
                f"weight streaming: block {block} of {self.owner} was called outside a call of the transformer; "
                "streamed blocks run only inside the transformer's own call"
            )
        self.ops.mark()
        slot = self.slot_of(block)
        if self.holders[slot] != block:
            self._load(block, prefetched=False)
        self.ops.wait(slot)
        if block not in self.attached:
            self.ops.attach(block)
            self.attached.add(block)
        self._learn(block)
        self._prefetch_after(block)

    def end_call(self) -> None:
        """Every block's tensors back on its host copy; the call's bytes counted."""
        self._detach_all()
        self.in_call = False
        c = self.counters
        c.calls += 1
        c.bytes_last_call = c.bytes_this_call

    # -- decisions -----------------------------------------------------------------------------
    def _learn(self, block: int) -> None:
        """The order seen: ``block`` follows the previous one of this pass. A block entered again in one call
        starts a new pass (a capture's run, then its replay, in one call): no wrap-around is learnt."""
        if block in self.entered:
            self.entered.clear()
            self.previous = None
        self.entered.add(block)
        if self.previous is None:
            self.first = block
        else:
            self.successors[self.previous] = block
        self.previous = block

    def predicted_after(self, block: int) -> list[int]:
        """The blocks to load after ``block``: its predicted successors, one per other slot, up to a repeat."""
        taken, found, current = {self.slot_of(block)}, [], block
        for _ in range(self.slots - 1):
            current = self.successors[current]
            if current is None or self.slot_of(current) in taken:
                break
            taken.add(self.slot_of(current))
            found.append(current)
        return found

    def _prefetch_after(self, block: int) -> None:
        for upcoming in self.predicted_after(block):
            if self.holders[self.slot_of(upcoming)] != upcoming:
                self._load(upcoming, prefetched=True)

    def _load(self, block: int, prefetched: bool) -> None:
        slot = self.slot_of(block)
        previous = self.holders[slot]
        if previous is not None and previous in self.attached:
            self.ops.detach(previous)
            self.attached.discard(previous)
        self.ops.load(block, slot)
        self.holders[slot] = block
        c = self.counters
        c.bytes_this_call += self.sizes[block]
        c.bytes_streamed += self.sizes[block]
        if prefetched:
            c.prefetched += 1
        else:
            c.sync_loads += 1

    def _detach_all(self) -> None:
        for block in sorted(self.attached):
            self.ops.detach(block)
        self.attached.clear()

    def resize(self, block: int, nbytes: int) -> None:
        """A block was packed again (its tensors changed): its new size, and no slot holds it any more."""
        self.sizes[block] = nbytes
        self.holders = [None if h == block else h for h in self.holders]
