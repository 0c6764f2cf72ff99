"""Zoo cases of video transformers outside the known families (and image models built on video blocks).

Configs follow the small configs of diffusers' own model tests where there are any; inputs have the kinds,
devices and layouts of each class's pipeline call.
"""

from __future__ import annotations

from typing import Any

import torch

from .case import InputMaker, ZooCase

__all__ = ["CASES"]


def _text_video(m: InputMaker, latents: tuple[int, ...], text: int, text_dim: int, **extra: Any) -> dict[str, Any]:
    """The common ``(hidden_states, timestep, encoder_hidden_states)`` call of Wan-like video models."""
    return {
        "hidden_states": m.randn(*latents),
        "timestep": m.tensor([999] * latents[0]),
        "encoder_hidden_states": m.randn(latents[0], text, text_dim),
        **extra,
    }


# -- Wan-like (B, C, F, H, W) with patch (1, 2, 2) ----------------------------------------------------
WAN_LIKE = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", rope_max_seq_len=32)

ANYFLOW = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32,
               gate_value=0.25, deltatime_type="r")
ANYFLOW_FAR = dict(ANYFLOW, compressed_patch_size=(1, 4, 4), full_chunk_limit=3)


def _anyflow(m: InputMaker, frames: int = 2, **extra: Any) -> dict[str, Any]:
    return {  # (B, F, C, H, W) latents and per-frame timesteps
        "hidden_states": m.randn(1, frames, 4, 8, 8),
        "timestep": torch.full((1, frames), 500.0, device=m.device, dtype=m.dtype),
        "r_timestep": torch.full((1, frames), 250.0, device=m.device, dtype=m.dtype),
        "encoder_hidden_states": m.randn(1, 12, 16),
        **extra,
    }


def _anyflow_far(m: InputMaker) -> dict[str, Any]:
    return _anyflow(m, frames=4, chunk_partition=[2, 2])


CHRONOEDIT = dict(WAN_LIKE, attention_head_dim=8, in_channels=16, out_channels=16, text_dim=32, rope_max_seq_len=64,
                  image_dim=None, added_kv_proj_dim=None, rope_temporal_skip_len=8)


def _chronoedit(m: InputMaker) -> dict[str, Any]:
    return _text_video(m, (1, 16, 2, 8, 8), 12, 32, encoder_hidden_states_image=None)


HELIOS = {k: v for k, v in WAN_LIKE.items() if k != "rope_max_seq_len"} | dict(  # Helios takes rope_dim instead
    rope_dim=(4, 4, 4), has_multi_term_memory_patch=True, guidance_cross_attn=True, zero_history_timestep=True,
    is_amplify_history=False)


def _helios(m: InputMaker) -> dict[str, Any]:
    frames = 2
    kwargs = _text_video(m, (1, 4, frames, 8, 8), 12, 16)
    index = lambda n: torch.arange(n, device=m.device).unsqueeze(0)  # noqa: E731 - (1, n) frame indices
    kwargs.update(
        indices_hidden_states=index(frames),
        indices_latents_history_short=index(frames - 1),
        indices_latents_history_mid=index(frames - 1),
        indices_latents_history_long=index((frames - 1) * 4),
        latents_history_short=m.randn(1, 4, frames - 1, 8, 8),
        latents_history_mid=m.randn(1, 4, frames - 1, 8, 8),
        latents_history_long=m.randn(1, 4, (frames - 1) * 4, 8, 8),
    )
    return kwargs


SKYREELS_V2 = WAN_LIKE


def _skyreels_v2(m: InputMaker) -> dict[str, Any]:
    return _text_video(m, (1, 4, 2, 8, 8), 12, 16)


WAN_VACE = dict(WAN_LIKE, in_channels=16, out_channels=16, text_dim=32, num_layers=4, vace_layers=[0, 2],
                vace_in_channels=48)


def _wan_vace(m: InputMaker) -> dict[str, Any]:
    return _text_video(m, (1, 16, 2, 8, 8), 12, 32, control_hidden_states=m.randn(1, 48, 2, 8, 8))


WAN_ANIMATE = dict(WAN_LIKE, in_channels=12, latent_channels=4, image_dim=16,
                   motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16,
                   motion_style_dim=8, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
                   face_encoder_num_heads=2, inject_face_latents_blocks=2)


