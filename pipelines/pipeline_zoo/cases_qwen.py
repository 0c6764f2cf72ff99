"""Pipeline zoo cases of Qwen-Image (``diffusers.pipelines.qwenimage``).

Components are the ``qwenimage`` family's tiny ones (Qwen2.5-VL of width 32, the Wan-style VAE with 16 latent
channels, 64 px); true CFG runs two transformer calls per step. The edit and layered pipelines also show the
images to the vision-language encoder: their tokenizer has Qwen's vision tokens and a Qwen2-VL processor, and
the encoder's config the matching token ids. The edit pipelines encode their reference image at the pipelines'
fixed area of 1024x1024 px (diffusers' ``VAE_IMAGE_SIZE``); its tokens join the sequence.
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE = 64
_CONTROLNET_KEYS = ("patch_size", "in_channels", "out_channels", "attention_head_dim", "num_attention_heads",
                    "joint_attention_dim", "axes_dims_rope")


def _qwen(parts: Parts) -> dict[str, Any]:
    return parts.family("qwenimage")


def _vl(parts: Parts) -> dict[str, Any]:
    components = _qwen(parts)
    tokenizer = parts.vl_tokenizer("qwen2")
    components["tokenizer"] = tokenizer
    components["text_encoder"] = parts.qwen25_vl("text_encoder", tokenizer)
    components["processor"] = parts.vl_processor(tokenizer)
    return components


def _layered(parts: Parts) -> dict[str, Any]:
    # the layered model adds a layer axis to RoPE and takes an extra condition flag
    components = _vl(parts)
    config = {**get_family("qwenimage").tiny.transformer, "use_layer3d_rope": True, "use_additional_t_cond": True}
    components["transformer"] = parts.model("transformer", "QwenImageTransformer2DModel", config)
    return components


def _controlnet(parts: Parts, **extra: Any) -> dict[str, Any]:
    components = _qwen(parts)
    tiny = get_family("qwenimage").tiny.transformer
    config = {key: tiny[key] for key in _CONTROLNET_KEYS} | {"num_layers": 2} | extra
    components["controlnet"] = parts.model("controlnet", "QwenImageControlNetModel", config)
    return components


def _text(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox in the snow", "negative_prompt": "blurry", "true_cfg_scale": 4.0, "height": SIZE,
            "width": SIZE, "max_sequence_length": 64, "output_type": "latent", **extra}


def _img2img(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, image=m.image(SIZE, SIZE), strength=0.5, num_inference_steps=4, **extra)


def _edit(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, **{"image": m.image(SIZE, SIZE), **extra})


def _layered_call(m: Media) -> dict[str, Any]:
    # 640 or 1024 px, nothing else; its output_type="latent" raises (diffusers 0.42.1 returns an unbound name)
    call = _text(m, image=m.image(SIZE, SIZE), layers=2, resolution=640, output_type="pt")
    del call["height"], call["width"]
    return call


CASES: list[PipelineCase] = [
    PipelineCase("QwenImagePipeline", _qwen, _text, note="true CFG: two transformer calls per step"),
    PipelineCase("QwenImageImg2ImgPipeline", _qwen, _img2img),
    PipelineCase("QwenImageInpaintPipeline", _qwen, lambda m: _img2img(m, mask_image=m.mask(SIZE, SIZE))),
    PipelineCase("QwenImageEditPipeline", _vl, _edit,
                 note="the reference image through the VL encoder and as latent tokens in the sequence"),
    PipelineCase("QwenImageEditPlusPipeline", _vl, lambda m: _edit(m, image=m.images(2, SIZE, SIZE)),
                 note="two reference images"),
    PipelineCase("QwenImageEditInpaintPipeline", _vl,
                 lambda m: _edit(m, mask_image=m.mask(SIZE, SIZE), strength=0.5, num_inference_steps=4)),
    PipelineCase("QwenImageLayeredPipeline", _layered, _layered_call,
                 note="the image decomposed into 2 layers (a layer axis in the latents and RoPE)"),
    PipelineCase("QwenImageControlNetPipeline", _controlnet, lambda m: _text(m, control_image=m.control(SIZE, SIZE)),
                 note="ControlNet block residuals passed to the transformer"),
    PipelineCase("QwenImageControlNetInpaintPipeline", lambda p: _controlnet(p, extra_condition_channels=4),
                 lambda m: _text(m, control_image=m.image(SIZE, SIZE), control_mask=m.mask(SIZE, SIZE))),
]
