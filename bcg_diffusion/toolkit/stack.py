"""The speed stack (:class:`~.stack_options.StackOptions`) on a built pipeline, one layer at a time, for
``bcg-serve`` and the stack benchmark.

The order: quantization right after the build (:func:`quantize_layer`, before adapters are attached), then
(:func:`apply_speed_layers`) the attention backend, the step cache and regional compile; BCG comes last, from the
command. Compile installs the library's attention wrappers first (``bcg_diffusion.install_attention_breaks``),
with BCG or without, so that the compiled blocks trace the same attention op either way: an accelerated pipeline is
then bitwise equal to the same stack run eagerly (docs/accelerate.md, "Composition"). A layer that cannot be applied
raises :class:`~.options.Failure`: exit code 2 for what the options asked and the model cannot do, 1 for a failure.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import bcg_diffusion

from .cache_option import apply_cache, check_cache, reset_cache_state
from .options import Failure
from .quant_option import apply_quant
from .speedups import regional_compile, set_attention_backend
from .stack_options import StackOptions

__all__ = ["AppliedStack", "apply_speed_layers", "compile_layer", "compiled_graphs", "quantize_layer"]


@dataclass
class AppliedStack:
    """What :func:`apply_speed_layers` did: the lines that say so, the process-wide patches it made (the attention
    wrappers of compile), which :meth:`remove_patches` undoes, and ``before_call``: what to call before each pipeline
    call with a step cache on (``None`` without one): the state of diffusers' step-cache hooks reset, so that a call
    starts like a first one even after a call that failed half-way (which leaves the hooks' state as it was; a
    finished call resets most of them itself)."""

    notes: list[str] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)
    before_call: Callable[[], None] | None = None

    def remove_patches(self) -> None:
        while self.handles:
            self.handles.pop().remove()


def quantize_layer(pipe: Any, stack: StackOptions) -> list[str]:
    """``--quant``: torchao quantization of ``pipe.transformer``; the note to print (none when off)."""
    if not stack.quant:
        return []
    try:
        return [apply_quant(pipe, stack.quant)]
    except Exception as exc:  # noqa: BLE001 - e.g. a config the device does not support
        raise Failure(1, f"error: --quant {stack.quant}: {type(exc).__name__}: {exc}") from exc


def compile_layer(transformer: Any) -> tuple[str, Any]:
    """Regional compile of ``transformer`` with the library's attention wrappers installed first, static shapes
    (``dynamic=False``); the note and the wrappers' handle (``remove()`` undoes them once nothing compiled runs any
    more).

    Static shapes: each size is compiled for itself, so a size runs the same kernels whatever was compiled before it
    and with BCG or without. With torch's automatic dynamic shapes the second size would recompile the blocks with
    dynamic shapes, and later calls of the first size would run those kernels in an eager process while an
    accelerated one replays the static kernels it captured: not bitwise the same. torch compiles at most
    ``torch._dynamo.config.recompile_limit`` shapes per block class (8 by default; it warns and runs the others
    uncompiled)."""
    handle = bcg_diffusion.install_attention_breaks(transformer)
    try:
        note = regional_compile(transformer, dynamic=False)
    except BaseException:
        handle.remove()
        raise
    return f"{note}, attention as the library's op (install_attention_breaks)", handle


def apply_speed_layers(pipe: Any, stack: StackOptions, family: str | None, steps: int) -> AppliedStack:
    """The attention backend, the step cache (for calls of ``steps`` steps; ``family``: the pipeline's, ``None``
    when unknown) and regional compile of ``stack`` on ``pipe``, in that order; what was done (with the step cache's
    reset to run before each call, ``before_call``)."""
    applied = AppliedStack()
    transformer = getattr(pipe, "transformer", None)
    if (stack.attention_backend or stack.compile or stack.cache) and transformer is None:
        raise Failure(2, "error: --attention-backend, --cache and --compile need a pipeline with a transformer")
    if stack.attention_backend:
        try:
            applied.notes.append(set_attention_backend(transformer, stack.attention_backend))
        except Exception as exc:  # noqa: BLE001 - e.g. the backend's package is not installed
            raise Failure(2, f"error: --attention-backend {stack.attention_backend}: {exc}") from exc
    if stack.cache is not None:
        applied.notes.append(_cache_layer(pipe, stack, family, steps))
        applied.before_call = functools.partial(reset_cache_state, transformer)
    if stack.compile:
        try:
            note, handle = compile_layer(transformer)
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
        applied.notes.append(note)
        applied.handles.append(handle)
    return applied


def _cache_layer(pipe: Any, stack: StackOptions, family: str | None, steps: int) -> str:
    if family is None:
        raise Failure(2, f"error: --cache {stack.cache.text} needs a pipeline of a known family (its recipe depends "
                      "on the family); this one is of none")
    try:
        check_cache(stack.cache, family)
        return apply_cache(pipe, stack.cache, family, steps)
    except ValueError as exc:
        raise Failure(2, f"error: --cache: {exc}") from exc


def compiled_graphs() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far (0 when it was never imported): a count that
    moves when anything compiles or recompiles."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return int(utils.counters["stats"]["unique_graphs"])
