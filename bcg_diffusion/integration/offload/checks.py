"""Refusals of weight streaming, made before anything is moved (the model is left as it was)."""

from __future__ import annotations

import torch

from ...config import OffloadConfig
from ...errors import AccelerationError
from ..model_hooks import hooks_of

GIB = 2**30
OPTION = "BCGConfig(offload=OffloadConfig(slots=2)) (bcg-generate / bcg-serve --offload)"
_DIFFUSERS_OFFLOAD_HOOKS = ("GroupOffloadingHook", "LazyPrefetchGroupOffloadingHook", "LayerExecutionTrackerHook")


def refuse_other_offloading(root: torch.nn.Module) -> None:
    """Raise for diffusers' group offloading and accelerate's offload hooks (model / sequential CPU offload,
    ``device_map``) anywhere in ``root``: they move the same weights per call."""
    for path, module in root.named_modules():
        owner = f"{type(root).__name__}{'.' + path if path else ''}"
        if module.__dict__.get("_hf_hook") is not None:
            raise AccelerationError(
                f"{owner} has accelerate hooks (enable_model_cpu_offload / enable_sequential_cpu_offload / device_map): "
                "they move weights per call to new addresses. For a model larger than the GPU use weight streaming "
                f"instead: load it without them (on the CPU) and pass {OPTION}."
            )
        names = [type(hook).__name__ for _, hook in hooks_of(module)]
        found = [n for n in names if n in _DIFFUSERS_OFFLOAD_HOOKS]
        if found:
            raise AccelerationError(
                f"{owner} has diffusers' group offloading ({found[0]}): it moves weights per call to new addresses. "
                f"Turn it off and use weight streaming instead: load the transformer without enable_group_offload "
                f"(on the CPU) and pass {OPTION}."
            )


def streaming_device(config: OffloadConfig) -> torch.device:
    """Where the blocks compute: ``config.device``, else the current CUDA device, else the CPU."""
    if config.device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AccelerationError(f"OffloadConfig(device={config.device!r}): no CUDA device is available here")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_slots(slots: int, blocks: int, owner: str) -> None:
    if slots > blocks:
        raise AccelerationError(
            f"OffloadConfig(slots={slots}): {owner} has only {blocks} repeated blocks; use at most {blocks} slots "
            "(2 holds the least in device memory)"
        )


def room_problem(cap_bytes: int, in_use_bytes: int, slots: int, slot_bytes: int, resident_bytes: int) -> str | None:
    """Why ``slots`` slots of ``slot_bytes`` and ``resident_bytes`` more do not fit under ``cap_bytes`` with
    ``in_use_bytes`` in use (``None`` where they fit)."""
    needed = slots * slot_bytes + resident_bytes
    if in_use_bytes + needed <= cap_bytes:
        return None
    return (
        f"weight streaming needs {needed / GIB:.2f} GiB on the device ({slots} slots of {slot_bytes / GIB:.2f} GiB, "
        f"the largest block, and {resident_bytes / GIB:.2f} GiB of weights outside the blocks) with "
        f"{max(in_use_bytes, 0) / GIB:.2f} GiB already in use, over the memory cap of {cap_bytes / GIB:.2f} GiB. "
        "Use fewer slots (the least is 2), free device memory, or raise the cap "
        "(torch.cuda.set_per_process_memory_fraction)."
    )


def device_cap(device: torch.device) -> int:
    """Bytes this process may allocate on ``device``: its memory times the per-process fraction."""
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _: 1.0)(device)
    return int(torch.cuda.get_device_properties(device).total_memory * fraction)


def check_room(device: torch.device, slots: int, slot_bytes: int, resident_bytes: int, freed_bytes: int) -> None:
    """Raise where the slots and the weights to move onto ``device`` do not fit under its cap (CUDA only);
    ``freed_bytes``: block weights on the device now, which streaming frees."""
    if device.type != "cuda":
        return
    in_use = torch.cuda.memory_allocated(device) - freed_bytes
    problem = room_problem(device_cap(device), in_use, slots, slot_bytes, resident_bytes)
    if problem:
        raise AccelerationError(problem)
