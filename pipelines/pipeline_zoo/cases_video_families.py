"""Pipeline zoo cases of the video families HunyuanVideo, LTX-Video and CogVideoX, and of Lumina (Next and 2).

Components are the families' tiny ones. Videos are the shortest valid ones: 5 frames for 4x temporal compression
(HunyuanVideo, CogVideoX: 2 latent frames), 9 for LTX's 8x. Image-to-video models that take the image latents on the
channel axis have twice the latent channels as input.
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from ..text_encoders import build_tokenizer
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

PROMPT = "a red fox running in the snow"
_HUNYUAN = get_family("hunyuanvideo").tiny.transformer


def _video(size: int, frames: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "height": size, "width": size, "num_frames": frames, "output_type": "latent", **extra}


# -- HunyuanVideo ----------------------------------------------------------------------------------------------
HV_SIZE, HV_FRAMES = 32, 5


def _hunyuan_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _video(HV_SIZE, HV_FRAMES, **{"guidance_scale": 6.0, "max_sequence_length": 32, **extra})


def _framepack(parts: Parts) -> dict[str, Any]:
    components = parts.family("hunyuanvideo")
    keep = {k: v for k, v in _HUNYUAN.items() if k in _FRAMEPACK_KEYS}
    config = keep | dict(image_condition_type=None, has_image_proj=True, image_proj_dim=32, has_clean_x_embedder=True)
    components["transformer"] = parts.model("transformer", "HunyuanVideoFramepackTransformer3DModel", config)
    components["image_encoder"] = parts.siglip_vision(hidden=32)
    components["feature_extractor"] = parts.siglip_image_processor(32)
    return components


_FRAMEPACK_KEYS = ("in_channels", "out_channels", "num_attention_heads", "attention_head_dim", "num_layers",
                   "num_single_layers", "num_refiner_layers", "mlp_ratio", "patch_size", "patch_size_t", "qk_norm",
                   "guidance_embeds", "text_embed_dim", "pooled_projection_dim", "rope_theta", "rope_axes_dim")


def _framepack_call(m: Media) -> dict[str, Any]:
    # one latent window of 2 frames (a 5-frame section), guidance embedded
    return _hunyuan_text(m, image=m.image(HV_SIZE, HV_SIZE), latent_window_size=2)


def _hunyuan_i2v(parts: Parts) -> dict[str, Any]:
    # LLaVA: a 3-layer Llama of width 32 (the pipeline reads the third-last hidden state) with a CLIP vision tower of
    # 16 patches of 8 px; the image's 16 tokens replace the template's <image> token
    components = parts.family("hunyuanvideo", dict(in_channels=33, image_condition_type="latent_concat"))
    tokenizer = _llava_tokenizer()
    ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id") for key in ("pad", "bos", "eos")}
    text = dict(model_type="llama", vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=1, **ids)
    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
    components["tokenizer"] = tokenizer
    components["text_encoder"] = parts.transformers_model(
        "text_encoder", "LlavaForConditionalGeneration", "LlavaConfig", text_config=text, vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-2, image_seq_length=IMAGE_TOKENS, **ids)
    components["image_processor"] = parts.clip_image_processor(32)
    return components


IMAGE_TOKENS = 16


def _llava_tokenizer():
    """The local Llama-3 tokenizer with LLaVA's ``<image>`` token."""
    tokenizer = build_tokenizer("llama3", 256)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]}, replace_extra_special_tokens=False)
    return tokenizer


def _hunyuan_i2v_call(m: Media) -> dict[str, Any]:
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE

    # the template's layout in the local vocabulary: <image> is token 5 (after the begin-of-text, header and "\n\n"
    # tokens), its 16 image tokens follow; crop_start as the real value was computed (template tokens minus 5)
    template = DEFAULT_PROMPT_TEMPLATE["template"]
    crop_start = len(_llava_tokenizer()(template)["input_ids"]) - 5
    prompt_template = {"template": template, "crop_start": crop_start, "image_emb_start": 5,
                       "image_emb_end": 5 + IMAGE_TOKENS, "image_emb_len": IMAGE_TOKENS}
    return _hunyuan_text(m, image=m.image(HV_SIZE, HV_SIZE), prompt_template=prompt_template, guidance_scale=1.0,
                         true_cfg_scale=1.0)


# -- LTX-Video ---------------------------------------------------------------------------------------------------
LTX_SIZE, LTX_FRAMES = 64, 9


def _ltx_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _video(LTX_SIZE, LTX_FRAMES, negative_prompt="blurry", guidance_scale=3.0, max_sequence_length=32, **extra)


def _ltx_fixed_shift(parts: Parts) -> dict[str, Any]:
    # the pipelines of LTX-Video 0.9.5+ pass their own sigma schedule: its scheduler shifts by no resolution
    return parts.family("ltx", scheduler=dict(use_dynamic_shifting=False))


def _ltx_condition(m: Media) -> dict[str, Any]:
    # a conditioning image on frame 0 and a conditioning video from frame 8, both as latent tokens
    return _ltx_text(m, image=m.image(LTX_SIZE, LTX_SIZE), video=m.video(LTX_FRAMES, LTX_SIZE, LTX_SIZE),
                     frame_index=0)


