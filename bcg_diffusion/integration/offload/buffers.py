"""The packed host copies of the blocks (page-locked where asked) and the device slots.

A host copy is one CPU byte buffer per block, page-aligned and a whole number of pages long, registered
with CUDA (``cudaHostRegister``) when pinned: copies from it to the device are then asynchronous DMA. It is
not taken from torch's pinned-memory cache, which rounds every allocation up to a power of two (a 680 MB
block would take 1 GiB of page-locked memory). Registration goes through cuda-bindings, as the capture core's.
"""

from __future__ import annotations

import logging
import weakref

import torch

from ...core._cudart import check_cuda, cudart
from ...errors import AccelerationError

logger = logging.getLogger("bcg_diffusion")
PAGE = 4096
GIB = 2**30


def _register(ptr: int, nbytes: int) -> None:
    check_cuda(cudart().cudaHostRegister(ptr, nbytes, 0), "cudaHostRegister")


def _unregister(ptr: int) -> None:
    check_cuda(cudart().cudaHostUnregister(ptr), "cudaHostUnregister")


def _unpin_quietly(ptr: int) -> None:
    try:
        _unregister(ptr)
    except Exception as exc:  # noqa: BLE001 - unpinning never fails what it is part of
        logger.warning("bcg: weight streaming: unpinning a host copy failed: %s", exc)


class HostCopy:
    """One block's bytes in host memory (``tensor``: uint8); :meth:`release` unpins it (the memory stays
    valid while any view of it lives). A copy dropped without :meth:`release` is unpinned when collected, before
    its memory can be freed (it holds that memory)."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        length = max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)
        with torch.inference_mode(False):
            raw = torch.empty(length + PAGE, dtype=torch.uint8)
        start = (-raw.data_ptr()) % PAGE
        self.tensor = raw[start: start + length]
        self.pinned = False
        self._unpin: weakref.finalize | None = None
        if pin:
            try:
                _register(self.tensor.data_ptr(), length)
            except Exception as exc:  # noqa: BLE001 - said with what to do
                raise AccelerationError(
                    f"weight streaming could not page-lock {length / GIB:.2f} GiB of host memory for a block ({exc}). "
                    "Free host memory (or raise the locked-memory limit, ulimit -l, in containers), or pass "
                    "OffloadConfig(pin_memory=False): pageable copies, which hold the host until done."
                ) from None
            self.pinned = True
            self._unpin = weakref.finalize(self, _unpin_quietly, self.tensor.data_ptr())

    @property
    def nbytes(self) -> int:
        return self.tensor.numel()

    def release(self) -> None:
        if self.pinned:
            self.pinned = False
            self._unpin()  # once: a finalizer runs at most once


def allocate_host(sizes: list[int], pin: bool) -> list[HostCopy]:
    """One :class:`HostCopy` per size; on failure the ones made are released and the error raised."""
    made: list[HostCopy] = []
    try:
        for nbytes in sizes:
            made.append(HostCopy(nbytes, pin))
    except BaseException:
        release_host(made)
        raise
    return made


def release_host(copies: list[HostCopy]) -> None:
    for copy in copies:
        copy.release()


def allocate_slots(count: int, nbytes: int, device: torch.device) -> list[torch.Tensor]:
    """``count`` device byte buffers of ``nbytes`` each; a clear error when the device has no room."""
    try:
        with torch.inference_mode(False):
            return [torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device) for _ in range(count)]
    except torch.OutOfMemoryError as exc:
        raise AccelerationError(
            f"weight streaming: {count} slots of {nbytes / GIB:.2f} GiB do not fit on {device} "
            f"({str(exc).splitlines()[0]}). Use fewer slots (OffloadConfig(slots=2)) or free device memory."
        ) from None
