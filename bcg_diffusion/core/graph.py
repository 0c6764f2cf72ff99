"""The breakable CUDA graph: captured segments with eager breaks between them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .boxing import box_tuple
from .copy_back import copy_into
from .replay_token import replay_token_scope


class GraphState(enum.Enum):
    EMPTY = "empty"
    CAPTURING = "capturing"
    CAPTURED = "captured"
    FAILED = "failed"


@dataclass
class _Segment:
    """One captured ``torch.cuda.CUDAGraph``."""

    graph: torch.cuda.CUDAGraph

    def run(self) -> None:
        self.graph.replay()


@dataclass
class _EagerBreak:
    """An eager call between two segments and the bridge buffer its result is copied into.

    ``args``/``kwargs`` hold non-owning views of pool intermediates (see ``nonowning``);
    ``output`` (the bridge buffer) is held strongly: later segments read its address.
    """

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    output: Any
    name: str

    def run(self) -> None:
        copy_into(self.output, box_tuple(self.fn(*self.args, **self.kwargs)), path=f"result of {self.name}")


@dataclass
class _DebugBridges:
    """Bridge buffers of a debug-mode graph, matched to breaks by call order."""

    outputs: list = field(default_factory=list)
    names: list = field(default_factory=list)
    cursor: int = 0


class BreakableCUDAGraph:
    """Captured CUDA graph segments and the eager steps between them (breaks and hooked calls).

    Fill it with :class:`~bcg_diffusion.BreakableCUDAGraphCapture`; then :meth:`replay` runs
    ``segment, break, segment, ...`` on the current stream, inside a fresh replay token scope.
    All segments share one memory pool (:attr:`pool`), which they keep alive.
    """

    def __init__(self) -> None:
        self._steps: list[_Segment | _EagerBreak] = []
        self._retained: list[torch.cuda.CUDAGraph] = []  # empty segments: keep the pool's use count
        self._state = GraphState.EMPTY
        self._failure: str | None = None
        self._pool: Any = None
        self._debug: _DebugBridges | None = None
        self.device: torch.device | None = None
        # Host seconds of the capture by phase: "setup" (stream, library handles, cuBLAS workspace),
        # "instantiate" (capture_end of every segment: end of capture and graph instantiation).
        self.capture_seconds: dict[str, float] = {}

    # -- introspection -------------------------------------------------------------------
    @property
    def state(self) -> GraphState:
        return self._state

    @property
    def pool(self) -> Any:
        """The memory-pool handle the segments were captured into (``None`` before capture)."""
        return self._pool

    @property
    def num_segments(self) -> int:
        """Captured, non-empty segments (a break right after another leaves no segment between)."""
        if self._debug is not None:
            return len(self._debug.outputs) + 1
        return sum(isinstance(s, _Segment) for s in self._steps)

    @property
    def num_breaks(self) -> int:
        """Eager breaks between segments."""
        if self._debug is not None:
            return len(self._debug.outputs)
        return sum(not isinstance(s, _Segment) for s in self._steps)

    @property
    def is_debug(self) -> bool:
        """True for a graph filled in debug mode (segments run eagerly, nothing captured)."""
        return self._debug is not None

    @property
    def break_names(self) -> list[str]:
        if self._debug is not None:
            return list(self._debug.names)
        return [s.name for s in self._steps if not isinstance(s, _Segment)]

    def __repr__(self) -> str:
        detail = f", failure={self._failure!r}" if self._failure else ""
        mode = ", debug" if self._debug is not None else ""
        return (
            f"BreakableCUDAGraph(state={self._state.value}, segments={self.num_segments}, "
            f"breaks={self.num_breaks}{mode}{detail})"
        )

    # -- replay ----------------------------------------------------------------------------
    def replay(self) -> None:
        """Run every segment and break in order on the current stream.

        Raises ``RuntimeError`` if the graph was never captured, is being captured, or its
        capture failed; and ``BreakOutputMismatchError`` if a break returns another structure.
        """
        if self._state is not GraphState.CAPTURED:
            if self._state is GraphState.FAILED:
                raise RuntimeError(
                    f"cannot replay a BreakableCUDAGraph whose capture failed ({self._failure}); "
                    "run the code eagerly or capture it again into a new graph"
                )
            raise RuntimeError(f"cannot replay a BreakableCUDAGraph in state '{self._state.value}'; capture it first")
        if self._debug is not None:
            raise RuntimeError(
                "a debug-mode BreakableCUDAGraph captured nothing to replay; run the body again under "
                "BreakableCUDAGraphCapture(graph, debug=True) instead"
            )
        with replay_token_scope():
            for step in self._steps:
                step.run()

    def reset(self) -> None:
        """Drop all segments, breaks and bridge buffers; the graph can be captured again."""
        self._steps.clear()
        self._retained.clear()
        self._state = GraphState.EMPTY
        self._failure = None
        self._pool = None
        self._debug = None
        self.capture_seconds = {}

    # -- used by the capture ----------------------------------------------------------------
    def _begin(self, pool: Any, device: torch.device, debug: bool) -> None:
        if self._state is GraphState.CAPTURING:
            raise RuntimeError("this BreakableCUDAGraph is already being captured")
        if debug and self._debug is not None and self._state is GraphState.CAPTURED:
            self._debug.cursor = 0  # a debug graph is run again through the same bridges
        elif self._state is not GraphState.EMPTY:
            raise RuntimeError(
                f"this BreakableCUDAGraph is {self._state.value}; call reset() or use a new graph to capture again"
            )
        else:
            self._debug = _DebugBridges() if debug else None
        self._state = GraphState.CAPTURING
        self._pool = pool
        self.device = device

    def _time(self, phase: str, seconds: float) -> None:
        self.capture_seconds[phase] = self.capture_seconds.get(phase, 0.0) + seconds

    def _add_segment(self, segment: torch.cuda.CUDAGraph) -> None:
        self._steps.append(_Segment(segment))

    def _retain(self, segment: torch.cuda.CUDAGraph) -> None:
        self._retained.append(segment)

    def _add_break(self, step: Any) -> None:
        """A non-segment step: anything with ``run()`` and ``name`` (an eager break, a hooked call)."""
        self._steps.append(step)

    def _debug_first_pass(self) -> bool:
        """Debug mode: True while the first (capturing) pass records the bridges."""
        bridges = self._debug
        return bridges is not None and bridges.cursor == len(bridges.outputs)

    def _debug_bridge(self, name: str, result: Any) -> Any:
        """Debug mode: first pass keeps ``result`` as bridge buffer; later passes copy into it."""
        bridges = self._debug
        assert bridges is not None
        boxed = box_tuple(result)
        if bridges.cursor == len(bridges.outputs):
            bridges.outputs.append(boxed)
            bridges.names.append(name)
        else:
            bridge = bridges.outputs[bridges.cursor]
            copy_into(bridge, boxed, path=f"result of {name}")
            boxed = bridge
        bridges.cursor += 1
        return boxed

    def _finish(self) -> None:
        if self._debug is not None and self._debug.cursor != len(self._debug.outputs):
            self._fail(
                f"debug run made {self._debug.cursor} breaks, the first run made {len(self._debug.outputs)}"
            )
            raise RuntimeError(f"debug-mode graph changed structure: {self._failure}")
        self._state = GraphState.CAPTURED

    def _fail(self, reason: str) -> None:
        self._steps.clear()
        self._retained.clear()
        self._debug = None
        self._state = GraphState.FAILED
        self._failure = reason
