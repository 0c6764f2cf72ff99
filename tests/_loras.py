"""LoRA files for the adapter tests of the server: random adapters for a tiny family, and broken ones."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bcg_pipelines.lora_files import write_family_lora

#: name -> (rank, alpha, seed, targets): different ranks, an alpha != rank (scaling 0.5), a subset of targets.
ADAPTERS = {
    "anime": (4, None, 1, ("to_q", "to_k", "to_v", "to_out.0")),
    "sketch": (8, 4, 2, ("to_q", "to_k", "to_v", "to_out.0")),
    "noir": (4, None, 3, ("to_q", "to_v")),
}


def write_adapters(out: Path, family: str = "flux", size: str = "tiny") -> dict[str, Path]:
    """:data:`ADAPTERS` for ``family`` at ``size`` under ``out``; name -> file."""
    return {name: write_family_lora(family, size, out / name, rank, alpha=alpha, seed=seed, targets=targets)
            for name, (rank, alpha, seed, targets) in ADAPTERS.items()}


def rewrite(source: Path, target: Path, change) -> Path:
    """A copy of the LoRA file ``source`` with its tensors passed through ``change(dict) -> dict``."""
    with safe_open(str(source), "pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(change(tensors), str(target), metadata=metadata)
    return target


def wrong_shapes(source: Path, target: Path) -> Path:
    """Every ``lora_A`` takes one input feature more than the model has."""
    return rewrite(source, target, lambda t: {k: torch.cat([v, v[:, :1]], 1) if ".lora_A." in k else v
                                              for k, v in t.items()})


def unknown_module(source: Path, target: Path) -> Path:
    """One pair of matrices renamed to a module the transformer does not have."""
    def change(t):
        key = sorted(t)[0]
        stem = key.split(".lora_")[0]
        return {(k.replace(stem, "transformer.no_such_block.to_q") if k.startswith(stem + ".lora_") else k): v
                for k, v in t.items()}
    return rewrite(source, target, change)
