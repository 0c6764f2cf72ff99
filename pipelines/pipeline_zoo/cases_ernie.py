"""Pipeline zoo case of ERNIE-Image (``ernie_image``): a Mistral-3 text model (its second-last hidden state per
prompt, unpadded) and the Flux.2 VAE (32 latent channels, patchified 2x2: 128 transformer channels)."""

from __future__ import annotations

from typing import Any

from ..text_encoders import preset
from ..zoo import cases_image as zoo_image
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]


def _ernie(parts: Parts) -> dict[str, Any]:
    flux2 = parts.family("flux2")
    tokenizer = flux2["tokenizer"]
    config = preset("mistral3_tiny")
    config["text_config"].update(num_hidden_layers=2, pad_token_id=tokenizer.pad_token_id,
                                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    encoder = parts.transformers_model("text_encoder", "Mistral3Model", "Mistral3Config", **config)
    transformer = dict(zoo_image.ERNIE, in_channels=128, out_channels=128, text_in_dim=16)
    return {"tokenizer": tokenizer, "text_encoder": encoder, "vae": flux2["vae"],
            "transformer": parts.model("transformer", "ErnieImageTransformer2DModel", transformer),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


CASES: list[PipelineCase] = [
    PipelineCase("ErnieImagePipeline", _ernie,
                 lambda m: {"prompt": "a red fox in the snow", "negative_prompt": "blurry", "height": 64, "width": 64,
                            "guidance_scale": 4.0, "use_pe": False, "output_type": "latent"},
                 note="per-prompt text lengths (a list of unpadded hidden states); batched CFG; no prompt enhancer"),
]
