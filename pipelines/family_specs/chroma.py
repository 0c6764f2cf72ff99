"""Chroma (lodestones/Chroma): Flux.1-schnell-derived MMDiT, 19 double- and 38 single-stream blocks, 8.9B.

Flux's per-block modulation MLPs are replaced by one "distilled guidance" approximator network; there is
no CLIP encoder and no guidance embedding. T5-XXL (512 tokens, masked), Flux VAE, flow-matching Euler.
CFG runs two transformer calls per step.
"""

from ..registry import FamilySpec, SizeSpec
from ._common import FLUX_SCHEDULER, FLUX_VAE_FULL, kl_vae_tiny, t5_xxl

FULL_TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,
    out_channels=None,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    axes_dims_rope=(16, 56, 56),
    approximator_num_channels=64,
    approximator_hidden_dim=5120,
    approximator_layers=5,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,  # tiny T5 width
    axes_dims_rope=(4, 6, 6),
    approximator_num_channels=16,
    approximator_hidden_dim=32,
    approximator_layers=2,
)

SPEC = FamilySpec(
    name="chroma",
    title="Chroma",
    reference_id="lodestones/Chroma",
    pipeline_class_name="ChromaPipeline",
    transformer_class_name="ChromaTransformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=FLUX_SCHEDULER,
    text_encoders=(t5_xxl("text_encoder", "tokenizer", max_length=512),),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(FLUX_VAE_FULL), height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=FLUX_VAE_FULL, height=1024, width=1024),
    default_steps=35,
    default_guidance=5.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="two_calls",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Flux VAE (16 latent channels, scale factor 8)",
    notes="latents are packed in 2x2 patches (transformer patch_size=1 on 64 packed channels)",
)
