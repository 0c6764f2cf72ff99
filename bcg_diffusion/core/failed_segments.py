"""Where a segment whose capture failed goes: it is kept, never destroyed.

When ``capture_begin`` has run, torch's CUDA allocators (device and pinned host) route allocations to the
graph's pool through a filter that points at the ``torch.cuda.CUDAGraph`` object, and the default CUDA
generator keeps a pointer to it as well. A capture that ends cleanly undoes all of that in ``capture_end``;
one that fails may not (torch 2.11: pytorch #190308 is open for errors raised before the end of a capture,
#190348 for the pool a failed capture leaves referenced). Destroying such an object can leave the allocator or
the generator holding a dangling pointer, which a later allocation or capture follows. So a failed segment is
parked here for the life of the process instead: an object of a few hundred bytes (its partial graph, if any,
was already destroyed), which costs nothing next to the memory of its pool that torch keeps anyway.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_parked: list[Any] = []


def park(segment: Any) -> None:
    """Keep ``segment`` (a ``torch.cuda.CUDAGraph`` whose capture did not end cleanly) alive for good."""
    if segment is None:
        return
    with _lock:
        _parked.append(segment)


def parked_count() -> int:
    """How many failed segments this process keeps (one per capture that did not end cleanly)."""
    with _lock:
        return len(_parked)
