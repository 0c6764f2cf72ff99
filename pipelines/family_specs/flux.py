"""Flux.1-dev (black-forest-labs/FLUX.1-dev): MMDiT with 19 double- and 38 single-stream blocks, 12B.

Guidance-distilled: the guidance scale enters as an embedding (one transformer call per step). True CFG
(``negative_prompt`` + ``true_cfg_scale > 1``) makes it two calls per step.
"""

from ..registry import FamilySpec, SizeSpec
from ._common import FLUX_SCHEDULER, FLUX_VAE_FULL, clip_l, kl_vae_tiny, t5_xxl

FULL_TRANSFORMER = dict(
    patch_size=1,
    in_channels=64,
    out_channels=None,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,  # tiny T5 width
    pooled_projection_dim=32,  # tiny CLIP width
    axes_dims_rope=(4, 6, 6),
)

SPEC = FamilySpec(
    name="flux",
    title="Flux.1-dev",
    reference_id="black-forest-labs/FLUX.1-dev",
    pipeline_class_name="FluxPipeline",
    transformer_class_name="FluxTransformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=FLUX_SCHEDULER,
    text_encoders=(
        clip_l("text_encoder", "tokenizer"),
        t5_xxl("text_encoder_2", "tokenizer_2", max_length=512),
    ),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(FLUX_VAE_FULL), height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=FLUX_VAE_FULL, height=1024, width=1024),
    default_steps=28,
    default_guidance=3.5,
    guidance_kwarg="guidance_scale",
    cfg_mode="embedded",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Flux VAE (16 latent channels, scale factor 8)",
    notes="latents are packed in 2x2 patches (transformer patch_size=1 on 64 packed channels)",
)
