"""``apply_weight_streaming`` / ``remove_weight_streaming``: weight streaming of a transformer on its own.

``accelerate_pipeline(pipe, BCGConfig(offload=OffloadConfig(...)))`` streams and accelerates in one call; these
two functions stream a transformer without accelerating it (to compare, or where graphs are not wanted), or
before accelerating it (the acceleration then uses the streaming and leaves it on when removed).
docs/accelerate.md "Weight streaming" says how it works and what it costs.
"""

from __future__ import annotations

from typing import Any

import torch

from .accelerate import is_accelerated
from .config import OffloadConfig, offload_config
from .errors import AccelerationError
from .integration.offload import start_streaming, streaming_of


def _module(obj: Any, what: str) -> torch.nn.Module:
    if isinstance(obj, torch.nn.Module):
        return obj
    hint = (" (a pipeline: pass pipe.transformer, or accelerate_pipeline(pipe, BCGConfig(offload=OffloadConfig())))"
            if hasattr(obj, "components") else "")
    raise TypeError(f"{what} needs a torch.nn.Module (a diffusers transformer), got {type(obj).__name__}{hint}")


def apply_weight_streaming(transformer: torch.nn.Module, config: OffloadConfig | int | None = None) -> torch.nn.Module:
    """Stream ``transformer``'s repeated blocks from host memory through ``config.slots`` device slots (an int:
    the slot count; default :class:`~bcg_diffusion.OffloadConfig`); returns ``transformer``.

    The blocks' weights are packed into (page-locked) host memory, the other weights are put on the device, and
    every call of the transformer loads each block into its slot one block ahead of the compute; the output is
    bitwise the output of the same model resident. Raises :class:`AccelerationError`, with the model left as it
    was, for: too many slots, no repeated blocks, other offloading on the model (group offloading, accelerate's
    hooks), host memory that cannot be page-locked, or a device memory cap too small for the slots. An
    accelerated transformer is refused (pass ``BCGConfig(offload=...)`` to the acceleration instead).
    """
    module = _module(transformer, "apply_weight_streaming")
    checked = offload_config(OffloadConfig() if config is None else config)
    if is_accelerated(module):
        raise AccelerationError(
            f"{type(module).__name__} is accelerated: weight streaming goes on first. Call remove_acceleration(), "
            "then apply_weight_streaming and accelerate again, or accelerate with BCGConfig(offload=OffloadConfig())"
        )
    start_streaming(module, checked, created_by="user")
    return module


def remove_weight_streaming(transformer: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`apply_weight_streaming`: the blocks' weights back on the device each was on before (from the
    host copies, so weights written meanwhile are kept), every hook out; returns ``transformer``. A no-op on a
    transformer that does not stream; raises :class:`AccelerationError` while it is accelerated."""
    module = _module(transformer, "remove_weight_streaming")
    streaming = streaming_of(module)
    if streaming is not None:
        streaming.remove()
    return module


def is_streaming(transformer: Any) -> bool:
    """Whether ``transformer`` streams its weights (``apply_weight_streaming`` or ``BCGConfig(offload=...)``)."""
    return streaming_of(transformer) is not None
