"""What BCG accepts under diffusers parallelism, and clear refusals for the rest.

Accepted: context parallelism (``ContextParallelConfig`` with ``ulysses_degree`` and/or
``ring_degree``) with even shards. Refused, each with an :class:`AccelerationError` saying what to
do: tensor parallelism; the ``ulysses_anything`` / ``ring_anything`` modes (uneven shards: each
attention exchanges sizes with a host synchronisation, and ranks may get other graph keys);
``BCGConfig(compile=True)`` (the whole-forward compile would trace the gather's collective into
the captured graph); step caches that decide on the host from the rank's own shard (FirstBlockCache,
MagCache: ranks may skip different blocks and wait for each other forever, even without BCG); a
module carrying both a context-parallel hook and another hook (the other hook's captured body would
see the unsplit input); ``BCGConfig.eager_modules`` holding attention or a context-parallel hook
(an eager module runs for real during a capture, and its collectives would run there).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks._common import _ATTENTION_CLASSES

from ..errors import AccelerationError
from .model_state import INLINE_HOOKS, diffusers_hook_names

# diffusers hooks whose decisions read the rank's own shard on the host
PER_RANK_CACHE_HOOKS: dict[str, str] = {
    "FBCHeadBlockHook": "FirstBlockCache",
    "FBCBlockHook": "FirstBlockCache",
    "MagCacheHeadHook": "MagCache",
    "MagCacheBlockHook": "MagCache",
}
DETERMINISTIC_CACHES = "TaylorSeer, PyramidAttentionBroadcast or FasterCache"


def context_parallel_config(module: torch.nn.Module) -> Any:
    """The ``ContextParallelConfig`` of ``module`` (set by ``enable_parallelism``), ``None`` without
    parallelism; raises :class:`AccelerationError` for the parallel set-ups BCG refuses."""
    parallel = getattr(module, "_parallel_config", None)
    if parallel is None:
        return None
    name = type(module).__name__
    if getattr(parallel, "tensor_parallel_config", None) is not None:
        raise AccelerationError(
            f"{name} has diffusers tensor parallelism enabled: BCG does not replay tensor-parallel transformers (their "
            "all-reduces sit between the projections, inside what BCG captures). Use context parallelism "
            "(ContextParallelConfig(ulysses_degree=N) or ring_degree=N) under BCG, or run tensor parallelism without "
            "accelerate_pipeline; see docs/multi-gpu.md."
        )
    cp = getattr(parallel, "context_parallel_config", None)
    if cp is None:
        raise AccelerationError(
            f"{name} has a diffusers parallel config without context parallelism ({type(parallel).__name__}); BCG "
            "accepts ContextParallelConfig only (docs/multi-gpu.md)."
        )
    anything = [m for m in ("ulysses_anything", "ring_anything") if getattr(cp, m, False)]
    if anything:
        raise AccelerationError(
            f"{name} uses ContextParallelConfig({anything[0]}=True): uneven shards exchange their sizes with a host "
            "synchronisation in every attention and may give the ranks different graph keys, so BCG does not replay "
            f"it. Use shapes that split evenly with {anything[0]}=False (docs/multi-gpu.md, 'Shapes that split evenly')."
        )
    return cp


def check_config(module: torch.nn.Module, config: Any) -> None:
    """Refuse the :class:`~bcg_diffusion.BCGConfig` settings that cannot run under context parallelism."""
    if config.compile:
        raise AccelerationError(
            f"BCGConfig(compile=True) compiles {type(module).__name__}'s whole forward, which under context parallelism "
            "would trace diffusers' output gather (a collective) into the captured graph. Compile the blocks "
            "(transformer.compile_repeated_blocks()) and leave compile=False."
        )


def check_structure(root: torch.nn.Module, eager_module_names: list[str]) -> None:
    """Refuse hooks and eager modules that break lockstep under context parallelism (see the
    module docstring). Cheap enough for every structure change (one pass over the modules)."""
    name = type(root).__name__
    for path, module in root.named_modules():
        hooks = diffusers_hook_names(module)
        if not hooks:
            continue
        owner = f"{name}.{path}" if path else name
        for hook in hooks:
            cache = PER_RANK_CACHE_HOOKS.get(hook)
            if cache is not None:
                raise AccelerationError(
                    f"{owner} has {cache}'s hook {hook}: under context parallelism each rank decides on its own shard "
                    "whether to skip blocks, so ranks may take different paths and wait for each other forever (with or "
                    f"without BCG). Disable it (transformer.disable_cache()) or use {DETERMINISTIC_CACHES}, which decide "
                    "by step and agree on every rank."
                )
        others = [h for h in hooks if h not in INLINE_HOOKS]
        others += [f"torch:{a.strip('_')}" for a in ("_forward_pre_hooks", "_forward_hooks") if module.__dict__.get(a)]
        if path and others and any(h in INLINE_HOOKS for h in hooks):
            raise AccelerationError(
                f"{owner} has diffusers' context-parallel hook and {', '.join(others)}: the other hook's captured body "
                "would see the input before the split. Put the other hook on another module (or remove it)."
            )
    for path in eager_module_names:
        if path.endswith("()"):
            continue  # methods and functions: no attention module of their own
        module = root.get_submodule(path) if path else root
        holds = _attention_or_split(module)
        if holds is not None:
            raise AccelerationError(
                f"BCGConfig.eager_modules names {path!r}, which holds {holds}: an eager module runs for real during a "
                "capture, so under context parallelism its collectives would run there on this rank alone. Name a "
                "module without attention, or leave eager_modules empty."
            )


def _attention_or_split(module: torch.nn.Module) -> str | None:
    for sub_path, sub in module.named_modules():
        where = f" ({sub_path})" if sub_path else ""
        if isinstance(sub, _ATTENTION_CLASSES):
            return f"an attention module{where}"
        if any(h in INLINE_HOOKS for h in diffusers_hook_names(sub)):
            return f"a context-parallel hook{where}"
    return None
