"""Pipeline zoo cases of Stable Diffusion 3 (``stable_diffusion_3``, ``controlnet_sd3``, ``pag``).

Components are the ``sd3`` family's tiny ones (CLIP-L, CLIP-G, T5, 16-channel VAE, 64 px); CFG runs batched.
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE = 64
_CONTROLNET_KEYS = ("sample_size", "patch_size", "in_channels", "attention_head_dim", "num_attention_heads",
                    "joint_attention_dim", "caption_projection_dim", "pooled_projection_dim", "out_channels",
                    "pos_embed_max_size", "qk_norm")


def _sd3(parts: Parts) -> dict[str, Any]:
    return parts.family("sd3")


def _controlnet(parts: Parts, **extra: Any) -> dict[str, Any]:
    components = _sd3(parts)
    tiny = get_family("sd3").tiny.transformer
    config = {key: tiny[key] for key in _CONTROLNET_KEYS} | {"num_layers": 2} | extra
    components["controlnet"] = parts.model("controlnet", "SD3ControlNetModel", config)
    return components


def _text(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox in the snow", "negative_prompt": "blurry", "height": SIZE, "width": SIZE,
            "guidance_scale": 4.5, "max_sequence_length": 32, "output_type": "latent", **extra}


def _img2img(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(m, image=m.image(SIZE, SIZE), strength=0.5, num_inference_steps=4, **extra)


def _inpaint(m: Media) -> dict[str, Any]:
    return _img2img(m, mask_image=m.mask(SIZE, SIZE))


def _control(m: Media) -> dict[str, Any]:
    return _text(m, control_image=m.control(SIZE, SIZE))


def _control_inpaint(m: Media) -> dict[str, Any]:
    return _text(m, control_image=m.control(SIZE, SIZE), control_mask=m.mask(SIZE, SIZE))


CASES: list[PipelineCase] = [
    PipelineCase("StableDiffusion3Pipeline", _sd3, _text, note="batched CFG (a batch of 2 per step)"),
    PipelineCase("StableDiffusion3Img2ImgPipeline", _sd3, _img2img),
    PipelineCase("StableDiffusion3InpaintPipeline", _sd3, _inpaint),
    PipelineCase("StableDiffusion3PAGPipeline", _sd3, lambda m: _text(m, pag_scale=3.0), group="stable_diffusion_3",
                 note="perturbed-attention guidance: a batch of 3 per step, identity attention in the PAG layer"),
    PipelineCase("StableDiffusion3PAGImg2ImgPipeline", _sd3, lambda m: _img2img(m, pag_scale=3.0),
                 group="stable_diffusion_3"),
    PipelineCase("StableDiffusion3ControlNetPipeline", _controlnet, _control, group="stable_diffusion_3",
                 note="ControlNet block residuals passed to the transformer"),
    PipelineCase("StableDiffusion3ControlNetInpaintingPipeline",
                 lambda p: _controlnet(p, extra_conditioning_channels=1), _control_inpaint,
                 group="stable_diffusion_3", note="the control image and its mask as the ControlNet's condition"),
]
