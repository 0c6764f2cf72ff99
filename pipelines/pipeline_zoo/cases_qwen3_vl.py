"""Pipeline zoo cases of pipelines whose text encoder is a Qwen3-VL: Krea 2, JoyImage Edit (and Plus),
Nucleus-MoE Image, Qwen-Image 2.1 and Ideogram 4.

The encoder is a tiny Qwen3-VL (:meth:`~bcg_pipelines.pipeline_zoo.parts.Parts.qwen3_vl`) whose vision token ids
match the local Qwen tokenizer with Qwen's vision tokens; the processor a Qwen3-VL one over it (16 px patches, at most
16 per image).
"""

from __future__ import annotations

from typing import Any

from ..zoo import cases_image as zoo_image
from .case import PipelineCase
from .media import Media
from .parts import QWEN_VL_CHAT_TEMPLATE, Parts

__all__ = ["CASES"]

PROMPT = "a red fox in the snow"
SIZE = 64


def _tokenizer(parts: Parts):
    tokenizer = parts.vl_tokenizer("qwen2")
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    return tokenizer


def _qwen_vae(parts: Parts) -> Any:
    return parts.family("qwenimage")["vae"]


def _krea2(parts: Parts) -> dict[str, Any]:
    # the text: hidden states of 3 layers of a 16-wide Qwen3-VL text model, stacked
    tokenizer = _tokenizer(parts)
    return {"tokenizer": tokenizer, "text_encoder": parts.qwen3_vl("text_encoder", tokenizer, hidden=16,
                                                                  model_class="Qwen3VLModel"),
            "vae": _qwen_vae(parts), "transformer": parts.model("transformer", "Krea2Transformer2DModel",
                                                                 dict(zoo_image.KREA2, in_channels=64)),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler"), "text_encoder_select_layers": (0, 1, 2)}


def _joyimage(parts: Parts, plus: bool = False) -> dict[str, Any]:
    tokenizer = _tokenizer(parts)
    name = "JoyImageEditPlusTransformer3DModel" if plus else "JoyImageEditTransformer3DModel"
    return {"tokenizer": tokenizer, "processor": parts.qwen3_vl_processor(tokenizer),
            "text_encoder": parts.qwen3_vl("text_encoder", tokenizer), "vae": parts.family("wan")["vae"],
            "transformer": parts.model("transformer", name, dict(zoo_image.JOYIMAGE, text_dim=32)),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler"), "text_token_max_length": 64}


def _nucleus(parts: Parts) -> dict[str, Any]:
    tokenizer = _tokenizer(parts)
    config = dict(zoo_image.NUCLEUS, in_channels=64, out_channels=16, joint_attention_dim=32)
    return {"processor": parts.qwen3_vl_processor(tokenizer), "text_encoder": parts.qwen3_vl("text_encoder", tokenizer),
            "vae": _qwen_vae(parts), "transformer": parts.model("transformer", "NucleusMoEImageTransformer2DModel",
                                                                 config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _qwenimage21(parts: Parts) -> dict[str, Any]:
    tokenizer = _tokenizer(parts)
    vae = dict(base_dim=8, decoder_base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4, 4], num_res_blocks=1,
               temperal_downsample=[False, True, True, True], latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
    return {"processor": parts.qwen3_vl_processor(tokenizer), "text_encoder": parts.qwen3_vl("text_encoder", tokenizer),
            "vae": parts.vae("AutoencoderKLQwenImage21", vae),
            "transformer": parts.model("transformer", "QwenImage21Transformer2DModel", zoo_image.QWENIMAGE21),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _text(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "output_type": "latent", **extra}


CASES: list[PipelineCase] = [
    PipelineCase("Krea2Pipeline", _krea2, lambda m: _text(height=SIZE, width=SIZE, guidance_scale=4.5,
                                                          max_sequence_length=32),
                 note="3 text-encoder layers stacked per token"),
    PipelineCase("JoyImageEditPipeline", _joyimage, lambda m: _text(image=m.image(SIZE, SIZE), height=SIZE, width=SIZE,
                                                                    guidance_scale=4.0, max_sequence_length=64)),
    PipelineCase("JoyImageEditPlusPipeline", lambda p: _joyimage(p, plus=True),
                 lambda m: _text(images=[m.image(SIZE, SIZE)], height=SIZE, width=SIZE, guidance_scale=4.0,
                                 max_sequence_length=64),
                 two_outputs=lambda call: {**call, "prompt": [PROMPT, PROMPT], "images": [call["images"]] * 2}),
    PipelineCase("NucleusMoEImagePipeline", _nucleus,
                 lambda m: _text(height=SIZE, width=SIZE, guidance_scale=4.0, return_index=-1),
                 note="the last hidden state of the 2-layer encoder (the default -8 needs 8 layers); MoE routing with "
                 "scatter_add (not bitwise repeatable on CUDA without deterministic algorithms)"),
    PipelineCase("QwenImage21Pipeline", _qwenimage21,
                 lambda m: _text(height=SIZE, width=SIZE, true_cfg_scale=4.0, output_resolution=SIZE)),
]


# -- Ideogram 4 ------------------------------------------------------------------------------------------------------
IDEOGRAM_TAPS = 13  # the pipeline taps 13 of the Qwen3-VL text model's 36 layers (0, 3, ..., 33, 35)


def _ideogram4(parts: Parts) -> dict[str, Any]:
    tokenizer = _tokenizer(parts)
    encoder = parts.qwen3_vl("text_encoder", tokenizer, hidden=16, layers=36, model_class="Qwen3VLModel")
    # the Flux.2 VAE's 32 latent channels, patchified 2x2
    config = dict(zoo_image.IDEOGRAM4, in_channels=128, llm_features_dim=IDEOGRAM_TAPS * 16)
    return {"tokenizer": tokenizer, "text_encoder": encoder, "vae": parts.family("flux2")["vae"],
            "transformer": parts.model("transformer", "Ideogram4Transformer2DModel", config),
            "unconditional_transformer": parts.model("unconditional_transformer", "Ideogram4Transformer2DModel",
                                                     config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


CASES += [
    PipelineCase("Ideogram4Pipeline", _ideogram4,
                 lambda m: {"prompt": PROMPT, "height": SIZE, "width": SIZE, "num_inference_steps": 2,
                            "guidance_schedule": (7.0, 7.0), "max_sequence_length": 48, "output_type": "latent"},
                 note="a second transformer (unconditional_transformer) makes the unconditional prediction"),
]
