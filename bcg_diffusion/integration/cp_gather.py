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
unaccelerated models are unaffected. :func:`acquire` returns the undo.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..core.capture import eager_on_graph

_lock = threading.Lock()
_users = 0
_saved: Any = None  # EquipartitionSharder.__dict__["unshard"] before the patch (a classmethod)


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


def acquire() -> Callable[[], None]:
    """Make the gather an eager break (reference-counted); returns the undo (idempotent)."""
    global _users, _saved
    sharder = _sharder()
    with _lock:
        if _users == 0:
            _saved = sharder.__dict__["unshard"]
            sharder.unshard = _make_break(_saved.__get__(None, sharder))
        _users += 1
    released = False

    def release() -> None:
        global _users, _saved
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _users -= 1
            if _users == 0:
                sharder.unshard = _saved
                _saved = None

    return release


def is_patched() -> bool:
    """Whether the gather is an eager break now (for tests and introspection)."""
    return _users > 0
