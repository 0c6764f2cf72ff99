"""diffusers step-cache configs for a pipeline, from a short text (``fbc:0.2``, ``taylorseer:3``).

Used by ``scripts/generate.py --cache``, the benchmark and the tests. The configs are diffusers'
own (``transformer.enable_cache(config)``); this module only fills in what depends on the
pipeline: the timestep callback, the latent layout, whether CFG is batched, the step count.
"""

from __future__ import annotations

from typing import Any

CACHE_NAMES = ("fbc", "taylorseer", "magcache", "pab", "fastercache")
CACHE_HELP = (
    "fbc[:THRESHOLD] (FirstBlockCache, default 0.5), taylorseer[:INTERVAL] (TaylorSeer, default 2), "
    "magcache[:THRESHOLD] (MagCache, default 0.06), pab[:RANGE] (PyramidAttentionBroadcast, default 2), "
    "fastercache[:RANGE] (FasterCache, default 2)"
)
_ATTENTION_PATTERN = r"^(transformer_blocks|single_transformer_blocks|blocks)\.\d+\.attn\d*$"
_VIDEO_LAYOUT = {"wan": "BCFHW", "hunyuanvideo": "BCFHW", "ltx": "BCFHW", "cogvideox": "BFCHW"}


def parse_cache(text: str) -> tuple[str, float | None]:
    """``"fbc:0.2"`` -> ``("fbc", 0.2)``; raises ``ValueError`` naming the accepted forms."""
    name, _, value = text.partition(":")
    name = name.strip().lower()
    if name not in CACHE_NAMES:
        raise ValueError(f"unknown cache {text!r}; use one of: {CACHE_HELP}")
    if not value:
        return name, None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"cache {text!r}: the value after ':' must be a number ({CACHE_HELP})") from None
    if number <= 0:
        raise ValueError(f"cache {text!r}: the value after ':' must be positive")
    return name, number


def cache_config(text: str, pipe: Any, family: str, num_inference_steps: int, cfg_mode: str) -> Any:
    """The diffusers cache config for ``text`` on ``pipe`` (a pipeline of ``family``)."""
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    name, value = parse_cache(text)

    def timestep() -> Any:
        return pipe.current_timestep

    if name == "fbc":
        return FirstBlockCacheConfig(threshold=value if value is not None else 0.5)
    if name == "taylorseer":
        # diffusers' default patterns miss attention modules named attn1/attn2 (Wan, CogVideoX)
        return TaylorSeerCacheConfig(
            cache_interval=int(value or 2), disable_cache_before_step=1, cache_identifiers=[_ATTENTION_PATTERN]
        )
    if name == "magcache":
        # Random weights have no calibrated ratios: a flat profile makes the error grow only with the
        # skip count, so the cache computes, reuses up to max_skip_steps, computes again.
        return MagCacheConfig(
            threshold=value if value is not None else 0.06,
            num_inference_steps=num_inference_steps,
            mag_ratios=[1.0] * num_inference_steps,
            retention_ratio=0.0,
        )
    skip = int(value or 2)
    if name == "pab":
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=skip,
            cross_attention_block_skip_range=skip,
            spatial_attention_timestep_skip_range=(-1, 10_000),
            cross_attention_timestep_skip_range=(-1, 10_000),
            current_timestep_callback=timestep,
        )
    return FasterCacheConfig(
        spatial_attention_block_skip_range=skip,
        spatial_attention_timestep_skip_range=(-1, 10_000),
        unconditional_batch_skip_range=skip,
        unconditional_batch_timestep_skip_range=(-1, 10_000),
        current_timestep_callback=timestep,
        attention_weight_callback=lambda _: 0.5,
        tensor_format=_VIDEO_LAYOUT.get(family, "BCHW"),
        is_guidance_distilled=cfg_mode != "batched",
    )


def enable_cache(transformer: Any, config: Any) -> None:
    """``transformer.enable_cache(config)``, or diffusers' ``apply_*`` function for transformers
    without ``CacheMixin`` (PixArt, SD3, Sana, Lumina2, Z-Image)."""
    if hasattr(transformer, "enable_cache"):
        transformer.enable_cache(config)
        return
    from diffusers import hooks

    appliers = {
        "FirstBlockCacheConfig": hooks.apply_first_block_cache,
        "TaylorSeerCacheConfig": hooks.apply_taylorseer_cache,
        "MagCacheConfig": hooks.apply_mag_cache,
        "PyramidAttentionBroadcastConfig": hooks.apply_pyramid_attention_broadcast,
        "FasterCacheConfig": hooks.apply_faster_cache,
    }
    appliers[type(config).__name__](transformer, config)
