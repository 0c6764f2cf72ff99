"""Pipeline zoo cases of HunyuanVideo 1.5 and HunyuanImage 2.1 (``hunyuan_video1_5``, ``hunyuan_image``).

Text: a Qwen2.5-VL text model of width 32 (chat template; the pipelines drop a fixed system prefix and pad to
their maximum lengths) and a ByT5 encoder (``ByT5Tokenizer`` needs no vocabulary file) for the glyph texts in
quotes. HunyuanVideo 1.5's input carries the condition latents and a mask channel next to the latents (t2v: zeros).
"""

from __future__ import annotations

from typing import Any

from ..zoo import cases_image as zoo_image
from ..zoo import cases_video as zoo_video
from .case import PipelineCase
from .media import Media
from .parts import QWEN_VL_CHAT_TEMPLATE, Parts

__all__ = ["CASES"]

PROMPT = 'a red fox holding a sign that says "hello"'
LATENT = 4


def _text_encoders(parts: Parts, model_class: str = "Qwen2_5_VLTextModel") -> dict[str, Any]:
    from transformers import ByT5Tokenizer

    tokenizer = parts.tokenizer("qwen2", 32768)
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    byt5 = ByT5Tokenizer()
    encoder = parts.qwen25_vl("text_encoder", parts.vl_tokenizer("qwen2"), model_class=model_class)
    return {"tokenizer": tokenizer, "text_encoder": encoder, "tokenizer_2": byt5,
            "text_encoder_2": parts.text_encoder("text_encoder_2", "t5", "t5_tiny", byt5, vocab_size=4096)}


def _hv15(parts: Parts, image: bool = False) -> dict[str, Any]:
    vae = dict(latent_channels=LATENT, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1,
               spatial_compression_ratio=16, temporal_compression_ratio=4)
    config = dict(zoo_video.HUNYUAN_VIDEO15, in_channels=2 * LATENT + 1, out_channels=LATENT, text_embed_dim=32,
                  text_embed_2_dim=32, image_embed_dim=32, target_size=64, task_type="i2v" if image else "t2v")
    from diffusers.guiders import ClassifierFreeGuidance

    components = {**_text_encoders(parts), "vae": parts.vae("AutoencoderKLHunyuanVideo15", vae),
                  "transformer": parts.model("transformer", "HunyuanVideo15Transformer3DModel", config),
                  "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", shift=7.0),
                  "guider": ClassifierFreeGuidance(guidance_scale=6.0)}
    if image:
        components["image_encoder"] = parts.siglip_vision(hidden=32)
        components["feature_extractor"] = parts.siglip_image_processor(32)
    return components


def _video(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "num_frames": 5, "output_type": "latent", **extra}


def _hunyuan_image(parts: Parts, refiner: bool = False) -> dict[str, Any]:
    if refiner:
        vae = parts.vae("AutoencoderKLHunyuanImageRefiner", dict(latent_channels=LATENT,
                                                                  block_out_channels=(8, 8, 8, 8, 8),
                                                                  layers_per_block=1))
    else:
        # group norms of 32 groups: 32 channels per level
        vae = parts.vae("AutoencoderKLHunyuanImage", dict(in_channels=3, out_channels=3, latent_channels=LATENT,
                                                           block_out_channels=(32,) * 6, layers_per_block=1,
                                                           spatial_compression_ratio=32, sample_size=64))
    # the refiner folds two latent frames of the image into the channels (2 x 4), then adds the condition's
    config = dict(zoo_image.HUNYUAN_IMAGE, in_channels=4 * LATENT if refiner else LATENT,
                  out_channels=2 * LATENT if refiner else LATENT, guidance_embeds=True)
    if refiner:  # 3D latents (a frame axis): 3-axis patches and RoPE
        config.update(patch_size=(1, 1, 1), rope_axes_dim=(2, 2, 4))
    components = {**_text_encoders(parts, model_class="Qwen2_5_VLForConditionalGeneration"), "vae": vae,
                  "transformer": parts.model("transformer", "HunyuanImageTransformer2DModel", config),
                  "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", shift=4.0)}
    if refiner:
        components = {k: v for k, v in components.items() if not k.endswith("_2")}
    return components


def _image(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": 64, "width": 64, "output_type": "latent",
            "distilled_guidance_scale": 3.25, **extra}


CASES: list[PipelineCase] = [
    PipelineCase("HunyuanVideo15Pipeline", _hv15, lambda m: _video(height=64, width=64),
                 note="Qwen2.5-VL and ByT5 (glyph) text, the CFG guider as two calls per step"),
    PipelineCase("HunyuanVideo15ImageToVideoPipeline", lambda p: _hv15(p, image=True),
                 lambda m: _video(image=m.image(64, 64)), note="image latents and SigLIP image embedding"),
    PipelineCase("HunyuanImagePipeline", _hunyuan_image, lambda m: _image(),
                 group="hunyuan_image", note="guidance embedding; ByT5 glyph text"),
    PipelineCase("HunyuanImageRefinerPipeline", lambda p: _hunyuan_image(p, refiner=True),
                 lambda m: _image(image=m.image(64, 64))),
]
