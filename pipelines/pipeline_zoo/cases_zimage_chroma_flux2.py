"""Pipeline zoo cases of Z-Image, Chroma and Flux.2 (``z_image``, ``chroma``, ``flux2``).

Components are the families' tiny ones (64 px). Flux.2 Klein swaps Mistral for a Qwen3 causal LM whose hidden
states of three layers are stacked (3 x 16 = 48 wide, the tiny transformer's text width); the calls pick layers
1, 2 and 3 of the 4-layer encoder (``text_encoder_out_layers``). The Z-Image ControlNet shares the transformer's
embedders and refiners (``ZImageControlNetModel.from_transformer`` in the pipeline's constructor); its control
input is the control image's latents (16 channels), with the mask and the image latents for inpainting (33).
"""

from __future__ import annotations

from typing import Any

import torch

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE = 64
_ZIMAGE = get_family("zimage").tiny.transformer
_ZIMAGE_CONTROL_KEYS = ("all_patch_size", "all_f_patch_size", "dim", "n_refiner_layers", "n_heads", "n_kv_heads",
                        "norm_eps", "qk_norm")


def _text(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox in the snow", "height": SIZE, "width": SIZE, "output_type": "latent",
            "max_sequence_length": 64, **extra}


def _img2img(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, image=m.image(SIZE, SIZE), strength=0.5, num_inference_steps=4, **extra)


# -- Z-Image ---------------------------------------------------------------------------------------------------
def _zimage_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, negative_prompt="blurry", guidance_scale=4.0, **extra)


def _zimage_controlnet(parts: Parts, control_in_dim: int) -> dict[str, Any]:
    components = parts.family("zimage")
    config = {key: _ZIMAGE[key] for key in _ZIMAGE_CONTROL_KEYS}
    config.update(control_layers_places=[0, 1], control_refiner_layers_places=[0], control_in_dim=control_in_dim)
    components["controlnet"] = parts.model("controlnet", "ZImageControlNetModel", config)
    return components


def _zimage_omni(parts: Parts) -> dict[str, Any]:
    components = parts.family("zimage", dict(siglip_feat_dim=32))
    components["siglip"] = parts.transformers_model(
        "siglip", "Siglip2VisionModel", "Siglip2VisionConfig", hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, patch_size=8, num_patches=16)
    from transformers import Siglip2ImageProcessor

    components["siglip_processor"] = Siglip2ImageProcessor(patch_size=8, max_num_patches=16)
    return components


def _chroma_inpaint(parts: Parts) -> dict[str, Any]:
    # diffusers 0.42.1's ChromaInpaintPipeline reads transformer.config.guidance_embeds, which Chroma's config lacks:
    # every call raised AttributeError; the key a Flux-style config would have is registered (Chroma has no
    # guidance embedding)
    components = parts.family("chroma")
    components["transformer"].register_to_config(guidance_embeds=False)
    return components


# -- Flux.2 Klein ----------------------------------------------------------------------------------------------
def _klein(parts: Parts, distilled: bool = False) -> dict[str, Any]:
    components = parts.family("flux2", dict(guidance_embeds=False))
    tokenizer = parts.tokenizer("qwen3", 32768)
    components["tokenizer"] = tokenizer
    components["text_encoder"] = parts.language_model(
        "text_encoder", "Qwen3ForCausalLM", "Qwen3Config", tokenizer, hidden_size=16, intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    components["is_distilled"] = distilled
    return components


def _klein_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, text_encoder_out_layers=(1, 2, 3), **extra)


CASES: list[PipelineCase] = [
    PipelineCase("ZImagePipeline", lambda p: p.family("zimage"), _zimage_text,
                 note="batched CFG over lists of per-sample latents"),
    PipelineCase("ZImageImg2ImgPipeline", lambda p: p.family("zimage"),
                 lambda m: _img2img(m, negative_prompt="blurry", guidance_scale=4.0)),
    PipelineCase("ZImageInpaintPipeline", lambda p: p.family("zimage"),
                 lambda m: _img2img(m, mask_image=m.mask(SIZE, SIZE), negative_prompt="blurry", guidance_scale=4.0)),
    PipelineCase("ZImageControlNetPipeline", lambda p: _zimage_controlnet(p, 16),
                 lambda m: _zimage_text(m, control_image=m.control(SIZE, SIZE)),
                 note="the ControlNet shares the transformer's embedders and refiners"),
    PipelineCase("ZImageControlNetInpaintPipeline", lambda p: _zimage_controlnet(p, 33),
                 lambda m: _zimage_text(m, image=m.image(SIZE, SIZE), mask_image=m.mask(SIZE, SIZE),
                                        control_image=m.control(SIZE, SIZE))),
    PipelineCase("ZImageOmniPipeline", _zimage_omni, lambda m: _zimage_text(m, image=[m.image(SIZE, SIZE)]),
                 dtype=torch.bfloat16,
                 note="a condition image as SigLIP-2 features and latents in the sequence; bf16 only (the pipeline "
                 "casts the image to bf16 for the VAE)"),
    PipelineCase("ChromaPipeline", lambda p: p.family("chroma"),
                 lambda m: _text(m, negative_prompt="blurry", guidance_scale=5.0), note="two calls per step (CFG)"),
    PipelineCase("ChromaImg2ImgPipeline", lambda p: p.family("chroma"),
                 lambda m: _img2img(m, negative_prompt="blurry", guidance_scale=5.0)),
    PipelineCase("ChromaInpaintPipeline", _chroma_inpaint,
                 lambda m: _img2img(m, mask_image=m.mask(SIZE, SIZE), negative_prompt="blurry", true_cfg_scale=2.0),
                 note="guidance_embeds=False registered on the transformer's config (diffusers 0.42.1 reads it)"),
    PipelineCase("Flux2Pipeline", lambda p: p.family("flux2"), lambda m: _text(m, guidance_scale=4.0),
                 note="embedded guidance"),
    PipelineCase("Flux2KleinPipeline", _klein, lambda m: _klein_text(m, guidance_scale=4.0),
                 note="Qwen3 text encoder; CFG as two calls per step"),
    PipelineCase("Flux2KleinKVPipeline", lambda p: _klein(p, distilled=True),
                 lambda m: _klein_text(m, image=m.image(SIZE, SIZE)),
                 note="distilled; the reference image's keys and values cached after the first step"),
    PipelineCase("Flux2KleinInpaintPipeline", _klein,
                 lambda m: _klein_text(m, image=m.image(SIZE, SIZE), mask_image=m.mask(SIZE, SIZE), strength=0.5,
                                       num_inference_steps=4, guidance_scale=4.0)),
]
