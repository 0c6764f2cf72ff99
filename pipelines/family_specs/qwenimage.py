"""Qwen-Image (Qwen/Qwen-Image): 60 double-stream MMDiT blocks, 20B.

Qwen2.5-VL-7B text encoder (chat-templated prompt, the 34-token system prefix dropped), Wan-style VAE
used per frame (16 latent channels), flow-matching Euler with exponential dynamic shift. CFG is "true
CFG": with a negative prompt and ``true_cfg_scale > 1`` it runs two transformer calls per step, so the
default call passes ``negative_prompt=" "`` as the model card does.
"""

from ..registry import FamilySpec, SizeSpec, TextEncoderSpec
from ._common import WAN_VAE_FULL, WAN_VAE_TINY

FULL_TRANSFORMER = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    guidance_embeds=False,
    axes_dims_rope=(16, 56, 56),
)

TINY_TRANSFORMER = dict(
    FULL_TRANSFORMER,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,  # tiny Qwen2.5-VL width
    axes_dims_rope=(4, 6, 6),
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=0.9,
    base_image_seq_len=256,
    max_image_seq_len=8192,
    shift_terminal=0.02,
    time_shift_type="exponential",
)

QWEN25_VL = TextEncoderSpec(
    component="text_encoder",
    tokenizer_component="tokenizer",
    kind="qwen2_5_vl",
    tokenizer_style="qwen2",
    real_model="Qwen2.5-VL-7B-Instruct (Qwen/Qwen2.5-VL-7B-Instruct)",
    max_length=32768,
    tiny_preset="qwen2_5_vl_tiny",
    full_preset="qwen2_5_vl_7b_full",
)

SPEC = FamilySpec(
    name="qwenimage",
    title="Qwen-Image",
    reference_id="Qwen/Qwen-Image",
    pipeline_class_name="QwenImagePipeline",
    transformer_class_name="QwenImageTransformer2DModel",
    vae_class_name="AutoencoderKLQwenImage",
    scheduler_class_name="FlowMatchEulerDiscreteScheduler",
    scheduler_config=SCHEDULER,
    text_encoders=(QWEN25_VL,),
    tiny=SizeSpec(transformer=TINY_TRANSFORMER, vae=WAN_VAE_TINY, height=64, width=64),
    full=SizeSpec(transformer=FULL_TRANSFORMER, vae=WAN_VAE_FULL, height=1328, width=1328),
    default_steps=50,
    default_guidance=4.0,
    guidance_kwarg="true_cfg_scale",
    cfg_mode="two_calls",
    call_kwargs={"negative_prompt": " "},
    vae_scale_factor=8,
    patch_size=2,
    vae_note="real Qwen-Image VAE (16 latent channels, scale factor 8)",
    notes="latents are packed in 2x2 patches",
)
