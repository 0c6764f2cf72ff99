"""The ``--cache SPEC`` option of the commands on a built pipeline: a diffusers step cache on its transformer
(made by the recipes of :mod:`.cache_recipes`) or a cache-dit cache on the whole pipeline.

Used by ``generate --cache``, the benchmark's ``--cache-rows`` and the tests. A spec is read once into a
:class:`~.cache_spec.CacheSpec` (the functions here take one, or its text); this module checks it against a
family, enables and disables it, resets its state between runs and counts what it computed and reused
(:func:`cache_passes`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from .cache_recipes import CACHE_FAMILIES, CacheContext, recipe
from .cache_spec import CACHE_DIT_FILE, CACHE_HELP, CACHE_NAMES, CacheSpec, as_spec

if TYPE_CHECKING:  # imported where used
    from bcg_diffusion import CachePasses

__all__ = ["CACHE_FAMILIES", "CACHE_HELP", "CACHE_NAMES", "CacheSpec", "apply_cache", "cache_config",
           "cache_dit_settings", "cache_passes", "cache_unsupported_reason", "check_cache", "disable_cache",
           "enable_cache", "reset_cache_state"]

def cache_dit_settings(spec: CacheSpec | str) -> dict[str, Any]:
    """``cache_dit.enable_cache`` keyword arguments for a cache-dit spec (fresh objects each call)."""
    import cache_dit

    spec = as_spec(spec)
    name, value = spec.name, spec.value
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


def cache_config(spec: CacheSpec | str, pipe: Any, family: str, num_inference_steps: int, cfg_mode: str) -> Any:
    """The diffusers cache config for ``spec`` on ``pipe`` (a pipeline of ``family``), from its recipe."""
    spec = as_spec(spec)
    return recipe(spec).config(spec, CacheContext(pipe, family, num_inference_steps, cfg_mode))


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


def cache_unsupported_reason(spec: CacheSpec | str, family: str) -> str | None:
    """Why the cache ``spec`` cannot run on ``family`` (``None`` where it runs); ``ValueError`` for an
    unknown cache."""
    spec = as_spec(spec)
    if spec.is_cache_dit:
        return None  # cache-dit says itself which pipelines it adapts (cache_dit.supported_pipelines())
    steps = recipe(spec)
    if family in steps.families:
        return None
    why = steps.why_not.get(family, "it was not checked with this cache")
    return (f"cache {spec.name!r} cannot run on {family}: {why} (diffusers {_diffusers_version()}). "
            f"It runs on: {', '.join(steps.families)}")


def check_cache(spec: CacheSpec | str, family: str | None) -> CacheSpec:
    """``spec`` (parsed where it is text), or ``ValueError`` saying why (and where it runs instead) when the
    cache cannot run on ``family`` (``None``: a family not known yet, not checked)."""
    spec = as_spec(spec)
    if family is not None:
        reason = cache_unsupported_reason(spec, family)
        if reason:
            raise ValueError(reason)
    return spec


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
    from bcg_diffusion import STEP_CACHE_HOOK_NAMES

    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook_name, hook in list(getattr(registry, "hooks", {}).items()):
            if type(hook).__name__ in STEP_CACHE_HOOK_NAMES:
                registry.remove_hook(hook_name, recurse=False)


def reset_cache_state(transformer: Any) -> None:
    """Reset the state of the step-cache hooks on ``transformer``'s modules (what a finished pipeline
    call does for CacheMixin transformers), so the next call starts like a first one."""
    from bcg_diffusion import STEP_CACHE_HOOK_NAMES

    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook in list(getattr(registry, "hooks", {}).values()):
            if type(hook).__name__ in STEP_CACHE_HOOK_NAMES and getattr(hook, "_is_stateful", False):
                hook.reset_state(registry._module_ref)


# -- the option on a built pipeline --------------------------------------------------------------------
def apply_cache(pipe: Any, spec: CacheSpec | str, family: str, steps: int) -> str:
    """Enable the step cache ``spec`` on ``pipe.transformer`` (cache-dit's: on ``pipe``) for calls of
    ``steps`` steps; return a note."""
    import bcg_pipelines as pipelines

    spec = as_spec(spec)
    if spec.is_cache_dit:
        import cache_dit

        settings = cache_dit_settings(spec)
        note = _fit_cache_dit_blocks(settings["cache_config"], pipe.transformer) if spec.name != CACHE_DIT_FILE else ""
        cache_dit.enable_cache(pipe, **settings)
        return f"cache-dit {type(settings['cache_config']).__name__} on the pipeline (--cache {spec.text}){note}"

    config = cache_config(spec, pipe, family, steps, pipelines.get_family(family).cfg_mode)
    enable_cache(pipe.transformer, config)
    return f"step cache {type(config).__name__} on the transformer (--cache {spec.text})"


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
