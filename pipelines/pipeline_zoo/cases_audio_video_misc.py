"""Pipeline zoo cases of Stable Audio Open, AnyFlow, Helios and LongCat-AudioDiT.

Stable Audio: a tiny Oobleck VAE (sampling rate 4, 2x downsampling), a T5 of width 32 projected to the DiT's
4-wide conditioning, the EDM DPM-Solver scheduler. AnyFlow and Helios run on the ``wan`` family's UMT5 and 16-channel
Wan VAE with the transformer zoo's configs adapted to those widths.
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from ..zoo import cases_audio as zoo_audio
from ..zoo import cases_video as zoo_video
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

PROMPT = "a red fox running in the snow"
SIZE, FRAMES = 32, 5
_WAN = get_family("wan").tiny.transformer


def _stable_audio(parts: Parts) -> dict[str, Any]:
    tok = parts.tokenizer("t5", 128)
    vae = dict(encoder_hidden_size=6, downsampling_ratios=[1, 2], decoder_channels=3, decoder_input_channels=3,
               audio_channels=2, channel_multiples=[2, 4], sampling_rate=4)
    projection = dict(text_encoder_dim=32, conditioning_dim=4, min_value=0, max_value=32)
    from diffusers.pipelines.stable_audio.modeling_stable_audio import StableAudioProjectionModel

    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "t5", "t5_tiny", tok),
            "projection_model": parts.model("projection_model", StableAudioProjectionModel, projection),
            "vae": parts.vae("AutoencoderOobleck", vae),
            "transformer": parts.model("transformer", "StableAudioDiTModel", zoo_audio.STABLE_AUDIO),
            "scheduler": parts.scheduler("EDMDPMSolverMultistepScheduler", solver_order=2,
                                         prediction_type="v_prediction", sigma_data=1.0,
                                         sigma_schedule="exponential")}


def _wan_text(parts: Parts) -> dict[str, Any]:
    wan = parts.family("wan")
    return {k: wan[k] for k in ("tokenizer", "text_encoder", "vae")}


def _anyflow(parts: Parts, far: bool = False) -> dict[str, Any]:
    config = dict(zoo_video.ANYFLOW_FAR if far else zoo_video.ANYFLOW, in_channels=16, out_channels=16, text_dim=32)
    name = "AnyFlowFARTransformer3DModel" if far else "AnyFlowTransformer3DModel"
    return {**_wan_text(parts), "transformer": parts.model("transformer", name, config),
            "scheduler": parts.scheduler("FlowMapEulerDiscreteScheduler", shift=5.0)}


def _helios(parts: Parts, **scheduler: Any) -> dict[str, Any]:
    config = dict(zoo_video.HELIOS, in_channels=16, out_channels=16, text_dim=32)
    return {**_wan_text(parts), "transformer": parts.model("transformer", "HeliosTransformer3DModel", config),
            "scheduler": parts.scheduler("HeliosScheduler", **scheduler)}


def _video(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": SIZE, "width": SIZE, "num_frames": FRAMES,
            "max_sequence_length": 32, "output_type": "latent", **extra}


def _helios_call(m: Media, **extra: Any) -> dict[str, Any]:
    # one chunk of 2 latent frames with history windows of 4, 2 and 1 latent frames
    return _video(**{"num_frames": 5, "history_sizes": [4, 2, 1], "num_latent_frames_per_chunk": 2,
                     "guidance_scale": 5.0, **extra})


CASES: list[PipelineCase] = [
    PipelineCase("StableAudioPipeline", _stable_audio,
                 lambda m: {"prompt": "a fox barking", "negative_prompt": "noise", "audio_end_in_s": 2.0,
                            "guidance_scale": 7.0, "output_type": "pt"},
                 note="batched CFG; the global and the text conditioning of the DiT, rotary table on the CPU"),
    PipelineCase("AnyFlowPipeline", _anyflow, lambda m: _video(guidance_scale=1.0),
                 note="flow-map sampling with a second (r) timestep"),
    PipelineCase("AnyFlowFARPipeline", lambda p: _anyflow(p, far=True),
                 lambda m: _video(num_frames=13, guidance_scale=1.0, chunk_partition=[2, 2]),
                 note="frame-autoregressive chunks with a key/value cache"),
    PipelineCase("HeliosPipeline", lambda p: _helios(p, stages=1), _helios_call,
                 note="history latents at three scales per chunk"),
    # gamma 0.2: with the default 1/3 the block-noise covariance of a 2x2 patch is singular (eigenvalue 1 - 3 gamma),
    # and its Cholesky factorisation failed on the CPU
    PipelineCase("HeliosPyramidPipeline", lambda p: _helios(p, gamma=0.2),
                 lambda m: _helios_call(m, height=128, width=128, pyramid_num_inference_steps_list=[1, 1, 1]),
                 note="three pyramid stages of one step each, from 4x4 to 16x16 latents; scheduler gamma 0.2"),
]


# -- LongCat-AudioDiT ----------------------------------------------------------------------------------------------
def _longcat_audio(parts: Parts) -> dict[str, Any]:
    # a 1-D VAE of 8 channels, 2 levels of stride 4 (16x), latent width 8, sample rate 256: 16 latent frames a second
    vae = dict(in_channels=1, channels=8, c_mults=[1, 2], strides=[4, 4], latent_dim=8, encoder_latent_dim=16,
               downsampling_ratio=16, sample_rate=256)
    tok = parts.tokenizer("t5", 128)
    return {"tokenizer": tok, "text_encoder": parts.text_encoder("text_encoder", "umt5", "umt5_tiny", tok),
            "vae": parts.vae("LongCatAudioDiTVae", vae),
            "transformer": parts.model("transformer", "LongCatAudioDiTTransformer", zoo_audio.LONGCAT_AUDIO),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


CASES += [
    PipelineCase("LongCatAudioDiTPipeline", _longcat_audio,
                 lambda m: {"prompt": "a fox barking", "negative_prompt": "noise", "audio_duration_s": 1.0,
                            "guidance_scale": 4.0, "output_type": "pt"},
                 two_outputs=lambda call: {**call, "prompt": [call["prompt"]] * 2,
                                           "negative_prompt": [call["negative_prompt"]] * 2},
                 note="UMT5 text, batched CFG; two outputs are two prompts"),
]
