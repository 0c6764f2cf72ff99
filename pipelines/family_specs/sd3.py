"""Stable Diffusion 3.5 medium (stabilityai/stable-diffusion-3.5-medium): MMDiT-X, 24 joint blocks, 2.2B.

The first 13 blocks add a second (image-only) self-attention ("dual attention"); the last block is
context-pre-only. Three text encoders: CLIP-L and CLIP-G (with projection) and T5-XXL. CFG is batched.
"""

from dataclasses import replace

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import clip_l, kl_vae_full, kl_vae_tiny, t5_xxl

FULL_TRANSFORMER = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    sample_size=8,  # pipeline default 64 px
    num_layers=3,  # dual-attention block, plain joint block, context-pre-only block
    attention_head_dim=8,
    num_attention_heads=4,
    joint_attention_dim=64,  # tiny T5 width (the 32 + 32 CLIP embeddings are padded to it)
    caption_projection_dim=32,
    pooled_projection_dim=64,  # CLIP-L + CLIP-G pooled projections
    pos_embed_max_size=16,
    dual_attention_layers=(0,),
)

VAE_FULL = kl_vae_full(
    16,
    scaling_factor=1.5305,
    shift_factor=0.0609,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=True,
    force_upcast=True,
)

CLIP_G = TextEncoderSpec(
    component="text_encoder_2",
    tokenizer_component="tokenizer_2",
    kind="clip_proj",
    tokenizer_style="clip",
    real_model="OpenCLIP ViT-bigG/14 text encoder (laion/CLIP-ViT-bigG-14-laion2B-39B-b160k)",
    max_length=77,
    tiny_preset="clip_tiny",
    full_preset="clip_g_full",
)

SPEC = FamilySpec(
    name="sd3",
    title="Stable Diffusion 3.5 medium",
    reference_id="stabilityai/stable-diffusion-3.5-medium",
    pipeline_class_name="StableDiffusion3Pipeline",
    transformer_class_name="SD3Transformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=dict(num_train_timesteps=1000, shift=3.0),
    text_encoders=(
        clip_l("text_encoder", "tokenizer", projection=True),
        CLIP_G,
        replace(t5_xxl("text_encoder_3", "tokenizer_3", max_length=256), tiny_preset="t5_tiny_wide"),
    ),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(VAE_FULL), height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=1024, width=1024),
    default_steps=40,
    default_guidance=4.5,
    guidance_kwarg="guidance_scale",
    cfg_mode="batched",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real SD3 VAE (16 latent channels, scale factor 8)",
)
