"""Flux.2-dev (black-forest-labs/FLUX.2-dev): 8 double- and 48 single-stream blocks, 32B.

Mistral-Small-3.1 text encoder (chat template with system message; hidden states 10, 20 and 30 stacked
to a 15360-wide context), VAE with 32 latent channels packed 2x2 (128 transformer channels), flow-matching
Euler with an empirical resolution/step shift. Guidance-distilled: embedded guidance, one call per step.
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import FLUX_SCHEDULER, kl_vae_full, kl_vae_tiny

FULL_TRANSFORMER = dict(
    patch_size=1,
    in_channels=128,
    out_channels=None,
    num_layers=8,
    num_single_layers=48,
    attention_head_dim=128,
    num_attention_heads=48,
    joint_attention_dim=15360,
    timestep_guidance_channels=256,
    mlp_ratio=3.0,
    axes_dims_rope=(32, 32, 32, 32),
    rope_theta=2000,
    eps=1e-6,
    guidance_embeds=True,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=48,  # 3 stacked hidden states of the tiny Mistral (width 16)
    timestep_guidance_channels=32,
    axes_dims_rope=(4, 4, 4, 4),
)

VAE_FULL = kl_vae_full(
    32,
    use_quant_conv=True,
    use_post_quant_conv=True,
    mid_block_add_attention=True,
    batch_norm_eps=1e-4,
    batch_norm_momentum=0.1,
    patch_size=(2, 2),
)

VAE_TINY = kl_vae_tiny(VAE_FULL)

# Flux.1's scheduler settings, with the exponential time shift.
SCHEDULER = dict(FLUX_SCHEDULER, time_shift_type="exponential")

MISTRAL3 = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="mistral3",
    tokenizer_style="mistral",
    real_model="Mistral-Small-3.1-24B-Instruct (mistralai/Mistral-Small-3.1-24B-Instruct-2503)",
    max_length=131072,
    tiny_preset="mistral3_tiny",
    full_preset="mistral3_small_full",
)

SPEC = FamilySpec(
    name="flux2",
    title="Flux.2-dev",
    reference_id="black-forest-labs/FLUX.2-dev",
    pipeline_class_name="Flux2Pipeline",
    transformer_class_name="Flux2Transformer2DModel",
    vae_class_name="AutoencoderKLFlux2",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(MISTRAL3,),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=VAE_TINY, height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=1024, width=1024),
    default_steps=50,
    default_guidance=4.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="embedded",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Flux.2 VAE (32 latent channels, scale factor 8, packed 2x2)",
    notes="the tokenizer is a Mistral-style tokenizer with a chat template standing in for the PixtralProcessor",
)
