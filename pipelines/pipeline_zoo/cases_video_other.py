"""Pipeline zoo cases of video pipelines outside the known families: SkyReels-V2, Sana-Video, Mochi, Latte, Allegro and
EasyAnimate.

SkyReels-V2 and Sana-Video run on the ``wan`` family's tiny UMT5 / Gemma-2 and 16-channel Wan VAE; the others get tiny
VAEs of their own classes. Videos are 5 frames of 32 px unless a VAE needs more.
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from ..zoo import cases_video as zoo_video
from .case import PipelineCase
from .media import Media
from .parts import QWEN_VL_CHAT_TEMPLATE, Parts

__all__ = ["CASES"]

PROMPT = "a red fox running in the snow"
SIZE, FRAMES = 32, 5
_WAN = get_family("wan").tiny.transformer
_WAN_INNER = _WAN["num_attention_heads"] * _WAN["attention_head_dim"]
_SKYREELS_KEYS = ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
                  "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "rope_max_seq_len")


def _video(size: int = SIZE, frames: int | None = FRAMES, **extra: Any) -> dict[str, Any]:
    call = {"prompt": PROMPT, "negative_prompt": "blurry", "height": size, "width": size, "num_frames": frames,
            "output_type": "latent", **extra}
    return {k: v for k, v in call.items() if v is not None}


# -- SkyReels-V2 ----------------------------------------------------------------------------------------------------
def _skyreels(parts: Parts, image: bool = False, **config: Any) -> dict[str, Any]:
    components = parts.family("wan", scheduler=dict(use_flow_sigmas=True, flow_shift=8.0))
    settings = {k: _WAN[k] for k in _SKYREELS_KEYS} | config
    if image:
        settings |= dict(in_channels=36, image_dim=32, added_kv_proj_dim=_WAN_INNER)
        from transformers import CLIPProcessor

        components["image_encoder"] = parts.clip_vision(hidden=32, projection=True)
        components["image_processor"] = CLIPProcessor(image_processor=parts.clip_image_processor(32),
                                                      tokenizer=parts.tokenizer("clip", 77))
    components["transformer"] = parts.model("transformer", "SkyReelsV2Transformer3DModel", settings)
    return components


def _forcing(m: Media, **extra: Any) -> dict[str, Any]:
    # diffusion forcing: per-frame noise levels; 2 latent frames in blocks of one (ar_step 1: asynchronous)
    return _video(**{"max_sequence_length": 32, "base_num_frames": FRAMES, "ar_step": 1, "causal_block_size": 1,
                     **extra})


# -- Sana-Video -------------------------------------------------------------------------------------------------------
def _sana_video(parts: Parts) -> dict[str, Any]:
    components = {k: v for k, v in parts.family("sana").items() if k in ("tokenizer", "text_encoder")}
    wan = parts.family("wan")
    config = dict(zoo_video.SANA_VIDEO, caption_channels=32)
    components.update(vae=wan["vae"], transformer=parts.model("transformer", "SanaVideoTransformer3DModel", config),
                      scheduler=parts.scheduler("FlowMatchEulerDiscreteScheduler", shift=8.0))
    return components


def _sana_video_call(m: Media, **extra: Any) -> dict[str, Any]:
    # Sana-Video names its frame count ``frames``
    return _video(frames=None, **extra) | {"frames": FRAMES, "use_resolution_binning": False,
                                           "complex_human_instruction": None, "max_sequence_length": 32}


# -- Mochi, Latte, Allegro ----------------------------------------------------------------------------------------------
def _mochi(parts: Parts) -> dict[str, Any]:
    tok = parts.tokenizer("t5", 256)
    # its group norms have 32 groups: 32 channels per level
    vae = dict(latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
               decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1))
    config = dict(zoo_video.MOCHI, text_embed_dim=32, in_channels=12, pooled_projection_dim=32)
    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "t5", "t5_tiny", tok),
            "vae": parts.vae("AutoencoderKLMochi", vae),
            "transformer": parts.model("transformer", "MochiTransformer3DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _latte(parts: Parts) -> dict[str, Any]:
    tok = parts.tokenizer("t5", 120)
    config = dict(zoo_video.LATTE, caption_channels=32, video_length=FRAMES)
    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "t5", "t5_tiny", tok),
            "vae": parts.kl_vae(4), "transformer": parts.model("transformer", "LatteTransformer3DModel", config),
            "scheduler": parts.scheduler("DDIMScheduler")}


def _allegro(parts: Parts) -> dict[str, Any]:
    tok = parts.tokenizer("t5", 512)
    vae = dict(block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=4,
               sample_size=64)
    # head width 12: the 3-axis RoPE splits it in thirds
    config = dict(zoo_video.ALLEGRO, attention_head_dim=12, cross_attention_dim=24, caption_channels=32,
                  sample_height=8, sample_width=8, sample_frames=9)
    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "t5", "t5_tiny", tok),
            "vae": parts.vae("AutoencoderKLAllegro", vae),
            "transformer": parts.model("transformer", "AllegroTransformer3DModel", config),
            "scheduler": parts.scheduler("EulerAncestralDiscreteScheduler")}


# -- EasyAnimate -----------------------------------------------------------------------------------------------------
def _easyanimate(parts: Parts, in_channels: int = 4, **transformer: Any) -> dict[str, Any]:
    tokenizer = parts.vl_tokenizer("qwen2")
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    text_encoder = parts.qwen25_vl("text_encoder", tokenizer, model_class=None)
    vae = dict(block_out_channels=[8, 8, 8, 8], latent_channels=4, layers_per_block=1, norm_num_groups=4)
    config = dict(zoo_video.EASYANIMATE, text_embed_dim=32, in_channels=in_channels, **transformer)
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": parts.vae("AutoencoderKLMagvit", vae),
            "transformer": parts.model("transformer", "EasyAnimateTransformer3DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


EASY_SIZE, EASY_FRAMES = 64, 5


def _easy_call(**extra: Any) -> dict[str, Any]:
    return _video(EASY_SIZE, EASY_FRAMES, guidance_scale=5.0, **extra)


CASES: list[PipelineCase] = [
    PipelineCase("SkyReelsV2Pipeline", _skyreels, lambda m: _video(max_sequence_length=32, guidance_scale=6.0),
                 note="two calls per step (CFG)"),
    PipelineCase("SkyReelsV2ImageToVideoPipeline", lambda p: _skyreels(p, image=True),
                 lambda m: _video(max_sequence_length=32, image=m.image(SIZE, SIZE)),
                 note="image latents on channels and a CLIP image embedding"),
    PipelineCase("SkyReelsV2DiffusionForcingPipeline", _skyreels, lambda m: _forcing(m),
                 note="diffusion forcing: per-frame timesteps, causal blocks"),
    PipelineCase("SkyReelsV2DiffusionForcingImageToVideoPipeline", _skyreels,
                 lambda m: _forcing(m, image=m.image(SIZE, SIZE))),
    PipelineCase("SkyReelsV2DiffusionForcingVideoToVideoPipeline", _skyreels,
                 lambda m: _forcing(m, video=m.video(FRAMES, SIZE, SIZE), num_frames=9, base_num_frames=9,
                                   overlap_history=5),
                 note="the input video's last frames continue into 9 frames"),
    PipelineCase("SanaVideoPipeline", _sana_video, _sana_video_call, note="batched CFG"),
    PipelineCase("SanaImageToVideoPipeline", _sana_video, lambda m: _sana_video_call(m, image=m.image(SIZE, SIZE)),
                 group="sana_video", note="the first latent frame is the image's"),
    PipelineCase("MochiPipeline", _mochi, lambda m: _video(frames=7, max_sequence_length=32, guidance_scale=4.5),
                 note="batched CFG; 6x temporal compression (7 frames: 2 latent frames)"),
    PipelineCase("LattePipeline", _latte,
                 lambda m: {**_video(64, None, guidance_scale=7.5, clean_caption=False), "video_length": FRAMES},
                 note="spatial and temporal attention blocks alternate"),
    PipelineCase("AllegroPipeline", _allegro,
                 lambda m: _video(64, 9, guidance_scale=7.5, clean_caption=False, max_sequence_length=32)),
    PipelineCase("EasyAnimatePipeline", _easyanimate, lambda m: _easy_call(), note="Qwen2.5-VL text, batched CFG"),
    # resize_inpaint_mask_directly=False: with True, diffusers 0.42.1 reads vae.config.cache_mag_vae, which
    # AutoencoderKLMagvit's config does not have (AttributeError)
    PipelineCase("EasyAnimateInpaintPipeline",
                 lambda p: _easyanimate(p, in_channels=12, resize_inpaint_mask_directly=False),
                 lambda m: _easy_call(video=m.video_tensor(EASY_FRAMES, EASY_SIZE, EASY_SIZE),
                                      mask_video=m.mask_tensor(EASY_FRAMES, EASY_SIZE, EASY_SIZE)),
                 note="mask and masked-video latents on channels"),
]
