"""Zoo cases of image transformers outside the known families.

Configs follow the small configs of diffusers' own model tests where there are any (facts: widths, layer
counts, rope axes); inputs have the kinds, devices and layouts of each class's pipeline call.
"""

from __future__ import annotations

from typing import Any

import torch

from .case import InputMaker, ZooCase
from .ids import flux_image_ids, flux_text_ids, grid_ids

__all__ = ["CASES"]


# -- Flux-like MMDiTs (packed 2x2 latents, 3-axis ids) -------------------------------------------------
def _flux_like(m: InputMaker, channels: int, text: int, text_dim: int, **extra: Any) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, channels),
        "encoder_hidden_states": m.randn(1, text, text_dim),
        "timestep": m.timestep(1, 1.0),
        "img_ids": flux_image_ids(m, 4, 4),
        "txt_ids": flux_text_ids(m, text),
        **extra,
    }


BRIA = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=None, axes_dims_rope=[0, 8, 8])


def _bria(m: InputMaker) -> dict[str, Any]:
    return _flux_like(m, 16, 24, 32)


BRIA_FIBO = dict(BRIA, joint_attention_dim=64, text_encoder_dim=32)


def _bria_fibo(m: InputMaker) -> dict[str, Any]:
    kwargs = _flux_like(m, 16, 24, 64)
    text = kwargs["encoder_hidden_states"]
    # the pipeline passes the text encoder's last hidden layers, each (B, T, text_encoder_dim)
    kwargs["text_encoder_layers"] = [text[:, :, :32].contiguous(), text[:, :, 32:].contiguous()]
    return kwargs


LONGCAT_IMAGE = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                     num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])


def _longcat_image(m: InputMaker) -> dict[str, Any]:
    return _flux_like(m, 16, 24, 32, guidance=None)


OVIS = dict(patch_size=1, in_channels=16, out_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8))


def _ovis(m: InputMaker) -> dict[str, Any]:
    return _flux_like(m, 16, 24, 32, joint_attention_kwargs=None)


FLUX3 = dict(in_channels=16, cond_in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=32, timestep_channels=32, axes_dims_rope=(4, 4, 4, 4))


def _flux3(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 16),
        "encoder_hidden_states": m.randn(1, 24, 32),
        "timestep": m.timestep(1, 1.0),
        "img_ids": grid_ids(m, (1, 4, 4, 1)),
        "txt_ids": grid_ids(m, (1, 1, 1, 24)),
    }


# -- patch-embedding DiTs on (B, C, H, W) latents ----------------------------------------------------
AURAFLOW = dict(sample_size=16, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                out_channels=4, pos_embed_max_size=64)


def _auraflow(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 16, 16),
        "encoder_hidden_states": m.randn(2, 24, 32),
        "timestep": m.timestep(2, 1000.0),
    }


COGVIEW3PLUS = dict(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=2,
                    out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8,
                    sample_size=8)
COGVIEW4 = dict(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=4,
                out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4)


def _cogview(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG; sizes in pixels
        "hidden_states": m.randn(2, 4, 8, 8),
        "encoder_hidden_states": m.randn(2, 16, 8),
        "timestep": m.timestep(2, 999.0),
        "original_size": m.tensor([[64, 64], [64, 64]], dtype=m.dtype),
        "target_size": m.tensor([[64, 64], [64, 64]], dtype=m.dtype),
        "crop_coords": m.tensor([[0, 0], [0, 0]], dtype=m.dtype),
    }


DIT = dict(in_channels=4, out_channels=8, activation_fn="gelu-approximate", num_attention_heads=2,
           attention_head_dim=8, attention_bias=True, num_layers=2, norm_type="ada_norm_zero",
           num_embeds_ada_norm=1000, patch_size=2, sample_size=8)


def _dit(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG: class labels, the null class (1000) last
        "hidden_states": m.randn(2, 4, 8, 8),
        "timestep": m.tensor([999, 999]),
        "class_labels": m.tensor([207, 1000]),
    }


ERNIE = dict(hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64, in_channels=16,
             out_channels=16, patch_size=1, text_in_dim=16, rope_theta=256, rope_axes_dim=(8, 4, 4), eps=1e-6,
             qk_layernorm=True)


def _ernie(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 8, 8),
        "timestep": m.timestep(1, 1.0),
        "text_bth": m.randn(1, 16, 16),
        "text_lens": m.tensor([12]),
    }


HUNYUAN_DIT = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                   num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4,
                   hidden_size=16, text_len=4, text_len_t5=4, activation_fn="gelu-approximate")


