"""cache-dit settings and twins for the CPU (debug mode) and GPU tests of cache-dit under BCG.

Every setting is chosen so that the eager twin's decisions change from step to step (some steps
cached, some computed): a threshold every step passes, with ``max_continuous_cached_steps=1``,
alternates cached and computed steps after the warm-up steps, whatever the random weights give.
"""

from __future__ import annotations

import cache_dit
import torch
from cache_dit import DBCacheConfig, DBPruneConfig, TaylorSeerCalibratorConfig

import bcg_diffusion as bcg
from _pipes import build, run

STEPS = 8
LAYERS = 3  # blocks per block list of the deeper tiny transformers (Fn + Bn below the block count)


def settings(case: str, steps: int = STEPS, threshold: float | None = None) -> dict:
    """``enable_cache`` keyword arguments of one case (fresh objects: cache-dit keeps and mutates them).
    ``threshold``: the residual-difference threshold of ``dbcache_threshold`` (see :func:`median_threshold`)."""
    mixed = dict(residual_diff_threshold=100.0, max_warmup_steps=2, max_continuous_cached_steps=1)
    if case == "dbcache":
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, **mixed))
    if case == "dbcache_f2b1":
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=2, Bn_compute_blocks=1, **mixed))
    if case == "dbcache_threshold":  # decisions from the measured residual differences themselves
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=2,
                                               residual_diff_threshold=threshold if threshold is not None else 0.5))
    if case == "dbprune":
        return dict(cache_config=DBPruneConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=2,
                                               residual_diff_threshold=100.0, max_continuous_cached_steps=1))
    if case == "taylorseer":
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, **mixed),
                    calibrator_config=TaylorSeerCalibratorConfig(taylorseer_order=1))
    if case == "scm":
        mask = cache_dit.steps_mask(compute_bins=[3, 1, 1], cache_bins=[2, 1, 1], total_steps=steps)
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=2,
                                               residual_diff_threshold=100.0, steps_computation_mask=mask,
                                               steps_computation_policy="dynamic"))
    if case == "separate_cfg":
        return dict(cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, enable_separate_cfg=True, **mixed))
    raise ValueError(f"unknown cache-dit case {case!r}")


def deeper(pipe, seed: int = 0):
    """``pipe`` with its tiny transformer rebuilt with :data:`LAYERS` blocks per list (same seed,
    same weights for twins), so that Fn and Bn blocks are not all the blocks."""
    old = pipe.transformer
    config = dict(old.config)
    changed = {k: LAYERS for k in ("num_layers", "num_single_layers") if k in config}
    if not changed:
        return pipe
    config.update(changed)
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    torch.manual_seed(seed)
    with torch.device(old.device):
        new = type(old)(**config).to(old.dtype).eval()
    pipe.register_modules(transformer=new)
    return pipe


def twins(family: str, device: str, dtype=torch.float32, layers: bool = True):
    """An eager pipeline and its twin (same seed, same weights) for one family."""
    pipes = [build(family, device=device, dtype=dtype), build(family, device=device, dtype=dtype)]
    return [deeper(p) for p in pipes] if layers else pipes


def cached_steps(pipe_or_transformer) -> list:
    """What cache-dit's summary lists per cache context: cached steps (DBCache) or pruned steps."""
    return [(s.cached_steps, s.cfg_cached_steps, s.pruned_steps, s.cfg_pruned_steps)
            for s in cache_dit.summary(pipe_or_transformer)]


def median_threshold(family: str, device: str, steps: int = STEPS, dtype=torch.float32) -> float:
    """The median residual difference cache-dit measures for ``family``'s deeper tiny pipeline
    over ``steps`` steps (caching nothing): a threshold that caches about half the steps."""
    pipe = deeper(build(family, device=device, dtype=dtype))
    cache_dit.enable_cache(pipe, cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0, max_warmup_steps=2,
                                                            residual_diff_threshold=1e-6))
    generate(pipe, family, steps)
    diffs = sorted(v for s in cache_dit.summary(pipe) for v in s.residual_diffs.values())
    cache_dit.disable_cache(pipe)
    return float(diffs[len(diffs) // 2])


def enable(pipe, case: str, steps: int = STEPS, order: str = "cache_first", config=None, target=None, threshold=None):
    """Enable cache-dit (``case``) and BCG on ``pipe`` in ``order`` ("cache_first" or
    "bcg_first"); ``config=None`` leaves BCG off (the eager twin)."""
    target = pipe if target is None else target
    if config is not None and order == "bcg_first":
        bcg.accelerate_pipeline(pipe, config)
    cache_dit.enable_cache(target, **settings(case, steps, threshold))
    if config is not None and order == "cache_first":
        bcg.accelerate_pipeline(pipe, config)
    return pipe


def generate(pipe, family: str, steps: int = STEPS):
    return run(pipe, family, steps=steps)


def mixed(steps_lists: list) -> bool:
    """True when some step was cached (or pruned) and some computed, in some context."""
    flat = [s for entry in steps_lists for lists in entry for s in lists]
    return bool(flat)
