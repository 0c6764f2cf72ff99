"""Pipeline zoo cases of pipelines with a T5Gemma text encoder: PRX (latent and pixel space) and Stable Audio 3.

The encoder is transformers' ``T5GemmaEncoder`` at width 32 (2 layers) over the local Gemma tokenizer.
"""

from __future__ import annotations

from typing import Any

from ..zoo import cases_image as zoo_image
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

PROMPT = "a red fox in the snow"


def t5gemma(parts: Parts, name: str = "text_encoder", encoder_only: bool = True) -> dict[str, Any]:
    """The local Gemma tokenizer and a tiny ``T5GemmaEncoderModel`` (or its ``T5GemmaEncoder``, ``encoder_only``)."""
    tokenizer = parts.tokenizer("gemma", 256)
    ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id") for key in ("pad", "bos", "eos")}
    module = dict(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=64, **ids)
    model = parts.transformers_model(name, "T5GemmaEncoderModel", "T5GemmaConfig", is_encoder_decoder=False,
                                     encoder=module, vocab_size=4096)
    return {"tokenizer": tokenizer, name: model.encoder if encoder_only else model}


def _prx(parts: Parts, pixel: bool = False) -> dict[str, Any]:
    components = {**t5gemma(parts), "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}
    if pixel:  # the transformer denoises pixels: 3 channels in and out, patches of 8 px
        config = dict(zoo_image.PRX, in_channels=3, patch_size=8)
        components.update(default_sample_size=64, prompt_max_tokens=32)
    else:
        config = dict(zoo_image.PRX)
        components.update(vae=parts.kl_vae(16), default_sample_size=64)
    components["transformer"] = parts.model("transformer", "PRXTransformer2DModel", config)
    return components


def _call(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": 64, "width": 64, "guidance_scale": 4.0,
            "use_resolution_binning": False, "output_type": "latent", **extra}


CASES: list[PipelineCase] = [
    PipelineCase("PRXPipeline", _prx, lambda m: _call(tokenizer_max_length=32), note="batched CFG with a text mask"),
    PipelineCase("PRXPixelPipeline", lambda p: _prx(p, pixel=True), lambda m: _call(output_type="pt"),
                 group="prx", note="denoising in pixel space (no VAE)"),
]


# -- Stable Audio 3 ------------------------------------------------------------------------------------------------
SA3_LATENT = 8


def _stable_audio3(parts: Parts) -> dict[str, Any]:
    from diffusers.pipelines.stable_audio_3.modeling_stable_audio_3 import StableAudio3DurationEmbedder

    from ..zoo import cases_audio as zoo_audio

    # 2-channel audio at 64 Hz in patches of 4, one transformer block halving it: 8x downsampling
    vae = dict(audio_channels=2, patch_size=4, encoder_channels=8, encoder_c_mults=(1,), encoder_strides=(2,),
               encoder_transformer_depths=(1,), latent_dim=SA3_LATENT, dim_heads=8, sampling_rate=64)
    # the duration embedding joins the text tokens (32 wide) and is the global condition; the local condition is
    # the inpainting mask and the kept audio's latents
    config = dict(zoo_audio.STABLE_AUDIO3, cond_token_dim=32, global_cond_dim=32, local_add_cond_dim=SA3_LATENT + 1)
    return {**t5gemma(parts, encoder_only=False), "vae": parts.vae("AutoencoderSAME", vae),
            "duration_embedder": parts.model("duration_embedder", StableAudio3DurationEmbedder,
                                             dict(output_dim=config["global_cond_dim"], fourier_dim=16)),
            "transformer": parts.model("transformer", "StableAudio3DiTModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _audio_call(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a fox barking", "duration": 1.0, "num_inference_steps": 2, "output_type": "pt", **extra}


def _audio(m: Media, seconds: float = 1.0) -> Any:
    return m.randn(1, 2, int(64 * seconds), dtype=m.dtype) * 0.1


CASES += [
    PipelineCase("StableAudio3Pipeline", _stable_audio3, lambda m: _audio_call(m, negative_prompt="noise",
                                                                              guidance_scale=3.0),
                 note="T5Gemma text, a duration embedding as the global condition"),
    PipelineCase("StableAudio3AudioToAudioPipeline", _stable_audio3,
                 lambda m: _audio_call(m, audio=_audio(m), init_noise_level=0.5), group="stable_audio_3"),
    PipelineCase("StableAudio3InpaintPipeline", _stable_audio3,
                 lambda m: _audio_call(m, audio=_audio(m), mask_start_seconds=0.25, mask_end_seconds=0.75),
                 group="stable_audio_3", note="the kept audio's latents and the mask as a local condition"),
]


# -- Motif-Video (T5Gemma 2) --------------------------------------------------------------------------------------
def _motif(parts: Parts, image: bool = False) -> dict[str, Any]:
    from diffusers.guiders import ClassifierFreeGuidance

    from ..zoo import cases_video as zoo_video

    tokenizer = parts.tokenizer("gemma", 256)
    ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id") for key in ("pad", "bos", "eos")}
    text = dict(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=64, dropout_rate=0.0,
                **ids)  # dropout_rate: what T5Gemma2Config would hand down to its encoder's text config
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    encoder = parts.transformers_model("text_encoder", "T5Gemma2Encoder", "T5Gemma2EncoderConfig", text_config=text,
                                       vision_config=vision, mm_tokens_per_image=4, boi_token_index=4093,
                                       eoi_token_index=4094, image_token_index=4095)
    wan = parts.family("wan")
    config = dict(zoo_video.MOTIF_VIDEO, text_embed_dim=32, image_embed_dim=16)  # the vision tower's width
    components = {"tokenizer": tokenizer, "text_encoder": encoder, "vae": wan["vae"],
                  "transformer": parts.model("transformer", "MotifVideoTransformer3DModel", config),
                  "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", shift=5.0),
                  "guider": ClassifierFreeGuidance(guidance_scale=5.0)}
    if image:
        components["feature_extractor"] = parts.siglip_image_processor(32)
    return components


def _motif_call(m: Media, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox running in the snow", "negative_prompt": "blurry", "height": 32, "width": 32,
            "num_frames": 5, "max_sequence_length": 32, "output_type": "latent", **extra}


CASES += [
    PipelineCase("MotifVideoPipeline", _motif, _motif_call,
                 note="T5Gemma 2 text; latents, condition latents and mask on channels; CFG guider"),
    PipelineCase("MotifVideoImage2VideoPipeline", lambda p: _motif(p, image=True),
                 lambda m: _motif_call(m, image=m.image(32, 32))),
]
