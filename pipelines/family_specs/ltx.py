"""LTX-Video 0.9 (Lightricks/LTX-Video): 28 DiT blocks with cross-attention, 1.9B.

T5-XXL text encoder (128 tokens, masked), video VAE with 128 latent channels (32x spatial, 8x temporal
compression; the transformer uses patch size 1), flow-matching Euler with resolution-dependent shift.
CFG is batched.
"""

from ..registry import FamilySpec, SizeSpec
from ._common import t5_xxl

FULL_TRANSFORMER = dict(
    in_channels=128,
    out_channels=128,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=32,
    attention_head_dim=64,
    cross_attention_dim=2048,
    num_layers=28,
    activation_fn="gelu-approximate",
    qk_norm="rms_norm_across_heads",
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    caption_channels=4096,
    attention_bias=True,
    attention_out_bias=True,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    cross_attention_dim=32,
    num_layers=2,
    caption_channels=32,  # tiny T5 width
)

VAE_FULL = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=128,
    block_out_channels=(128, 256, 512, 512),
    decoder_block_out_channels=(128, 256, 512, 512),
    layers_per_block=(4, 3, 3, 3, 4),
    decoder_layers_per_block=(4, 3, 3, 3, 4),
    spatio_temporal_scaling=(True, True, True, False),
    decoder_spatio_temporal_scaling=(True, True, True, False),
    decoder_inject_noise=(False, False, False, False, False),
    upsample_residual=(False, False, False, False),
    upsample_factor=(1, 1, 1, 1),
    timestep_conditioning=False,
    patch_size=4,
    patch_size_t=1,
    resnet_norm_eps=1e-6,
    scaling_factor=1.0,
    encoder_causal=True,
    decoder_causal=False,
)

VAE_TINY = dict(
    VAE_FULL,
    block_out_channels=(8, 16, 32, 32),
    decoder_block_out_channels=(8, 16, 32, 32),
    layers_per_block=(1, 1, 1, 1, 1),
    decoder_layers_per_block=(1, 1, 1, 1, 1),
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.95,
    max_shift=2.05,
    base_image_seq_len=1024,
    max_image_seq_len=4096,
    shift_terminal=0.1,
)

SPEC = FamilySpec(
    name="ltx",
    title="LTX-Video 0.9",
    reference_id="Lightricks/LTX-Video",
    pipeline_class_name="LTXPipeline",
    transformer_class_name="LTXVideoTransformer3DModel",
    vae_class_name="AutoencoderKLLTXVideo",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(t5_xxl("text_encoder", "tokenizer", max_length=128),),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=VAE_TINY, height=64, width=64, num_frames=9),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=512, width=704, num_frames=161),
    default_steps=50,
    default_guidance=3.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="batched",
    vae_scale_factor=32,
    patch_size=1,
    is_video=True,
    frame_multiple=8,
    vae_note="real LTX-Video 0.9 VAE (128 latent channels, 32x spatial, 8x temporal)",
)
