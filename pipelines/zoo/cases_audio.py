"""Zoo cases of audio transformers and of the omni model (vision tokens inside a language-model sequence).

Configs follow the small configs of diffusers' own model and pipeline tests where there are any; inputs
have the kinds, devices and layouts of each class's pipeline call.
"""

from __future__ import annotations

from typing import Any

import torch

from .case import InputMaker, ZooCase

__all__ = ["CASES"]


ACE_STEP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2, rope_theta=10000.0,
                rms_norm_eps=1e-6, sliding_window=16)


def _ace_step(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG; the context latents carry the source audio and its mask (2 x acoustic dim)
        "hidden_states": m.randn(2, 8, 8),
        "timestep": m.timestep(2, 0.5),
        "timestep_r": m.timestep(2, 0.5),
        "encoder_hidden_states": m.randn(2, 10, 32),
        "context_latents": m.randn(2, 8, 16),
    }


LONGCAT_AUDIO = dict(dit_dim=64, dit_depth=2, dit_heads=4, dit_text_dim=32, latent_dim=8, text_conv=False)


def _longcat_audio(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 8),
        "encoder_hidden_states": m.randn(1, 10, 32),
        "encoder_attention_mask": m.mask(1, 10, valid=7, dtype=torch.bool),
        "timestep": m.timestep(1, 0.5),
        "attention_mask": m.mask(1, 16, dtype=torch.bool),
    }


MINIMAX_MUSIC3 = dict(in_channels=8, condition_dim=16, num_layers=2, num_attention_heads=2, attention_head_dim=8,
                      ff_inner_dim=32, rotary_dim=4, fourier_embedding_dim=8)


def _minimax_music3(m: InputMaker) -> dict[str, Any]:
    return {  # (B, C, L) latents; one conditioning vector per latent frame
        "hidden_states": m.randn(1, 8, 24),
        "timestep": m.timestep(1, 0.5),
        "encoder_hidden_states": m.randn(1, 24, 16),
    }


STABLE_AUDIO = dict(sample_size=4, in_channels=3, num_layers=2, attention_head_dim=4, num_key_value_attention_heads=2,
                    out_channels=3, cross_attention_dim=4, time_proj_dim=8, global_states_input_dim=8,
                    cross_attention_input_dim=4)


def _stable_audio(m: InputMaker, rope_on_device: bool = False) -> dict[str, Any]:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    length = 8  # latent frames; the global state is prepended as one token
    # the pipeline builds the table without a device (attention_head_dim // 2 wide) and passes it on the CPU
    rope = get_1d_rotary_pos_embed(2, length + 1, use_real=True, repeat_interleave_real=False)
    return {  # batched CFG, one timestep for the batch
        "hidden_states": m.randn(2, 3, length),
        "timestep": m.timestep(1, 0.5),
        "encoder_hidden_states": m.randn(2, 6, 4),
        "global_hidden_states": m.randn(2, 1, 8),
        "rotary_embedding": tuple(t.to(m.device) for t in rope) if rope_on_device else rope,
    }


STABLE_AUDIO3 = dict(io_channels=8, patch_size=1, embed_dim=32, depth=2, num_heads=4, cond_token_dim=16,
                     global_cond_dim=12, local_add_cond_dim=5, timestep_features_dim=16, ff_mult=2, num_memory_tokens=3,
                     use_differential_attention=False)


def _stable_audio3(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(2, 8, 16),
        "timestep": m.timestep(2, 0.5),
        "encoder_hidden_states": m.randn(2, 4, 16),
        "global_hidden_states": m.randn(2, 12),
    }


T5_FILM = dict(input_dims=8, targets_length=16, d_model=32, num_layers=2, num_heads=2, d_kv=16, d_ff=64,
               dropout_rate=0.0)


def _t5_film(m: InputMaker) -> dict[str, Any]:
    return {  # the note encoder's and the context encoder's outputs with their masks
        "encodings_and_masks": [
            (m.randn(1, 12, 32), m.mask(1, 12, valid=9, dtype=torch.bool)),
            (m.randn(1, 16, 32), m.mask(1, 16, dtype=torch.bool)),
        ],
        "decoder_input_tokens": m.randn(1, 16, 8),
        "decoder_noise_time": m.timestep(1, 0.5),
    }


COSMOS3 = dict(head_dim=6, hidden_act="relu2", hidden_size=12, intermediate_size=24, latent_channel=2,
               latent_patch_size=1, num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=1,
               patch_latent_dim=2, qk_norm_for_text=False, rms_norm_eps=1e-5, rope_axes_dim=[1, 1, 1], rope_theta=1e8,
               vocab_size=32)


def _cosmos3(m: InputMaker) -> dict[str, Any]:
    height = width = 2  # one latent frame of 2x2 vision tokens after two text tokens
    vision = height * width
    length = 2 + vision
    vision_indexes = torch.arange(2, length, device=m.device)
    return {
        "input_ids": m.tensor([1, 2]),
        "text_indexes": m.tensor([0, 1]),
        "position_ids": torch.zeros(3, length, dtype=torch.long, device=m.device),
        "und_len": 2,
        "sequence_length": length,
        "vision_tokens": [m.randn(1, 2, 1, height, width)],
        "vision_token_shapes": [(1, height, width)],
        "vision_sequence_indexes": vision_indexes,
        "vision_mse_loss_indexes": vision_indexes,
        "vision_timesteps": m.ones(vision),
        "vision_noisy_frame_indexes": [m.tensor([0])],
    }


CASES: list[ZooCase] = [
    ZooCase("AceStepTransformer1DModel", ACE_STEP, _ace_step),
    ZooCase("Cosmos3OmniTransformer", COSMOS3, _cosmos3, note="vision tokens at given indexes of a text sequence"),
    ZooCase("LongCatAudioDiTTransformer", LONGCAT_AUDIO, _longcat_audio),
    ZooCase("MiniMaxMusic3Transformer1DModel", MINIMAX_MUSIC3, _minimax_music3),
    ZooCase("StableAudioDiTModel", STABLE_AUDIO, _stable_audio, note="the pipeline's rotary table stays on the CPU"),
    ZooCase("StableAudioDiTModel", STABLE_AUDIO, lambda m: _stable_audio(m, rope_on_device=True), variant="device_rope"),
    ZooCase("StableAudio3DiTModel", STABLE_AUDIO3, _stable_audio3),
    ZooCase("T5FilmDecoder", T5_FILM, _t5_film, note="the spectrogram-diffusion decoder (deprecated pipeline)"),
]
