"""Capturing code into a :class:`BreakableCUDAGraph`, and the ``eager_on_graph`` break decorator."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from typing import Any, Callable

import torch

from . import _cudart, failed_segments, side_streams
from .active_capture import ACTIVE_CAPTURE, is_capturing_breakable
from .boxing import box_tuple, unbox_tuple
from .graph import BreakableCUDAGraph, GraphState, _EagerBreak
from .hooked_calls import CapturedBody, HookedCallStep, argument_signature, bypassing_hooks
from .nonowning import BreakArguments, KeptNonOwning, non_owning_view
from .pool_check import check_enabled, check_in_pool
from .replay_token import no_replay_token
from .tree import tree_map

logger = logging.getLogger(__name__)

_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


class _CaptureState:
    """Per-capture state: the open segment, the capture stream, forks, the pool."""

    def __init__(self, graph: BreakableCUDAGraph, pool: Any, stream: Any, mode: str, debug: bool, parent: "_CaptureState | None" = None) -> None:
        self.graph = graph
        self.pool = pool
        self.stream = stream
        self.mode = mode
        self.debug = debug
        self.segment: torch.cuda.CUDAGraph | None = None
        self.in_break = False
        if parent is not None:  # a body sub-graph: same stream, forks, pool and break arguments as its capture
            self.tracker, self.arguments = parent.tracker, parent.arguments
        else:
            self.tracker = side_streams.ForkTracker(stream) if stream is not None else None
            self.arguments = BreakArguments()  # finalized when this (outermost) capture ends
        self._to_refork: list = []

    def begin_segment(self) -> None:
        if self.debug:
            return
        segment = torch.cuda.CUDAGraph()
        _begin_capture(segment, self.pool, self.mode, self.stream)
        self.segment = segment
        if self._to_refork:
            self.tracker.refork(self._to_refork)
            self._to_refork = []

    def end_segment(self) -> None:
        if self.debug or self.segment is None:
            return
        segment, self.segment = self.segment, None
        self._to_refork = self.tracker.join_all()
        nodes = _cudart.captured_node_count(self.stream)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                if nodes == 0:
                    warnings.simplefilter("ignore")  # torch warns about empty graphs
                segment.capture_end()
        except BaseException:
            # an invalidated capture is found here: undo what capture_begin set up, keep the object
            _clean_up_failed_end(segment, self.stream, self.pool)
            raise
        if nodes == 0:
            # Not replayed, but kept alive: destroying it would drop the pool's use count to zero
            # while later segments still capture into the pool.
            self.graph._retain(segment)
        else:
            self.graph._add_segment(segment)
        self.graph._time("instantiate", time.perf_counter() - start)

    def run_break(
        self,
        fn: Callable,
        capture_stub: Callable | None,
        name: str,
        args: tuple,
        kwargs: dict,
        capture_allocator: Callable | None = None,
    ) -> Any:
        if self.in_break:  # a break called from inside a break is a plain call
            return fn(*args, **kwargs)
        if self.debug:
            first_pass = self.graph._debug_first_pass()
            self.in_break = True
            try:
                with bypassing_hooks() if first_pass else contextlib.nullcontext():
                    result = fn(*args, **kwargs)
            finally:
                self.in_break = False
            return unbox_tuple(self.graph._debug_bridge(name, result))
        # An allocator runs while the segment still captures: its buffers come from the graph pool,
        # so the pool can reuse them once the model drops them (the graphs keep the pool alive).
        pooled = capture_allocator(*args, **kwargs) if capture_allocator is not None else None
        self.end_segment()
        if pooled is not None:
            result = pooled
            bridge = box_tuple(tree_map(non_owning_view, pooled))
        else:
            self.in_break = True
            try:
                # capture runs on placeholders: hook state must not advance, and random numbers drawn
                # here must not move torch's generators (a replay draws what the eager call draws)
                with bypassing_hooks(), torch.random.fork_rng(devices=[self.stream.device]):
                    result = (capture_stub or fn)(*args, **kwargs)
            finally:
                self.in_break = False
            bridge = box_tuple(result)
        self.graph._add_break(
            _EagerBreak(
                fn=fn,
                args=self.arguments.detach(args, name),
                kwargs=self.arguments.detach(kwargs, name),
                output=bridge,
                name=name,
            )
        )
        self.begin_segment()
        return result

    def run_hooked(
        self,
        chain: Callable,
        body: CapturedBody,
        args: tuple,
        kwargs: dict,
        *,
        fresh_outputs: bool,
        retain_args: bool,
        replay_body: bool,
    ) -> Any:
        """A hooked call under capture (see :mod:`.hooked_calls`): capture the body as a sub-graph
        of this capture (same pool and stream) and record a step that runs the chain at replay."""
        if self.in_break:
            return chain(*args, **kwargs)
        name = body.name
        if self.debug:
            first_pass = self.graph._debug_first_pass()
            self.in_break = True
            try:
                # the first (capturing) pass must not advance hook state: it runs the body alone
                if first_pass:
                    with bypassing_hooks():
                        result = body.fn(*args, **kwargs)
                else:
                    result = chain(*args, **kwargs)
            finally:
                self.in_break = False
            return unbox_tuple(self.graph._debug_bridge(name, result))
        self.end_segment()
        sub = BreakableCUDAGraph()
        sub._begin(self.pool, self.stream.device, debug=False)
        sub_state = _CaptureState(sub, self.pool, self.stream, self.mode, debug=False, parent=self)
        token = ACTIVE_CAPTURE.set(sub_state)
        try:
            sub_state.begin_segment()
            outputs = body.fn(*args, **kwargs)
            sub_state.end_segment()
            sub._finish()
            for phase, seconds in sub.capture_seconds.items():
                self.graph._time(phase, seconds)
        except BaseException as exc:
            sub_state.abort()
            sub._fail(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            ACTIVE_CAPTURE.reset(token)
        keep = (lambda v: v) if retain_args else (lambda v: self.arguments.detach(v, name))
        self.graph._add_break(
            HookedCallStep(
                chain=chain,
                body=body,
                sub=sub,
                args=keep(args),
                kwargs=keep(kwargs),
                signature=argument_signature(args, kwargs),
                output=box_tuple(outputs),
                body_outputs=outputs,
                name=name,
                fresh_outputs=fresh_outputs,
                replay_body=replay_body,
            )
        )
        self.begin_segment()
        return outputs

    def finalize_arguments(self) -> list[KeptNonOwning]:
        """After the whole capture ended: break arguments still alive become owning, the others stay
        non-owning and are returned (:mod:`.nonowning`); with ``BCG_DIFFUSION_CHECK_BREAK_ARGS=1`` those
        are checked to lie in the pool (:mod:`.pool_check`, an allocator snapshot), raising if one does not."""
        kept = self.arguments.finalize()
        if kept and self.stream is not None and check_enabled():
            check_in_pool(kept, self.pool, self.stream.device)
        return kept

    def abort(self) -> None:
        """End an open segment after a failure so that no stream is left capturing."""
        segment, self.segment = self.segment, None
        if self.tracker is not None:
            self.tracker.join_all()
        if segment is None or self.stream is None:
            return
        _end_failed_capture(segment, self.stream, self.pool)


def _end_failed_capture(segment: torch.cuda.CUDAGraph, stream: Any, pool: Any) -> None:
    """End ``segment``'s capture after a failure: no stream is left capturing, the pool is no
    longer recorded to, and the generators no longer believe they are capturing. A segment whose
    ``capture_end`` fails is parked (:mod:`.failed_segments`), never destroyed."""
    try:
        segment.capture_end()
        return
    except Exception as exc:
        logger.debug("capture_end after a failed capture raised: %s", exc)
    _clean_up_failed_end(segment, stream, pool)


def _clean_up_failed_end(segment: torch.cuda.CUDAGraph, stream: Any, pool: Any) -> None:
    """After ``segment.capture_end()`` raised: park the segment, stop routing allocations to the
    pool where torch did not get to, end the stream's capture and clear the error it left."""
    failed_segments.park(segment)
    _stop_allocating_to(pool, stream)
    try:
        _cudart.abandon_capture(stream)
    finally:
        _cudart.cudart().cudaGetLastError()  # clear the error the failed capture left
    reset_generator_capture_state(stream.device)


