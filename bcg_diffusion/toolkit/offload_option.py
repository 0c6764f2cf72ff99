"""``--offload [K]`` of the commands (``bcg-generate``, ``bcg-serve``): weight streaming of the transformer.

The pipeline is built (or loaded) on the CPU, its other components are put on the device, and each transformer
streams its repeated blocks through K device slots (``bcg_diffusion.apply_weight_streaming``); an acceleration
made afterwards uses that streaming (docs/accelerate.md "Weight streaming").
"""

from __future__ import annotations

from typing import Any

OFFLOAD_HELP = (
    "stream the transformer's repeated blocks from host memory through K device buffers (default 2): for a model "
    "larger than the GPU. The pipeline is built on the CPU and its other components go to the device; the output is "
    "bitwise the same as without it, and with --bcg the graphs keep replaying"
)
DEFAULT_SLOTS = 2


def offload_problem(slots: int | None) -> str | None:
    """Why ``--offload K`` cannot run (``None`` where it can)."""
    if slots is not None and slots < 2:
        return f"--offload {slots}: give K >= 2 device buffers (one block computing, the next one loading)"
    return None


def offload_with_quant_problem(slots: int | None, quant: str | None) -> str | None:
    """Why ``--offload`` cannot go with ``--quant`` (``None`` where it can): both commands refuse it alike."""
    if slots is None or not quant:
        return None
    return (f"--offload with --quant {quant}: torchao quantizes on the device the transformer is on, and --offload "
            "keeps it on the CPU; in Python quantize on the GPU, then apply_weight_streaming")


def build_device(slots: int | None, device: Any) -> Any:
    """Where the pipeline is built: the CPU under ``--offload`` (the transformer stays there), else ``device``."""
    return "cpu" if slots is not None else device


def stream_transformers(pipe: Any, slots: int, device: Any) -> str:
    """Every component but the transformers on ``device``; each transformer streams its blocks through ``slots``
    slots there. Returns the note to print."""
    import torch

    import bcg_diffusion

    transformers = []
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        if bcg_diffusion.is_transformer_component(name):
            transformers.append((name, component))
        else:
            component.to(device)
    for _, transformer in transformers:
        bcg_diffusion.apply_weight_streaming(transformer, bcg_diffusion.OffloadConfig(slots=slots, device=str(device)))
    offload = bcg_diffusion.get_stats(pipe).offload
    return (f"weight streaming: {', '.join(n for n, _ in transformers)}: {offload.blocks} blocks in host memory "
            f"({fmt_bytes(offload.host_bytes)}{', pinned' if offload.pinned else ''}) through {slots} slots of "
            f"{fmt_bytes(offload.slot_bytes // slots)} on {device}; {fmt_bytes(offload.resident_bytes)} of the "
            "transformer stays there")


def fmt_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"
