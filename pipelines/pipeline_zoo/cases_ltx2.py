"""Pipeline zoo cases of LTX-2 (``diffusers.pipelines.ltx2``): video and audio in one transformer.

Components (sizes from diffusers' own LTX-2 fast tests): a tiny Gemma-3 text encoder (the local Gemma tokenizer; its
hidden states of every layer go through ``LTX2TextConnectors``), a one-level ``AutoencoderKLLTX2Video`` (4 latent
channels, 2x spatial and temporal compression), a one-level ``AutoencoderKLLTX2Audio`` with 8 mel bins, a small
``LTX2Vocoder`` and a two-block ``LTX2VideoTransformer3DModel``. Videos are 5 frames of 32 px.
"""

from __future__ import annotations

from typing import Any

from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

PROMPT = "a robot dancing in the rain"
SIZE, FRAMES = 32, 5
TEXT_WIDTH, TEXT_LAYERS = 32, 2


def _gemma3(parts: Parts) -> dict[str, Any]:
    tokenizer = parts.tokenizer("gemma", 1024)
    ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id") for key in ("pad", "bos", "eos")}
    text = dict(vocab_size=4096, hidden_size=TEXT_WIDTH, intermediate_size=64, num_hidden_layers=TEXT_LAYERS,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, **ids)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    encoder = parts.transformers_model("text_encoder", "Gemma3ForConditionalGeneration", "Gemma3Config",
                                       text_config=text, vision_config=vision, mm_tokens_per_image=4, **ids)
    return {"tokenizer": tokenizer, "text_encoder": encoder}


