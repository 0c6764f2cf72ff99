"""Break arguments that do not pin segment intermediates.

A break's arguments (q, k, v) are usually intermediates of the segment before it, living in the
graph's private memory pool. Holding them strongly would pin one copy per break for the life of
the graph. Instead the replay closure keeps *non-owning* views of pool tensors: same address,
shape and strides, no reference on the block. That is safe because replay is sequential: the
segment before a break writes the block, the break reads it, and only later segments may reuse it.
Tensors outside the pool (static inputs, weights, eager tensors) are held strongly.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

import torch

from .tree import tree_map

logger = logging.getLogger(__name__)


def pool_segments(pool: Any, device: torch.device) -> list[dict]:
    """The allocator segments (``torch.cuda.memory_snapshot`` entries) of memory pool ``pool`` on
    ``device``. Raises whatever the snapshot raises where the allocator cannot be queried."""
    pool = tuple(pool)
    try:
        segments = torch.cuda.memory_snapshot(mempool_id=pool)
    except TypeError:  # older torch: no mempool_id argument
        segments = torch.cuda.memory_snapshot()
    return [
        s
        for s in segments
        if tuple(s.get("segment_pool_id", ())) == pool and s.get("device", device.index) == device.index
    ]


def non_owning_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor aliasing ``t``'s memory (same shape, strides, offset) that does not keep it alive."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    view = torch.empty(0, dtype=t.dtype, device=t.device)
    view.set_(alias, t.storage_offset(), t.size(), t.stride())
    return view


class PoolMembership:
    """Answers "does this CUDA address lie in the capture pool?" from allocator snapshots.

    Address ranges of the pool's segments are cached and refreshed on a miss (the pool only
    grows during a capture). When the allocator cannot be queried every answer is ``False``,
    which is safe: the tensor is then held strongly.
    """

    def __init__(self, pool: Any, device: torch.device) -> None:
        self._pool = tuple(pool)
        self._device = device
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._outside: set[int] = set()
        self._broken = False

    def contains(self, ptr: int) -> bool:
        if self._hit(ptr):
            return True
        if ptr in self._outside or self._broken:
            return False
        self._refresh()
        if self._hit(ptr):
            return True
        self._outside.add(ptr)
        return False

    def _hit(self, ptr: int) -> bool:
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr < self._ends[i]

    def _refresh(self) -> None:
        try:
            segments = pool_segments(self._pool, self._device)
        except Exception as exc:  # pragma: no cover - depends on the torch build
            logger.debug("allocator snapshot unavailable (%s); break arguments held strongly", exc)
            self._broken = True
            return
        ranges = sorted((s["address"], s["address"] + s["total_size"]) for s in segments)
        self._starts = [a for a, _ in ranges]
        self._ends = [b for _, b in ranges]


def detach_from_pool(value: Any, membership: PoolMembership) -> Any:
    """``value`` with its containers copied and every CUDA tensor that lives in the pool replaced
    by a non-owning view. Other objects are kept as they are (held strongly)."""

    def detach(t: torch.Tensor) -> torch.Tensor:
        if t.is_cuda and type(t) is torch.Tensor and membership.contains(t.untyped_storage().data_ptr()):
            return non_owning_view(t)
        return t

    return tree_map(detach, value)
