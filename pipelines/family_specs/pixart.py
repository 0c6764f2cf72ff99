"""PixArt-Sigma XL-2 1024 (PixArt-alpha/PixArt-Sigma-XL-2-1024-MS): 28 DiT blocks with cross-attention, 0.6B.

One T5-XXL encoder (300 tokens, masked); SDXL VAE (4 latent channels); DPM-Solver++; CFG is batched.
The pipeline snaps (height, width) to its aspect-ratio bins by default (``use_resolution_binning``) and
resizes the result back, so the tiny model generates at 256 px (sample size 32) whatever was asked.
"""

from ..registry import FamilySpec, SizeSpec
from ._common import kl_vae_full, kl_vae_tiny, t5_xxl

FULL_TRANSFORMER = dict(
    num_attention_heads=16,
    attention_head_dim=72,
    in_channels=4,
    out_channels=8,
    num_layers=28,
    dropout=0.0,
    norm_num_groups=32,
    cross_attention_dim=1152,
    attention_bias=True,
    sample_size=128,
    patch_size=2,
    activation_fn="gelu-approximate",
    num_embeds_ada_norm=1000,
    upcast_attention=False,
    norm_type="ada_norm_single",
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    interpolation_scale=2,
    use_additional_conditions=False,
    caption_channels=4096,
    attention_type="default",
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    cross_attention_dim=32,
    sample_size=32,  # 256 px bins
    interpolation_scale=None,
    caption_channels=32,  # tiny T5 width
)

# SDXL VAE (madebyollin/sdxl-vae-fp16-fix layout), as shipped in the PixArt-Sigma repository.
VAE_FULL = kl_vae_full(
    4,
    scaling_factor=0.13025,
    force_upcast=True,
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    prediction_type="epsilon",
    solver_order=2,
    algorithm_type="dpmsolver++",
    solver_type="midpoint",
    lower_order_final=True,
    use_karras_sigmas=False,
    timestep_spacing="linspace",
    steps_offset=0,
)

SPEC = FamilySpec(
    name="pixart",
    title="PixArt-Sigma XL-2 1024",
    reference_id="PixArt-alpha/PixArt-Sigma-XL-2-1024-MS",
    pipeline_class_name="PixArtSigmaPipeline",
    transformer_class_name="PixArtTransformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="DPMSolverMultistepScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(t5_xxl("text_encoder", "tokenizer", max_length=300),),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(VAE_FULL), height=256, width=256),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=1024, width=1024),
    default_steps=20,
    default_guidance=4.5,
    guidance_kwarg="guidance_scale",
    cfg_mode="batched",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real SDXL VAE (4 latent channels, scale factor 8)",
    notes="resolution binning maps requests to the nearest aspect-ratio bin (256 px bins for tiny)",
)
