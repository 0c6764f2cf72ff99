"""Z-Image Turbo (Tongyi-MAI/Z-Image-Turbo): single-stream S3-DiT, 30 blocks + 2 refiners per stream, 6B.

Qwen3-4B text encoder (chat template, second-last hidden state, padding dropped), Flux VAE,
flow-matching Euler with shift 3. Distilled to run without guidance (``guidance_scale=0``, 9 steps):
one transformer call per step. With ``guidance_scale > 0`` CFG is batched (a list of 2B latents).
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import FLUX_VAE_FULL, kl_vae_tiny

FULL_TRANSFORMER = dict(
    all_patch_size=(2,),
    all_f_patch_size=(1,),
    in_channels=16,
    dim=3840,
    n_layers=30,
    n_refiner_layers=2,
    n_heads=30,
    n_kv_heads=30,
    norm_eps=1e-5,
    qk_norm=True,
    cap_feat_dim=2560,
    rope_theta=256.0,
    t_scale=1000.0,
    axes_dims=[32, 48, 48],
    axes_lens=[1024, 512, 512],
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    dim=32,
    n_layers=2,
    n_refiner_layers=1,
    n_heads=2,
    n_kv_heads=2,
    cap_feat_dim=32,  # tiny Qwen3 width
    axes_dims=[4, 6, 6],
)

QWEN3 = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="qwen3",
    tokenizer_style="qwen3",
    real_model="Qwen3-4B (Qwen/Qwen3-4B)",
    max_length=32768,
    tiny_preset="qwen3_tiny",
    full_preset="qwen3_4b_full",
)

SPEC = FamilySpec(
    name="zimage",
    title="Z-Image Turbo",
    reference_id="Tongyi-MAI/Z-Image-Turbo",
    pipeline_class_name="ZImagePipeline",
    transformer_class_name="ZImageTransformer2DModel",
    vae_class_name="AutoencoderKL",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
    text_encoders=(QWEN3,),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=kl_vae_tiny(FLUX_VAE_FULL), height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=FLUX_VAE_FULL, height=1024, width=1024),
    default_steps=9,
    default_guidance=0.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="none",
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Flux VAE (16 latent channels, scale factor 8)",
)
