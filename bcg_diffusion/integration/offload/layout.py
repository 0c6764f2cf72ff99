"""What of a block is packed where: each tensor's place in the block's one buffer.

A block's parameters and buffers (and, for a wrapper tensor subclass such as torchao's quantized
weights, the plain tensors inside it) are laid out one after another in one byte buffer, each at an
offset aligned to :data:`ALIGN` bytes with its own strides, so that a view of the host copy or of a
device slot at that offset is the tensor as it was (same shape, strides, dtype, alignment class).

Kept out (they stay where they are, resident): tensors registered in more than one place (tied
weights, a module shared by two blocks), tensors whose storage another tensor shares, empty or overlapping
tensors (``expand``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterator

import torch

from ...errors import AccelerationError

ALIGN = 512  # bytes: a fresh CUDA allocation's alignment, so kernels see the alignment they would see resident
_TABLES = ("_parameters", "_buffers")


def aligned(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def is_wrapper(t: torch.Tensor) -> bool:
    """A wrapper tensor subclass (torchao's quantized weights): its data lives in inner tensors."""
    return getattr(type(t), "__tensor_flatten__", None) is not None


@dataclass(eq=False)
class TensorSite:
    """One plain tensor of a block: where the block registers it and where it lies in the block's buffer.

    ``registered`` is what ``module.<table>[name]`` held when planned (a parameter, a buffer, or a wrapper);
    ``attr`` the attribute path from it to the plain tensor inside a wrapper (empty for a plain tensor)."""

    module: torch.nn.Module
    table: str
    name: str
    registered: torch.Tensor
    attr: tuple[str, ...]
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    origin: torch.device

    @property
    def key(self) -> tuple:
        return id(self.module), self.table, self.name, self.attr

    @property
    def span(self) -> int:
        """Bytes from ``offset`` that the tensor covers."""
        return (1 + sum((n - 1) * s for n, s in zip(self.size, self.stride))) * self.dtype.itemsize

    def is_registered(self) -> bool:
        """Whether the module still registers the object planned (not a new parameter, not removed)."""
        return self.module.__dict__[self.table].get(self.name) is self.registered

    def tensor(self) -> torch.Tensor:
        """The plain tensor now (inside the wrapper where there is one)."""
        t = self.registered
        for name in self.attr:
            t = getattr(t, name)
        return t

    def fits(self, t: torch.Tensor) -> bool:
        """Whether ``t`` can be written into this site's place as it is (same dtype, shape, strides)."""
        return t.dtype == self.dtype and tuple(t.shape) == self.size and tuple(t.stride()) == self.stride

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        """This tensor as a view of ``buffer`` (a block's host copy or a device slot, bytes)."""
        flat = buffer[self.offset: self.offset + self.span].view(self.dtype)
        return flat.as_strided(self.size, self.stride)

    def point(self, view: torch.Tensor) -> None:
        """Make the block's tensor ``view`` (``.data`` of a parameter or buffer; the inner attribute of a wrapper)."""
        if not self.attr:
            self.registered.data = view
            return
        holder = self.registered
        for name in self.attr[:-1]:
            holder = getattr(holder, name)
        setattr(holder, self.attr[-1], view)


@dataclass(eq=False)
class BlockLayout:
    """One block's packed tensors (``sites``, in buffer order) and the bytes its buffer needs."""

    path: str
    module: torch.nn.Module
    sites: list[TensorSite]
    nbytes: int

    def keys(self) -> list[tuple]:
        return [site.key for site in self.sites]


def registered_tensors(module: torch.nn.Module) -> Iterator[tuple[str, str, torch.Tensor]]:
    """``(table, name, tensor)`` of what ``module`` itself registers (parameters, then buffers)."""
    for table in _TABLES:
        for name, t in module.__dict__[table].items():
            if t is not None:
                yield table, name, t


def _plain_leaves(t: torch.Tensor, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    if not is_wrapper(t):
        yield path, t
        return
    names, _ = t.__tensor_flatten__()
    for name in names:
        inner = getattr(t, name, None)
        if not isinstance(inner, torch.Tensor):
            raise AccelerationError(_wrapper_message(t, f"its inner part {name!r} is not a tensor"))
        yield from _plain_leaves(inner, path + (name,))


def _wrapper_message(t: torch.Tensor, why: str) -> str:
    return (
        f"weight streaming cannot pack the tensor subclass {type(t).__name__}: {why}. Streaming packs the plain "
        "tensors inside a wrapper (torchao's quantized weights) where they are attributes it can set; quantize "
        "with another torchao config, or keep this model on the device (BCGConfig(offload=None))."
    )


def check_settable(t: torch.Tensor, attr: tuple[str, ...]) -> None:
    """Raise unless the plain tensor at ``attr`` inside the wrapper ``t`` can be replaced by assignment."""
    holder = t
    for name in attr[:-1]:
        holder = getattr(holder, name)
    inner = getattr(holder, attr[-1])
    try:
        setattr(holder, attr[-1], inner)
        ok = getattr(holder, attr[-1]) is inner
    except (AttributeError, TypeError) as exc:
        raise AccelerationError(_wrapper_message(t, f"setting {'.'.join(attr)} failed ({exc})")) from None
    if not ok:
        raise AccelerationError(_wrapper_message(t, f"{'.'.join(attr)} does not keep the tensor assigned to it"))


def _packable(t: torch.Tensor) -> bool:
    """Non-empty, and its elements fill a span of memory exactly once (any order of dimensions)."""
    if t.numel() == 0:
        return False
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _storage(t: torch.Tensor) -> int | None:
    return t.untyped_storage().data_ptr() if t.device.type != "meta" and t.numel() else None


def shared_tensors(root: torch.nn.Module, own: frozenset[int] = frozenset()) -> set[int]:
    """``id``s of plain tensors that must stay where they are: registered twice (tied), or sharing storage with
    another tensor (``own``: storages of streaming's own host copies, whose views share them by design)."""
    every = [m for _, m in root.named_modules(remove_duplicate=False)]  # a module shared by two blocks counts twice
    uses = collections.Counter(id(t) for m in every for _, _, t in registered_tensors(m))
    plain = {id(leaf): leaf for m in root.modules() for _, _, t in registered_tensors(m) for _, leaf in _plain_leaves(t)}
    storages = collections.Counter(_storage(t) for t in plain.values())
    shared = {i for i, n in uses.items() if n > 1}
    shared |= {i for i, t in plain.items() if _storage(t) is not None and _storage(t) not in own
               and storages[_storage(t)] > 1}
    return shared


def check_wrapper_device(registered: torch.Tensor, device: torch.device, where: str) -> None:
    """A wrapper (torchao) must already be on ``device``: its device is fixed when it is made, and streaming
    moves only the plain tensors inside it."""
    if is_wrapper(registered) and registered.device != device:
        raise AccelerationError(
            f"weight streaming: {where} is a {type(registered).__name__} on {registered.device}, not on {device}. "
            f"Quantize the transformer on {device} (or move it there) before streaming: streaming moves the plain "
            "tensors inside a tensor subclass, whose own device is fixed when it is made."
        )


def plan_block(path: str, block: torch.nn.Module, shared: set[int], device: torch.device) -> BlockLayout:
    """The layout of ``block``'s packable tensors (``shared``: ids from :func:`shared_tensors`, kept out)."""
    sites, offset = [], 0
    for module in block.modules():
        for table, name, registered in registered_tensors(module):
            if id(registered) in shared:
                continue
            check_wrapper_device(registered, device, f"{path}'s {name!r}")
            for attr, t in _plain_leaves(registered):
                if t.device.type == "meta":
                    raise AccelerationError(
                        f"weight streaming: {path}'s tensor {name!r} is on the meta device (not loaded); load the "
                        "weights first (from_pretrained without device_map, or to_empty and load_state_dict)"
                    )
                if id(t) in shared or not _packable(t):
                    continue
                if attr:
                    check_settable(registered, attr)
                site = TensorSite(module, table, name, registered, attr, offset, tuple(t.shape), tuple(t.stride()),
                                  t.dtype, t.device)
                sites.append(site)
                offset = aligned(offset + site.span)
    return BlockLayout(path, block, sites, offset)


def resident_sites(root: torch.nn.Module, layouts: list[BlockLayout], device: torch.device) -> list[TensorSite]:
    """Every plain tensor of ``root`` that no layout packs: what stays (or is put) on ``device``."""
    packed = {site.key for layout in layouts for site in layout.sites}
    sites = []
    for module in root.modules():
        for table, name, registered in registered_tensors(module):
            check_wrapper_device(registered, device, f"{type(root).__name__}'s {name!r}")
            for attr, t in _plain_leaves(registered):
                site = TensorSite(module, table, name, registered, attr, 0, tuple(t.shape), tuple(t.stride()),
                                  t.dtype, t.device)
                if site.key not in packed:
                    sites.append(site)
    return sites
