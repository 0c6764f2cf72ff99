"""The registry of diffusers step-cache recipes: for each cache of ``--cache``, its default, how its diffusers
config is made for a pipeline, and where it runs (and why not elsewhere).

A recipe only fills in what depends on the pipeline: the timestep callback, the latent layout, whether CFG is
batched, the step count; the configs are diffusers' own (``transformer.enable_cache(config)``). Adding a cache
is one :class:`StepCacheRecipe` in :data:`RECIPES`; a family that a recipe does not name is reported as not
checked. :data:`CACHE_FAMILIES` is where each cache runs in diffusers 0.42.1 with the pipelines' default calls
(CFG as the family runs it): the same pipeline runs or fails eagerly whatever its size, and under BCG a cache
gives exactly what it gives eagerly, so this is also where it runs under BCG (tests/tools/test_cache_support_cpu.py
runs every pair on the tiny pipelines to keep it true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .cache_spec import CacheSpec

__all__ = ["CACHE_FAMILIES", "RECIPES", "CacheContext", "StepCacheRecipe", "recipe"]

_ATTENTION_PATTERN = r"^(transformer_blocks|single_transformer_blocks|blocks)\.\d+\.attn\d*$"
_VIDEO_LAYOUT = {"wan": "BCFHW", "hunyuanvideo": "BCFHW", "ltx": "BCFHW", "cogvideox": "BFCHW"}
_ALWAYS = (-1, 10_000)  # a timestep range that every step falls in


@dataclass(frozen=True)
class CacheContext:
    """What a recipe reads of the pipeline it configures."""

    pipe: Any
    family: str
    num_inference_steps: int
    cfg_mode: str  # bcg_pipelines.CFG_MODES

    def timestep(self) -> Any:
        return self.pipe.current_timestep


@dataclass(frozen=True)
class StepCacheRecipe:
    """One diffusers step cache: ``make(value, context)`` builds its config (``value``: the number after ``:``,
    never ``None``: :attr:`default` fills it in); ``families`` where it runs; ``why_not``: the reason for each
    family where it does not."""

    name: str
    default: float
    make: Callable[[float, CacheContext], Any]
    families: tuple[str, ...]
    why_not: Mapping[str, str] = field(default_factory=dict)

    def config(self, spec: CacheSpec, context: CacheContext) -> Any:
        return self.make(self.default if spec.value is None else spec.value, context)


def _fbc(value: float, ctx: CacheContext) -> Any:
    from diffusers.hooks import FirstBlockCacheConfig

    return FirstBlockCacheConfig(threshold=value)


def _taylorseer(value: float, ctx: CacheContext) -> Any:
    from diffusers.hooks import TaylorSeerCacheConfig

    # diffusers' default patterns miss attention modules named attn1/attn2 (Wan, CogVideoX)
    return TaylorSeerCacheConfig(cache_interval=int(value), disable_cache_before_step=1,
                                 cache_identifiers=[_ATTENTION_PATTERN])


def _magcache(value: float, ctx: CacheContext) -> Any:
    from diffusers.hooks import MagCacheConfig

    # Random weights have no calibrated ratios: a flat profile makes the error grow only with the skip count,
    # so the cache computes, reuses up to max_skip_steps, computes again.
    steps = ctx.num_inference_steps
    return MagCacheConfig(threshold=value, num_inference_steps=steps, mag_ratios=[1.0] * steps, retention_ratio=0.0)


def _pab(value: float, ctx: CacheContext) -> Any:
    from diffusers.hooks import PyramidAttentionBroadcastConfig

    skip = int(value)
    return PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=skip, cross_attention_block_skip_range=skip,
        spatial_attention_timestep_skip_range=_ALWAYS, cross_attention_timestep_skip_range=_ALWAYS,
        current_timestep_callback=ctx.timestep,
    )


def _fastercache(value: float, ctx: CacheContext) -> Any:
    from diffusers.hooks import FasterCacheConfig

    skip = int(value)
    return FasterCacheConfig(
        spatial_attention_block_skip_range=skip, spatial_attention_timestep_skip_range=_ALWAYS,
        unconditional_batch_skip_range=skip, unconditional_batch_timestep_skip_range=_ALWAYS,
        current_timestep_callback=ctx.timestep, attention_weight_callback=lambda _: 0.5,
        tensor_format=_VIDEO_LAYOUT.get(ctx.family, "BCHW"), is_guidance_distilled=ctx.cfg_mode != "batched",
    )


_NO_CONTEXT = "its pipeline opens no transformer.cache_context(...) around the transformer call, which the cache's state needs"
_NOT_REGISTERED = "diffusers' TransformerBlockRegistry does not know its transformer block class, through which the cache hooks blocks"
_NO_HIDDEN_STATES = "its transformer blocks take no hidden_states argument, which the cache reads"
_NO_MATCH = "the cache's attention-module patterns match no module of its transformer, so nothing would be cached"
_NO_TIMESTEP = "its pipeline has no current_timestep, which the cache reads"
_TEXT_LENGTHS = ("PAB shares one cache between the two CFG calls, and the negative prompt's text length differs from "
                 "the prompt's (QwenImage trims text per prompt)")
_NOT_BATCHED = ("FasterCache needs CFG as one batched call with unpacked latents, and this family runs CFG as two "
                "calls or is guidance-distilled")
_NO_TIMESTEP_FAMILIES = ("sd3", "pixart", "sana", "lumina2", "zimage")

RECIPES: Mapping[str, StepCacheRecipe] = MappingProxyType({r.name: r for r in (
    StepCacheRecipe("fbc", 0.5, _fbc, ("flux", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox"), {
        "sd3": _NO_CONTEXT, "pixart": _NO_CONTEXT, "flux2": _NO_CONTEXT, "sana": _NOT_REGISTERED,
        "lumina2": _NOT_REGISTERED, "chroma": _NOT_REGISTERED, "zimage": _NO_HIDDEN_STATES}),
    StepCacheRecipe("taylorseer", 2, _taylorseer, ("flux", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox"), {
        "sd3": _NO_CONTEXT, "pixart": _NO_CONTEXT, "sana": _NO_CONTEXT, "chroma": _NO_CONTEXT, "flux2": _NO_CONTEXT,
        "lumina2": _NO_MATCH, "zimage": _NO_MATCH}),
    StepCacheRecipe("magcache", 0.06, _magcache,
                    ("flux", "sd3", "pixart", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox", "flux2"), {
        "sana": _NOT_REGISTERED, "lumina2": _NOT_REGISTERED, "chroma": _NOT_REGISTERED, "zimage": _NO_HIDDEN_STATES}),
    StepCacheRecipe("pab", 2, _pab, ("flux", "wan", "hunyuanvideo", "ltx", "cogvideox", "chroma", "flux2"), {
        **dict.fromkeys(_NO_TIMESTEP_FAMILIES, _NO_TIMESTEP), "qwenimage": _TEXT_LENGTHS}),
    StepCacheRecipe("fastercache", 2, _fastercache, ("cogvideox",), {
        **dict.fromkeys(_NO_TIMESTEP_FAMILIES, _NO_TIMESTEP),
        "ltx": "FasterCache needs unpacked latents, and LTX-Video packs them into a sequence",
        **dict.fromkeys(("flux", "wan", "qwenimage", "hunyuanvideo", "chroma", "flux2"), _NOT_BATCHED)}),
)})

#: Where each diffusers step cache runs (the recipes' ``families``).
CACHE_FAMILIES: Mapping[str, tuple[str, ...]] = MappingProxyType({name: r.families for name, r in RECIPES.items()})


def recipe(spec: CacheSpec) -> StepCacheRecipe:
    """The recipe of a diffusers step cache (``KeyError`` for cache-dit's, which have none here)."""
    return RECIPES[spec.name]
