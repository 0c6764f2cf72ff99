"""The kinds of work the planting harness plants: each takes one floating-point tensor of a site's
output and returns a tensor of the same shape and dtype, doing work a CUDA graph cannot hold or must
not bake in.

Three families, by what the library must do with them:

- ``host read``: the work reads a device value on the host or synchronises (``.item()``, ``.tolist()``,
  ``torch.cuda.synchronize()``, a CPU copy, a branch on a value, ``nonzero``, a boolean mask, an
  allocation sized by a read value). A capture of it fails; the library must run the smallest unit
  around it eagerly and say where. The output depends on the value read, so a replay that baked it in
  would differ.
- ``rng``: torch random numbers and dropout in train mode. CUDA graphs replay torch's generator
  state (each replay draws the numbers the eager call would have), so these may be captured.
- ``hidden state``: Python ``random`` and a call counter decide which kernels run (or a scalar baked
  into one). The graph key cannot see them: code that holds them must run eagerly, or, where the
  library takes the code for the class's own (a free function, a torch function patched
  process-wide), the replay assumes it decides nothing per call (docs/accelerate.md, What a replay
  assumes).

On the CPU (debug mode) nothing is captured, so a host read would not fail: the host-read kinds raise
the error CUDA raises (``operation not permitted when stream is capturing``) where a real capture
would record them (:func:`bcg_diffusion.core.is_recording_segment`), so the library's failure
handling runs on the CPU too. On CUDA the real operation fails by itself.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from bcg_diffusion.core import is_recording_segment

HOST_READ, RNG, HIDDEN_STATE = "host read", "rng", "hidden state"
EMULATED_ERROR = (
    "operation not permitted when stream is capturing (emulated on the CPU by the planting harness: "
    "a debug-mode capture is recording here)"
)


@dataclass
class PlantState:
    """Per-plant Python state (a call counter) and where the plant ran: ``fired`` counts its runs,
    ``fired_in_capture`` those inside a segment being recorded (there a real capture fails on a host
    read), ``places`` the innermost module paths (``""``: the transformer) it ran under."""

    calls: int = 0
    fired: int = 0
    fired_in_capture: int = 0
    places: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Start the hidden state over (before the twin's calls and before the accelerated ones)."""
        self.calls = 0


@dataclass(frozen=True)
class Kind:
    name: str
    family: str
    what: str
    work: Callable[[torch.Tensor, PlantState], torch.Tensor]


def _host_read(t: torch.Tensor) -> None:
    """Raise as CUDA would where a debug-mode capture records CPU work (a real capture fails by itself)."""
    if t.device.type == "cpu" and is_recording_segment():
        raise RuntimeError(EMULATED_ERROR)


def _small(value: float) -> float:
    """A small host scalar derived from ``value`` (what the output adds: it depends on the read)."""
    return (abs(value) % 1.0) * 1e-2


def _item(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    return t + _small(t.detach().float().abs().mean().item())


def _tolist(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    values = t.detach().reshape(-1)[:8].float().cpu().tolist()
    return t + _small(sum(values))


def _synchronize(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    if t.is_cuda:
        torch.cuda.synchronize(t.device)
    return t * 1.0


def _cpu_tensor(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    host = t.detach().reshape(-1)[:8].to("cpu", torch.float32)  # a CPU tensor made from device data
    return t + (host.abs().mean() * 1e-2).to(t.device, t.dtype)


def _branch(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    if t.detach().float().mean() > 0:  # a Python branch on a tensor value
        return t * 1.01
    return t * 0.99


def _nonzero(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    found = (t.detach().reshape(-1) > 0).nonzero()  # output size depends on the data
    return t + (found.shape[0] % 7) * 1e-3


def _bool_mask(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    flat = t.detach().reshape(-1)
    picked = flat[flat > 0]  # a boolean mask: output size depends on the data
    return t + (picked.float().sum() / flat.numel() * 1e-2).to(t.dtype)


def _host_sized(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    _host_read(t)
    value = t.detach().float().abs().sum().item()
    size = 1 + (int(value * 1000) % 5 if math.isfinite(value) else 0)  # at capture a break sees placeholders
    extra = torch.ones(size, device=t.device, dtype=t.dtype)  # an allocation sized by a host value
    return t + extra.sum() * 1e-3


def _torch_random(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    return t + torch.randn_like(t) * 1e-2


def _dropout(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    return torch.nn.functional.dropout(t, p=0.1, training=True)


def _python_random(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    if random.random() < 0.5:  # Python random decides which kernels run
        return t * 1.01
    return t


def _counter(t: torch.Tensor, state: PlantState) -> torch.Tensor:
    state.calls += 1  # a call counter decides which kernels run
    if state.calls % 2:
        return t * (1.0 + (state.calls % 3) * 0.01)
    return t


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("item", HOST_READ, "`.item()` of a value", _item),
    Kind("tolist", HOST_READ, "`.cpu().tolist()` of values", _tolist),
    Kind("synchronize", HOST_READ, "`torch.cuda.synchronize()`", _synchronize),
    Kind("cpu_tensor", HOST_READ, "a CPU tensor made from device data, copied back", _cpu_tensor),
    Kind("branch", HOST_READ, "a Python branch on a tensor value", _branch),
    Kind("nonzero", HOST_READ, "`nonzero` (data-dependent output size)", _nonzero),
    Kind("bool_mask", HOST_READ, "boolean-mask indexing (data-dependent output size)", _bool_mask),
    Kind("host_sized", HOST_READ, "an allocation whose size is a host value read from the data", _host_sized),
    Kind("torch_random", RNG, "torch random numbers (`randn_like`)", _torch_random),
    Kind("dropout", RNG, "dropout in train mode", _dropout),
    Kind("python_random", HIDDEN_STATE, "Python `random` decides which kernels run", _python_random),
    Kind("counter", HIDDEN_STATE, "a call counter decides which kernels run", _counter),
)}