def _ltx2(parts: Parts, **transformer: Any) -> dict[str, Any]:
    connectors = dict(caption_channels=TEXT_WIDTH, text_proj_in_factor=TEXT_LAYERS + 1,
                      video_connector_num_attention_heads=4, video_connector_attention_head_dim=8,
                      video_connector_num_layers=1, video_connector_num_learnable_registers=None,
                      audio_connector_num_attention_heads=4, audio_connector_attention_head_dim=8,
                      audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
                      connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
                      causal_temporal_positioning=False, rope_type="split")
    vae = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
               decoder_block_out_channels=(8,), layers_per_block=(1,), decoder_layers_per_block=(1, 1),
               spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
               decoder_inject_noise=(False, False), downsample_type=("spatial",), upsample_residual=(False,),
               upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
               decoder_causal=False)
    audio_vae = dict(base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None,
                     in_channels=2, resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height",
                     dropout=0.0, mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160,
                     is_causal=True, mel_bins=8)
    vocoder = dict(in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                   upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                   leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    config = dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
                  attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
                  audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
                  qk_norm="rms_norm_across_heads", caption_channels=TEXT_WIDTH, rope_double_precision=False,
                  rope_type="split") | transformer
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    video_vae = parts.vae("AutoencoderKLLTX2Video", vae)
    video_vae.use_framewise_encoding = video_vae.use_framewise_decoding = False
    return {**_gemma3(parts), "connectors": parts.model("connectors", LTX2TextConnectors, connectors),
            "vae": video_vae, "audio_vae": parts.vae("AutoencoderKLLTX2Audio", audio_vae, name="audio_vae"),
            "vocoder": parts.model("vocoder", LTX2Vocoder, vocoder, fill_zeros=False),
            "transformer": parts.model("transformer", "LTX2VideoTransformer3DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _call(**extra: Any) -> dict[str, Any]:
    # the legacy sampling knobs (no STG, no modality guidance): CFG as a batch of 2
    return {"prompt": PROMPT, "negative_prompt": "", "height": SIZE, "width": SIZE, "num_frames": FRAMES,
            "frame_rate": 25.0, "guidance_scale": 3.0, "stg_scale": 0.0, "modality_scale": 1.0,
            "guidance_rescale": 0.0, "audio_guidance_scale": 3.0, "audio_stg_scale": 0.0, "audio_modality_scale": 1.0,
            "audio_guidance_rescale": 0.0, "spatio_temporal_guidance_blocks": None, "use_cross_timestep": False,
            "max_sequence_length": 16, "output_type": "latent", **extra}


#: The DFR transformer places keyframes with an absolute position embedding and reads the VAE's strides.
DFR = dict(vae_scale_factors=(2, 2, 2), use_keyframes_abs_pos_embedding=True)


def _dfr_refine(parts: Parts) -> dict[str, Any]:
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplerModel

    components = {k: v for k, v in _ltx2(parts, **DFR).items() if k != "scheduler"}
    upsampler = dict(in_channels=4, mid_channels=32, num_blocks_per_stage=1, dims=3, spatial_upsample=False,
                     temporal_upsample=True)
    components["temporal_latent_upsampler"] = parts.model("temporal_latent_upsampler", LTX2LatentUpsamplerModel,
                                                           upsampler, fill_zeros=False)
    components["scheduler"] = parts.scheduler("LTXEulerAncestralRFScheduler", eta=0.5)
    return components


def _condition(m: Media) -> dict[str, Any]:
    from diffusers.pipelines.ltx2 import LTX2VideoCondition

    return _call(conditions=[LTX2VideoCondition(frames=m.image(SIZE, SIZE), index=0, crf=0)])


def _in_context(m: Media) -> dict[str, Any]:
    from diffusers.pipelines.ltx2 import LTX2ReferenceCondition

    return _call(reference_conditions=[LTX2ReferenceCondition(frames=m.video(FRAMES, SIZE, SIZE))])


def _hdr(m: Media) -> dict[str, Any]:
    from diffusers.pipelines.ltx2 import LTX2HDRReferenceCondition

    call = _call(reference_conditions=[LTX2HDRReferenceCondition(frames=m.video(FRAMES, SIZE, SIZE))])
    for key in [k for k in call if k.startswith("audio_")]:  # video only
        del call[key]
    return call


def _dfr(m: Media, **extra: Any) -> dict[str, Any]:
    call = _call(num_frames=9, sigmas=[1.0, 0.5], **extra)
    for key in ("negative_prompt", "guidance_scale", "stg_scale", "modality_scale", "guidance_rescale",
                "audio_guidance_scale", "audio_stg_scale", "audio_modality_scale", "audio_guidance_rescale",
                "spatio_temporal_guidance_blocks"):
        call.pop(key)
    return call


def _refine(m: Media) -> dict[str, Any]:
    # what LTX2DFRPipeline's _dfr call returns for 9 frames (latents 5 x 16 x 16, one keyframe at pixel frame 8, audio
    # latents); the round doubles the frame rate (9 latent frames out)
    call = _dfr(m, latents=m.randn(1, 4, 5, 16, 16), keyframes_latents=m.randn(1, 4, 1, 16, 16), keyframe_positions=[8],
                audio_latents=m.randn(1, 2, 9, 2))
    return call


CASES: list[PipelineCase] = [
    PipelineCase("LTX2Pipeline", _ltx2, lambda m: _call(), note="video and audio streams, batched CFG"),
    PipelineCase("LTX2ImageToVideoPipeline", _ltx2, lambda m: _call(image=m.image(SIZE, SIZE), image_crf=0),
                 note="the first frame's tokens conditioned on the image (image_crf=0: no H.264 re-compression, which "
                 "needs PyAV)"),
    PipelineCase("LTX2ConditionPipeline", _ltx2, _condition, note="an image condition at frame 0"),
    PipelineCase("LTX2InContextPipeline", _ltx2, _in_context, note="a reference video's tokens in the sequence"),
    PipelineCase("LTX2HDRPipeline", _ltx2, _hdr, note="HDR reference video tokens; video only"),
    PipelineCase("LTX2DFRPipeline", lambda p: _ltx2(p, **DFR), lambda m: _dfr(m),
                 note="distilled, keyframe slots with an absolute position embedding; sigmas [1, 0.5]"),
    PipelineCase("LTX2DFRTemporalRefinePipeline", _dfr_refine, _refine,
                 note="a refine round of a DFR pass's outputs (seeded tensors of their shapes): the temporal latent "
                 "upsampler doubles the frames, then the transformer denoises"),
]
