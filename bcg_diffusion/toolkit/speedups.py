"""Speed settings the scripts apply to a transformer: regional torch.compile, the attention backend and
diffusers context parallelism."""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

import bcg_diffusion

from .choices import CP_MODES  # ``--cp`` values (ulysses_degree, ring_degree); the parser reads them from .choices
from .options import Failure

__all__ = [
    "CP_MODES",
    "attention_backend_names",
    "attention_backend_problem",
    "compile_leftover_children",
    "enable_context_parallel",
    "has_cp_plan",
    "leftover_children",
    "quiet_library_warnings",
    "regional_compile",
    "regional_compile_all",
    "set_attention_backend",
    "speed_up",
]


@contextlib.contextmanager
def quiet_library_warnings():
    """Silence warnings and log records below ERROR (around calls whose warnings were already explained)."""
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def speed_up(pipe, *, compile: bool, bcg: bool, on_cuda: bool, max_graphs: int | None = None) -> list[str]:
    """``--compile`` then ``--bcg`` on ``pipe`` (BCG captures the compiled kernels; without CUDA it runs eagerly,
    its warnings silenced); ``max_graphs``: the captured keys BCG keeps (``BCGConfig.max_graphs``; ``None``: the
    library's default). The notes to print. ``Failure`` (exit code 1) saying which step failed."""
    notes = []
    if compile:
        try:
            notes.append(regional_compile(pipe.transformer))
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
    if bcg:
        try:
            with contextlib.nullcontext() if on_cuda else quiet_library_warnings():
                config = None if max_graphs is None else bcg_diffusion.BCGConfig(max_graphs=max_graphs)
                bcg_diffusion.accelerate_pipeline(pipe, config)
        except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError
            raise Failure(1, f"error: BCG could not be applied: {type(exc).__name__}: {exc}") from exc
        notes.append("BCG on" if on_cuda else
                     "note: BCG needs a CUDA GPU and none is in use here, so every call runs eagerly")
    return notes


def regional_compile(transformer, **compile_kwargs) -> str:
    """Compile the repeated blocks of ``transformer`` in place; return a sentence saying how.

    Uses diffusers' ``compile_repeated_blocks()`` where the class lists ``_repeated_blocks``, else
    ``nn.Module.compile`` on each block of the transformer's top-level ``ModuleList`` children
    (``ValueError`` if it has neither).
    """
    cls = type(transformer).__name__
    kw_text = f" ({', '.join(f'{k}={v!r}' for k, v in compile_kwargs.items())})" if compile_kwargs else ""
    repeated = getattr(transformer, "_repeated_blocks", None)
    if repeated:
        transformer.compile_repeated_blocks(**compile_kwargs)
        return f"regional torch.compile{kw_text} via {cls}.compile_repeated_blocks() on {', '.join(repeated)}"
    lists = []
    for name, child in transformer.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child):
            for block in child:
                block.compile(**compile_kwargs)
            lists.append(f"{name} ({len(child)} x {type(child[0]).__name__})")
    if not lists:
        raise ValueError(f"{cls} has neither _repeated_blocks nor ModuleList children of blocks to compile")
    return f"regional torch.compile{kw_text} of each block in {', '.join(lists)} ({cls} defines no _repeated_blocks)"


#: Leaf modules that do no work worth a compiled region (left alone by :func:`compile_leftover_children`).
NOT_WORTH_COMPILING = (torch.nn.Identity, torch.nn.Dropout)


def _is_block_container(child: torch.nn.Module, repeated: tuple[str, ...]) -> bool:
    """A ModuleList / ModuleDict that holds the blocks :func:`regional_compile` compiles."""
    if not isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)) or not len(child):
        return False
    items = child.values() if isinstance(child, torch.nn.ModuleDict) else child
    return not repeated or any(type(m).__name__ in repeated for m in items)