def _stop_allocating_to(pool: Any, stream: Any) -> None:
    end_pool = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end_pool is not None and pool is not None:
        try:
            end_pool(stream.device.index, pool)
        except Exception as exc:  # noqa: BLE001 - not recording to it: nothing to stop
            logger.debug("endAllocateToPool: %s", exc)


def _begin_capture(graph: torch.cuda.CUDAGraph, pool: Any, mode: str, stream: Any) -> None:
    """``graph.capture_begin`` that, when it fails (the pool is still recorded to, ...), leaves no
    capture open and the generators not believing they capture."""
    try:
        graph.capture_begin(pool=pool, capture_error_mode=mode)
    except BaseException:
        failed_segments.park(graph)  # the allocator or the generator may already point at it
        _stop_allocating_to(pool, stream)
        try:
            _cudart.abandon_capture(stream)
        finally:
            _cudart.cudart().cudaGetLastError()
        reset_generator_capture_state(stream.device)
        raise


def reset_generator_capture_state(device: torch.device | int | None = None) -> None:
    """After a capture whose ``capture_end`` failed (ours or a plain ``torch.cuda.graph``), torch's
    CUDA generators still believe they are capturing (every later random op would raise). An empty
    capture runs their prologue and epilogue again, which resets that flag."""
    with torch.cuda.stream(torch.cuda.Stream(device)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dummy = torch.cuda.CUDAGraph()
        dummy.capture_begin(capture_error_mode="relaxed")
        dummy.capture_end()


def _blas_calls(x: torch.Tensor) -> None:
    """A plain GEMM and a GEMM with bias in fp32 and bf16: the cuBLAS and cuBLASLt paths of matmuls."""
    for t in (x, x.to(torch.bfloat16)):
        t @ t
        torch.addmm(t[0], t, t)


def _init_library_handles() -> None:
    """Create this thread's cuBLAS and cuBLASLt handles before capture: creating them is not
    allowed while a stream captures."""
    torch.cuda.current_blas_handle()
    _blas_calls(torch.ones(8, 8, device=torch.cuda.current_device()))


def clear_blas_workspaces() -> None:
    """Drop torch's cached cuBLAS/cuBLASLt workspaces (one per handle and stream); the next matmul
    on a stream allocates a new one. torch's own CUDA graph trees (``mode="reduce-overhead"``) do
    the same around each recording."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _own_blas_workspace(pool: Any, stream: Any, mode: str) -> torch.cuda.CUDAGraph:
    """Make the capture stream's cuBLAS workspace a block of ``pool``.

    Kernels captured into a graph write to the workspace cuBLAS was given at capture time. A
    workspace allocated before the capture lives outside the pool: when anything later clears
    torch's workspace cache (CUDA graph trees do, on every recording), that memory goes back to
    the allocator and replays write into whatever reuses it, or fault once it is freed. So the
    cache is cleared and a tiny matmul is captured into the pool, where the new workspace is then
    allocated. Returns the tiny graph, which the caller must keep alive (it holds the pool's use
    count). A failure (another thread's device-wide synchronisation invalidates any capture) is
    cleaned up and raised.
    """
    x = torch.ones(8, 8, device=torch.cuda.current_device())
    clear_blas_workspaces()
    tiny = torch.cuda.CUDAGraph()
    _begin_capture(tiny, pool, mode, stream)
    try:
        _blas_calls(x)
    except BaseException:
        _end_failed_capture(tiny, stream, pool)
        raise
    try:
        tiny.capture_end()
    except BaseException:
        _end_failed_capture(tiny, stream, pool)
        raise
    return tiny


class BreakableCUDAGraphCapture:
    """Context manager that captures the enclosed code into ``graph``.

    Args:
        graph: an empty :class:`BreakableCUDAGraph`.
        pool: memory-pool handle to capture into (share one between graphs whose replays never
            overlap); default: the graph's own new pool.
        stream: side stream to capture on; default: a new stream. The capture stream waits for
            the current stream on entry, and the current stream waits for it on exit.
        capture_error_mode: ``"global"``, ``"thread_local"`` or ``"relaxed"``, as
            ``torch.cuda.CUDAGraph.capture_begin``.
        debug: capture nothing; run the body eagerly with the same breaks and bridge copies.
            Running the body again under a debug capture of the same graph copies every break's
            result into the first run's bridge buffers, as a replay would.

    Contracts: nested captures raise ``RuntimeError``. An exception in the body ends the capture
    (no stream left capturing, no hook installed, context state reset), marks ``graph`` failed
    and re-raises. Calls of functions decorated with :func:`eager_on_graph` become breaks.
    """

    def __init__(
        self,
        graph: BreakableCUDAGraph,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        debug: bool = False,
    ) -> None:
        if not isinstance(graph, BreakableCUDAGraph):
            raise TypeError(f"BreakableCUDAGraphCapture needs a BreakableCUDAGraph, got {type(graph).__name__}")
        if capture_error_mode not in _CAPTURE_ERROR_MODES:
            raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES}, got {capture_error_mode!r}")
        self.graph = graph
        self.pool = pool
        self.stream = stream
        self.capture_error_mode = capture_error_mode
        self.debug = debug
        self._state: _CaptureState | None = None
        self._resets: list[Callable[[], None]] = []

    def __enter__(self) -> BreakableCUDAGraph:
        if ACTIVE_CAPTURE.get() is not None:
            raise RuntimeError(
                "nested BreakableCUDAGraphCapture: a breakable capture is already active in this context; "
                "end it before starting another (use eager_on_graph for work that must run eagerly)"
            )
        if self.debug:
            self._enter_debug()
            return self.graph
        if not torch.cuda.is_available():
            raise RuntimeError(
                "BreakableCUDAGraphCapture needs a CUDA device, and torch sees none; run the code "
                "eagerly, or use debug=True to exercise the break structure without capture"
            )
        start = time.perf_counter()
        _cudart.cudart()  # clear install hint now, not mid-capture
        current = torch.cuda.current_stream()
        if _cudart.is_stream_capturing(current):
            raise RuntimeError(
                "nested capture: the current stream is already capturing a CUDA graph "
                "(torch.cuda.graph or another capture); a breakable capture cannot run inside it"
            )
        stream = self.stream if self.stream is not None else torch.cuda.Stream(current.device)
        pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
        self.graph._begin(pool, current.device, debug=False)
        stream.wait_stream(current)
        stream_ctx = torch.cuda.stream(stream)
        stream_ctx.__enter__()
        _init_library_handles()
        self._resets.append(lambda: stream_ctx.__exit__(None, None, None))
        # Afterwards no stream's cached workspace is a block of this pool, so eager matmuls never
        # write into memory the graph's kernels use (the graph keeps using its block).
        self._resets.append(clear_blas_workspaces)
        self._resets.append(lambda: current.wait_stream(stream))
        blas_start = time.perf_counter()
        try:
            self.graph._retain(_own_blas_workspace(pool, stream, self.capture_error_mode))
        except BaseException as exc:
            self.graph._fail(f"{type(exc).__name__}: {exc}")
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.graph._time("blas_workspace", time.perf_counter() - blas_start)
        state = _CaptureState(self.graph, pool, stream, self.capture_error_mode, debug=False)
        self._activate(state)
        self._resets.append(side_streams.install(state.tracker).remove)
        try:
            state.begin_segment()
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.graph._time("setup", time.perf_counter() - start)
        return self.graph

    def _enter_debug(self) -> None:
        self.graph._begin(self.pool, torch.device("cpu"), debug=True)
        self._activate(_CaptureState(self.graph, self.pool, None, self.capture_error_mode, debug=True))

    def _activate(self, state: _CaptureState) -> None:
        self._state = state
        token = ACTIVE_CAPTURE.set(state)
        self._resets.append(lambda: ACTIVE_CAPTURE.reset(token))
        no_token = no_replay_token()
        no_token.__enter__()
        self._resets.append(lambda: no_token.__exit__(None, None, None))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        state = self._state
        try:
            if state is not None and exc_type is None:
                try:
                    state.end_segment()
                    state.finalize_arguments()
                    self.graph._finish()
                except BaseException as end_exc:
                    state.abort()
                    if self.graph.state is not GraphState.FAILED:
                        self.graph._fail(f"{type(end_exc).__name__}: {end_exc}")
                    raise
            elif state is not None:
                state.abort()
                self.graph._fail(f"{exc_type.__name__}: {exc}")
        finally:
            self._state = None
            while self._resets:
                self._resets.pop()()
        return False


def eager_on_graph(
    enable: Any = True, capture_stub: Callable | None = None, capture_allocator: Callable | None = None
) -> Callable:
    """Decorator: the function runs eagerly between graph segments.

    Outside a capture the wrapped function is called directly. Inside one, the call ends the
    current segment, runs the function (or ``capture_stub``, which only has to return outputs of
    the right structure, shapes, dtypes and devices), records a replay closure, and begins the
    next segment, which reads the returned objects (the bridge buffer). At replay the real
    function runs again on the same argument tensors and its result is copied in place into the
    bridge buffer. ``enable=False`` leaves the function undecorated.

    ``capture_allocator`` (optional) is called *before* the segment ends, with the same arguments;
    it must only allocate (no kernels, no host reads) and return the output structure (a tensor or a
    tuple of tensors), or ``None`` to decline. Its buffers then live in the graph pool, held by
    the replay closure as non-owning views, so a step with N breaks does not keep N bridge
    buffers alive: later segments reuse the memory once the model drops the tensors. Usable bare
    (``@eager_on_graph``) or called (``@eager_on_graph()``).

    A break function must: return the same structure, shapes and dtypes on every call; not
    keep references to its arguments across calls (they are views into reused memory); do its
    work on the current stream.
    """
    if callable(enable):
        return eager_on_graph()(enable)

    def decorate(fn: Callable) -> Callable:
        if not enable:
            return fn
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = ACTIVE_CAPTURE.get()
            if state is None:
                return fn(*args, **kwargs)
            return state.run_break(fn, capture_stub, name, args, kwargs, capture_allocator)

        wrapper.__bcg_eager_fn__ = fn  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _no_work() -> None:
    return None


_break = eager_on_graph(_no_work)


def break_graph() -> None:
    """End the current segment and begin the next one, doing no work (a no-op outside capture)."""
    _break()


def returns_boxed_tuples_under_capture(fn: Callable) -> Callable:
    """Wrap ``fn`` so that it returns a boxed tuple while a breakable capture is active in this
    context, and its plain result otherwise."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return box_tuple(out) if is_capturing_breakable() else out

    return wrapper
