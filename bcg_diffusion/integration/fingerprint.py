"""Fingerprint of a module's weights, so that a changed weight never replays a stale graph.

The fingerprint covers, for every parameter and buffer, its address and its version counter
(bumped by in-place writes such as ``load_state_dict``; for wrapper tensor subclasses such as
torchao's quantized weights, those of the inner tensors that hold the data), and the state of PEFT/LoRA layers
(scaling, active and merged adapters, disabled flag). Parameter lists are re-read only when a
module anywhere registers a parameter, buffer or submodule (global torch registration hooks,
installed while at least one transformer is accelerated), which is what loading or unloading
LoRA and assigning new ``nn.Parameter`` objects do.
Not covered: writes through ``param.data`` (no version bump); call ``clear_graphs(pipe)``.
Under ``accelerate_pipeline`` the addresses and versions are read once per pipeline call.

A buffer that the model's own forward reassigns during an accelerated call (OmniGen's rope sets
``self.inv_freq = ...`` on every call) is the forward's state, not a weight: inside
:func:`forward_state` the new value is written in place into the buffer it replaces (same shape,
dtype, device and strides), so the buffer keeps its address for every reader, eager or captured, and
a replay rewrites it as the eager call did (the copy is a kernel of the graph). Such buffers count in
the fingerprint by address only. A reassignment that cannot be written in place (another shape, a
tensor that needs gradients, an inference tensor outside inference mode) is a registration like any
other: the fingerprint changes and the call gets a new key.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import weakref
from typing import Any, Iterator

import torch

from ..core.handles import RemovableHandle, SharedPatch

_epoch = 0
_version_of = operator.attrgetter("_version")


_in_call = threading.local()  # depth: inside an accelerated call in this thread (see forward_state)
# buffers a forward reassigned during an accelerated call, written in place (id -> tensor, weakly held)
_forward_state: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_state_epoch = 0  # bumped when a buffer joins _forward_state
_transient = threading.local()  # per thread: a stack of {(id(module), name): (module, name, first old value)}
_SLOTS = ("_parameters", "_buffers", "_modules")
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


def _bump(module: Any = None, name: Any = None, value: Any = None) -> None:
    global _epoch
    frames = getattr(_transient, "frames", None)
    if frames and module is not None:
        old = _value_now(module, name)
        if old is None and isinstance(module, _CONTAINERS):
            return  # filling a new container (a ModuleList slice made during the call)
        # the hook runs before the assignment: the first value seen is what the block must end with
        frames[-1].setdefault((id(module), name), (module, name, old))
        return
    _epoch += 1


@contextlib.contextmanager
def transient_registrations() -> Iterator[None]:
    """Registrations in this thread inside the block that the block's end has undone (a library
    swapping a block list for the duration of a call with ``unittest.mock.patch.object``), and new
    entries of containers (slicing a ``ModuleList`` makes a new one), do not count as changes;
    any other counts once the block ends."""
    frames = _transient.__dict__.setdefault("frames", [])
    frames.append({})
    try:
        yield
    finally:
        seen = frames.pop()
        if any(_value_now(module, name) is not old for module, name, old in seen.values()):
            _bump()


@contextlib.contextmanager
def forward_state() -> Iterator[None]:
    """Inside the block (an accelerated call in this thread), a buffer the forward reassigns is
    written in place into the buffer it replaces (see the module docstring)."""
    _in_call.depth = getattr(_in_call, "depth", 0) + 1
    try:
        yield
    finally:
        _in_call.depth -= 1


def _kept_in_place(module: Any, name: str, value: Any) -> torch.Tensor | None:
    """The buffer ``name`` of ``module`` with ``value`` written into it, when ``value`` can replace it in
    place; ``None`` otherwise (the assignment is then an ordinary registration)."""
    buffers = module.__dict__.get("_buffers")
    old = buffers.get(name) if buffers is not None else None
    if (
        type(old) is not torch.Tensor or type(value) is not torch.Tensor or old is value
        or old.shape != value.shape or old.dtype != value.dtype or old.device != value.device
        or old.stride() != value.stride() or old.requires_grad or value.requires_grad
    ):
        return None
    try:
        with torch.no_grad():
            old.copy_(value)
    except RuntimeError:  # an inference tensor outside inference mode, overlapping memory, ...
        return None
    global _state_epoch
    if id(old) not in _forward_state:
        _forward_state[id(old)] = old
        _state_epoch += 1
    return old


def _on_buffer(module: Any = None, name: Any = None, value: Any = None) -> torch.Tensor | None:
    """torch's global buffer registration hook: a reassignment inside an accelerated call is written
    in place (returned, torch registers it: the same tensor); anything else bumps the epoch."""
    if getattr(_in_call, "depth", 0) and module is not None:
        kept = _kept_in_place(module, name, value)
        if kept is not None:
            return kept
    _bump(module, name, value)
    return None


def is_forward_state(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a buffer that a forward reassigns during its calls (kept in place)."""
    return _forward_state.get(id(tensor)) is tensor


def _value_now(module: Any, name: str) -> Any:
    for slots in _SLOTS:
        table = module.__dict__.get(slots)
        if table is not None and name in table:
            return table[name]
    return None


