"""bcg-diffusion: breakable CUDA graphs for diffusers diffusion-transformer pipelines.

The user API is here; the capture core (breakable graphs, breaks, replay tokens) is
:mod:`bcg_diffusion.core`.

The names are imported lazily (PEP 562): ``import bcg_diffusion`` imports neither torch nor diffusers,
so a command that only answers ``--help`` starts in a fraction of a second; the first use of a name
(``bcg_diffusion.accelerate_pipeline``, ``from bcg_diffusion import get_stats``) imports its module.
``dir(bcg_diffusion)`` and ``from bcg_diffusion import *`` list every public name as before.
"""

import importlib as _importlib
import sys as _sys
import types as _types

from .known_messages import quiet_known_messages

__version__ = "0.1.0"

quiet_known_messages()  # before diffusers is imported through this package (known_messages.py says which, and why)

#: Every public name (the one list: ``__all__`` is made from it) and the submodule that defines it; ``None``
#: for a name defined in this file.
_EXPORTS: dict[str, str | None] = {
    "__version__": None,
    "install_attention_breaks": None,
    "quiet_known_messages": None,
    "accelerate_pipeline": ".accelerate",
    "accelerate_transformer": ".accelerate",
    "clear_graphs": ".accelerate",
    "get_stats": ".accelerate",
    "is_accelerated": ".accelerate",
    "remove_acceleration": ".accelerate",
    "CompileCache": ".compile_cache",
    "use_compile_cache": ".compile_cache",
    "BCGConfig": ".config",
    "OffloadConfig": ".config",
    "BreakOutputMismatchError": ".core",
    "CudaRuntimeError": ".core",
    "eager_on_graph": ".core",
    "get_current_replay_token": ".core",
    "AccelerationError": ".errors",
    "BCGCaptureWarning": ".errors",
    "RankAbortedError": ".errors",
    "RankAgreementError": ".errors",
    "RankDisagreementError": ".errors",
    "RankOutOfStepError": ".errors",
    "RankTimeoutError": ".errors",
    "UnknownTransformerError": ".errors",
    "RunnerWatcher": ".integration.events",
    "watch_every_runner": ".integration.events",
    "KNOWN_TRANSFORMERS": ".families",
    "is_transformer_component": ".families",
    "BCGStats": ".stats",
    "GraphEntryStats": ".stats",
    "OffloadStats": ".stats",
    "CachePasses": ".step_caches",
    "STEP_CACHE_HOOK_NAMES": ".step_caches",
    "count_cache_passes": ".step_caches",
    "pipeline_for_thread": ".thread_pipelines",
    "WarmedShape": ".warmup",
    "WarmupReport": ".warmup",
    "warmup": ".warmup",
    "apply_weight_streaming": ".weight_streaming",
    "is_streaming": ".weight_streaming",
    "remove_weight_streaming": ".weight_streaming",
}


def install_attention_breaks(transformer):
    """Route ``transformer``'s attention calls through the library's attention wrappers, without
    accelerating it; returns the :class:`~bcg_diffusion.core.RemovableHandle` whose ``remove()`` undoes it.

    The wrappers replace ``dispatch_attention_fn`` in the transformer's module and, where its processors
    call it directly, ``torch.nn.functional.scaled_dot_product_attention``. Outside a capture they call
    the original; traced by ``torch.compile`` each call becomes one custom op (``bcg::dispatch_attention``
    or ``bcg::sdpa``), so a tool can let Inductor split its own CUDA graphs at attention
    (``graph_partition=True, custom_should_partition_ops=[...]``). The patch is process-wide: it is
    shared with accelerated transformers and stays until the last handle of it is removed.
    """
    from .integration.breaks import attention

    return attention.install(transformer)


__all__ = sorted(_EXPORTS)


_resolved: set[str] = set()  # the public names bound in the package so far


def __getattr__(name: str):
    """A public name on first use: import its submodule, keep the value in the package (PEP 562). A name
    bound once and deleted since (``del``, ``monkeypatch.delattr``) stays absent, as after an eager import."""
    module = _EXPORTS.get(name)
    if module is None or name in _resolved:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    _resolved.add(name)
    return value


def __dir__() -> list[str]:
    return sorted(name for name in set(globals()) | set(__all__) if not name.startswith("_") or name in __all__
                  or name.startswith("__"))


class _Package(_types.ModuleType):
    """The package's module type. Importing a submodule binds it on the package (``setattr``); where a
    public name is also a submodule's name (``warmup``: the module ``bcg_diffusion.warmup`` defines the
    function ``warmup``), the public name keeps the function, as an eager ``from .warmup import warmup``
    would, whoever imports the submodule first."""

    def __setattr__(self, name: str, value) -> None:
        if (name in _EXPORTS and isinstance(value, _types.ModuleType)
                and value.__name__ == f"{__name__}.{name}" and hasattr(value, name)):
            value = getattr(value, name)
        if name in _EXPORTS:
            _resolved.add(name)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
