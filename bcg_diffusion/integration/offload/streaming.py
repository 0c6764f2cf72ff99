"""Weight streaming put on a transformer (:func:`start_streaming`) and taken off (:meth:`WeightStreaming.remove`).

What is done to the transformer: its repeated blocks' tensors become views of packed host copies (between
calls) and of device slots (inside a call, from each block's entry); the other weights are put on the
device; each block's call (its instance ``_call_impl``, or ``_compiled_call_impl`` when compiled) first runs
the *entry* (:meth:`WeightStreaming.enter_block`, put at the bottom of the block's forward chain by
:mod:`.block_entry`), an eager break of the capture core: at capture and at every replay it runs between
graph segments, on the current stream; and two torch hooks on the transformer
begin and end each call (a forward pre-hook, and a forward hook with ``always_call``). Torch's module
registration hooks are held (shared with the weight fingerprint) so that tensors added to a block are seen.

Calls of one streamed transformer are serialised (one lock); a call nested in a call of the same transformer
streams with the outer one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch

from .. import fingerprint
from ...config import OffloadConfig
from ...core.capture import eager_on_graph
from ...errors import AccelerationError
from ...stats import OffloadStats
from .block_entry import install_entry
from .blocks import find_blocks
from .buffers import HostCopy, allocate_host, allocate_slots, release_host
from .checks import check_room, check_slots, refuse_other_offloading, streaming_device
from .copies import CudaCopies, PlainCopies
from .layout import BlockLayout, TensorSite, plan_block, resident_sites, shared_tensors
from .pointing import StreamedWeights
from .residency import Residency
from .weight_changes import replaced_sites, replanned, rewrite_sites

logger = logging.getLogger("bcg_diffusion")
_ATTR = "_bcg_weight_streaming"


def streaming_of(module: Any) -> "WeightStreaming | None":
    """The weight streaming on ``module`` (``None`` where there is none)."""
    return module.__dict__.get(_ATTR) if isinstance(module, torch.nn.Module) else None


class _SlotWork:
    """The work behind :class:`~.residency.Residency`'s decisions (its ``SlotOps``)."""

    def __init__(self, weights: StreamedWeights, copies: Any) -> None:
        self.weights, self.copies = weights, copies

    def mark(self) -> None:
        self.copies.mark()

    def load(self, block: int, slot: int) -> None:
        self.copies.load(self.weights.source(block), self.weights.target(block), slot)

    def wait(self, slot: int) -> None:
        self.copies.wait(slot)

    def attach(self, block: int) -> None:
        self.weights.to_slot(block)

    def detach(self, block: int) -> None:
        self.weights.to_host(block)


