"""CogVideoX-2b (THUDM/CogVideoX-2b): 30 expert-adaLN DiT blocks over concatenated text+video tokens.

T5-XXL text encoder (226 tokens), 3D VAE (16 latent channels, 8x spatial, 4x temporal), sin-cos
positional embeddings (no RoPE in the 2b model), v-prediction DDIM. CFG is batched.
"""

from ..registry import FamilySpec, SizeSpec
from ._common import t5_xxl

FULL_TRANSFORMER = dict(
    num_attention_heads=30,
    attention_head_dim=64,
    in_channels=16,
    out_channels=16,
    flip_sin_to_cos=True,
    freq_shift=0,
    time_embed_dim=512,
    text_embed_dim=4096,
    num_layers=30,
    dropout=0.0,
    attention_bias=True,
    sample_width=90,
    sample_height=60,
    sample_frames=49,
    patch_size=2,
    patch_size_t=None,
    temporal_compression_ratio=4,
    max_text_seq_length=226,
    activation_fn="gelu-approximate",
    timestep_activation_fn="silu",
    norm_elementwise_affine=True,
    norm_eps=1e-5,
    spatial_interpolation_scale=1.875,
    temporal_interpolation_scale=1.0,
    use_rotary_positional_embeddings=False,
    use_learned_positional_embeddings=False,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    time_embed_dim=32,
    text_embed_dim=32,  # tiny T5 width
    num_layers=2,
    sample_width=4,  # pipeline default 32 px
    sample_height=4,
    sample_frames=9,
)

VAE_FULL = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("CogVideoXDownBlock3D",) * 4,
    up_block_types=("CogVideoXUpBlock3D",) * 4,
    block_out_channels=(128, 256, 256, 512),
    latent_channels=16,
    layers_per_block=3,
    act_fn="silu",
    norm_eps=1e-6,
    norm_num_groups=32,
    temporal_compression_ratio=4,
    sample_height=480,
    sample_width=720,
    scaling_factor=1.15258426,
)

VAE_TINY = dict(VAE_FULL, block_out_channels=(16, 16, 16, 16), layers_per_block=1, norm_num_groups=8,
                sample_height=32, sample_width=32)

SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    set_alpha_to_one=True,
    steps_offset=0,
    prediction_type="v_prediction",
    rescale_betas_zero_snr=True,
    snr_shift_scale=3.0,
    timestep_spacing="trailing",
)

SPEC = FamilySpec(
    name="cogvideox",
    title="CogVideoX-2b",
    reference_id="THUDM/CogVideoX-2b",
    pipeline_class_name="CogVideoXPipeline",
    transformer_class_name="CogVideoXTransformer3DModel",
    vae_class_name="AutoencoderKLCogVideoX",
    scheduler_class_name="CogVideoXDDIMScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(t5_xxl("text_encoder", "tokenizer", max_length=226),),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=VAE_TINY, height=32, width=32, num_frames=9),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=480, width=720, num_frames=49),
    default_steps=50,
    default_guidance=6.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="batched",
    vae_scale_factor=8,
    patch_size=2,
    is_video=True,
    frame_multiple=4,
    vae_note="real CogVideoX VAE (16 latent channels, 8x spatial, 4x temporal)",
)
