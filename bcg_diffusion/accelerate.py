"""``accelerate_pipeline`` / ``accelerate_transformer`` / ``remove_acceleration``.

Everything done to a model is local to it: a ``bcg_graphs`` diffusers hook at the bottom of the
transformer's hook chain (the graph runner), the interceptors of its hooked submodules, and
reference-counted attention-break patches; an :class:`_Acceleration` record stored on the module
undoes all of it. A pipeline carries no state of its own: it is accelerated when its transformer
components are, so pipelines sharing components (``from_pipe``) share the acceleration.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .core import _cudart
from .integration import fingerprint
from .config import ENV_ENABLE, BCGConfig, env_flag
from .errors import AccelerationError
from .families import transformer_info
from .integration.model_hooks import DEEPCOPY_MESSAGE, ForwardHook, insert_innermost, remove_exactly
from .integration.runner import GraphRunner
from .stats import BCGStats, GraphEntryStats

logger = logging.getLogger("bcg_diffusion")

_ATTR = "_bcg_acceleration"
GRAPHS_HOOK = "bcg_graphs"
_warned: set[str] = set()

__all__ = ["AccelerationError"]


@dataclass
class _Acceleration:
    runner: GraphRunner
    undos: list[Callable[[], None]] = field(default_factory=list)

    def undo(self) -> None:
        while self.undos:
            self.undos.pop()()

    def __deepcopy__(self, memo: dict) -> Any:
        raise AccelerationError(DEEPCOPY_MESSAGE)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _checked_config(config: Any) -> BCGConfig:
    if config is None:
        config = BCGConfig()
    if not isinstance(config, BCGConfig):
        raise TypeError(
            f"config must be a bcg_diffusion.BCGConfig, got {type(config).__name__}; e.g. BCGConfig(debug=True)"
        )
    return config.with_environment()


def _disabled_reason() -> str | None:
    if not env_flag(ENV_ENABLE, default=True):
        return f"{ENV_ENABLE}=0 is set: acceleration is off and the model runs eagerly"
    if not torch.cuda.is_available():
        return "bcg-diffusion needs a CUDA GPU; none is available, so the model runs eagerly"
    return None


def _load_capture_runtime() -> None:
    """Import cuda-bindings now: its one-time import cost is paid at set-up, not by the first
    capture, and a missing package is named here."""
    try:
        _cudart.cudart()
    except RuntimeError as exc:
        raise AccelerationError(str(exc)) from None


def _check_module(module: Any) -> torch.nn.Module:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"accelerate_transformer needs a torch.nn.Module (a diffusers transformer), got {type(module).__name__}; "
            "use accelerate_pipeline for a pipeline"
        )
    if getattr(module, "_orig_mod", None) is not None:
        raise AccelerationError(
            f"{type(module).__name__} is a whole-model torch.compile wrapper; accelerate the original module and "
            "compile its blocks (compile_repeated_blocks) instead."
        )
    return module


def _transformers_of(pipe: Any) -> list[tuple[str, torch.nn.Module]]:
    components = getattr(pipe, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"accelerate_pipeline needs a diffusers pipeline (with .components), got {type(pipe).__name__}; "
            "use accelerate_transformer for a bare transformer"
        )
    found = [
        (name, comp)
        for name, comp in components.items()
        if isinstance(comp, torch.nn.Module) and name.startswith("transformer")
    ]
    if not found:
        raise AccelerationError(f"{type(pipe).__name__} has no transformer component to accelerate")
    return found


def accelerate_transformer(module: torch.nn.Module, config: BCGConfig | None = None) -> torch.nn.Module:
    """Make ``module``'s calls replay breakable CUDA graphs; returns ``module``.

    Needs a known transformer class (or ``config.allow_unknown``) on a CUDA device. Without CUDA,
    or with ``BCG_DIFFUSION=0``, it is a no-op with one warning (arguments are checked first, on
    every machine). Raises :class:`AccelerationError` when ``module`` is already accelerated or
    carries something a replay cannot reproduce (offloading, layerwise casting, ...).
    """
    module = _check_module(module)
    config = _checked_config(config)
    reason = _disabled_reason()
    if reason is not None:
        _warn_once(reason)
        return module
    if module.__dict__.get(_ATTR) is not None:
        raise AccelerationError(
            f"{type(module).__name__} is already accelerated; call remove_acceleration() first to change the config"
        )
    info = transformer_info(module, config.allow_unknown)
    _load_capture_runtime()
    if config.check_weights == "auto":
        config = dataclasses.replace(config, check_weights="every_call")
    runner = GraphRunner(module, config, info)
    acceleration = _Acceleration(runner)
    acceleration.undos.append(runner.close)
    try:
        fingerprint.acquire_registration_hooks()
        acceleration.undos.append(fingerprint.release_registration_hooks)
        hook = ForwardHook(runner.bind, stateful_reset=runner.on_pipeline_call_end)
        insert_innermost(module, hook, GRAPHS_HOOK)
        acceleration.undos.append(lambda: remove_exactly(module, GRAPHS_HOOK))
        runner._follow_structure()  # refusals (offloading, casting) raise here, not at the first call
        runner.state.invalidate()  # and the first call reads again what changed since (a cache enabled now)
    except BaseException:
        acceleration.undo()
        raise
    module.__dict__[_ATTR] = acceleration
    return module


def accelerate_pipeline(pipe: Any, config: BCGConfig | None = None) -> Any:
    """Accelerate every transformer of a diffusers pipeline (``transformer``, ``transformer_2``).

    Returns ``pipe``. Raises :class:`AccelerationError` if a transformer is already accelerated
    (``remove_acceleration`` undoes it) or the pipeline offloads models. Without CUDA, or with
    ``BCG_DIFFUSION=0``, a no-op with one warning (arguments are checked first, on every machine).
    Weights and model structure are re-read once per pipeline call (at its end, through diffusers'
    ``maybe_free_model_hooks``), for every pipeline sharing the transformer.
    """
    transformers = _transformers_of(pipe)
    config = _checked_config(config)
    reason = _disabled_reason()
    if reason is not None:
        _warn_once(reason)
        return pipe
    accelerated = [name for name, module in transformers if module.__dict__.get(_ATTR) is not None]
    if accelerated:
        raise AccelerationError(
            f"this {type(pipe).__name__} is already accelerated ({', '.join(accelerated)}); call "
            "remove_acceleration(pipe) first"
        )
    if getattr(pipe, "_offload_gpu_id", None) is not None and getattr(pipe, "_all_hooks", None):
        raise AccelerationError(
            f"{type(pipe).__name__} has model CPU offload enabled: the transformer moves between CPU and GPU per "
            "call, which a CUDA graph cannot replay. Call pipe.remove_all_hooks() and pipe.to('cuda') first."
        )
    for _, module in transformers:
        transformer_info(module, config.allow_unknown)
        _check_module(module)
    if config.check_weights == "auto":
        config = dataclasses.replace(config, check_weights="per_pipeline_call")
    done: list[torch.nn.Module] = []
    try:
        for _, module in transformers:
            accelerate_transformer(module, config)
            done.append(module)
    except BaseException:
        for module in done:
            _remove_from_module(module)
        raise
    return pipe


def _remove_from_module(module: torch.nn.Module) -> bool:
    acceleration = module.__dict__.pop(_ATTR, None)
    if acceleration is None:
        return False
    acceleration.undo()
    return True


def remove_acceleration(obj: Any) -> Any:
    """Undo :func:`accelerate_pipeline` or :func:`accelerate_transformer`: graphs are freed, every
    hook and patch is removed (hooks others registered meanwhile stay), the original forward runs
    again. Returns ``obj``. A no-op for a pipeline or module that is not accelerated; a
    ``TypeError`` for anything else. On a pipeline it acts on its transformer components, so
    pipelines sharing them (``from_pipe``) are all affected."""
    if isinstance(obj, torch.nn.Module):
        _remove_from_module(obj)
        return obj
    components = getattr(obj, "components", None)
    if not isinstance(components, dict):
        raise TypeError(
            f"remove_acceleration needs a diffusers pipeline or a torch.nn.Module, got {type(obj).__name__}"
        )
    for component in components.values():
        if isinstance(component, torch.nn.Module):
            _remove_from_module(component)
    return obj


def _runners(obj: Any) -> list[GraphRunner]:
    if isinstance(obj, torch.nn.Module):
        acceleration = obj.__dict__.get(_ATTR)
        return [acceleration.runner] if acceleration is not None else []
    components = getattr(obj, "components", None)
    if not isinstance(components, dict):
        return []
    return [r for c in components.values() if isinstance(c, torch.nn.Module) for r in _runners(c)]


def is_accelerated(obj: Any) -> bool:
    """True when ``obj`` (pipeline or transformer) is accelerated."""
    return bool(_runners(obj))


def get_stats(obj: Any) -> BCGStats | None:
    """Captured keys, segments and breaks per key, capture time, graph memory, hits and misses of an
    accelerated pipeline or transformer; ``None`` when it is not accelerated."""
    runners = _runners(obj)
    if not runners:
        return None
    entries = []
    for runner in runners:
        for entry in runner.entries.values():
            entries.append(
                GraphEntryStats(
                    key=entry.key.summary(),
                    segments=entry.segments,
                    breaks=entry.breaks,
                    capture_time_s=entry.capture_time_s,
                    memory_bytes=entry.memory_bytes,
                    hits=entry.hits,
                    fallback=entry.fallback,
                    eager_modules=tuple(entry.eager_modules),
                    capture_phases=tuple(entry.phases.items()),
                )
            )
    passes = [r.cache_passes() for r in runners]
    return BCGStats(
        transformer=", ".join(type(r.module).__name__ for r in runners),
        debug=any(r.config.debug for r in runners),
        hits=sum(e.hits for r in runners for e in r.entries.values() if e.fallback is None),
        misses=sum(r.misses for r in runners),
        captures=sum(r.captures for r in runners),
        eager_calls=sum(r.eager_calls for r in runners),
        capture_time_s=sum(e.capture_time_s for e in entries),
        graph_memory_bytes=sum(e.memory_bytes for e in entries),
        entries=tuple(entries),
        structure_changes=sum(r.structure_changes for r in runners),
        warmup_calls=sum(r.warmup_calls for r in runners),
        hooked_module_calls=sum(c for c, _ in passes),
        hooked_module_computed=sum(d for _, d in passes),
    )


def clear_graphs(obj: Any) -> None:
    """Free every captured graph of an accelerated pipeline or transformer (recaptured on demand);
    use after writing weights through ``param.data``, which the weight fingerprint cannot see."""
    for runner in _runners(obj):
        runner.clear()