class WeightStreaming:
    """The weight streaming of one transformer (module docstring); made by :func:`start_streaming`.

    ``on_relayout``: callbacks run when weights moved to new addresses (a block packed again after tensors
    were added or removed): the graph runner drops its graphs there. ``accelerated``: set while an
    acceleration uses this streaming (it must be removed first)."""

    def __init__(self, root: torch.nn.Module, config: OffloadConfig, device: torch.device,
                 weights: StreamedWeights, resident: list[TensorSite]) -> None:
        self.root = root
        self.config = config
        self.device = device
        self.weights = weights
        self.resident = resident
        self.copies = CudaCopies(device, config.slots, config.measure_waits) if device.type == "cuda" else PlainCopies()
        self.residency = Residency(weights.sizes, config.slots, _SlotWork(weights, self.copies), type(root).__name__)
        self.on_relayout: list[Callable[[], None]] = []
        self.created_by = "user"
        self.accelerated = False
        self.handles: list[Any] = []
        self._lock = threading.RLock()
        self._depth = 0
        self._epoch = fingerprint.registration_epoch()
        self.enter_block = torch._dynamo.disable(eager_on_graph(self._enter))

    # -- the transformer's calls ------------------------------------------------------------------
    def _enter(self, block: int) -> None:
        """A block's entry (an eager break): it becomes resident and the next blocks start loading."""
        self.residency.enter(block)

    def before_call(self, module: torch.nn.Module, args: Any) -> None:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            if module.__dict__.get("_hf_hook") is not None:  # model CPU offload enabled since: it would move it all
                refuse_other_offloading(module)
            self.copies.follow_stream()
            with torch.inference_mode(False), torch.no_grad():  # views made here serve calls in any mode
                self._take_in_changes()
            self.residency.begin_call()

    def after_call(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        try:
            if self._depth == 1 and self.residency.in_call:
                self.residency.end_call()
                self.copies.finish()
        finally:
            self._depth -= 1
            self._lock.release()

    # -- weights written between calls ----------------------------------------------------------
    def _take_in_changes(self) -> None:
        """Bring what was written to the blocks between calls into their host copies (:mod:`.weight_changes`)."""
        fresh: dict[int, BlockLayout] = {}
        epoch = fingerprint.registration_epoch()
        if epoch != self._epoch:
            self._epoch = epoch
            fresh = replanned(self.root, self.weights, self.device)
        for index in range(len(self.weights.layouts)):
            if index in fresh:
                continue
            found = replaced_sites(self.weights, index)
            if found is None:
                layout = self.weights.layouts[index]
                fresh[index] = plan_block(layout.path, layout.module, shared_tensors(self.root, self.weights.own_storages),
                                          self.device)
            elif found:
                rewrite_sites(self.weights, index, found)
        if fresh:
            self._repack(fresh)

    def _repack(self, fresh: dict[int, BlockLayout]) -> None:
        """Pack the blocks of ``fresh`` anew (their tensors changed); larger slots where they outgrew them."""
        needed = max(max(layout.nbytes for layout in fresh.values()), self.weights.slots[0].numel())
        if needed > self.weights.slots[0].numel():  # made before the old ones go: a failure leaves them as they were
            self.weights.replace_slots(allocate_slots(self.config.slots, needed, self.device))
        for index, layout in fresh.items():
            host = HostCopy(layout.nbytes, self.config.pin_memory and self.device.type == "cuda")
            with torch.no_grad():
                for site in layout.sites:
                    site.view(host.tensor).copy_(site.tensor())
            self.weights.replace_block(index, layout, host).release()
            self.weights.to_host(index)
            self.residency.resize(index, layout.nbytes)
        logger.info("bcg: weight streaming: %d block(s) of %s packed again (their tensors changed); graphs are "
                    "captured anew", len(fresh), type(self.root).__name__)
        for callback in list(self.on_relayout):
            callback()

    # -- stats and removal ------------------------------------------------------------------------
    def snapshot(self) -> OffloadStats:
        """The statistics now (waits for a call of the transformer in progress in another thread to end)."""
        with self._lock:
            self.copies.drain()
            c = self.residency.counters
            resident = {id(t): t for t in (site.tensor() for site in self.resident) if t.device == self.device}
            return self._stats(c, resident)

    def _stats(self, c: Any, resident: dict[int, torch.Tensor]) -> OffloadStats:
        return OffloadStats(
            slots=self.config.slots, blocks=len(self.weights.layouts),
            resident_bytes=sum(t.numel() * t.element_size() for t in resident.values()),
            slot_bytes=self.weights.slot_bytes, host_bytes=self.weights.host_bytes,
            pinned=all(h.pinned for h in self.weights.hosts), calls=c.calls, bytes_last_call=c.bytes_last_call,
            bytes_streamed=c.bytes_streamed, prefetched=c.prefetched, sync_loads=c.sync_loads,
            wait_s=self.copies.wait_s,
        )

    def remove(self) -> None:
        """Undo everything: the blocks' tensors back where they were when streaming began (as views of their
        former host copies, unpinned, where that was the CPU), the other weights too, every hook out."""
        with self._lock:
            if self._depth:
                raise AccelerationError("weight streaming cannot be removed during a call of its transformer")
            if self.accelerated:
                raise AccelerationError(
                    f"{type(self.root).__name__} is accelerated with this weight streaming: call "
                    "bcg_diffusion.remove_acceleration() first (it removes streaming it applied itself)"
                )
            _remove_all(self.handles)
            self.copies.finish()
            _restore_blocks(self.weights)
            for site in self.resident:
                _move(site, site.origin)
            release_host(self.weights.hosts)
            self.weights.replace_slots([])
            self.root.__dict__.pop(_ATTR, None)


# -- putting it on ------------------------------------------------------------------------------------
def start_streaming(root: torch.nn.Module, config: OffloadConfig, created_by: str = "user") -> WeightStreaming:
    """Stream ``root``'s repeated blocks as ``config`` says (module docstring). Every refusal is raised before
    anything moves, and a failure on the way undoes what was done: the model is left as it was."""
    if streaming_of(root) is not None:
        raise AccelerationError(
            f"{type(root).__name__} already streams its weights; remove it first (remove_weight_streaming, or "
            "remove_acceleration where accelerate_pipeline applied it)"
        )
    refuse_other_offloading(root)
    device = streaming_device(config)
    blocks = find_blocks(root)
    check_slots(config.slots, len(blocks), type(root).__name__)
    shared = shared_tensors(root)
    layouts = [plan_block(path, block, shared, device) for path, block in blocks]
    resident = resident_sites(root, layouts, device)
    _check_room(device, config, layouts, resident)
    undos: list[Callable[[], None]] = []
    try:
        with torch.inference_mode(False), torch.no_grad():  # the views serve calls in any mode
            streaming = _build(root, config, device, layouts, resident, undos)
        streaming.handles = _install(streaming, [path for path, _ in blocks], [block for _, block in blocks])
    except BaseException:
        while undos:
            undos.pop()()
        raise
    streaming.created_by = created_by
    root.__dict__[_ATTR] = streaming
    logger.info("bcg: weight streaming of %s: %d blocks through %d slots of %.2f GiB on %s", type(root).__name__,
                len(layouts), config.slots, streaming.weights.slots[0].numel() / 2**30, device)
    return streaming


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_room(device: torch.device, config: OffloadConfig, layouts: list[BlockLayout],
                resident: list[TensorSite]) -> None:
    to_move = {id(t): t for t in (s.tensor() for s in resident) if t.device != device}
    on_device = {id(t): t for layout in layouts for t in (s.tensor() for s in layout.sites) if t.device == device}
    check_room(device, config.slots, max(layout.nbytes for layout in layouts),
               sum(map(_tensor_bytes, to_move.values())), sum(map(_tensor_bytes, on_device.values())))


def _build(root: torch.nn.Module, config: OffloadConfig, device: torch.device, layouts: list[BlockLayout],
           resident: list[TensorSite], undos: list[Callable[[], None]]) -> WeightStreaming:
    """Host copies and slots made and filled, the other weights on the device, the blocks pointed at their
    host copies; ``undos`` gets what puts each step back."""
    hosts = allocate_host([layout.nbytes for layout in layouts], config.pin_memory and device.type == "cuda")
    undos.append(lambda: release_host(hosts))
    slots = allocate_slots(config.slots, max(layout.nbytes for layout in layouts), device)
    weights = StreamedWeights(layouts, hosts, slots)
    for index in range(len(layouts)):
        weights.fill_host(index)
    for site in resident:
        origin = site.tensor().device
        if _move(site, device):
            undos.append(lambda site=site, origin=origin: _move(site, origin))
    originals = [[site.tensor() for site in layout.sites] for layout in layouts]
    undos.append(lambda: _point_back(layouts, originals))
    for index in range(len(layouts)):
        weights.to_host(index)
    return WeightStreaming(root, config, device, weights, resident)


def _move(site: TensorSite, device: torch.device) -> bool:
    """Put one resident tensor on ``device``; whether it moved."""
    t = site.tensor()
    if t.device == device:
        return False
    try:
        site.point(t.to(device))
    except torch.OutOfMemoryError as exc:
        raise AccelerationError(
            f"weight streaming: the weights outside the blocks do not fit on {device} ({str(exc).splitlines()[0]})"
        ) from None
    return True


def _point_back(layouts: list[BlockLayout], originals: list[list[torch.Tensor]]) -> None:
    for layout, tensors in zip(layouts, originals):
        for site, t in zip(layout.sites, tensors):
            site.point(t)


def _restore_blocks(weights: StreamedWeights) -> None:
    """Each block tensor back on the device it was on: its host view where that was the CPU, else a copy."""
    for index, layout in enumerate(weights.layouts):
        for site, view in zip(layout.sites, weights.host_views[index]):
            site.point(view if site.origin.type == "cpu" else view.to(site.origin))


def _install(streaming: WeightStreaming, paths: list[str], blocks: list[torch.nn.Module]) -> list[Any]:
    """The blocks' entries, the transformer's call hooks and the registration hooks; the handles, last first
    when removed (removed here again if one fails)."""
    handles: list[Any] = []
    try:
        handles.append(fingerprint.registration_hooks())
        for index, block in enumerate(blocks):
            handles.append(install_entry(block, index, streaming.enter_block, f"weight streaming entry of {paths[index]}"))
        root = streaming.root
        handles.append(root.register_forward_pre_hook(torch._dynamo.disable(streaming.before_call)))
        handles.append(root.register_forward_hook(torch._dynamo.disable(streaming.after_call), always_call=True))
    except BaseException:
        _remove_all(handles)
        raise
    return handles


def _remove_all(handles: list[Any]) -> None:
    while handles:
        handle = handles.pop()
        handle.remove()
