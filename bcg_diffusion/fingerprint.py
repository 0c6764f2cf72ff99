"""Fingerprint of a module's weights, so that a changed weight never replays a stale graph.

The fingerprint covers, for every parameter and buffer, its address and its version counter
(bumped by in-place writes such as ``load_state_dict``), and the state of PEFT/LoRA layers
(scaling, active and merged adapters, disabled flag). Parameter lists are re-read only when a
module anywhere registers a parameter, buffer or submodule (global torch registration hooks,
installed while at least one transformer is accelerated), which is what loading or unloading
LoRA and assigning new ``nn.Parameter`` objects do.
Not covered: writes through ``param.data`` (no version bump); call ``clear_graphs(pipe)``.
Under ``accelerate_pipeline`` the addresses and versions are read once per pipeline call.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

import torch

_lock = threading.Lock()
_users = 0
_handles: list[Any] = []
_epoch = 0
_version_of = operator.attrgetter("_version")


def _bump(*_: Any) -> None:
    global _epoch
    _epoch += 1


def acquire_registration_hooks() -> None:
    """Install the global registration hooks (reference-counted)."""
    global _users
    from torch.nn.modules import module as nn_module

    with _lock:
        if _users == 0:
            for name in (
                "register_module_parameter_registration_hook",
                "register_module_buffer_registration_hook",
                "register_module_module_registration_hook",
            ):
                register = getattr(nn_module, name, None)
                if register is not None:
                    _handles.append(register(_bump))
        _users += 1


def release_registration_hooks() -> None:
    """Undo :func:`acquire_registration_hooks`; the last user removes the hooks."""
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            while _handles:
                _handles.pop().remove()


class WeightsFingerprint:
    """Computes the fingerprint of one module; cheap per call (C-level maps over tensors)."""

    def __init__(self, module: torch.nn.Module, every_call: bool = True) -> None:
        self._module = module
        self._epoch = -1
        self._tensors: list[torch.Tensor] = []
        self._adapters: list[Any] = []
        self.every_call = every_call
        self._cached: tuple | None = None

    def invalidate(self) -> None:
        """Recompute on the next :meth:`current` (called at the start of each pipeline call)."""
        self._cached = None

    def current(self) -> tuple:
        """The fingerprint: recomputed every call, or cached until :meth:`invalidate` or a
        parameter/buffer/module registration anywhere."""
        if self.every_call or self._cached is None or self._epoch != _epoch:
            self._cached = self.compute()
        return self._cached

    def _refresh(self) -> None:
        module = self._module
        self._tensors = [p for p in module.parameters()] + [b for b in module.buffers()]
        self._adapters = [m for m in module.modules() if isinstance(getattr(m, "scaling", None), dict)]
        self._epoch = _epoch

    def compute(self) -> tuple:
        if self._epoch != _epoch or not self._tensors:
            self._refresh()
        tensors = self._tensors
        ptrs = tuple(map(torch.Tensor.data_ptr, tensors))
        versions = sum(map(_version_of, tensors))
        adapters = tuple(_adapter_state(m) for m in self._adapters)
        return (len(tensors), hash(ptrs), versions, adapters)


def _adapter_state(layer: Any) -> tuple:
    return (
        tuple(sorted(layer.scaling.items())),
        tuple(getattr(layer, "active_adapters", ()) or ()),
        bool(getattr(layer, "disable_adapters", False)),
        tuple(getattr(layer, "merged_adapters", ()) or ()),
    )