def _ltx_long(m: Media) -> dict[str, Any]:
    # two temporal tiles of 9 frames overlapping by 8 pixel frames (1 latent frame), an image on frame 0
    call = _ltx_text(m, cond_image=m.image(LTX_SIZE, LTX_SIZE), num_frames=17, temporal_tile_size=9,
                     temporal_overlap=8, decode_horizontal_tiles=1, decode_vertical_tiles=1)
    call.pop("negative_prompt")
    return call


# -- CogVideoX ---------------------------------------------------------------------------------------------------
COG_SIZE, COG_FRAMES = 32, 5


def _cog_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _video(COG_SIZE, COG_FRAMES, negative_prompt="blurry", guidance_scale=6.0, **extra)


def _cog_v2v(m: Media) -> dict[str, Any]:
    call = _cog_text(m, video=m.video(COG_FRAMES, COG_SIZE, COG_SIZE), strength=0.5, num_inference_steps=4)
    del call["num_frames"]
    return call


def _cog_control(m: Media) -> dict[str, Any]:
    call = _cog_text(m, control_video=m.video(COG_FRAMES, COG_SIZE, COG_SIZE))
    del call["num_frames"]
    return call


# -- Lumina ------------------------------------------------------------------------------------------------------
def _lumina_next(parts: Parts) -> dict[str, Any]:
    # Lumina-Next: a Gemma (1) encoder; LuminaNextDiT2DModel of the transformer zoo's size, text width 32
    components = parts.family("lumina2")
    tokenizer = components["tokenizer"]
    components["text_encoder"] = parts.language_model(
        "text_encoder", "GemmaModel", "GemmaConfig", tokenizer, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    config = dict(sample_size=8, patch_size=2, in_channels=16, hidden_size=24, num_layers=2, num_attention_heads=3,
                  num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, learn_sigma=True,
                  qk_norm=True, cross_attention_dim=32, scaling_factor=1.0)
    components["transformer"] = parts.model("transformer", "LuminaNextDiT2DModel", config)
    return components


def _image(size: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": size, "width": size, "guidance_scale": 4.0,
            "output_type": "latent", **extra}


CASES: list[PipelineCase] = [
    PipelineCase("HunyuanVideoPipeline", lambda p: p.family("hunyuanvideo"), _hunyuan_text,
                 note="embedded guidance, one call per step"),
    PipelineCase("HunyuanSkyreelsImageToVideoPipeline", lambda p: p.family("hunyuanvideo", dict(in_channels=32)),
                 lambda m: _hunyuan_text(m, image=m.image(HV_SIZE, HV_SIZE), negative_prompt="blurry",
                                         true_cfg_scale=2.0, guidance_scale=1.0),
                 note="image latents on channels; true CFG (two calls per step)"),
    PipelineCase("HunyuanVideoImageToVideoPipeline", _hunyuan_i2v, _hunyuan_i2v_call,
                 note="LLaVA text and image tokens (the template's image-token layout for the local vocabulary), "
                 "image latents and a mask channel on the input"),
    PipelineCase("HunyuanVideoFramepackPipeline", _framepack, _framepack_call,
                 note="SigLIP image embedding, clean and 2x/4x history latents per section"),
    PipelineCase("LTXPipeline", lambda p: p.family("ltx"), _ltx_text, note="batched CFG"),
    PipelineCase("LTXImageToVideoPipeline", lambda p: p.family("ltx"),
                 lambda m: _ltx_text(m, image=m.image(LTX_SIZE, LTX_SIZE)),
                 note="per-token timesteps: the first frame's tokens are conditioning"),
    PipelineCase("LTXConditionPipeline", _ltx_fixed_shift, _ltx_condition,
                 note="image and video conditions as extra latent tokens"),
    PipelineCase("LTXI2VLongMultiPromptPipeline", _ltx_fixed_shift, _ltx_long,
                 note="two temporal tiles, an image condition on frame 0"),
    PipelineCase("CogVideoXPipeline", lambda p: p.family("cogvideox"), _cog_text, note="batched CFG"),
    PipelineCase("CogVideoXImageToVideoPipeline", lambda p: p.family("cogvideox", dict(in_channels=32)),
                 lambda m: _cog_text(m, image=m.image(COG_SIZE, COG_SIZE)), group="cogvideo",
                 note="image latents on channels"),
    PipelineCase("CogVideoXVideoToVideoPipeline", lambda p: p.family("cogvideox"), _cog_v2v),
    PipelineCase("CogVideoXFunControlPipeline", lambda p: p.family("cogvideox", dict(in_channels=32)), _cog_control,
                 note="control video latents on channels"),
    PipelineCase("Lumina2Pipeline", lambda p: p.family("lumina2"), lambda m: _image(64, max_sequence_length=32),
                 note="two calls per step (CFG)"),
    PipelineCase("LuminaPipeline", _lumina_next, lambda m: _image(64, max_sequence_length=32, clean_caption=False),
                 group="lumina", note="Lumina-Next: batched CFG, rotary table on the CPU"),
]