def _hunyuan_dit_rope(m: InputMaker, on_device: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2-D rotary tables of 4x4 tokens, built as the pipeline builds them."""
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    cos, sin = get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4), use_real=True, output_type="pt")
    device = m.device if on_device else torch.device("cpu")
    return cos.to(device), sin.to(device)


def _hunyuan_dit(m: InputMaker, rope_on_device: bool = True) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 8, 8),
        "timestep": m.timestep(2, 999.0),
        "encoder_hidden_states": m.randn(2, 4, 8),
        "text_embedding_mask": m.mask(2, 4, valid=3),
        "encoder_hidden_states_t5": m.randn(2, 4, 8),
        "text_embedding_mask_t5": m.mask(2, 4, valid=2),
        "image_meta_size": m.tensor([[64, 64, 64, 64, 0, 0]] * 2, dtype=m.dtype),
        "style": m.tensor([0, 0]),
        "image_rotary_emb": _hunyuan_dit_rope(m, rope_on_device),
    }


LUMINA_NEXT = dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=24, num_layers=2, num_attention_heads=3,
                   num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, learn_sigma=True,
                   qk_norm=True, cross_attention_dim=32, scaling_factor=1.0)


def _lumina_next(m: InputMaker, rope_on_device: bool = False) -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    rope = get_2d_rotary_pos_embed_lumina(8, 384, 384)  # head_dim 24 / 3; the pipeline keeps it on the CPU
    return {  # batched CFG
        "hidden_states": m.randn(2, 4, 16, 16),
        "timestep": m.timestep(2, 0.5),
        "encoder_hidden_states": m.randn(2, 16, 32),
        "encoder_mask": m.mask(2, 16, valid=6),
        "image_rotary_emb": rope.to(m.device) if rope_on_device else rope,
        "cross_attention_kwargs": {},
    }


PRX = dict(in_channels=16, patch_size=2, context_in_dim=32, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=2,
           axes_dim=[8, 8], theta=10_000)


def _prx(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 8, 8),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, 16, 32),
        "attention_mask": m.mask(1, 16, valid=7, dtype=torch.bool),
    }


# -- classes with their own input layouts -------------------------------------------------------------
BRIA_FIBO2 = dict(in_channels=4, patch_size=2, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, cap_feat_dim=16,
                  injection_layer_ids=(1,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8,
                  gist_step=4, gist_min_text_len=4, gist_max_text_len=32, axes_dims=(4, 6, 6), axes_lens=(64, 32, 32))


def _bria_fibo2(m: InputMaker) -> dict[str, Any]:
    return {  # text: the Perceiver's bundle, then one bundle per injection block
        "hidden_states": m.randn(1, 4, 8, 8),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, 2, 16, 16),
        "encoder_attention_mask": None,
    }


GLM_IMAGE = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                 text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=64)


def _glm_image(m: InputMaker, with_kv_caches: bool = True) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    kwargs = {  # 8x8 latents, patch 2: 16 image tokens, one prior token each
        "hidden_states": m.randn(1, 4, 8, 8),
        "encoder_hidden_states": m.randn(1, 12, 32),
        "prior_token_id": m.randint(0, 64, 1, 16),
        "prior_token_drop": torch.zeros(1, 16, dtype=torch.bool, device=m.device),
        "timestep": m.timestep(1, 999.0),
        "target_size": m.tensor([[64, 64]], dtype=m.dtype),
        "crop_coords": m.tensor([[0, 0]], dtype=m.dtype),
    }
    if with_kv_caches:
        # text-to-image: the pipeline passes an empty cache in "read" mode for the conditional call
        caches = GlmImageKVCache(num_layers=m.config["num_layers"])
        caches.set_mode("read")
        kwargs["kv_caches"] = caches
    return kwargs


HIDREAM = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
               num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2,
               num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(32, 32), llama_layers=(0, 1),
               force_inference_output=True)


def _hidream(m: InputMaker) -> dict[str, Any]:
    return {  # the Llama states: (layers, B, T, D), indexed by llama_layers
        "hidden_states": m.randn(1, 4, 16, 16),
        "timesteps": m.timestep(1, 999.0),
        "encoder_hidden_states_t5": m.randn(1, 8, 8),
        "encoder_hidden_states_llama3": m.randn(2, 1, 8, 4),
        "pooled_embeds": m.randn(1, 8),
    }


HUNYUAN_IMAGE = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                     num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), guidance_embeds=False,
                     text_embed_dim=32, text_embed_2_dim=32, rope_axes_dim=(4, 4))


def _hunyuan_image(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 4, 8, 8),
        "timestep": m.timestep(1, 1000.0),
        "encoder_hidden_states": m.randn(1, 16, 32),
        "encoder_attention_mask": m.mask(1, 16, valid=6),
        "encoder_hidden_states_2": m.randn(1, 8, 32),
        "encoder_attention_mask_2": m.mask(1, 8, valid=3),
    }


IDEOGRAM4 = dict(in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, intermediate_size=32,
                 adaln_dim=16, llm_features_dim=24, rope_theta=10_000, mrope_section=(2, 1, 1), norm_eps=1e-5)


def _ideogram4(m: InputMaker) -> dict[str, Any]:
    from diffusers.models.transformers import transformer_ideogram4 as ideogram

    text, image = 4, 4  # 4 LLM tokens, then a 2x2 image
    hidden = torch.cat([m.zeros(1, text, 16), m.randn(1, image, 16)], dim=1)
    features = torch.cat([m.randn(1, text, 24), m.zeros(1, image, 24)], dim=1)
    positions = torch.zeros(1, text + image, 3, dtype=torch.long)
    positions[:, :text] = torch.arange(text)[:, None]
    offset = ideogram.IMAGE_POSITION_OFFSET
    positions[:, text:, 0] = offset
    positions[:, text:, 1] = torch.tensor([0, 0, 1, 1]) + offset
    positions[:, text:, 2] = torch.tensor([0, 1, 0, 1]) + offset
    indicator = torch.full((1, text + image), ideogram.OUTPUT_IMAGE_INDICATOR, dtype=torch.long)
    indicator[:, :text] = ideogram.LLM_TOKEN_INDICATOR
    return {
        "hidden_states": hidden,
        "timestep": m.timestep(1, 0.5),
        "encoder_hidden_states": features,
        "position_ids": positions.to(m.device),
        "segment_ids": torch.ones(1, text + image, dtype=torch.long, device=m.device),
        "indicator": indicator.to(m.device),
    }


JOYIMAGE = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2,
                rope_dim_list=[4, 6, 6], theta=256)


def _joyimage_edit(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 1, 4, 4),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, 12, 16),
    }


def _joyimage_edit_plus(m: InputMaker) -> dict[str, Any]:
    # patchified, padded input [B, max_patches, C, pt, ph, pw]: a 2x2 target and a 1x2 reference image (6 patches),
    # padded to 8
    return {
        "hidden_states": m.randn(1, 8, 16, 1, 2, 2),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, 12, 16),
        "encoder_hidden_states_mask": m.mask(1, 12, valid=8, dtype=m.dtype),
        "shape_list": [[(1, 2, 2), (1, 1, 2)]],
    }


KREA2 = dict(in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3,
             text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16,
             num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2), rope_theta=1000.0,
             norm_eps=1e-5)


def _krea2(m: InputMaker) -> dict[str, Any]:
    text, height, width = 4, 2, 2
    positions = torch.zeros(text + height * width, 3)
    positions[text:, 1] = torch.arange(height).repeat_interleave(width)
    positions[text:, 2] = torch.arange(width).repeat(height)
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, -1] = False
    return {  # the text: hidden states of num_text_layers encoder layers, (B, T, layers, D)
        "hidden_states": m.randn(1, height * width, 16),
        "encoder_hidden_states": m.randn(1, text, 3, 16),
        "timestep": m.timestep(1, 0.5),
        "position_ids": positions.to(m.device),
        "encoder_attention_mask": mask.to(m.device),
    }


NUCLEUS = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
               joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=True,
               dense_moe_strategy="leave_first_block_dense", num_experts=4, moe_intermediate_dim=16,
               capacity_factors=[2.0, 2.0])


def _nucleus(m: InputMaker) -> dict[str, Any]:
    return {  # 4x4 packed latents; the pipeline always passes the text mask
        "hidden_states": m.randn(1, 16, 16),
        "img_shapes": [(1, 4, 4)],
        "encoder_hidden_states": m.randn(1, 8, 16),
        "encoder_hidden_states_mask": m.mask(1, 8, valid=5),
        "timestep": m.timestep(1, 1.0),
    }


OMNIGEN = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=2,
               pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
               rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]})


def _omnigen(m: InputMaker) -> dict[str, Any]:
    text, tokens = 24, 16  # 24 prompt tokens holding one 8x8 input image (16 patches), then time + output image
    length = text + 1 + tokens
    return {
        "hidden_states": m.randn(1, 4, 8, 8),
        "timestep": m.timestep(1, 0.5),
        "input_ids": m.randint(1, 10, 1, text),
        "input_img_latents": [m.randn(1, 4, 8, 8)],
        "input_image_sizes": {0: [[2, 2 + tokens]]},
        "attention_mask": m.ones(1, length, length),
        "position_ids": m.tensor([list(range(length))]),
    }


QWENIMAGE21 = dict(patch_size=1, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=16,
                   num_attention_heads=2, context_in_dim=32, mlp_ratio=2, axes_dims_rope=(4, 6, 6))


def _qwenimage21(m: InputMaker) -> dict[str, Any]:
    # text-to-image: 8 text slots of the vision-language sequence, then the target's 4x4 tokens as 4 slots of 2x2
    text, slots = 8, 4
    img_mask = torch.zeros(1, text + slots, dtype=torch.bool)
    img_mask[:, text:] = True
    return {
        "hidden_states": m.randn(1, 16, 16),
        "encoder_hidden_states": m.randn(1, text, 32),
        "timestep": m.timestep(1, 1.0),
        "img_shapes": [[(1, 4, 4)]],
        "img_mask": img_mask.to(m.device),
    }


CASES: list[ZooCase] = [
    ZooCase("AuraFlowTransformer2DModel", AURAFLOW, _auraflow),
    ZooCase("BriaTransformer2DModel", BRIA, _bria),
    ZooCase("BriaFiboTransformer2DModel", BRIA_FIBO, _bria_fibo),
    ZooCase("BriaFibo2Transformer2DModel", BRIA_FIBO2, _bria_fibo2),
    ZooCase("CogView3PlusTransformer2DModel", COGVIEW3PLUS, _cogview),
    ZooCase("CogView4Transformer2DModel", COGVIEW4, _cogview),
    ZooCase("DiTTransformer2DModel", DIT, _dit),
    ZooCase("ErnieImageTransformer2DModel", ERNIE, _ernie),
    ZooCase("Flux3Transformer2DModel", FLUX3, _flux3),
    ZooCase("GlmImageTransformer2DModel", GLM_IMAGE, _glm_image,
            note="the pipeline's kv_caches object (empty, read mode) is an input"),
    ZooCase("GlmImageTransformer2DModel", GLM_IMAGE, lambda m: _glm_image(m, with_kv_caches=False),
            variant="no_kv_caches", note="no cache object: the boolean-mask scaling of the prior embedding is reached"),
    ZooCase("HiDreamImageTransformer2DModel", HIDREAM, _hidream,
            note="MoE feed-forwards (2 experts) in both block kinds"),
    ZooCase("HunyuanDiT2DModel", HUNYUAN_DIT, _hunyuan_dit,
            note="rotary tables on the device, as the pipeline builds them"),
    ZooCase("HunyuanDiT2DModel", HUNYUAN_DIT, lambda m: _hunyuan_dit(m, rope_on_device=False), variant="cpu_rope",
            note="rotary tables on the CPU, as diffusers' model test passes them"),
    ZooCase("HunyuanImageTransformer2DModel", HUNYUAN_IMAGE, _hunyuan_image),
    ZooCase("Ideogram4Transformer2DModel", IDEOGRAM4, _ideogram4),
    ZooCase("JoyImageEditTransformer3DModel", JOYIMAGE, _joyimage_edit),
    ZooCase("JoyImageEditPlusTransformer3DModel", JOYIMAGE, _joyimage_edit_plus,
            note="a target and a reference image of other sizes, padded patches"),
    ZooCase("Krea2Transformer2DModel", KREA2, _krea2),
    ZooCase("LongCatImageTransformer2DModel", LONGCAT_IMAGE, _longcat_image),
    ZooCase("LuminaNextDiT2DModel", LUMINA_NEXT, _lumina_next, note="the pipeline's rotary table stays on the CPU"),
    ZooCase("LuminaNextDiT2DModel", LUMINA_NEXT, lambda m: _lumina_next(m, rope_on_device=True), variant="device_rope"),
    ZooCase("NucleusMoEImageTransformer2DModel", NUCLEUS, _nucleus, note="block 0 dense, block 1 MoE (4 experts)",
            atomic_adds=True),
    ZooCase("OmniGenTransformer2DModel", OMNIGEN, _omnigen),
    ZooCase("OvisImageTransformer2DModel", OVIS, _ovis),
    ZooCase("PRXTransformer2DModel", PRX, _prx),
    ZooCase("QwenImage21Transformer2DModel", QWENIMAGE21, _qwenimage21),
]
