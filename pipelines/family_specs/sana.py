"""Sana 1.6B 1024 px (Efficient-Large-Model/Sana_1600M_1024px_diffusers): 20 linear-attention DiT blocks.

Gemma-2-2B text encoder (with the pipeline's "complex human instruction" prefix), 32x deep-compression
autoencoder (DC-AE, 32 latent channels), flow DPM-Solver++; CFG is batched. Requests are snapped to
aspect-ratio bins (512 px bins for the tiny model, sample size 16).
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec

FULL_TRANSFORMER = dict(
    in_channels=32,
    out_channels=32,
    num_attention_heads=70,
    attention_head_dim=32,
    num_layers=20,
    num_cross_attention_heads=20,
    cross_attention_head_dim=112,
    cross_attention_dim=2240,
    caption_channels=2304,
    mlp_ratio=2.5,
    dropout=0.0,
    attention_bias=False,
    sample_size=32,
    patch_size=1,
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    interpolation_scale=None,
    guidance_embeds=False,
    qk_norm=None,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    num_cross_attention_heads=2,
    cross_attention_head_dim=16,
    cross_attention_dim=32,
    caption_channels=32,  # tiny Gemma width
    sample_size=16,  # 512 px bins
)

# mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers
VAE_FULL = dict(
    in_channels=3,
    latent_channels=32,
    attention_head_dim=32,
    encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    encoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    decoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    encoder_layers_per_block=(2, 2, 2, 3, 3, 3),
    decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
    encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    upsample_block_type="interpolate",
    downsample_block_type="Conv",
    decoder_norm_types="rms_norm",
    decoder_act_fns="silu",
    scaling_factor=0.41407,
)

VAE_TINY = dict(
    VAE_FULL,
    attention_head_dim=8,
    encoder_block_out_channels=(8, 8, 16, 16, 32, 32),
    decoder_block_out_channels=(8, 8, 16, 16, 32, 32),
    encoder_layers_per_block=(1, 1, 1, 1, 1, 1),
    decoder_layers_per_block=(1, 1, 1, 1, 1, 1),
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    prediction_type="flow_prediction",
    solver_order=2,
    algorithm_type="dpmsolver++",
    solver_type="midpoint",
    lower_order_final=True,
    final_sigmas_type="zero",
    use_flow_sigmas=True,
    flow_shift=3.0,
    timestep_spacing="linspace",
)

GEMMA2 = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="gemma2",
    tokenizer_style="gemma",
    real_model="Gemma-2-2B-it (google/gemma-2-2b-it)",
    max_length=300,
    tiny_preset="gemma2_tiny",
    full_preset="gemma2_2b_full",
)

SPEC = FamilySpec(
    name="sana",
    title="Sana 1.6B 1024px",
    reference_id="Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    pipeline_class_name="SanaPipeline",
    transformer_class_name="SanaTransformer2DModel",
    vae_class_name="AutoencoderDC",
    scheduler_class_name="DPMSolverMultistepScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(GEMMA2,),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=VAE_TINY, height=512, width=512),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=1024, width=1024),
    default_steps=20,
    default_guidance=4.5,
    guidance_kwarg="guidance_scale",
    cfg_mode="batched",
    vae_scale_factor=32,
    patch_size=1,
    vae_note="real DC-AE f32c32 (32 latent channels, scale factor 32)",
    notes="resolution binning maps requests to the nearest aspect-ratio bin (512 px bins for tiny)",
)
