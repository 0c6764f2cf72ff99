"""Pipeline zoo cases of Wan 2.1 and the pipelines built on its transformer (``wan``, ``lucy``, ``chronoedit``).

Components are the ``wan`` family's tiny ones (UMT5, the causal 3D VAE with 16 latent channels, 8x spatial and 4x
temporal compression); videos are 5 frames of 32 px (2 latent frames of 4x4). Image-to-video models take the
image latents and a 4-channel frame mask on the channel axis (36 input channels) and, for Wan 2.1 I2V, a CLIP
image embedding through added key/value projections.
"""

from __future__ import annotations

from typing import Any

import torch

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE, FRAMES = 32, 5
IMAGE_DIM = 32  # the tiny CLIP vision tower's width
_WAN = get_family("wan").tiny.transformer
INNER = _WAN["num_attention_heads"] * _WAN["attention_head_dim"]


def _wan(parts: Parts, transformer_class: str | None = None, **transformer: Any) -> dict[str, Any]:
    return parts.family("wan", transformer, transformer_class=transformer_class)


def _with_image_encoder(parts: Parts, components: dict[str, Any]) -> dict[str, Any]:
    components["image_encoder"] = parts.clip_vision(hidden=IMAGE_DIM)
    components["image_processor"] = parts.clip_image_processor(32)
    return components


def _i2v(parts: Parts) -> dict[str, Any]:
    return _with_image_encoder(parts, _wan(parts, in_channels=36, image_dim=IMAGE_DIM, added_kv_proj_dim=INNER))


def _chronoedit(parts: Parts) -> dict[str, Any]:
    config = dict(in_channels=36, image_dim=IMAGE_DIM, added_kv_proj_dim=INNER, rope_max_seq_len=64)
    return _with_image_encoder(parts, _wan(parts, "ChronoEditTransformer3DModel", **config))


def _vace(parts: Parts) -> dict[str, Any]:
    # the control video's inactive and reactive latents (2 x 16) and the 8x8 mask per latent (64) as VACE input
    return _wan(parts, "WanVACETransformer3DModel", num_layers=2, vace_layers=[0, 1], vace_in_channels=96)


def _lucy(parts: Parts) -> dict[str, Any]:
    """Lucy Edit: Wan 2.2 with the source video's latents on the channel axis. Its ``__call__`` preprocesses the
    video to float32 and encodes it with the VAE as it is, so the VAE must be float32 (the model card loads it so);
    the transformer runs in the case's dtype."""
    components = _wan(parts, in_channels=32)
    components["vae"] = torch.nn.Module.to(components["vae"], dtype=torch.float32)
    return components


def _animate(parts: Parts) -> dict[str, Any]:
    config = dict(in_channels=36, latent_channels=16, image_dim=IMAGE_DIM,
                  motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16,
                  motion_style_dim=8, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
                  face_encoder_num_heads=2, inject_face_latents_blocks=2)
    keep = ("patch_size", "num_attention_heads", "attention_head_dim", "text_dim", "freq_dim", "ffn_dim",
            "num_layers", "cross_attn_norm", "qk_norm", "eps", "rope_max_seq_len")
    components = parts.family("wan")
    components["transformer"] = parts.model(
        "transformer", "WanAnimateTransformer3DModel", {k: _WAN[k] for k in keep} | config)
    return _with_image_encoder(parts, components)


def _text(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox running in the snow", "negative_prompt": "blurry", "height": SIZE, "width": SIZE,
            "num_frames": FRAMES, "guidance_scale": 5.0, "max_sequence_length": 32, "output_type": "latent",
            **extra}


def _vace_call(m: Media) -> dict[str, Any]:
    video = m.video(FRAMES, SIZE, SIZE)
    masks = [m.mask(SIZE, SIZE) for _ in range(FRAMES)]
    return _text(m, video=video, mask=masks, reference_images=[m.image(SIZE, SIZE)])


def _animate_call(m: Media) -> dict[str, Any]:
    call = _text(m, image=m.image(SIZE, SIZE), pose_video=m.video(FRAMES, SIZE, SIZE),
                 face_video=m.video(FRAMES, 16, 16), segment_frame_length=FRAMES, guidance_scale=1.0)
    del call["num_frames"]
    return call


def _v2v(m: Media) -> dict[str, Any]:
    call = _text(m, video=m.video(FRAMES, SIZE, SIZE), strength=0.5, num_inference_steps=4)
    del call["num_frames"]
    return call


CASES: list[PipelineCase] = [
    PipelineCase("WanPipeline", _wan, _text, note="two transformer calls per step (CFG)"),
    PipelineCase("WanImageToVideoPipeline", _i2v, lambda m: _text(m, image=m.image(SIZE, SIZE)),
                 note="image latents and frame mask on channels, CLIP image embedding (Wan 2.1 I2V)"),
    PipelineCase("WanVideoToVideoPipeline", _wan, _v2v),
    PipelineCase("WanVACEPipeline", _vace, _vace_call,
                 note="control video, per-frame masks and a reference image through the VACE blocks"),
    PipelineCase("WanAnimatePipeline", _animate, _animate_call, steps=2,
                 note="reference image, pose video and face video (motion and face encoders) in one segment"),
    PipelineCase("LucyEditPipeline", _lucy, lambda m: _text(m, video=m.video(FRAMES, SIZE, SIZE)),
                 note="the source video's latents concatenated on channels; the VAE in float32, as Lucy's own "
                 "example loads it (the pipeline hands the VAE a float32 video whatever its dtype)"),
    PipelineCase("ChronoEditPipeline", _chronoedit, lambda m: _text(m, image=m.image(SIZE, SIZE)),
                 note="image edit as a 2-frame video"),
]
