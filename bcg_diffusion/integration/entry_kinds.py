"""What one capture of a graph key made: a :class:`GraphEntry`, one class per kind.

- :class:`CapturedGraph`: the graph, its static inputs and outputs; a call fills the inputs and replays it;
- :class:`DebugRun`: debug mode's stand-in for a captured graph (nothing captured: a replay runs the
  forward again on the static inputs, through the same breaks and bridge copies);
- :class:`EagerFallback`: the key runs eagerly (``reason``: why the capture failed, or why a graph was
  given up);
- :class:`ModuleModeEntry`: the capture failed in the transformer's own forward (or its Python is opaque):
  the forward runs eagerly and its units replay graphs of their own (``units``, :mod:`.module_mode`).

Every kind carries what the capture cost (``capture_time_s``, ``memory_bytes``, ``phases``), the parts
narrowed to eager breaks (``eager_modules``) and its replays (``hits``). A graph given up becomes an
:class:`EagerFallback` through :meth:`GraphEntry.fall_back`, which releases what it held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..core.capture import BreakableCUDAGraphCapture
from ..core.graph import BreakableCUDAGraph
from .breaks import attention


@dataclass(eq=False, kw_only=True)
class GraphEntry:
    """What every kind carries (see the module docstring). ``phases``: host seconds of the capture by phase
    (:func:`~.entries.capture_entry`; the runner adds ``static_inputs``, ``key`` and ``first_replay``)."""

    capture_time_s: float = 0.0
    memory_bytes: int = 0
    hits: int = 0
    eager_modules: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def segments(self) -> int:
        return 0

    @property
    def breaks(self) -> int:
        return 0

    def release(self) -> None:
        """Free what the entry holds (a graph, static buffers); nothing for most kinds."""

    def fall_back(self, reason: str) -> "EagerFallback":
        """This key runs eagerly from now on: what the entry held is released; the fallback keeps its cost,
        its narrowed parts and its hits, and holds no memory."""
        self.release()
        return EagerFallback(reason=reason, capture_time_s=self.capture_time_s, hits=self.hits,
                             eager_modules=list(self.eager_modules), phases=dict(self.phases))


@dataclass(eq=False, kw_only=True)
class CapturedGraph(GraphEntry):
    """A captured graph that replays: it reads ``static_inputs`` and writes ``outputs`` (its own buffers).
    ``borrowed``: indices of static inputs read in place (in module mode, an earlier unit's output)."""

    graph: BreakableCUDAGraph
    static_inputs: list[torch.Tensor]
    outputs: Any = None
    borrowed: frozenset[int] = frozenset()

    @property
    def segments(self) -> int:
        return self.graph.num_segments

    @property
    def breaks(self) -> int:
        return self.graph.num_breaks

    def fill(self, live: list[torch.Tensor]) -> bool:
        """Copy the live input tensors into the static inputs (those not already the same view);
        False, leaving the rest, when a borrowed one is not: the call must then run eagerly."""
        for i, (static, tensor) in enumerate(zip(self.static_inputs, live)):
            if _same_view(static, tensor):
                continue
            if i in self.borrowed:
                return False
            static.copy_(tensor)
        return True

    def replay(self, forward: Callable, attention_policy: str) -> Any:
        """Replay the graph (its static inputs filled); returns its outputs (the graph's buffers).
        Raises :class:`~bcg_diffusion.core.BreakOutputMismatchError` when a break returned another shape
        than at capture (the replay stopped part-way)."""
        self.graph.replay()
        return self.outputs

    def release(self) -> None:
        self.graph.reset()
        self.static_inputs = []
        self.outputs = None


@dataclass(eq=False, kw_only=True)
class DebugRun(CapturedGraph):
    """Debug mode's graph: nothing was captured; a replay runs ``forward`` again on the static
    ``(args, kwargs)`` of the capture, through the same breaks and bridge copies."""

    static_call: tuple[tuple, dict]

    def replay(self, forward: Callable, attention_policy: str) -> Any:
        s_args, s_kwargs = self.static_call
        with attention.policy(attention_policy), BreakableCUDAGraphCapture(self.graph, debug=True):
            return forward(*s_args, **s_kwargs)


@dataclass(eq=False, kw_only=True)
class EagerFallback(GraphEntry):
    """The key runs eagerly: ``reason`` says why (the failure, or why its graph was given up)."""

    reason: str


@dataclass(eq=False, kw_only=True)
class ModuleModeEntry(GraphEntry):
    """Module mode: the transformer's forward runs eagerly and each call of its units replays a graph of its
    own. ``units`` (a :class:`~.module_mode.UnitGraphs`) is given by the runner; its graphs are the key's."""

    units: Any = None

    @property
    def segments(self) -> int:
        return self.units.segments if self.units is not None else 0

    @property
    def breaks(self) -> int:
        return self.units.breaks if self.units is not None else 0

    def release(self) -> None:
        if self.units is not None:
            self.units.release()


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())
