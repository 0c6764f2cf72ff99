"""Break arguments that do not pin segment intermediates: provenance by lifetime.

A break's arguments (q, k, v) are usually intermediates of the segment before it, living in the
graph's private memory pool. Holding them strongly would pin one copy per break for the life of
the graph. So at the break every plain device tensor argument is recorded as a *non-owning* view
(same address, shape and strides, no reference on the block) plus a weak reference to its storage.
When the whole capture has ended, :meth:`BreakArguments.finalize` applies the lifetime rule:

- a storage still alive (the model, a cache, a bridge buffer or the static inputs hold it) is
  upgraded: the view becomes an owning tensor of that storage (same offset, sizes, strides), so the
  block stays valid whatever its owner does later;
- a storage that died during the capture stays non-owning: it was an intermediate of the captured
  code, allocated in the pool, which the segments keep alive. Reusing its block in later segments is
  safe because replay is sequential (the segment before the break writes it, the break reads it).

No allocator query is made (a snapshot walks every block). The one case the rule cannot see is a
tensor that existed before the capture, is passed to a break, and whose last owner drops it during
the capture: its block went back to the general allocator. The opt-in check of :mod:`.pool_check`
finds it. The logic is device-agnostic (``detachable`` picks the tensors), so it is tested on CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .tree import tree_map

logger = logging.getLogger(__name__)


def non_owning_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor aliasing ``t``'s memory (same shape, strides, offset) that does not keep it alive."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    view = torch.empty(0, dtype=t.dtype, device=t.device)
    view.set_(alias, t.storage_offset(), t.size(), t.stride())
    return view


def is_plain_cuda_tensor(t: torch.Tensor) -> bool:
    """The tensors recorded non-owning by default: plain ``torch.Tensor`` on a CUDA device (subclasses,
    such as quantized weights, wrap their data and are held as they are)."""
    return type(t) is torch.Tensor and t.is_cuda


@dataclass
class _Recorded:
    """One argument: its non-owning view, a weak reference to the storage it came from, and the
    storage's address then (a storage reallocated since, by ``resize_``, is not the same memory)."""

    view: torch.Tensor
    storage: StorageWeakRef
    data_ptr: int
    name: str


@dataclass(frozen=True)
class KeptNonOwning:
    """An argument left non-owning by :meth:`BreakArguments.finalize`: the break's name and the view."""

    name: str
    view: torch.Tensor


class BreakArguments:
    """The arguments of one capture's breaks (sub-captures of hooked calls share their capture's).

    ``detach`` records them non-owning while the capture runs; ``finalize`` applies the lifetime rule
    once the outermost capture has ended successfully (see the module docstring). A capture that fails
    drops the object unfinalized: its graph and views are discarded with it.
    """

    def __init__(self, detachable: Callable[[torch.Tensor], bool] = is_plain_cuda_tensor) -> None:
        self._detachable = detachable
        self._pending: list[_Recorded] = []

    @property
    def pending(self) -> int:
        """Arguments recorded and not finalized yet."""
        return len(self._pending)

    def detach(self, value: Any, name: str) -> Any:
        """``value`` with its containers copied and every detachable tensor replaced by a non-owning
        view, recorded under the break ``name``. Other objects are kept as they are (held strongly)."""

        def detach(t: torch.Tensor) -> torch.Tensor:
            if not self._detachable(t):
                return t
            storage = t.untyped_storage()
            if storage.nbytes() == 0:  # no memory to pin: held as it is
                return t
            view = non_owning_view(t)
            self._pending.append(_Recorded(view, StorageWeakRef(storage), storage.data_ptr(), name))
            return view

        return tree_map(detach, value)

    def finalize(self) -> list[KeptNonOwning]:
        """Upgrade every recorded view whose storage is still alive to an owning tensor of it; return
        the ones left non-owning. Drops the weak references; a second call finds nothing."""
        pending, self._pending = self._pending, []
        kept = [KeptNonOwning(r.name, r.view) for r in pending if not _upgrade(r)]
        logger.debug("break arguments: %d upgraded to owning, %d left non-owning (died during the capture)",
                     len(pending) - len(kept), len(kept))
        return kept


def _live_storage(record: _Recorded) -> torch.UntypedStorage | None:
    """The recorded storage, strongly, if it is alive and still at the recorded address."""
    if record.storage.expired():
        return None
    storage = torch.UntypedStorage._new_with_weak_ptr(record.storage.cdata)
    if storage is None or storage.data_ptr() != record.data_ptr:
        return None
    return storage


def _upgrade(record: _Recorded) -> bool:
    """Make ``record.view`` own its live storage in place (the replay closures hold that very tensor);
    False where the storage died (or moved) and the view stays non-owning."""
    storage = _live_storage(record)
    if storage is None:
        return False
    view = record.view
    if storage.nbytes() < view.untyped_storage().nbytes():
        return False
    with torch.inference_mode(view.is_inference()):
        view.set_(storage, view.storage_offset(), view.size(), view.stride())
    return True
