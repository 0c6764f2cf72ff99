"""The streamed blocks' bytes and views: each block's tensors point at its host copy or at its slot.

Between transformer calls every block's tensors are views of its host copy, so whatever writes weights
between calls (``load_state_dict``, LoRA fusing through ``param.data``, hot-swapping) writes the copy that
the next call streams. Inside a call a block's tensors are views of its slot from its entry until its slot
is loaded with another block (or the call ends). A block that ran without its entry would read its host
copy: on a CUDA device that fails loudly (CPU tensors), on the CPU it reads the right values.
"""

from __future__ import annotations

import torch

from .buffers import HostCopy
from .layout import BlockLayout


class StreamedWeights:
    """``layouts``, ``hosts`` (one :class:`~.buffers.HostCopy` per block) and ``slots`` (device byte buffers),
    with the views of every block's tensors on both sides."""

    def __init__(self, layouts: list[BlockLayout], hosts: list[HostCopy], slots: list[torch.Tensor]) -> None:
        self.layouts = layouts
        self.hosts = hosts
        self.slots = slots
        self.host_views = [[site.view(h.tensor) for site in layout.sites] for layout, h in zip(layouts, hosts)]
        self.slot_views = [self._slot_views(i) for i in range(len(layouts))]

    def _slot_views(self, block: int) -> list[torch.Tensor]:
        slot = self.slots[block % len(self.slots)]
        return [site.view(slot) for site in self.layouts[block].sites]

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def slot_bytes(self) -> int:
        return sum(s.numel() for s in self.slots)

    @property
    def host_bytes(self) -> int:
        return sum(layout.nbytes for layout in self.layouts)

    @property
    def own_storages(self) -> frozenset[int]:
        """Storages of the host copies (their views share them by design, see ``layout.shared_tensors``)."""
        return frozenset(h.tensor.untyped_storage().data_ptr() for h in self.hosts)

    @property
    def sizes(self) -> list[int]:
        return [layout.nbytes for layout in self.layouts]

    # -- copies ----------------------------------------------------------------------------------
    def source(self, block: int) -> torch.Tensor:
        return self.hosts[block].tensor[: self.layouts[block].nbytes]

    def target(self, block: int) -> torch.Tensor:
        return self.slots[block % len(self.slots)][: self.layouts[block].nbytes]

    def fill_host(self, block: int) -> None:
        """Copy the block's tensors as they are now into its host copy."""
        with torch.no_grad():
            for site, view in zip(self.layouts[block].sites, self.host_views[block]):
                view.copy_(site.tensor())

    # -- pointing --------------------------------------------------------------------------------
    def to_host(self, block: int) -> None:
        for site, view in zip(self.layouts[block].sites, self.host_views[block]):
            site.point(view)

    def to_slot(self, block: int) -> None:
        for site, view in zip(self.layouts[block].sites, self.slot_views[block]):
            site.point(view)

    def on_host(self, block: int) -> bool:
        """Whether every tensor of the block is still the view of its host copy (nothing replaced it)."""
        return all(site.is_registered() and site.tensor().data_ptr() == view.data_ptr()
                   for site, view in zip(self.layouts[block].sites, self.host_views[block]))

    # -- changes -----------------------------------------------------------------------------------
    def replace_block(self, block: int, layout: BlockLayout, host: HostCopy) -> HostCopy:
        """The block packed anew (``layout``, ``host``); returns the old host copy (the caller releases it)."""
        old = self.hosts[block]
        self.layouts[block], self.hosts[block] = layout, host
        self.host_views[block] = [site.view(host.tensor) for site in layout.sites]
        self.slot_views[block] = self._slot_views(block)
        return old

    def replace_slots(self, slots: list[torch.Tensor]) -> None:
        """New device slots (``[]``: none, their memory released once no tensor views it)."""
        self.slots = slots
        self.slot_views = [self._slot_views(i) if slots else [] for i in range(len(self.layouts))]
