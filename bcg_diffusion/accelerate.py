"""``accelerate_pipeline`` / ``accelerate_transformer`` / ``remove_acceleration``.

Everything done to a model is recorded in an :class:`_Acceleration` stored on it, whose
``undo`` restores the original forward exactly and releases every global patch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_breaks, fingerprint
from .config import ENV_ENABLE, BCGConfig, env_flag
from .families import transformer_info
from .runner import GraphRunner
from .stats import BCGStats, GraphEntryStats

logger = logging.getLogger("bcg_diffusion")

_ATTR = "_bcg_acceleration"
_MISSING = object()
_warned: set[str] = set()


class AccelerationError(RuntimeError):
    """Acceleration cannot be applied as asked; the message says what to change."""


@dataclass
class _Acceleration:
    runners: list[GraphRunner] = field(default_factory=list)
    undos: list[Callable[[], None]] = field(default_factory=list)

    def undo(self) -> None:
        while self.undos:
            self.undos.pop()()


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


def _check_composable(module: torch.nn.Module, owner: str) -> None:
    if getattr(module, "_hf_hook", None) is not None:
        raise AccelerationError(
            f"{owner} has accelerate offload hooks (enable_model_cpu_offload / enable_sequential_cpu_offload / "
            "device_map): weights move between CPU and GPU per call, which a CUDA graph cannot replay. "
            "Turn offloading off (keep the transformer on the GPU) before accelerate_pipeline."
        )
    registry = getattr(module, "_diffusers_hook", None)
    hooks = getattr(registry, "hooks", {}) or {}
    blocked = [name for name in hooks if "offload" in name or "cache" in name or "fbc" in name]
    if blocked:
        raise AccelerationError(
            f"{owner} has diffusers hooks {blocked} (group offloading or caching hooks read values on the host "
            "per call and cannot be captured). Disable them (e.g. disable_cache()) before accelerate_pipeline."
        )
    compiled = getattr(module, "_orig_mod", None)
    if compiled is not None:
        raise AccelerationError(
            f"{owner} is a whole-model torch.compile wrapper; accelerate the original module and compile its "
            "blocks (compile_repeated_blocks) instead."
        )


def accelerate_transformer(module: torch.nn.Module, config: BCGConfig | None = None) -> torch.nn.Module:
    """Make ``module``'s calls replay breakable CUDA graphs; returns ``module``.

    Needs a known transformer class (or ``config.allow_unknown``) on a CUDA device. Without CUDA,
    or with ``BCG_DIFFUSION=0``, it is a no-op with one warning. Raises
    :class:`AccelerationError` when ``module`` is already accelerated or cannot compose (offload).
    """
    config = _checked_config(config)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"accelerate_transformer needs a torch.nn.Module, got {type(module).__name__}")
    reason = _disabled_reason()
    if reason is not None:
        _warn_once(reason)
        return module
    if getattr(module, _ATTR, None) is not None:
        raise AccelerationError(
            f"{type(module).__name__} is already accelerated; call remove_acceleration() first to change the config"
        )
    info = transformer_info(module, config.allow_unknown)
    _check_composable(module, type(module).__name__)
    acceleration = _Acceleration()
    try:
        _attach(module, config, info, acceleration)
    except BaseException:
        acceleration.undo()
        raise
    setattr(module, _ATTR, acceleration)
    return module


def _attach(module: torch.nn.Module, config: BCGConfig, info: Any, acceleration: _Acceleration) -> None:
    previous = module.__dict__.get("forward", _MISSING)
    if config.check_weights == "auto":
        config = dataclasses.replace(config, check_weights="every_call")
    runner = GraphRunner(module, module.forward, config, info)
    acceleration.runners.append(runner)
    acceleration.undos.append(runner.close)
    fingerprint.acquire_registration_hooks()
    acceleration.undos.append(fingerprint.release_registration_hooks)
    acceleration.undos.append(attention_breaks.install(module, info.eager_functions))
    module.forward = runner

    def restore_forward() -> None:
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = previous

    acceleration.undos.append(restore_forward)


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


def accelerate_pipeline(pipe: Any, config: BCGConfig | None = None) -> Any:
    """Accelerate every transformer of a diffusers pipeline (``transformer``, ``transformer_2``).

    Returns ``pipe``. A second call raises :class:`AccelerationError`; ``remove_acceleration``
    undoes it. Offloaded pipelines raise with what to turn off. Without CUDA, or with
    ``BCG_DIFFUSION=0``, a no-op with one warning.
    """
    config = _checked_config(config)
    reason = _disabled_reason()
    if reason is not None:
        _warn_once(reason)
        return pipe
    if getattr(pipe, _ATTR, None) is not None:
        raise AccelerationError(
            f"this {type(pipe).__name__} is already accelerated; call remove_acceleration(pipe) first"
        )
    if getattr(pipe, "_offload_gpu_id", None) is not None and getattr(pipe, "_all_hooks", None):
        raise AccelerationError(
            f"{type(pipe).__name__} has model CPU offload enabled: the transformer moves between CPU and GPU per "
            "call, which a CUDA graph cannot replay. Call pipe.remove_all_hooks() and pipe.to('cuda') first."
        )
    transformers = _transformers_of(pipe)
    for name, module in transformers:
        transformer_info(module, config.allow_unknown)
        _check_composable(module, f"pipe.{name}")
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
    setattr(pipe, _ATTR, [m for _, m in transformers])
    _wrap_pipeline_call(pipe)
    return pipe


_call_wrappers: dict[type, type] = {}


def _wrap_pipeline_call(pipe: Any) -> None:
    """Give ``pipe`` a same-named subclass whose ``__call__`` first invalidates the weight
    fingerprints (so weights are checked once per pipeline call); undone by restoring the class."""
    cls = type(pipe)
    wrapper = _call_wrappers.get(cls)
    if wrapper is None:
        original_call = cls.__call__

        @functools.wraps(original_call)  # keeps inspect.signature(pipe.__call__) and the docstring
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            for runner in _runners(self):
                runner.fingerprint.invalidate()
            return original_call(self, *args, **kwargs)

        wrapper = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "__qualname__": cls.__qualname__, "_bcg_wrapped_class": cls})
        _call_wrappers[cls] = wrapper
    pipe.__class__ = wrapper


def _unwrap_pipeline_call(pipe: Any) -> None:
    original = type(pipe).__dict__.get("_bcg_wrapped_class")
    if original is not None:
        pipe.__class__ = original


def _remove_from_module(module: torch.nn.Module) -> bool:
    acceleration = module.__dict__.pop(_ATTR, None)
    if acceleration is None:
        return False
    acceleration.undo()
    return True


def remove_acceleration(obj: Any) -> Any:
    """Undo :func:`accelerate_pipeline` or :func:`accelerate_transformer`: the original forward is
    restored exactly, graphs are freed and global patches released. Returns ``obj``. A no-op on
    something not accelerated."""
    modules = obj.__dict__.pop(_ATTR, None) if not isinstance(obj, torch.nn.Module) else None
    if isinstance(obj, torch.nn.Module):
        _remove_from_module(obj)
    elif modules is not None:
        _unwrap_pipeline_call(obj)
    for module in modules or []:
        _remove_from_module(module)
    return obj


def _runners(obj: Any) -> list[GraphRunner]:
    if isinstance(obj, torch.nn.Module):
        acceleration = obj.__dict__.get(_ATTR)
        return list(acceleration.runners) if acceleration is not None else []
    return [r for m in getattr(obj, _ATTR, None) or [] for r in _runners(m)]


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
                )
            )
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
    )


def clear_graphs(obj: Any) -> None:
    """Free every captured graph of an accelerated pipeline or transformer (recaptured on demand);
    use after writing weights through ``param.data``, which the weight fingerprint cannot see."""
    for runner in _runners(obj):
        runner.clear()
