"""HunyuanVideo (hunyuanvideo-community/HunyuanVideo): 20 double- and 40 single-stream blocks, 13B.

Llama-3-8B-based text encoder (llava-llama-3-8b, prompt template whose first 95 tokens are cropped,
third-last hidden state) plus CLIP-L pooled embedding; causal 3D VAE (16 latent channels, 8x spatial,
4x temporal); flow-matching Euler with shift 7. Guidance-distilled (embedded guidance, one call per
step); true CFG (negative prompt + ``true_cfg_scale > 1``) makes it two calls.
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import clip_l

FULL_TRANSFORMER = dict(
    in_channels=16,
    out_channels=16,
    num_attention_heads=24,
    attention_head_dim=128,
    num_layers=20,
    num_single_layers=40,
    num_refiner_layers=2,
    mlp_ratio=4.0,
    patch_size=2,
    patch_size_t=1,
    qk_norm="rms_norm",
    guidance_embeds=True,
    text_embed_dim=4096,
    pooled_projection_dim=768,
    rope_theta=256.0,
    rope_axes_dim=(16, 56, 56),
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=1,
    num_single_layers=1,
    num_refiner_layers=1,
    text_embed_dim=32,  # tiny Llama width
    pooled_projection_dim=32,  # tiny CLIP width
    rope_axes_dim=(4, 6, 6),
)

VAE_FULL = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=16,
    down_block_types=("HunyuanVideoDownBlock3D",) * 4,
    up_block_types=("HunyuanVideoUpBlock3D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    norm_num_groups=32,
    scaling_factor=0.476986,
    spatial_compression_ratio=8,
    temporal_compression_ratio=4,
    mid_block_add_attention=True,
)

VAE_TINY = dict(VAE_FULL, block_out_channels=(16, 16, 16, 16), layers_per_block=1, norm_num_groups=8)

LLAMA = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="llama",
    tokenizer_style="llama3",
    real_model="llava-llama-3-8b text model (xtuner/llava-llama-3-8b-v1_1-transformers)",
    max_length=8192,
    tiny_preset="llama3_tiny",
    full_preset="llama3_8b_full",
)

SPEC = FamilySpec(
    name="hunyuanvideo",
    title="HunyuanVideo",
    reference_id="hunyuanvideo-community/HunyuanVideo",
    pipeline_class_name="HunyuanVideoPipeline",
    transformer_class_name="HunyuanVideoTransformer3DModel",
    vae_class_name="AutoencoderKLHunyuanVideo",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=dict(num_train_timesteps=1000, shift=7.0),
    text_encoders=(LLAMA, clip_l("text_encoder_2", "tokenizer_2")),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=VAE_TINY, height=32, width=32, num_frames=9),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=VAE_FULL, height=720, width=1280, num_frames=129),
    default_steps=50,
    default_guidance=6.0,
    guidance_kwarg="guidance_scale",
    cfg_mode="embedded",
    vae_scale_factor=8,
    patch_size=2,
    is_video=True,
    frame_multiple=4,
    vae_note="real HunyuanVideo VAE (16 latent channels, 8x spatial, 4x temporal)",
)
