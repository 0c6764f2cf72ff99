"""Wan 2.1 text-to-video 1.3B (Wan-AI/Wan2.1-T2V-1.3B-Diffusers): 30 DiT blocks (self + cross attention).

UMT5-XXL text encoder (512 tokens), causal 3D VAE (16 latent channels, 8x spatial / 4x temporal), flow
UniPC scheduler. CFG runs two transformer calls per step.
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import WAN_VAE_FULL, WAN_VAE_TINY

FULL_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    text_dim=32,  # tiny UMT5 width
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
    rope_max_seq_len=32,
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.0001,
    beta_end=0.02,
    beta_schedule="linear",
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
    solver_order=2,
    solver_type="bh2",
    predict_x0=True,
    lower_order_final=True,
    final_sigmas_type="zero",
    timestep_spacing="linspace",
)

UMT5 = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="umt5",
    tokenizer_style="t5",
    real_model="UMT5-XXL encoder (google/umt5-xxl)",
    max_length=512,
    tiny_preset="umt5_tiny",
    full_preset="umt5_xxl_full",
)

SPEC = FamilySpec(
    name="wan",
    title="Wan 2.1 T2V 1.3B",
    reference_id="Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    pipeline_class_name="WanPipeline",
    transformer_class_name="WanTransformer3DModel",
    vae_class_name="AutoencoderKLWan",
    scheduler_class_name="UniPCMultistepScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(UMT5,),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=WAN_VAE_TINY, height=32, width=32, num_frames=9),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=WAN_VAE_FULL, height=480, width=832, num_frames=81),
    default_steps=50,
    default_guidance=5.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="two_calls",
    vae_scale_factor=8,
    patch_size=2,
    is_video=True,
    frame_multiple=4,
    vae_note="real Wan 2.1 VAE (16 latent channels, 8x spatial, 4x temporal)",
)
