"""``accelerate_pipeline`` / ``accelerate_transformer`` / ``remove_acceleration``.

What is done to a model: a ``bcg_graphs`` diffusers hook at the bottom of the transformer's hook
chain (the graph runner), a guard in its instance ``_call_impl`` that follows what is assigned to
its ``forward``, the interceptors of its hooked submodules; and, shared by every accelerated
transformer of the process, the attention-break patches of diffusers' and torch's attention
functions and the module registration hooks (reference-counted: the last removal undoes them).
An :class:`_Acceleration` record stored on the module undoes all of it. A pipeline carries no state of its own: it is accelerated when its transformer
components are, so pipelines sharing components (``from_pipe``) share the acceleration.

With ``BCGConfig(offload=...)`` each transformer's weights are streamed first (:mod:`.integration.offload`), also
where acceleration is off (the model then streams eagerly); removing the acceleration removes that streaming.
Streaming applied by the user beforehand (:func:`~bcg_diffusion.apply_weight_streaming`) is used and left on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .core import cuda_runtime
from .integration import fingerprint
from .config import ENV_ENABLE, BCGConfig, env_flag
from .errors import AccelerationError
from .families import is_transformer_component, transformer_info
from .integration.model_hooks import DEEPCOPY_MESSAGE, ForwardHook, insert_innermost, remove_exactly
from .integration.offload import start_streaming, streaming_of
from .integration.runner import GraphRunner
from .stats import BCGStats, OffloadStats

logger = logging.getLogger("bcg_diffusion")

_ATTR = "_bcg_acceleration"
_INACTIVE_ATTR = "_bcg_inactive_reason"  # on a model that accelerate_* left eager (no CUDA, BCG_DIFFUSION=0)
GRAPHS_HOOK = "bcg_graphs"
_warned: set[str] = set()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

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
    """Warn once per process, at the caller's line: the first frame outside this package (the user's
    ``accelerate_pipeline(pipe)``, not a line of the library)."""
    if message not in _warned:
        _warned.add(message)
        frame, level = sys._getframe(), 1
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame, level = frame.f_back, level + 1
        warnings.warn(message, RuntimeWarning, stacklevel=level)


def _checked_config(config: Any) -> BCGConfig:
    if config is None:
        config = BCGConfig()
    if not isinstance(config, BCGConfig):
        raise TypeError(
            f"config must be a bcg_diffusion.BCGConfig, got {type(config).__name__}; e.g. BCGConfig(debug=True)"
        )
    return config.with_environment()


def _disabled_reason(config: BCGConfig) -> str | None:
    if not env_flag(ENV_ENABLE, default=True):
        return f"{ENV_ENABLE}=0 is set: acceleration is off and the model runs eagerly"
    if not torch.cuda.is_available() and not config.debug:
        return "bcg-diffusion needs a CUDA GPU; none is available, so the model runs eagerly"
    return None


def _load_capture_runtime() -> None:
    """Import cuda-bindings now: its one-time import cost is paid at set-up, not by the first
    capture, and a missing package is named here."""
    try:
        cuda_runtime()
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
        if isinstance(comp, torch.nn.Module) and is_transformer_component(name)
    ]
    if not found:
        raise AccelerationError(f"{type(pipe).__name__} has no transformer component to accelerate")
    return found


def _prepared(config: Any) -> tuple[BCGConfig, str | None]:
    """The checked config and why acceleration is off on this machine (``None`` when it is on)."""
    config = _checked_config(config)
    reason = _disabled_reason(config)
    if reason is not None:
        _warn_once(reason)
    elif not torch.cuda.is_available():
        logger.info("bcg: debug mode without CUDA: calls on CPU tensors run the break structure eagerly, capturing nothing")
    return config, reason


def _refuse_accelerated(owner: str, modules: list[tuple[str, torch.nn.Module]], what_to_call: str) -> None:
    accelerated = [name for name, module in modules if module.__dict__.get(_ATTR) is not None]
    if accelerated:
        raise AccelerationError(f"{owner} is already accelerated ({', '.join(accelerated)}); call {what_to_call} first")


def accelerate_transformer(module: torch.nn.Module, config: BCGConfig | None = None) -> torch.nn.Module:
    """Make ``module``'s calls replay breakable CUDA graphs; returns ``module``.

    Needs a known transformer class (or ``config.allow_unknown``) on a CUDA device. Without CUDA,
    or with ``BCG_DIFFUSION=0``, it is a no-op with one warning (arguments are checked first, on
    every machine). Raises :class:`AccelerationError` when ``module`` is already accelerated or
    carries something a replay cannot reproduce (offloading, layerwise casting, ...).
    """
    module = _check_module(module)
    config, reason = _prepared(config)
    if reason is not None:
        _stream_inactive([module], config, reason)
        return module
    _refuse_accelerated(type(module).__name__, [("transformer", module)], "remove_acceleration() to change the config")
    info = transformer_info(module, config.allow_unknown)
    if config.check_weights == "auto":
        config = dataclasses.replace(config, check_weights="every_call")
    _accelerate_all([(module, info)], config)
    return module


def _stream_inactive(modules: list[torch.nn.Module], config: BCGConfig, reason: str) -> None:
    """Acceleration is off here: each module is marked with why, and streams its weights where ``config`` says."""
    done: list[torch.nn.Module] = []
    try:
        for module in modules:
            if config.offload is not None:
                start_streaming(module, config.offload, created_by="acceleration")
            done.append(module)
    except BaseException:
        for module in done:
            _remove_from_module(module)
        raise
    for module in modules:
        module.__dict__[_INACTIVE_ATTR] = reason


def _accelerate_all(planned: list[tuple[torch.nn.Module, Any]], config: BCGConfig) -> None:
    """Stream (where ``config`` says) and accelerate each module; all undone if one fails."""
    done: list[torch.nn.Module] = []
    try:
        for module, info in planned:
            done.append(module)
            if config.offload is not None:
                start_streaming(module, config.offload, created_by="acceleration")
            _accelerate(module, config, info)
    except BaseException:
        for module in done:
            _remove_from_module(module)
        raise


def _use_streaming(module: torch.nn.Module, runner: GraphRunner, acceleration: _Acceleration) -> None:
    """The runner drops its graphs when streamed weights move; streaming made for this acceleration is removed
    with it (its undo runs last)."""
    streaming = streaming_of(module)
    if streaming is None:
        return
    if streaming.created_by == "acceleration":
        acceleration.undos.append(streaming.remove)
    streaming.accelerated = True
    streaming.on_relayout.append(runner.clear)

    def release() -> None:
        streaming.accelerated = False
        streaming.on_relayout.remove(runner.clear)

    acceleration.undos.append(release)


def _accelerate(module: torch.nn.Module, config: BCGConfig, info: Any) -> None:
    """Put the graph runner on ``module`` (checked by the caller); undone by ``_Acceleration.undo``."""
    if torch.cuda.is_available():
        _load_capture_runtime()
    runner = GraphRunner(module, config, info)
    acceleration = _Acceleration(runner)
    try:
        _use_streaming(module, runner, acceleration)
        acceleration.undos.append(fingerprint.registration_hooks().remove)
        hook = ForwardHook(lambda below: (lambda *args, **kwargs: runner.enter(0, args, kwargs)),
                           stateful_reset=runner.on_pipeline_call_end)
        insert_innermost(module, hook, GRAPHS_HOOK)
        acceleration.undos.append(lambda: remove_exactly(module, GRAPHS_HOOK))
        acceleration.undos.append(runner.close)
        runner.attach(hook.fn_ref.original_forward, hook.fn_ref.forward, hook.fn_ref)  # refusals raise here
    except BaseException:
        acceleration.undo()
        runner.detach()
        raise
    module.__dict__[_ATTR] = acceleration


def accelerate_pipeline(pipe: Any, config: BCGConfig | None = None) -> Any:
    """Accelerate every transformer of a diffusers pipeline (``transformer``, ``transformer_2``).

    Returns ``pipe``. Raises :class:`AccelerationError` if a transformer is already accelerated
    (``remove_acceleration`` undoes it) or the pipeline offloads models. Without CUDA, or with
    ``BCG_DIFFUSION=0``, a no-op with one warning (arguments are checked first, on every machine).
    Weights and model structure are re-read once per pipeline call (at its end, through diffusers'
    ``maybe_free_model_hooks``), for every pipeline sharing the transformer.
    """
    transformers = _transformers_of(pipe)
    config, reason = _prepared(config)
    if getattr(pipe, "_offload_gpu_id", None) is not None and getattr(pipe, "_all_hooks", None) and (
            reason is None or config.offload is not None):
        raise AccelerationError(
            f"{type(pipe).__name__} has model CPU offload enabled: accelerate's hook moves the whole transformer to "
            "the GPU for each call, to new addresses (a CUDA graph replays fixed ones) and at its full size. Call "
            "pipe.remove_all_hooks() first; keep the transformer on the GPU (pipe.to('cuda')), or, where it does not "
            "fit, leave it on the CPU and stream its blocks: BCGConfig(offload=OffloadConfig(slots=2))."
        )
    if reason is not None:
        _stream_inactive([module for _, module in transformers], config, reason)
        return pipe
    _refuse_accelerated(f"this {type(pipe).__name__}", transformers, "remove_acceleration(pipe)")
    planned = [(_check_module(module), transformer_info(module, config.allow_unknown)) for _, module in transformers]
    if config.check_weights == "auto":
        config = dataclasses.replace(config, check_weights="per_pipeline_call")
    _accelerate_all(planned, config)
    return pipe


def _remove_from_module(module: torch.nn.Module) -> bool:
    module.__dict__.pop(_INACTIVE_ATTR, None)
    acceleration = module.__dict__.pop(_ATTR, None)
    if acceleration is None:
        streaming = streaming_of(module)
        if streaming is not None and streaming.created_by == "acceleration":  # acceleration was off: it streamed alone
            streaming.remove()
            return True
        return False
    acceleration.undo()
    acceleration.runner.detach()  # after the hook is out: module.forward is what eager code runs
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


def get_stats(obj: Any) -> BCGStats:
    """How the calls of a pipeline or transformer ran: replayed, first calls, eager; captures that
    succeeded and failed; per key segments, breaks, capture time, graph memory and hits (see
    :class:`BCGStats`). On a model that is not accelerated (no CUDA device, ``BCG_DIFFUSION=0``,
    never accelerated) the stats say so (``active`` is False, ``inactive_reason`` says why), on
    every machine. ``TypeError`` for anything but a pipeline or a ``torch.nn.Module``."""
    runners = _runners(obj)
    if runners:
        return _with_offload(BCGStats.combine([r.snapshot() for r in runners]), [r.module for r in runners])
    if isinstance(obj, torch.nn.Module):
        modules = [obj]
    elif isinstance(getattr(obj, "components", None), dict):
        modules = [m for n, m in obj.components.items() if isinstance(m, torch.nn.Module) and is_transformer_component(n)]
    else:
        raise TypeError(f"get_stats needs a diffusers pipeline or a torch.nn.Module, got {type(obj).__name__}")
    reasons = [m.__dict__.get(_INACTIVE_ATTR) for m in modules]
    reason = next((r for r in reasons if r), None) or (
        "accelerate_pipeline was not called on it, or remove_acceleration undid it"
    )
    names = ", ".join(type(m).__name__ for m in modules) or type(obj).__name__
    return _with_offload(BCGStats.inactive(names, reason), modules)


def _with_offload(stats: BCGStats, modules: list[torch.nn.Module]) -> BCGStats:
    """``stats`` with the weight streaming of ``modules`` (``offload``), where any streams."""
    parts = [s.snapshot() for s in map(streaming_of, modules) if s is not None]
    return dataclasses.replace(stats, offload=OffloadStats.combine(parts)) if parts else stats


def clear_graphs(obj: Any) -> None:
    """Free every captured graph of an accelerated pipeline or transformer (recaptured on demand);
    use after writing weights through ``param.data``, which the weight fingerprint cannot see."""
    for runner in _runners(obj):
        runner.clear()
