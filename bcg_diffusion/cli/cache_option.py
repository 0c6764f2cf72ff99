"""The ``--cache SPEC`` option of the commands: a diffusers step cache on a pipeline's transformer, from a
short text (``fbc:0.2``, ``taylorseer:3``).

Used by ``generate --cache``, the benchmark's ``--cache-rows`` and the tests. The configs are diffusers'
own (``transformer.enable_cache(config)``); this module only fills in what depends on the pipeline: the
timestep callback, the latent layout, whether CFG is batched, the step count. It also says where each
cache runs (:data:`CACHE_FAMILIES`), checks a spec before anything is built, and counts what a cache
computed and reused (:func:`cache_passes`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # imported where used: the parsers read CACHE_HELP before torch is imported
    from bcg_diffusion import CachePasses

CACHE_NAMES = ("fbc", "taylorseer", "magcache", "pab", "fastercache")
# cache-dit's caches (the cache-dit extra): on the whole pipeline, through cache_dit.enable_cache
CACHE_DIT_NAMES = ("dbcache", "dbcache-taylorseer", "dbprune")
CACHE_DIT_FILE = "cache-dit"
CACHE_HELP = (
    "fbc[:THRESHOLD] (FirstBlockCache, default 0.5), taylorseer[:INTERVAL] (TaylorSeer, default 2), "
    "magcache[:THRESHOLD] (MagCache, default 0.06), pab[:RANGE] (PyramidAttentionBroadcast, default 2), "
    "fastercache[:RANGE] (FasterCache, default 2); cache-dit (pip install 'bcg-diffusion[cache-dit]'): "
    "dbcache[:THRESHOLD], dbcache-taylorseer[:THRESHOLD], dbprune[:THRESHOLD] (cache-dit's DBCache, DBCache with "
    "the TaylorSeer calibrator, DBPrune; residual-difference threshold, default cache-dit's 0.08), "
    "cache-dit:FILE.yaml (any cache-dit settings, read by cache_dit.load_configs)"
)
_ATTENTION_PATTERN = r"^(transformer_blocks|single_transformer_blocks|blocks)\.\d+\.attn\d*$"
_VIDEO_LAYOUT = {"wan": "BCFHW", "hunyuanvideo": "BCFHW", "ltx": "BCFHW", "cogvideox": "BFCHW"}


def is_cache_dit(text: str) -> bool:
    """Whether ``text`` names one of cache-dit's caches (see :data:`CACHE_HELP`)."""
    return text.partition(":")[0].strip().lower() in CACHE_DIT_NAMES + (CACHE_DIT_FILE,)


def parse_cache(text: str) -> tuple[str, float | str | None]:
    """``"fbc:0.2"`` -> ``("fbc", 0.2)``, ``"cache-dit:c.yaml"`` -> ``("cache-dit", "c.yaml")``; raises
    ``ValueError`` naming the accepted forms (and what to install for cache-dit's)."""
    name, _, value = text.partition(":")
    name = name.strip().lower()
    if name in CACHE_DIT_NAMES + (CACHE_DIT_FILE,):
        _require_cache_dit(text)
        if name == CACHE_DIT_FILE:
            if not value.strip():
                raise ValueError(f"cache {text!r}: give the settings file, e.g. cache-dit:cache.yaml")
            from pathlib import Path

            if not Path(value.strip()).is_file():
                raise ValueError(f"cache {text!r}: no file {value.strip()!r}")
            return name, value.strip()
    elif name not in CACHE_NAMES:
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


def _require_cache_dit(text: str) -> None:
    import importlib.util

    if importlib.util.find_spec("cache_dit") is None:
        raise ValueError(f"cache {text!r} is cache-dit's, which is not installed: pip install 'bcg-diffusion[cache-dit]'")


def cache_dit_settings(text: str) -> dict[str, Any]:
    """``cache_dit.enable_cache`` keyword arguments for a cache-dit spec (fresh objects each call)."""
    import cache_dit

    name, value = parse_cache(text)
    if name == CACHE_DIT_FILE:
        return dict(cache_dit.load_configs(value))
    threshold = {} if value is None else {"residual_diff_threshold": value}
    if name == "dbprune":
        return {"cache_config": cache_dit.DBPruneConfig(**threshold)}
    settings = {"cache_config": cache_dit.DBCacheConfig(**threshold)}
    if name == "dbcache-taylorseer":
        settings["calibrator_config"] = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=1)
    return settings