def _wan_animate(m: InputMaker) -> dict[str, Any]:
    frames = 4  # (frames - 1) pose frames; one face crop per 4 frames of the 77-frame segment layout
    return {
        "hidden_states": m.randn(1, 12, frames + 1, 8, 8),
        "timestep": m.tensor([999]),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "encoder_hidden_states_image": m.randn(1, 12, 16),
        "pose_hidden_states": m.randn(1, 4, frames, 8, 8),
        "face_pixel_values": m.randn(1, 3, 4 * frames - 3, 16, 16),
    }


# -- Wan-Animate-2 (reference K/V cache, flex attention) ---------------------------------------------
WAN_ANIMATE_2 = dict(patch_size=(1, 2, 2), text_len=16, in_dim=36, dim=64, ffn_dim=64, freq_dim=32, text_dim=32,
                     out_dim=16, num_heads=2, num_layers=2, cross_attn_norm=True, use_img_emb=True)
_REFERENCE_FRAMES, _LATENT = 2, 4  # reference latent frames; latent height = width


def _wan_animate_2_common(m: InputMaker, frames: int) -> dict[str, Any]:
    return {  # lists of per-sample tensors, as the modular pipeline passes them
        "hidden_states": [m.randn(16, frames, _LATENT, _LATENT)],
        "encoder_hidden_states": [m.randn(8, 32)],
        "condition_latents": [m.randn(20, frames, _LATENT, _LATENT)],
        "encoder_hidden_states_image": m.randn(1, 4, 1280),  # MLPProj takes the CLIP vision width
        "seq_len": frames * (_LATENT // 2) ** 2,
    }


def _wan_animate_2_grid(m: InputMaker) -> torch.Tensor:
    # host-side metadata: the pipeline builds it without a device
    return m.tensor([[_REFERENCE_FRAMES, _LATENT // 2, _LATENT // 2]], dtype=torch.long, on_device=False)


def _wan_animate_2_cached(m: InputMaker) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    config = m.config
    heads, head_dim = config["num_heads"], config["dim"] // config["num_heads"]
    reference_tokens = _REFERENCE_FRAMES * (_LATENT // 2) ** 2
    cache = WanAnimate2KVCache(config["num_layers"])
    for layer in cache.layer_caches:  # what the reference pass stores: pre-RoPE K/V of the reference tokens
        layer.store(m.randn(1, reference_tokens, heads, head_dim), m.randn(1, reference_tokens, heads, head_dim))
    return {
        **_wan_animate_2_common(m, _REFERENCE_FRAMES + 1),
        "timestep": m.timestep(1, 500.0),
        "kv_cache": cache,
        "kv_cache_mode": "cached",
        "reference_grid_sizes": _wan_animate_2_grid(m),
        "origin_len": 5,
        "origin_area": [32, 32],
    }


def _wan_animate_2_extract(m: InputMaker) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    return {
        **_wan_animate_2_common(m, _REFERENCE_FRAMES),
        "timestep": m.timestep(1, 1.0),
        "kv_cache": WanAnimate2KVCache(m.config["num_layers"]),
        "kv_cache_mode": "extract",
        "offset_grid_sizes": _wan_animate_2_grid(m),
    }


# -- HunyuanVideo-like ---------------------------------------------------------------------------------
HUNYUAN_VIDEO15 = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                       num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
                       text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v")


def _hunyuan_video15(m: InputMaker) -> dict[str, Any]:
    return {  # text-to-video: the pipeline passes all-zero image embeddings
        "hidden_states": m.randn(1, 4, 2, 8, 8),
        "timestep": m.timestep(1, 1000.0),
        "encoder_hidden_states": m.randn(1, 6, 16),
        "encoder_attention_mask": m.mask(1, 6, valid=4),
        "encoder_hidden_states_2": m.randn(1, 4, 8),
        "encoder_attention_mask_2": m.mask(1, 4, valid=2),
        "image_embeds": m.zeros(1, 3, 12),
    }


FRAMEPACK = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                 num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
                 text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None,
                 has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True)


def _framepack(m: InputMaker, indices_on_device: bool = False) -> dict[str, Any]:
    frames, history = 3, (2, 2, 8)  # latent window; 1x, 2x, 4x history frames (clean = prefix + 1x)
    indices = torch.arange(1 + frames + sum(history))  # anti-drifting layout: prefix, window, 1x, 2x, 4x
    prefix, window, one_x, two_x, four_x = indices.split([1, frames, *history])
    place = (lambda t: t.to(m.device)) if indices_on_device else (lambda t: t)  # the pipeline keeps them on the CPU
    return {
        "hidden_states": m.randn(1, 4, frames, 8, 8),
        "timestep": m.timestep(1, 1000.0),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "encoder_attention_mask": m.mask(1, 12, valid=7),
        "pooled_projections": m.randn(1, 8),
        "image_embeds": m.randn(1, 12, 16),
        "indices_latents": place(window),
        "guidance": m.timestep(1, 10000.0),
        "latents_clean": m.randn(1, 4, 1 + history[0], 8, 8),
        "indices_latents_clean": place(torch.cat([prefix, one_x])),
        "latents_history_2x": m.randn(1, 4, history[1], 8, 8),
        "indices_latents_history_2x": place(two_x),
        "latents_history_4x": m.randn(1, 4, history[2], 8, 8),
        "indices_latents_history_4x": place(four_x),
    }


MOTIF_VIDEO = dict(in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                   num_single_layers=1, num_decoder_layers=0, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
                   qk_norm="rms_norm", norm_type="layer_norm", text_embed_dim=32, image_embed_dim=4, rope_theta=256.0,
                   rope_axes_dim=(4, 4, 4), enable_text_cross_attention_dual=False,
                   enable_text_cross_attention_single=False)


def _motif_video(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 33, 3, 4, 4),
        "timestep": m.tensor([999]),
        "encoder_hidden_states": m.randn(1, 12, 32),
        "encoder_attention_mask": m.mask(1, 12, valid=8),
    }


# -- LTX-2 (video + audio streams) --------------------------------------------------------------------
LTX2 = dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
            cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
            audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
            caption_channels=16, rope_double_precision=False)
_LTX2_SHAPE = dict(num_frames=2, height=4, width=4, audio_num_frames=9, fps=25.0)


def _ltx2_coords(m: InputMaker, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rope coordinates ``LTX2Pipeline`` computes before the loop with the transformer's rope modules."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    config = m.config
    video = LTX2AudioVideoRotaryPosEmbed(dim=config["num_attention_heads"] * config["attention_head_dim"])
    audio = LTX2AudioVideoRotaryPosEmbed(dim=8, scale_factors=[4], modality="audio")
    s = _LTX2_SHAPE
    video_coords = video.prepare_video_coords(batch, s["num_frames"], s["height"], s["width"], m.device, fps=s["fps"])
    audio_coords = audio.prepare_audio_coords(batch, s["audio_num_frames"], m.device)
    return video_coords, audio_coords


def _ltx2(m: InputMaker, coords_in_forward: bool = False) -> dict[str, Any]:
    batch, s = 2, _LTX2_SHAPE  # batched CFG
    timestep = m.timestep(batch, 1000.0)
    kwargs = {
        "hidden_states": m.randn(batch, s["num_frames"] * s["height"] * s["width"], 4),
        "audio_hidden_states": m.randn(batch, s["audio_num_frames"], 4),
        "encoder_hidden_states": m.randn(batch, 16, 16),
        "audio_encoder_hidden_states": m.randn(batch, 16, 16),
        "timestep": timestep,
        "sigma": timestep,
        "encoder_attention_mask": m.mask(batch, 16, valid=10),
        "audio_encoder_attention_mask": m.mask(batch, 16, valid=10),
        **s,
        "isolate_modalities": False,
        "spatio_temporal_guidance_blocks": None,
        "perturbation_mask": None,
        "use_cross_timestep": False,
    }
    if not coords_in_forward:
        kwargs["video_coords"], kwargs["audio_coords"] = _ltx2_coords(m, batch)
    return kwargs


SANA_WM_REFINER = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                       cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
                       audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, caption_channels=16,
                       rope_double_precision=False)


def _sana_wm_refiner(m: InputMaker) -> dict[str, Any]:
    tokens, dim = 2 * 4 * 4, 16
    return {  # plain full attention (kv_cache=None); the rope tables are (B, tokens, inner_dim) cos and sin
        "hidden_states": m.randn(1, tokens, 4),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "timestep": torch.full((1, tokens), 500.0, device=m.device, dtype=torch.float32),
        "video_rotary_emb": (m.randn(1, tokens, dim, dtype=torch.float32), m.randn(1, tokens, dim, dtype=torch.float32)),
        "encoder_attention_mask": m.mask(1, 12, valid=8),
    }


# -- other video DiTs ----------------------------------------------------------------------------------
ALLEGRO = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=1,
               cross_attention_dim=16, sample_width=8, sample_height=8, sample_frames=8, caption_channels=8)


def _allegro(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 2, 8, 8),
        "encoder_hidden_states": m.randn(2, 16, 8),
        "encoder_attention_mask": m.mask(2, 16, valid=6),
        "timestep": m.tensor([999, 999]),
        "image_rotary_emb": None,
    }


