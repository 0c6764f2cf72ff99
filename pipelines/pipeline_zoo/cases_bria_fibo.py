"""Pipeline zoo cases of Bria FIBO (``bria_fibo``): a SmolLM3 causal LM whose last two hidden states are the text.

The pipelines use token id 128000 (SmolLM3's begin-of-text) for empty prompts, so the tiny SmolLM3 keeps the real
vocabulary size (128256 ids; 4M embedding parameters at width 32) over the local byte-level tokenizer.
"""

from __future__ import annotations

from typing import Any

from ..zoo import cases_image as zoo_image
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]


def _fibo(parts: Parts) -> dict[str, Any]:
    tokenizer = parts.tokenizer("llama3", 2048)
    encoder = parts.language_model("text_encoder", "SmolLM3ForCausalLM", "SmolLM3Config", tokenizer, vocab_size=128256,
                                   hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1)
    return {"tokenizer": tokenizer, "text_encoder": encoder, "vae": parts.family("wan")["vae"],
            "transformer": parts.model("transformer", "BriaFiboTransformer2DModel", zoo_image.BRIA_FIBO),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _call(**extra: Any) -> dict[str, Any]:
    return {"prompt": '{"description": "a red fox in the snow"}', "negative_prompt": "", "height": 64, "width": 64,
            "guidance_scale": 5.0, "max_sequence_length": 64, "output_type": "latent", **extra}


CASES: list[PipelineCase] = [
    PipelineCase("BriaFiboPipeline", _fibo, lambda m: _call(),
                 note="the text encoder's layers go to the transformer's blocks; batched CFG"),
    PipelineCase("BriaFiboEditPipeline", _fibo,
                 lambda m: _call(prompt='{"edit_instruction": "make the fox red"}', image=m.image(64, 64),
                                 _auto_resize=False),
                 note="the reference image's latents in the sequence"),
]