def _fit_cache_dit_blocks(config: Any, transformer: Any) -> str:
    """cache-dit's default ``Fn_compute_blocks`` (8) needs 8 blocks per block list: on a smaller
    (tiny) transformer use as many as its shortest block list has, and say so."""
    import torch

    lengths = [len(c) for c in transformer.children() if isinstance(c, torch.nn.ModuleList) and len(c)]
    shortest = min(lengths) if lengths else None
    if shortest is None or config.Fn_compute_blocks + config.Bn_compute_blocks <= shortest:
        return ""
    config.Fn_compute_blocks, config.Bn_compute_blocks = max(1, shortest - config.Bn_compute_blocks), min(config.Bn_compute_blocks, shortest - 1)
    return f"; Fn_compute_blocks={config.Fn_compute_blocks}, Bn_compute_blocks={config.Bn_compute_blocks} (its block lists are short)"


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


# Where each cache runs in diffusers 0.42.1, with the pipelines' default calls (CFG as the family
# runs it). The same pipeline runs eagerly or fails eagerly whatever its size, and under BCG a cache
# gives exactly what it gives eagerly, so this is also where it runs under BCG.
# tests/tools/test_scripts.py runs every (cache, family) pair on the tiny pipelines to keep it true.
CACHE_FAMILIES = {
    "fbc": ("flux", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox"),
    "taylorseer": ("flux", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox"),
    "magcache": ("flux", "sd3", "pixart", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox", "flux2"),
    "pab": ("flux", "wan", "hunyuanvideo", "ltx", "cogvideox", "chroma", "flux2"),
    "fastercache": ("cogvideox",),
}
_NO_CONTEXT = "its pipeline opens no transformer.cache_context(...) around the transformer call, which the cache's state needs"
_NOT_REGISTERED = "diffusers' TransformerBlockRegistry does not know its transformer block class, through which the cache hooks blocks"
_NO_HIDDEN_STATES = "its transformer blocks take no hidden_states argument, which the cache reads"
_NO_MATCH = "the cache's attention-module patterns match no module of its transformer, so nothing would be cached"
_NO_TIMESTEP = "its pipeline has no current_timestep, which the cache reads"
_TEXT_LENGTHS = ("PAB shares one cache between the two CFG calls, and the negative prompt's text length differs from "
                 "the prompt's (QwenImage trims text per prompt)")
_NOT_BATCHED = ("FasterCache needs CFG as one batched call with unpacked latents, and this family runs CFG as two "
                "calls or is guidance-distilled")
_WHY_NOT = {
    "fbc": {"sd3": _NO_CONTEXT, "pixart": _NO_CONTEXT, "flux2": _NO_CONTEXT, "sana": _NOT_REGISTERED,
            "lumina2": _NOT_REGISTERED, "chroma": _NOT_REGISTERED, "zimage": _NO_HIDDEN_STATES},
    "taylorseer": {"sd3": _NO_CONTEXT, "pixart": _NO_CONTEXT, "sana": _NO_CONTEXT, "chroma": _NO_CONTEXT,
                   "flux2": _NO_CONTEXT, "lumina2": _NO_MATCH, "zimage": _NO_MATCH},
    "magcache": {"sana": _NOT_REGISTERED, "lumina2": _NOT_REGISTERED, "chroma": _NOT_REGISTERED,
                 "zimage": _NO_HIDDEN_STATES},
    "pab": {"sd3": _NO_TIMESTEP, "pixart": _NO_TIMESTEP, "sana": _NO_TIMESTEP, "lumina2": _NO_TIMESTEP,
            "zimage": _NO_TIMESTEP, "qwenimage": _TEXT_LENGTHS},
    "fastercache": {"sd3": _NO_TIMESTEP, "pixart": _NO_TIMESTEP, "sana": _NO_TIMESTEP, "lumina2": _NO_TIMESTEP,
                    "zimage": _NO_TIMESTEP, "ltx": "FasterCache needs unpacked latents, and LTX-Video packs them "
                    "into a sequence", **{f: _NOT_BATCHED for f in ("flux", "wan", "qwenimage", "hunyuanvideo",
                                                                     "chroma", "flux2")}},
}


def cache_unsupported_reason(text: str, family: str) -> str | None:
    """Why the cache ``text`` cannot run on ``family`` (``None`` where it runs); ``ValueError`` for an
    unknown cache."""
    name, _ = parse_cache(text)
    if name in CACHE_DIT_NAMES + (CACHE_DIT_FILE,):
        return None  # cache-dit says itself which pipelines it adapts (cache_dit.supported_pipelines())
    if family in CACHE_FAMILIES[name]:
        return None
    why = _WHY_NOT[name].get(family, "it was not checked with this cache")
    return (f"cache {name!r} cannot run on {family}: {why} (diffusers {_diffusers_version()}). "
            f"It runs on: {', '.join(CACHE_FAMILIES[name])}")


def check_cache(text: str, family: str | None) -> tuple[str, float | None]:
    """``parse_cache(text)``, and ``ValueError`` saying why (and where it runs instead) when the cache
    cannot run on ``family`` (``None``: a family not known yet, not checked)."""
    parsed = parse_cache(text)
    if family is not None:
        reason = cache_unsupported_reason(text, family)
        if reason:
            raise ValueError(reason)
    return parsed


def _diffusers_version() -> str:
    import diffusers

    return diffusers.__version__


def disable_cache(transformer: Any) -> None:
    """Undo :func:`enable_cache`: cache-dit's ``disable_cache`` where cache-dit cached it,
    ``transformer.disable_cache()`` where it has one (CacheMixin), else remove the step-cache hooks
    that diffusers' ``apply_*`` functions registered on its modules."""
    if getattr(transformer, "_is_cached", False) and hasattr(transformer, "_context_manager"):
        import cache_dit

        cache_dit.disable_cache(transformer)
        return
    if hasattr(transformer, "disable_cache"):
        if getattr(transformer, "is_cache_enabled", False):
            transformer.disable_cache()
        return
    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook_name, hook in list(getattr(registry, "hooks", {}).items()):
            if type(hook).__name__ in _CACHE_HOOK_CLASSES:
                registry.remove_hook(hook_name, recurse=False)


def reset_cache_state(transformer: Any) -> None:
    """Reset the state of the step-cache hooks on ``transformer``'s modules (what a finished pipeline
    call does for CacheMixin transformers), so the next call starts like a first one."""
    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook in list(getattr(registry, "hooks", {}).values()):
            if type(hook).__name__ in _CACHE_HOOK_CLASSES and getattr(hook, "_is_stateful", False):
                hook.reset_state(registry._module_ref)


_CACHE_HOOK_CLASSES = (
    "FBCHeadBlockHook", "FBCBlockHook", "MagCacheHeadHook", "MagCacheBlockHook", "TaylorSeerCacheHook",
    "PyramidAttentionBroadcastHook", "FasterCacheBlockHook", "FasterCacheDenoiserHook",
)


# -- the option on a built pipeline --------------------------------------------------------------------
def check_cache_option(text: str, family: str | None) -> None:
    """``ValueError`` for an unknown cache spec, or one that cannot run on ``family`` (the message says
    why and on which families it runs); ``family=None`` checks the spec only."""
    check_cache(text, family)


def apply_cache(pipe: Any, text: str, family: str, steps: int) -> str:
    """Enable the step cache ``text`` on ``pipe.transformer`` (cache-dit's: on ``pipe``) for calls of
    ``steps`` steps; return a note."""
    import bcg_pipelines as pipelines

    if is_cache_dit(text):
        import cache_dit

        settings = cache_dit_settings(text)
        note = _fit_cache_dit_blocks(settings["cache_config"], pipe.transformer) if parse_cache(text)[0] != CACHE_DIT_FILE else ""
        cache_dit.enable_cache(pipe, **settings)
        return f"cache-dit {type(settings['cache_config']).__name__} on the pipeline (--cache {text}){note}"

    config = cache_config(text, pipe, family, steps, pipelines.get_family(family).cfg_mode)
    enable_cache(pipe.transformer, config)
    return f"step cache {type(config).__name__} on the transformer (--cache {text})"


@contextlib.contextmanager
def cache_passes(transformer: Any, enabled: bool) -> Iterator[CachePasses | None]:
    """``count_cache_passes(transformer)`` when ``enabled``, else ``None``. Under cache-dit: the
    transformer calls made (``calls``) and those cache-dit computed (``computed``) in the block,
    read from ``cache_dit.summary``."""
    from bcg_diffusion import CachePasses, count_cache_passes

    if not enabled:
        yield None
        return
    if getattr(transformer, "_is_cached", False) and hasattr(transformer, "_context_manager"):
        passes = CachePasses()
        yield passes
        calls, cached = cache_dit_steps(transformer)
        passes.calls, passes.computed = calls, calls - cached
        return
    with count_cache_passes(transformer) as passes:
        yield passes


def cache_dit_steps(transformer: Any) -> tuple[int, int]:
    """(transformer calls, of which cache-dit reused cached residuals) of the last pipeline call, as
    its summary counts them (CFG branches apart; the block list that caches most where there are several)."""
    import cache_dit

    calls = cached = 0
    for stats in cache_dit.summary(transformer, details=False, logging=False):
        executed = getattr(stats, "accumulated_transformer_executed_steps", 0) or 0
        reused = len(stats.cached_steps or []) + len(stats.cfg_cached_steps or [])
        reused += len(stats.pruned_steps or []) + len(stats.cfg_pruned_steps or [])
        calls, cached = max(calls, executed), max(cached, reused)
    return calls, cached