CONSISID = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8, patch_size=2,
                temporal_compression_ratio=4, max_text_seq_length=8, cross_attn_interval=1, is_kps=False,
                is_train_face=True, cross_attn_dim_head=1, cross_attn_num_heads=1, LFE_id_dim=2, LFE_vit_dim=2,
                LFE_depth=5, LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=1, LFE_num_querie=1, LFE_output_dim=10,
                LFE_ff_mult=1, LFE_num_scale=1)


def _consisid(m: InputMaker) -> dict[str, Any]:
    return {  # (B, F, C, H, W); face identity features
        "hidden_states": m.randn(2, 1, 4, 8, 8),
        "encoder_hidden_states": m.randn(2, 8, 8),
        "timestep": m.tensor([999, 999]),
        "image_rotary_emb": None,
        "id_vit_hidden": [m.randn(2, 2, 2)],
        "id_cond": m.randn(2, 2),
    }


# concat_padding_mask=False: with it, forward resizes the padding mask with torchvision, which the project
# does not depend on (the published configs set it; the blocks are the same)
COSMOS = dict(in_channels=5, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=2, mlp_ratio=2,
              text_embed_dim=16, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
              rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False, extra_pos_embed_type="learnable")


def _cosmos(m: InputMaker) -> dict[str, Any]:
    # Cosmos 2 text-to-image: the latents carry the conditioning-mask channel (in_channels = 4 + 1)
    return {
        "hidden_states": m.randn(1, 5, 1, 8, 8),
        "timestep": m.timestep(1, 0.5),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "padding_mask": None,
    }


