"""diffusers' context-parallel output gather as an eager break.

Under context parallelism diffusers all-gathers the transformer's output along the sequence in
the ``post_forward`` of a ``ContextParallelGatherHook`` (on ``proj_out``), through
``EquipartitionSharder.unshard``. That hook runs inline under a capture (its module is not a hooked
module, see :data:`~bcg_diffusion.integration.model_state.INLINE_HOOKS`); what must not be captured
is its collective. :func:`acquire` makes ``EquipartitionSharder.unshard`` an eager break: at capture
it only allocates the gathered output (from the graph pool, contiguous, as the all-gather returns
it), so no collective runs during a capture; at replay the real gather runs between two segments
and its result is copied into that buffer.

The patch is process-wide and reference-counted (one use per accelerated context-parallel
transformer); outside a capture the patched method is a plain call of the original, so
unaccelerated models are unaffected. :func:`acquire` returns its handle.
"""

from __future__ import annotations

from typing import Any, Callable

from ...core.capture import eager_on_graph
from ...core.handles import RemovableHandle, SharedPatch, patch_attribute

_patch: RemovableHandle | None = None  # EquipartitionSharder.unshard replaced, while the shared patch is applied


def _sharder() -> type:
    from diffusers.hooks.context_parallel import EquipartitionSharder

    return EquipartitionSharder


def gathered_like(tensor: Any, dim: int, mesh: Any) -> Any:
    """An empty tensor shaped like ``tensor`` all-gathered along ``dim`` over ``mesh`` (contiguous,
    like the all-gather's result). Allocation only: usable as a capture allocator."""
    shape = list(tensor.shape)
    shape[dim] *= mesh.size()
    return tensor.new_empty(shape)


def _make_break(original: Callable) -> classmethod:
    gather = eager_on_graph(capture_allocator=gathered_like)(original)

    def unshard(cls: type, tensor: Any, dim: int, mesh: Any) -> Any:
        return gather(tensor, dim, mesh)

    unshard.__bcg_original__ = original  # type: ignore[attr-defined]
    unshard.__doc__ = "bcg-diffusion: diffusers' EquipartitionSharder.unshard as an eager break (see cp_gather)."
    return classmethod(unshard)


def _apply() -> None:
    global _patch
    sharder = _sharder()
    original = sharder.__dict__["unshard"].__get__(None, sharder)  # the classmethod, bound to the class
    _patch = patch_attribute(sharder, "unshard", _make_break(original))


def _revert() -> None:
    global _patch
    patch, _patch = _patch, None
    if patch is not None:
        patch.remove()


_gather_patch = SharedPatch("EquipartitionSharder.unshard", _apply, _revert)


def acquire() -> RemovableHandle:
    """Make the gather an eager break while the handle lives (shared: the last handle removed undoes it)."""
    return _gather_patch.acquire()


def is_patched() -> bool:
    """Whether the gather is an eager break now (for tests and introspection)."""
    return _gather_patch.active
