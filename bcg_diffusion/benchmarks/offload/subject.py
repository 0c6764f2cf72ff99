"""What the offload benchmark runs: a transformer at a published size with random weights, and the inputs of
one of its calls at a shape, for the families it knows (Flux.1-dev, Wan 2.1 1.3B and 14B).

A case is ``model[:size][:HxW][:fFRAMES][:bBATCH]``, e.g. ``flux:full:1024x1024`` or ``wan14b:full:480x832:f33``;
``b`` counts the rows of the call (two for a step whose classifier-free guidance is one batch of two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

import bcg_pipelines as pipelines

# Wan 2.1 T2V 14B (Wan-AI/Wan2.1-T2V-14B-Diffusers): the 1.3B architecture at width 5120, 40 blocks
WAN_14B = dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40)
MODELS = {"flux": ("flux", {}), "wan": ("wan", {}), "wan14b": ("wan", WAN_14B)}
TEXT_TOKENS = 512


@dataclass(frozen=True)
class Case:
    model: str
    size: str = "full"
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    batch: int = 1

    @property
    def family(self) -> str:
        return MODELS[self.model][0]

    @property
    def label(self) -> str:
        shape = f":{self.height}x{self.width}" + (f":f{self.frames}" if self.frames else "")
        return f"{self.model}:{self.size}{shape}:b{self.batch}"


def parse_case(text: str, cuda: bool) -> Case:
    """``model[:size][:HxW][:fFRAMES][:bBATCH]`` as a :class:`Case` with its family's default shape filled in;
    without CUDA the tiny model at its tiny shape. ``ValueError`` saying what is allowed."""
    model, *tokens = [t for t in text.strip().split(":") if t] or [""]
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    fields: dict[str, Any] = {}
    for tok in tokens:
        if tok in pipelines.SIZES:
            fields["size"] = tok
        elif m := re.fullmatch(r"(\d+)x(\d+)", tok):
            fields["height"], fields["width"] = int(m.group(1)), int(m.group(2))
        elif m := re.fullmatch(r"([fb])(\d+)", tok):
            fields["frames" if m.group(1) == "f" else "batch"] = int(m.group(2))
        else:
            raise ValueError(f"case {text!r}: cannot read {tok!r} (expected tiny|full, HxW, fFRAMES or bBATCH)")
    case = Case(model, **fields)
    if not cuda:
        case = Case(model, "tiny", batch=case.batch)
    spec = pipelines.get_family(case.family).size(case.size)
    frames = case.frames or (spec.num_frames if case.family == "wan" else None)
    return Case(model, case.size, case.height or spec.height, case.width or spec.width, frames, case.batch)


def transformer_config(case: Case) -> dict[str, Any]:
    family, changes = MODELS[case.model]
    config = dict(pipelines.get_family(family).size(case.size).transformer)
    return {**config, **changes} if case.size == "full" else config


def build_transformer(case: Case, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """The case's transformer with random weights, made on ``device`` in ``dtype`` (eval mode)."""
    spec = pipelines.get_family(case.family)
    default = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device), torch.no_grad():
            model = spec.transformer_class(**transformer_config(case))
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)


def call_inputs(case: Case, device: torch.device, dtype: torch.dtype, seed: int = 1) -> dict[str, Any]:
    """Keyword arguments of one transformer call at the case's shape (random latents and text states)."""
    config = transformer_config(case)
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype)

    b, h, w = case.batch, case.height // 8, case.width // 8  # VAE: 8x spatially
    if case.family == "flux":
        tokens = (h // 2) * (w // 2)
        return dict(hidden_states=randn(b, tokens, config["in_channels"]),
                    encoder_hidden_states=randn(b, TEXT_TOKENS, config["joint_attention_dim"]),
                    pooled_projections=randn(b, config["pooled_projection_dim"]),
                    timestep=torch.full((b,), 0.5, device=device, dtype=dtype),
                    guidance=torch.full((b,), 3.5, device=device, dtype=dtype),
                    img_ids=torch.zeros(tokens, 3, device=device, dtype=dtype),
                    txt_ids=torch.zeros(TEXT_TOKENS, 3, device=device, dtype=dtype), return_dict=False)
    latent_frames = (case.frames - 1) // 4 + 1  # VAE: 4x temporally
    return dict(hidden_states=randn(b, config["in_channels"], latent_frames, h, w),
                encoder_hidden_states=randn(b, TEXT_TOKENS, config["text_dim"]),
                timestep=torch.full((b,), 500, device=device, dtype=torch.long), return_dict=False)