EASYANIMATE = dict(attention_head_dim=16, num_attention_heads=2, in_channels=4, mmdit_layers=2, num_layers=2,
                   out_channels=4, patch_size=2, sample_height=60, sample_width=90, text_embed_dim=16, time_embed_dim=8,
                   time_position_encoding_type="3d_rope", timestep_activation_fn="silu")


def _easyanimate(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 2, 8, 8),
        "timestep": m.tensor([999, 999]),
        "encoder_hidden_states": m.randn(2, 16, 16),
    }


KANDINSKY5 = dict(in_visual_dim=16, in_text_dim=16, in_text_dim2=8, time_dim=16, out_visual_dim=16, patch_size=(1, 2, 2),
                  model_dim=16, ff_dim=32, num_text_blocks=1, num_visual_blocks=2, axes_dims=(1, 1, 2),
                  visual_cond=False, attention_type="regular")


def _kandinsky5(m: InputMaker) -> dict[str, Any]:
    frames, height, width, text = 2, 8, 8, 12
    return {  # (B, F, H, W, C) latents; rope positions of the patchified grid and of the text
        "hidden_states": m.randn(1, frames, height, width, 16),
        "encoder_hidden_states": m.randn(1, text, 16),
        "timestep": m.timestep(1, 1000.0),
        "pooled_projections": m.randn(1, 8),
        "visual_rope_pos": [torch.arange(n, device=m.device) for n in (frames, height // 2, width // 2)],
        "text_rope_pos": torch.arange(text, device=m.device),
        "scale_factor": (1.0, 1.0, 1.0),
        "sparse_params": None,
    }


KANDINSKY6 = dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, patch_size=(1, 2, 2),
                  model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=2, axes_dims=(4, 6, 6), visual_cond=False,
                  in_audio_dim=4, out_audio_dim=4)


def _kandinsky6(m: InputMaker) -> dict[str, Any]:
    return {  # a video with its audio track
        "hidden_states": m.randn(1, 2, 8, 8, 4),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "pooled_projections": m.randn(1, 8),
        "timestep": m.timestep(1, 1000.0),
        "audio_hidden_states": m.randn(1, 10, 4),
        "encoder_attention_mask": m.mask(1, 12, valid=9, dtype=torch.bool),
    }


KANDINSKY6_SR = dict(in_visual_dim=4, out_visual_dim=4, time_dim=16, patch_size=(1, 1, 1), model_dim=32, ff_dim=64,
                     num_visual_blocks=2, axes_dims=(4, 6, 6), nabla_window=(3, 3, 3))


def _kandinsky6_sr(m: InputMaker) -> dict[str, Any]:
    # a latent tile: noisy latent, anchor latent and anchor mask; NABLA needs the grid in 8x8 blocks
    return {"hidden_states": m.randn(1, 2, 8, 8, 9), "timestep": m.timestep(1, 1000.0)}


LATTE = dict(sample_size=8, num_layers=1, patch_size=2, attention_head_dim=4, num_attention_heads=2, caption_channels=8,
             in_channels=4, cross_attention_dim=8, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
             num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
             video_length=2)


def _latte(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 2, 8, 8),
        "encoder_hidden_states": m.randn(2, 8, 8),
        "timestep": m.tensor([999, 999]),
        "enable_temporal_attentions": True,
    }