def registration_epoch() -> int:
    """Bumped whenever any module anywhere registers a parameter, buffer or submodule (while hooks
    are installed)."""
    return _epoch


def _install_hooks() -> None:
    from torch.nn.modules import module as nn_module

    for name, hook in (
        ("register_module_parameter_registration_hook", _bump),
        ("register_module_buffer_registration_hook", _on_buffer),
        ("register_module_module_registration_hook", _bump),
    ):
        register = getattr(nn_module, name, None)
        if register is not None:
            _torch_handles.append(register(hook))


def _remove_hooks() -> None:
    while _torch_handles:
        _torch_handles.pop().remove()


_torch_handles: list[Any] = []
_registration_hooks = SharedPatch("module registration hooks", _install_hooks, _remove_hooks)


def registration_hooks() -> RemovableHandle:
    """Install torch's global module registration hooks while the handle lives (shared: the last
    handle removed takes them out)."""
    return _registration_hooks.acquire()


class WeightsFingerprint:
    """Computes the fingerprint of one module; cheap per call (C-level maps over tensors)."""

    def __init__(self, module: torch.nn.Module, every_call: bool = True) -> None:
        self._module = module
        self._epoch = -1
        self._state_epoch = -1
        self._tensors: list[torch.Tensor] = []
        self._state: list[torch.Tensor] = []  # buffers the forward reassigns (by address only)
        self._wrappers: list[torch.Tensor] = []
        self._adapters: list[Any] = []
        self.every_call = every_call
        self._cached: tuple | None = None

    def invalidate(self) -> None:
        """Recompute on the next :meth:`current` (called at the start of each pipeline call)."""
        self._cached = None

    def current(self) -> tuple:
        """The fingerprint: recomputed every call, or cached until :meth:`invalidate`, a
        parameter/buffer/module registration anywhere, or a buffer found to be forward state."""
        if self.every_call or self._cached is None or self._epoch != _epoch or self._state_epoch != _state_epoch:
            self._cached = self.compute()
        return self._cached

    def _refresh(self) -> None:
        module = self._module
        owned = [p for p in module.parameters()] + [b for b in module.buffers()]
        self._state = [t for t in owned if is_forward_state(t)]
        owned = [t for t in owned if not is_forward_state(t)]
        self._tensors = [t for t in owned if getattr(type(t), "__tensor_flatten__", None) is None]
        self._wrappers = [t for t in owned if getattr(type(t), "__tensor_flatten__", None) is not None]
        self._adapters = [m for m in module.modules() if isinstance(getattr(m, "scaling", None), dict)]
        self._epoch = _epoch
        self._state_epoch = _state_epoch

    def compute(self) -> tuple:
        if self._epoch != _epoch or self._state_epoch != _state_epoch or not (self._tensors or self._wrappers):
            self._refresh()
        # wrapper subclasses are expanded on every computation: their inner tensors can be replaced
        tensors = self._tensors + [leaf for w in self._wrappers for leaf in storage_tensors(w)]
        # the order of parameters() follows registration order; forward state counts by address only
        ptrs = tuple(sorted(map(torch.Tensor.data_ptr, tensors + self._state)))
        versions = sum(map(_version_of, tensors))
        adapters = tuple(sorted((_adapter_state(m) for m in self._adapters), key=repr))
        return (len(tensors), hash(ptrs), versions, adapters)


def storage_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold ``t``'s data: ``t`` itself, or, for a wrapper tensor subclass
    (torchao's quantized weights, whose own ``data_ptr()`` is 0), its inner tensors, recursively."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None:
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for name in names for leaf in storage_tensors(getattr(t, name))]


def _adapter_state(layer: Any) -> tuple:
    return (
        tuple(sorted(layer.scaling.items())),
        tuple(getattr(layer, "active_adapters", ()) or ()),
        bool(getattr(layer, "disable_adapters", False)),
        tuple(getattr(layer, "merged_adapters", ()) or ()),
    )


def describe_adapters(fingerprint: Any) -> str:
    """The adapters a fingerprint of :meth:`WeightsFingerprint.current` has active, for a key's description:
    ``"adapters a (scaling 0.5)"``, ``"adapters disabled"``, or ``""`` (no adapter layer, none active, or not such
    a fingerprint). Two keys that differ only in their adapters' state then read differently."""
    if not (isinstance(fingerprint, tuple) and len(fingerprint) == 4 and fingerprint[3]):
        return ""
    layers = fingerprint[3]
    if all(disabled for _, _, disabled, _ in layers):
        return "adapters disabled"
    seen: dict[str, set] = {}
    for scaling, active, disabled, merged in layers:
        if disabled:
            continue
        for name in (*active, *merged):
            seen.setdefault(name, set()).add(dict(scaling).get(name))
    if not seen:
        return ""
    parts = []
    for name in sorted(seen)[:3]:
        scales = sorted(f"{v:g}" for v in seen[name] if isinstance(v, (int, float)))
        shown = ", ".join(scales[:3]) + (", ..." if len(scales) > 3 else "")
        parts.append(f"{name} (scaling {shown})" if scales else name)
    more = f" and {len(seen) - 3} more" if len(seen) > 3 else ""
    return "adapters " + ", ".join(parts) + more