def leftover_children(transformer) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of what :func:`regional_compile` leaves uncompiled: the direct children of
    ``transformer`` other than its repeated blocks (embedders, norms, output head, rotary embeddings).

    The blocks are the classes of ``_repeated_blocks`` where the class lists them, else every non-empty
    ``ModuleList`` child (as :func:`regional_compile` decides). A ``ModuleList`` / ``ModuleDict`` of other
    modules contributes its items (``name.0``, ...); modules without a ``forward`` of their own, identities,
    dropouts and modules already compiled are skipped.
    """
    repeated = tuple(getattr(transformer, "_repeated_blocks", None) or ())
    found: list[tuple[str, torch.nn.Module]] = []

    def consider(name: str, module: torch.nn.Module) -> None:
        if type(module).__name__ in repeated or isinstance(module, NOT_WORTH_COMPILING):
            return
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            items = module.items() if isinstance(module, torch.nn.ModuleDict) else enumerate(module)
            for key, item in items:
                consider(f"{name}.{key}", item)
            return
        if type(module).forward is torch.nn.Module.forward or module._compiled_call_impl is not None:
            return  # nothing to call, or compiled already
        found.append((name, module))

    for name, child in transformer.named_children():
        if not _is_block_container(child, repeated):
            consider(name, child)
    return found


def compile_leftover_children(transformer, **compile_kwargs) -> list[str]:
    """``module.compile(dynamic=False, **compile_kwargs)`` on each of :func:`leftover_children` in place
    (``dynamic`` may be overridden); return their names. The transformer's own ``forward`` stays uncompiled."""
    kwargs = {"dynamic": False, **compile_kwargs}
    names = []
    for name, module in leftover_children(transformer):
        module.compile(**kwargs)
        names.append(name)
    return names


def regional_compile_all(transformer, **compile_kwargs) -> str:
    """:func:`regional_compile`, then :func:`compile_leftover_children`: every module a step runs is inside
    a compiled region, while the transformer's ``forward`` Python stays eager. Returns a sentence saying how."""
    desc = regional_compile(transformer, **compile_kwargs)
    names = compile_leftover_children(transformer, **compile_kwargs)
    return f"{desc}; and the leftover children {', '.join(names) or '(none)'} each compiled (dynamic=False)"


def attention_backend_names() -> list[str]:
    """The values of diffusers' ``AttentionBackendName``."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [b.value for b in AttentionBackendName]


def attention_backend_problem(name: str) -> str | None:
    """Why diffusers cannot run attention backend ``name`` here (the package it needs is missing or too old),
    from diffusers' own requirement check (the one ``set_attention_backend`` runs), or ``None``."""
    from diffusers.models import attention_dispatch

    check = getattr(attention_dispatch, "_check_attention_backend_requirements", None)
    if check is None:  # another diffusers: set_attention_backend says it after the build
        return None
    try:
        check(attention_dispatch.AttentionBackendName(name))
    except (RuntimeError, ImportError, ValueError) as exc:
        return str(exc)
    return None


def set_attention_backend(transformer, name: str) -> str:
    """``transformer.set_attention_backend(name)``; return a note on how many attention processors it reached."""
    with quiet_library_warnings():  # diffusers warns that backends are experimental on every call
        transformer.set_attention_backend(name)
    processors = [m.processor for m in transformer.modules() if getattr(m, "processor", None) is not None]
    reached = sum(hasattr(proc, "_attention_backend") for proc in processors)
    if processors and not reached:
        return (f"attention backend {name!r} set, but none of the {len(processors)} attention processors of "
                f"{type(transformer).__name__} dispatch through it (they call SDPA directly)")
    return f"attention backend {name!r} set on {reached} of {len(processors)} attention processors"


def has_cp_plan(transformer_class: type) -> bool:
    """Whether diffusers can split this transformer class over GPUs (it defines a ``_cp_plan``)."""
    return getattr(transformer_class, "_cp_plan", None) is not None


def enable_context_parallel(transformer, mode: str, degree: int) -> str:
    """``transformer.enable_parallelism(config=ContextParallelConfig(<mode>_degree=degree))``; return a note.

    Needs an initialised process group of ``degree`` ranks (one GPU each); call it before
    ``accelerate_pipeline`` and after any ``set_attention_backend`` (diffusers checks the backend here).
    """
    if mode not in CP_MODES:
        raise ValueError(f"unknown context-parallel mode {mode!r}; choose one of {', '.join(CP_MODES)}")
    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(**{f"{mode}_degree": degree})
    with quiet_library_warnings():  # diffusers warns that parallelism is experimental on every call
        transformer.enable_parallelism(config=config)
    return (f"context parallelism: {type(transformer).__name__}.enable_parallelism(config=ContextParallelConfig("
            f"{mode}_degree={degree})): each step's sequence is split over {degree} GPUs")
