"""Writes to streamed weights made between calls, taken into the host copies before the next call streams.

What can happen to a block's tensors between calls, and what :func:`take_in_changes` does at the start of the
next call:

- written in place (``load_state_dict``, ``param.data += ...`` as LoRA fusing does, ``copy_``): the writes
  went to the host copy (the tensors are its views): nothing to do;
- a tensor's data replaced by one of the same dtype, shape and strides (``param.data = t``,
  ``torch.utils.swap_tensors`` as LoRA hot-swapping does): its value is copied into the host copy and the tensor
  points there again;
- tensors added, removed or replaced by others of another shape (loading or unloading a LoRA adapter, a new
  ``nn.Parameter``): the block is packed again (a new host copy; larger slots if it outgrew them), and the
  transformer's graphs are dropped (the weights moved).

Adding and removing tensors is seen through torch's module registration hooks (the weight fingerprint's
epoch); replaced data by comparing each tensor's address with its host view's, once per call.
"""

from __future__ import annotations

import torch

from .layout import BlockLayout, plan_block, shared_tensors
from .pointing import StreamedWeights


def replaced_sites(weights: StreamedWeights, block: int) -> list[int] | None:
    """Indices of the block's tensors whose data was replaced by a fitting tensor; ``None`` when the block
    must be packed again (a tensor no longer registered, or replaced by one that does not fit)."""
    found = []
    for index, (site, view) in enumerate(zip(weights.layouts[block].sites, weights.host_views[block])):
        if not site.is_registered():
            return None
        t = site.tensor()
        if t.data_ptr() == view.data_ptr():
            continue
        if not site.fits(t):
            return None
        found.append(index)
    return found


def rewrite_sites(weights: StreamedWeights, block: int, indices: list[int]) -> None:
    """Copy the replaced tensors' values into the host copy and point them at it again."""
    sites, views = weights.layouts[block].sites, weights.host_views[block]
    with torch.no_grad():
        for index in indices:
            views[index].copy_(sites[index].tensor())
            sites[index].point(views[index])


def replanned(root: torch.nn.Module, weights: StreamedWeights, device: torch.device) -> dict[int, BlockLayout]:
    """Blocks whose set of tensors changed (registered anew), with their new layouts."""
    shared = shared_tensors(root, weights.own_storages)
    changed = {}
    for index, layout in enumerate(weights.layouts):
        fresh = plan_block(layout.path, layout.module, shared, device)
        if fresh.keys() != layout.keys() or fresh.nbytes != layout.nbytes:
            changed[index] = fresh
    return changed
