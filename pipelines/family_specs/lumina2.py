"""Lumina-Image 2.0 (Alpha-VLLM/Lumina-Image-2.0): unified next-DiT, 26 blocks + 2 refiners per stream, 2.6B.

Gemma-2-2B text encoder (system prompt prepended, second-last hidden state, masked), Flux VAE,
flow-matching Euler. CFG runs two transformer calls per step (with ``cfg_trunc_ratio`` < 1 the late
steps drop the unconditional call).
"""

from dataclasses import replace

from ..registry import FamilySpec, SizeSpec
from ._common import FLUX_VAE_FULL, kl_vae_tiny
from .sana import GEMMA2

FULL_TRANSFORMER = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=None,
    hidden_size=2304,
    num_layers=26,
    num_refiner_layers=2,
    num_attention_heads=24,
    num_kv_heads=8,
    multiple_of=256,
    ffn_dim_multiplier=None,
    norm_eps=1e-5,
    scaling_factor=1.0,
    axes_dim_rope=(32, 32, 32),
    axes_lens=(300, 512, 512),
    cap_feat_dim=2304,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    sample_size=8,  # pipeline default 64 px
    hidden_size=32,
    num_layers=2,
    num_refiner_layers=1,
    num_attention_heads=2,
    num_kv_heads=1,
    multiple_of=16,
    axes_dim_rope=(4, 6, 6),
    cap_feat_dim=32,  # tiny Gemma width
)

SPEC = FamilySpec(
    name="lumina2",
    title="Lumina-Image 2.0",
    reference_id="Alpha-VLLM/Lumina-Image-2.0",
    pipeline_class_name="Lumina2Pipeline",
    transformer_class_name="Lumina2Transformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=dict(num_train_timesteps=1000, shift=6.0),
    text_encoders=(replace(GEMMA2, max_length=256),),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(FLUX_VAE_FULL), height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=FLUX_VAE_FULL, height=1024, width=1024),
    default_steps=50,
    default_guidance=4.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="two_calls",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Flux VAE (16 latent channels, scale factor 8)",
)
