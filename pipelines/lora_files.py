"""Random LoRA adapters for a family's transformer, written as diffusers LoRA safetensors (for tests and benchmarks).

The file is what a diffusers training script writes: ``peft``'s LoRA layers added to the transformer
(``add_adapter(LoraConfig(...))``), their state dict (``get_peft_model_state_dict``) saved with the pipeline
class's ``save_lora_weights`` and the adapter's config as metadata, so ``pipe.load_lora_weights(path)`` reads it.
The transformer is built on the ``meta`` device (no memory, seconds even for a published-size model) and only
the LoRA matrices are made, with random values from a seeded generator: the same arguments give the same file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch

from .registry import FamilySpec, get_family

__all__ = ["DEFAULT_TARGETS", "LORA_WEIGHT_NAME", "random_lora_state_dict", "write_family_lora", "write_lora"]

#: The attention projections most LoRAs of diffusion transformers train (every family here has them).
DEFAULT_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
#: The file name diffusers reads from a LoRA folder by default.
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def random_lora_state_dict(transformer: torch.nn.Module, rank: int, *, alpha: float | None = None, seed: int = 0,
                           targets: Sequence[str] = DEFAULT_TARGETS, strength: float = 0.5):
    """The peft state dict (keys ``<module>.lora_A.weight`` / ``lora_B.weight``) and ``LoraConfig`` of a random
    rank-``rank`` adapter on ``targets`` of ``transformer`` (left unchanged: the layers are added to it and removed).

    ``lora_A`` is drawn with standard deviation ``1/sqrt(in_features)`` and ``lora_B`` with ``strength/sqrt(rank)``,
    so the adapter's output is about ``strength`` times its input's scale: it visibly changes an image. ``alpha``
    defaults to ``rank`` (scaling 1.0). Values are float32, on the CPU.
    """
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    if rank < 1:
        raise ValueError(f"rank must be >= 1 (got {rank})")
    config = LoraConfig(r=rank, lora_alpha=rank if alpha is None else alpha, target_modules=list(targets),
                        init_lora_weights=False)
    transformer.add_adapter(config, adapter_name="_random_lora")
    try:
        shapes = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(transformer, adapter_name="_random_lora").items()}
    finally:
        transformer.delete_adapters("_random_lora")
    generator = torch.Generator("cpu").manual_seed(seed)
    state = {}
    for key in sorted(shapes):
        shape = shapes[key]
        std = 1 / math.sqrt(shape[1]) if ".lora_A." in key else strength / math.sqrt(rank)
        state[key] = torch.randn(shape, generator=generator, dtype=torch.float32) * std
    return state, config


def write_lora(pipeline_class: type, state: dict, config, out_dir: str | Path,
               weight_name: str = LORA_WEIGHT_NAME) -> Path:
    """Save a transformer LoRA ``state`` (peft keys) with ``pipeline_class.save_lora_weights``; the file's path."""
    save = getattr(pipeline_class, "save_lora_weights", None)
    if save is None:
        raise ValueError(f"{pipeline_class.__name__} has no save_lora_weights: diffusers loads no LoRA into it")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = config.to_dict()
    metadata["target_modules"] = sorted(metadata["target_modules"])  # a set: JSON needs a list
    save(out_dir, transformer_lora_layers=state, transformer_lora_adapter_metadata=metadata, weight_name=weight_name)
    return out_dir / weight_name


def write_family_lora(family: str | FamilySpec, size: str, out_dir: str | Path, rank: int, *,
                      alpha: float | None = None, seed: int = 0, targets: Sequence[str] = DEFAULT_TARGETS,
                      strength: float = 0.5, weight_name: str = LORA_WEIGHT_NAME) -> Path:
    """A random LoRA for ``family``'s transformer at model ``size`` (``tiny`` or ``full``), built on the meta
    device; see :func:`random_lora_state_dict`. Returns the file's path."""
    spec = get_family(family)
    with torch.device("meta"):
        transformer = spec.transformer_class(**spec.size(size).transformer)
    if not hasattr(transformer, "add_adapter"):
        raise ValueError(f"{spec.name}: {type(transformer).__name__} takes no LoRA adapters in diffusers "
                         "(it is not a PeftAdapterMixin)")
    state, config = random_lora_state_dict(transformer, rank, alpha=alpha, seed=seed, targets=targets,
                                           strength=strength)
    return write_lora(spec.pipeline_class, state, config, out_dir, weight_name)
