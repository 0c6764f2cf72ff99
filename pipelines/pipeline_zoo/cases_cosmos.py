"""Pipeline zoo cases of NVIDIA Cosmos (``diffusers.pipelines.cosmos``): Cosmos 1.0 and 2 world models and Cosmos 2.5.

Components: a tiny ``CosmosTransformer3DModel`` whose input has the latents, the conditioning-mask channel and (Cosmos
1.0 and 2.5) the padding mask's channel; T5 text for 1.0 and 2, a Qwen2.5-VL whose normalised hidden states of every
layer are concatenated for 2.5; the 16-channel Wan VAE (2 and 2.5) or a tiny ``AutoencoderKLCosmos`` (1.0). The
safety checker is a pass-through stand-in (:class:`~bcg_pipelines.pipeline_zoo.parts.PassThroughSafetyChecker`):
``cosmos_guardrail`` downloads its guard models, and the pipelines refuse to run without a checker.
"""

from __future__ import annotations

from typing import Any

from .case import PipelineCase
from .media import Media
from .parts import QWEN_VL_CHAT_TEMPLATE, Parts, PassThroughSafetyChecker

__all__ = ["CASES"]

PROMPT = "a red fox running in the snow"
SIZE, FRAMES = 32, 5


def _transformer(parts: Parts, in_channels: int, out_channels: int, text: int = 32, **extra: Any):
    config = dict(in_channels=in_channels, out_channels=out_channels, num_attention_heads=2, attention_head_dim=12,
                  num_layers=2, mlp_ratio=2, text_embed_dim=text, adaln_lora_dim=4, max_size=(4, 32, 32),
                  patch_size=(1, 2, 2), rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=False,
                  extra_pos_embed_type="learnable") | extra
    return parts.model("transformer", "CosmosTransformer3DModel", config)


def _t5(parts: Parts) -> dict[str, Any]:
    tok = parts.tokenizer("t5", 512)
    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "t5", "t5_tiny", tok)}


def _cosmos2(parts: Parts, in_channels: int = 17) -> dict[str, Any]:
    # video-to-world: latents (16) + the conditioning mask (1); text-to-image: the latents alone
    return {**_t5(parts), "vae": parts.family("wan")["vae"], "transformer": _transformer(parts, in_channels, 16),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", use_karras_sigmas=True),
            "safety_checker": PassThroughSafetyChecker()}


def _cosmos1(parts: Parts, in_channels: int = 17) -> dict[str, Any]:
    vae = dict(latent_channels=16, encoder_block_out_channels=(16, 16, 16, 16),
               decode_block_out_channels=(16, 16, 16, 16), attention_resolutions=(), resolution=64, num_layers=1,
               patch_size=4, spatial_compression_ratio=8, temporal_compression_ratio=8)
    return {**_t5(parts), "vae": parts.vae("AutoencoderKLCosmos", vae),
            "transformer": _transformer(parts, in_channels, 16),
            "scheduler": parts.scheduler("EDMEulerScheduler", sigma_max=80.0, sigma_min=0.002, sigma_data=0.5,
                                         sigma_schedule="karras", num_train_timesteps=1000, prediction_type="epsilon",
                                         rho=7.0, final_sigmas_type="sigma_min"),
            "safety_checker": PassThroughSafetyChecker()}


def _cosmos25(parts: Parts) -> dict[str, Any]:
    tokenizer = parts.vl_tokenizer("qwen2")
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    text_encoder = parts.qwen25_vl("text_encoder", tokenizer)
    layers = text_encoder.config.text_config.num_hidden_layers
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": parts.family("wan")["vae"],
            "transformer": _transformer(parts, 17, 16, text=32 * layers),
            "scheduler": parts.scheduler("UniPCMultistepScheduler", prediction_type="flow_prediction",
                                         use_flow_sigmas=True, flow_shift=1.0),
            "safety_checker": PassThroughSafetyChecker()}


def _video(frames: int | None = FRAMES, **extra: Any) -> dict[str, Any]:
    call = {"prompt": PROMPT, "negative_prompt": "blurry", "height": SIZE, "width": SIZE, "num_frames": frames,
            "guidance_scale": 7.0, "max_sequence_length": 32, "output_type": "latent", **extra}
    return {k: v for k, v in call.items() if v is not None}


CASES: list[PipelineCase] = [
    PipelineCase("Cosmos2TextToImagePipeline", lambda p: _cosmos2(p, 16), lambda m: _video(None),
                 note="two calls per step (CFG); the conditioning mask as an input channel"),
    PipelineCase("Cosmos2VideoToWorldPipeline", _cosmos2, lambda m: _video(image=m.image(SIZE, SIZE)),
                 note="the first latent frame conditioned on the image (per-frame timesteps)"),
    PipelineCase("CosmosTextToWorldPipeline", lambda p: _cosmos1(p, 16), lambda m: _video(9),
                 note="EDM Euler scheduler"),
    PipelineCase("CosmosVideoToWorldPipeline", _cosmos1, lambda m: _video(9, image=m.image(SIZE, SIZE))),
    PipelineCase("Cosmos2_5_PredictBasePipeline", _cosmos25, lambda m: _video(video=m.video(FRAMES, SIZE, SIZE)),
                 note="video-to-world (an image input needs torchvision); Qwen2.5-VL text: every layer's hidden "
                 "states, normalised and concatenated"),
]