MINIMAX_H3 = dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2, num_refiner_layers=2,
                  ffn_dim=32, in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2), text_dim=8, freq_dim=8,
                  time_embed_hidden_dim=24, time_embed_dim=16, rope_freq_dim=2)


def _minimax_h3(m: InputMaker) -> dict[str, Any]:
    # one packed sequence: text rows, audio rows, video rows; a (timestep, modality) row per token
    text, audio, video = 4, 6, 8
    length = text + audio + video
    text_idx = torch.arange(text)
    audio_idx = torch.arange(text, text + audio)
    video_idx = torch.arange(text + audio, length)
    tags = torch.zeros(length, dtype=torch.long)
    tags[text_idx], tags[audio_idx] = 1, 2
    timestep_rows = torch.zeros(length, dtype=torch.long)
    timestep_rows[audio_idx] = 1
    positions = torch.zeros(length, 3)
    positions[:, 0] = torch.arange(length, dtype=torch.float32)
    positions[video_idx, 1] = (torch.arange(video) % 4).float()
    positions[video_idx, 2] = (torch.arange(video) % 2).float()
    on = lambda t: t.to(m.device)  # noqa: E731
    return {
        "hidden_states": m.randn(1, video, 16),
        "audio_hidden_states": m.randn(1, audio, 6),
        "encoder_hidden_states": m.randn(1, text, 8),
        "timestep": m.tensor([0.7, 0.3], dtype=torch.float32),
        "timestep_indices": on(timestep_rows),
        "token_tags": on(tags),
        "position_ids": on(positions),
        "video_indices": on(video_idx),
        "audio_indices": on(audio_idx),
        "text_indices": on(text_idx),
    }


MOCHI = dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
             in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4,
             activation_fn="swiglu", max_sequence_length=16)


def _mochi(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 4, 2, 8, 8),
        "encoder_hidden_states": m.randn(1, 16, 16),
        "timestep": m.timestep(1, 1000.0),
        "encoder_attention_mask": m.mask(1, 16, valid=9),
    }


SANA_VIDEO = dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
                  num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=16,
                  mlp_ratio=2.5, dropout=0.0, attention_bias=False, sample_size=8, patch_size=(1, 2, 2),
                  norm_elementwise_affine=False, norm_eps=1e-6, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _sana_video(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 16, 2, 8, 8),
        "encoder_hidden_states": m.randn(2, 12, 16),
        "encoder_attention_mask": m.mask(2, 12, valid=7),
        "timestep": m.timestep(2, 999.0),
    }


SANA_WM = dict(in_channels=8, num_layers=2, hidden_size=32, num_attention_heads=2, patch_size=(1, 1, 1),
               softmax_every_n=2, linear_head_dim=16, chunk_plucker_channels=8, chunk_plucker_post_attn_blocks=2,
               image_size=64, caption_channels=16, mixed_precision="fp32")


