"""Pipeline zoo cases of Flux.1 (``diffusers.pipelines.flux``) and VisualCloze (a Flux Fill model).

Components are the ``flux`` family's tiny ones (CLIP + T5, 16-channel VAE with scale factor 8, 64 px); the
transformer's input width follows what each pipeline concatenates on the channel axis: 64 packed latent
channels, 128 with a control image's latents (Control), 384 with masked-image latents and the packed mask (Fill).
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE = 64
TEXT = dict(max_sequence_length=32)  # T5 tokens (the default 512 only pads)
FILL_CHANNELS = 64 + 64 + 4 * 8 * 8  # packed latents, packed masked-image latents, the packed 8x8 mask per latent


def _flux(parts: Parts, **transformer: Any) -> dict[str, Any]:
    return parts.family("flux", transformer)


_CONTROLNET_KEYS = ("patch_size", "in_channels", "num_layers", "num_single_layers", "attention_head_dim",
                    "num_attention_heads", "joint_attention_dim", "pooled_projection_dim", "guidance_embeds",
                    "axes_dims_rope")


def _controlnet(parts: Parts) -> dict[str, Any]:
    """The flux components and a FluxControlNetModel of the tiny transformer's sizes."""
    components = _flux(parts)
    tiny = get_family("flux").tiny.transformer
    components["controlnet"] = parts.model("controlnet", "FluxControlNetModel", {k: tiny[k] for k in _CONTROLNET_KEYS})
    return components


def _text(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox in the snow", "height": SIZE, "width": SIZE, "guidance_scale": 3.5,
            "output_type": "latent", **TEXT, **extra}


def _img2img(m: Media, **extra: Any) -> dict[str, Any]:
    # 4 steps at strength 0.5: two denoising steps from the noised image
    return _text(m, image=m.image(SIZE, SIZE), strength=0.5, num_inference_steps=4, **extra)


def _inpaint(m: Media, **extra: Any) -> dict[str, Any]:
    return _img2img(m, mask_image=m.mask(SIZE, SIZE), **extra)


def _kontext(m: Media, **extra: Any) -> dict[str, Any]:
    # the reference image's tokens join the sequence; no resize to Kontext's preferred 1 MP resolutions
    return _text(m, image=m.image(SIZE, SIZE), max_area=SIZE * SIZE, _auto_resize=False, **extra)


def _visualcloze(m: Media, **extra: Any) -> dict[str, Any]:
    # one in-context example row (2 images) and the query row (its image, then the one to generate)
    images = [m.images(2, SIZE, SIZE), [m.image(SIZE, SIZE), None]]
    return {"task_prompt": "Each row turns [IMAGE1] a depth map into [IMAGE2] a photo.",
            "content_prompt": "a red fox in the snow", "image": images, "guidance_scale": 30.0,
            "output_type": "latent", **TEXT, **extra}


def _visualcloze_upsampled(m: Media) -> dict[str, Any]:
    # the generation, then its SDEdit upsampling pass (a Fill pipeline sharing the transformer) at 64 px
    return _visualcloze(m, upsampling_height=SIZE, upsampling_width=SIZE, upsampling_strength=0.5)


def _visualcloze_parts(parts: Parts) -> dict[str, Any]:
    return {**_flux(parts, in_channels=FILL_CHANNELS, out_channels=64), "resolution": SIZE}


CASES: list[PipelineCase] = [
    PipelineCase("FluxPipeline", _flux, _text, note="guidance embedding, one call per step"),
    PipelineCase("FluxImg2ImgPipeline", _flux, _img2img),
    PipelineCase("FluxInpaintPipeline", _flux, _inpaint, note="the mask blends image latents in after each step"),
    PipelineCase("FluxFillPipeline", lambda p: _flux(p, in_channels=FILL_CHANNELS, out_channels=64),
                 lambda m: _text(m, image=m.image(SIZE, SIZE), mask_image=m.mask(SIZE, SIZE), guidance_scale=30.0),
                 note="masked-image latents and the packed mask concatenated on channels"),
    PipelineCase("FluxControlPipeline", lambda p: _flux(p, in_channels=128, out_channels=64),
                 lambda m: _text(m, control_image=m.control(SIZE, SIZE)),
                 note="the control image's latents concatenated on channels"),
    PipelineCase("FluxControlImg2ImgPipeline", lambda p: _flux(p, in_channels=128, out_channels=64),
                 lambda m: _img2img(m, control_image=m.control(SIZE, SIZE))),
    PipelineCase("FluxControlInpaintPipeline", lambda p: _flux(p, in_channels=128, out_channels=64),
                 lambda m: _inpaint(m, control_image=m.control(SIZE, SIZE))),
    PipelineCase("FluxControlNetPipeline", _controlnet, lambda m: _text(m, control_image=m.control(SIZE, SIZE)),
                 note="ControlNet residuals added inside the transformer's blocks"),
    PipelineCase("FluxControlNetImg2ImgPipeline", _controlnet,
                 lambda m: _img2img(m, control_image=m.control(SIZE, SIZE))),
    PipelineCase("FluxControlNetInpaintPipeline", _controlnet,
                 lambda m: _inpaint(m, control_image=m.control(SIZE, SIZE))),
    PipelineCase("FluxKontextPipeline", _flux, _kontext, note="reference-image tokens concatenated to the sequence"),
    PipelineCase("FluxKontextInpaintPipeline", _flux,
                 lambda m: _kontext(m, mask_image=m.mask(SIZE, SIZE), strength=0.5, num_inference_steps=4)),
    PipelineCase("VisualClozePipeline", _visualcloze_parts, _visualcloze_upsampled, group="visualcloze",
                 note="in-context example and query images laid out as one grid, Fill-style channels; then the upsampling pass"),
    PipelineCase("VisualClozeGenerationPipeline", _visualcloze_parts, _visualcloze, group="visualcloze"),
]
