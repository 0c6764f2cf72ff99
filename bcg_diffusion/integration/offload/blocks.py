"""The repeated blocks of a transformer: what weight streaming moves between host and device."""

from __future__ import annotations

import torch

from ...errors import AccelerationError

_LISTS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def _items(container: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return list(container.named_children())


def _is_block_list(container: torch.nn.Module) -> bool:
    """A list of at least two modules that hold weights and submodules of their own (not a list of Linears)."""
    items = [m for _, m in _items(container)]
    return len(items) >= 2 and all(
        next(m.children(), None) is not None and next(m.parameters(), None) is not None for m in items
    )


def _from_class_names(root: torch.nn.Module, names: tuple[str, ...]) -> list[tuple[str, torch.nn.Module]]:
    """Submodules whose class is named in ``names`` (diffusers' ``_repeated_blocks``), outermost only."""
    found: list[tuple[str, torch.nn.Module]] = []
    for path, module in root.named_modules():
        if path and type(module).__name__ in names and not any(path.startswith(p + ".") for p, _ in found):
            found.append((path, module))
    return found


def _from_block_lists(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The items of every ``ModuleList`` / ``ModuleDict`` of blocks, outermost lists only."""
    found: list[tuple[str, torch.nn.Module]] = []
    lists: list[str] = []
    for path, module in root.named_modules():
        if not isinstance(module, _LISTS) or any(path.startswith(p + ".") for p in lists) or not _is_block_list(module):
            continue
        lists.append(path)
        found += [(f"{path}.{name}" if path else name, item) for name, item in _items(module)]
    return found


def find_blocks(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(path, block)`` of ``root``'s repeated blocks, in registration order: the classes its
    ``_repeated_blocks`` names (Flux, Wan, Qwen-Image, ...), else the items of its lists of blocks
    (PixArt, SD3, ...). Raises :class:`AccelerationError` when there are none."""
    names = tuple(getattr(root, "_repeated_blocks", None) or ())
    found = _from_class_names(root, names) if names else []
    if not found:
        found = _from_block_lists(root)
    if not found:
        raise AccelerationError(
            f"weight streaming found no repeated blocks in {type(root).__name__}: it has no _repeated_blocks and no "
            "ModuleList of two or more blocks. Streaming moves whole blocks; keep this model on the device "
            "(BCGConfig(offload=None))."
        )
    return found