def _sana_wm(m: InputMaker) -> dict[str, Any]:
    frames = 2
    return {  # per-frame timesteps (B, 1, T); text (B, 1, L, D); the pipeline's data_info and text mask
        "hidden_states": m.randn(1, 8, frames, 4, 4),
        "timestep": torch.full((1, 1, frames), 999.0, device=m.device),
        "encoder_hidden_states": m.randn(1, 1, 12, 16),
        "data_info": {"img_hw": m.tensor([[64.0, 64.0]])},
        "mask": m.mask(1, 12, valid=8),
    }


CASES: list[ZooCase] = [
    ZooCase("AllegroTransformer3DModel", ALLEGRO, _allegro),
    ZooCase("AnyFlowTransformer3DModel", ANYFLOW, _anyflow),
    ZooCase("AnyFlowFARTransformer3DModel", ANYFLOW_FAR, _anyflow_far, note="chunk_partition [2, 2]; mask built inside"),
    ZooCase("ChronoEditTransformer3DModel", CHRONOEDIT, _chronoedit),
    ZooCase("ConsisIDTransformer3DModel", CONSISID, _consisid),
    ZooCase("CosmosTransformer3DModel", COSMOS, _cosmos, note="concat_padding_mask=False (no torchvision)"),
    ZooCase("EasyAnimateTransformer3DModel", EASYANIMATE, _easyanimate),
    ZooCase("HeliosTransformer3DModel", HELIOS, _helios),
    ZooCase("HunyuanVideo15Transformer3DModel", HUNYUAN_VIDEO15, _hunyuan_video15,
            note="text-to-video: zero image embeddings; padded text masks"),
    ZooCase("HunyuanVideoFramepackTransformer3DModel", FRAMEPACK, _framepack,
            note="batch 1; frame indices on the CPU, as the pipeline builds them"),
    ZooCase("HunyuanVideoFramepackTransformer3DModel", FRAMEPACK, lambda m: _framepack(m, indices_on_device=True),
            variant="device_indices", note="frame indices on the device: the text-length slicing is reached"),
    ZooCase("Kandinsky5Transformer3DModel", KANDINSKY5, _kandinsky5),
    ZooCase("Kandinsky6Transformer3DModel", KANDINSKY6, _kandinsky6),
    ZooCase("Kandinsky6SRTransformer3DModel", KANDINSKY6_SR, _kandinsky6_sr),
    ZooCase("LatteTransformer3DModel", LATTE, _latte),
    ZooCase("LTX2VideoTransformer3DModel", LTX2, _ltx2, note="video and audio coords passed, as LTX2Pipeline does"),
    ZooCase("LTX2VideoTransformer3DModel", LTX2, lambda m: _ltx2(m, coords_in_forward=True), variant="coords_in_forward",
            note="no coords: forward builds them (rope.prepare_video_coords)"),
    ZooCase("MiniMaxH3Transformer3DModel", MINIMAX_H3, _minimax_h3),
    ZooCase("MochiTransformer3DModel", MOCHI, _mochi),
    ZooCase("MotifVideoTransformer3DModel", MOTIF_VIDEO, _motif_video),
    ZooCase("SanaVideoTransformer3DModel", SANA_VIDEO, _sana_video),
    ZooCase("SanaWMTransformer3DModel", SANA_WM, _sana_wm, note="no camera conditions"),
    ZooCase("SanaWMLTX2RefinerTransformer3DModel", SANA_WM_REFINER, _sana_wm_refiner,
            note="without the refiner's sliding-window KV cache object"),
    ZooCase("SkyReelsV2Transformer3DModel", SKYREELS_V2, _skyreels_v2),
    ZooCase("WanAnimateTransformer3DModel", WAN_ANIMATE, _wan_animate),
    ZooCase("WanAnimate2Transformer3DModel", WAN_ANIMATE_2, _wan_animate_2_cached,
            note="a denoising call: filled reference K/V cache, CPU grid sizes, flex block mask"),
    ZooCase("WanAnimate2Transformer3DModel", WAN_ANIMATE_2, _wan_animate_2_extract, variant="extract",
            note="the reference pass (once per segment): writes the K/V cache"),
    ZooCase("WanVACETransformer3DModel", WAN_VACE, _wan_vace),
]
