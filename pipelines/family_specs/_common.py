"""Configs shared by several families (VAEs, schedulers, text encoder specs)."""

from __future__ import annotations

from ..registry import TextEncoderSpec

_KL_DOWN = ("DownEncoderBlock2D",) * 4
_KL_UP = ("UpDecoderBlock2D",) * 4

def kl_vae_full(latent_channels: int, **published) -> dict:
    """The 4-level ``AutoencoderKL`` layout shared by the VAEs of SDXL, SD3, Flux.1 and Flux.2 (128-256-512-512
    channels, 2 layers per block, 1024 px); ``published`` adds each model's own keys (scaling, quant convs, ...)."""
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=_KL_DOWN,
        up_block_types=_KL_UP,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        act_fn="silu",
        latent_channels=latent_channels,
        norm_num_groups=32,
        sample_size=1024,
        **published,
    )


#: The 16-channel KL VAE of Flux.1 (also used by Chroma, Lumina 2 and Z-Image): published config.
FLUX_VAE_FULL = kl_vae_full(
    16,
    scaling_factor=0.3611,
    shift_factor=0.1159,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=True,
    force_upcast=True,
)


def kl_vae_tiny(full: dict, channels: int = 16) -> dict:
    """A tiny ``AutoencoderKL`` config: same latent channels, scaling and 4 levels (scale factor 8) as ``full``."""
    return {
        **full,
        "block_out_channels": (channels,) * 4,
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "sample_size": 64,
    }


#: The causal 3D VAE of Wan 2.1 (``AutoencoderKLWan``; 16 latent channels, 8x spatial, 4x temporal):
#: published config. Qwen-Image ships the same config for its ``AutoencoderKLQwenImage``.
WAN_VAE_FULL = dict(
    base_dim=96,
    z_dim=16,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
)

#: A tiny Wan VAE: same latent channels and compression, 8 base channels, 1 residual block per level.
WAN_VAE_TINY = dict(WAN_VAE_FULL, base_dim=8, num_res_blocks=1)


#: The flow-matching Euler scheduler of Flux.1-dev (resolution-dependent shift).
FLUX_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)


def clip_l(component: str = "text_encoder", tokenizer: str = "tokenizer", projection: bool = False) -> TextEncoderSpec:
    """CLIP ViT-L/14 text encoder (real size at ``full``), max length 77."""
    return TextEncoderSpec(
        component=component,
        tokenizer_component=tokenizer,
        kind="clip_proj" if projection else "clip",
        tokenizer_style="clip",
        real_model="CLIP ViT-L/14 text encoder (openai/clip-vit-large-patch14)",
        max_length=77,
        tiny_preset="clip_tiny",
        full_preset="clip_l_full",
    )


def t5_xxl(component: str = "text_encoder", tokenizer: str = "tokenizer", max_length: int = 512) -> TextEncoderSpec:
    """T5 v1.1 XXL encoder (shrunk in depth at ``full``)."""
    return TextEncoderSpec(
        component=component,
        tokenizer_component=tokenizer,
        kind="t5",
        tokenizer_style="t5",
        real_model="T5 v1.1 XXL encoder (google/t5-v1_1-xxl)",
        max_length=max_length,
        tiny_preset="t5_tiny",
        full_preset="t5_xxl_full",
    )
