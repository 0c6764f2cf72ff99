"""Capturing one graph key with narrowing on failure (:mod:`.breaks.narrowing`), which makes a
:class:`~.entry_kinds.GraphEntry` of one kind, and :class:`Captures`: what one runner's captures share."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_layouts, host_random
from .breaks import attention, narrowing
from ..config import BCGConfig
from ..errors import BCGCaptureWarning
from ..core.capture import BreakableCUDAGraphCapture
from ..core.graph import BreakableCUDAGraph
from ..stats import CallCounters
from .breaks.eager_modules import EagerModules
from .entry_kinds import CapturedGraph, DebugRun, EagerFallback, GraphEntry, ModuleModeEntry
from .keys import Call, GraphKey

logger = logging.getLogger("bcg_diffusion")

# One capture at a time in the process: captures are rare, and serialising them keeps two threads'
# captures from interleaving their generator and cuBLAS-workspace set-up (and our own empty_cache
# calls out of captures: a device-wide synchronisation invalidates any capture). Replays and eager
# work in other threads go on (captures use capture_error_mode="thread_local").
capture_lock = threading.RLock()


@dataclass
class CaptureContext:
    """What a capture needs from its runner."""

    module: torch.nn.Module  # what is captured: the transformer, or one of its units in module mode
    forward: Callable
    config: BCGConfig
    eager_modules: EagerModules
    stream: torch.cuda.Stream
    warn: Callable[[str], None]
    evict_all: Callable[[], bool]
    root: torch.nn.Module | None = None  # the transformer (default: ``module``)
    pool: Any = None  # memory pool to capture into (default: a new one)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.root if self.root is not None else self.module


def capture_entry(
    ctx: CaptureContext, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict, layouts: list | None
) -> GraphEntry:
    """Capture ``ctx.forward(*s_args, **s_kwargs)`` on ``ctx.stream``, and on failure make the
    module that was running an eager break and retry (``config.max_narrowing`` times), then fall
    back to eager for this key. There is no warm-up run here: the key's first calls ran eagerly
    (lazy initialisation, compiled code) and recorded ``layouts`` (attention output layouts).
    Hooks of hooked modules do not run here (their state must advance once per real call): the
    caller replays the entry for the call's result. A capture that draws random numbers on the host
    (:mod:`.host_random`) makes the key run eagerly, the CPU generator put back where the call found it.

    The entry's ``phases`` give the host seconds of the capture: ``setup`` (capture stream,
    library handles and, within it, ``blas_workspace``), ``record`` (the forward under capture),
    ``instantiate`` (ending each segment's capture: instantiation of its graph), ``accounting``
    (graph memory), and ``retries`` (failed attempts before the one kept)."""
    with capture_lock, attention.policy(ctx.config.attention):
        return _capture(ctx, key, static, s_args, s_kwargs, layouts)


@dataclass
class _Attempts:
    """One key's capture across its attempts: the parts made eager so far, the first failure that
    led to narrowing, whether the one plain retry was made, the host seconds of failed attempts,
    and the memory pool the next attempt captures into."""

    ctx: CaptureContext
    start: float
    pool: Any
    narrowed: list[str] = field(default_factory=list)
    first_failure: str = ""
    retried: bool = False
    failed_s: float = 0.0

    @property
    def name(self) -> str:
        return type(self.ctx.module).__name__


def _capture(
    ctx: CaptureContext, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict, layouts: list | None
) -> GraphEntry:
    debug = ctx.config.debug  # debug mode takes the same path, failures and narrowing included; it captures nothing
    attempts = _Attempts(ctx, time.perf_counter(), ctx.pool)
    rng = host_random.watch(ctx.config)  # the CPU generator as the call found it: each attempt starts from it
    while True:
        graph = BreakableCUDAGraph()
        attempt = time.perf_counter()
        reserved = _reserved_bytes(static)  # what this attempt reserves is the graph's memory
        capture = (
            BreakableCUDAGraphCapture(graph, debug=True) if debug
            else BreakableCUDAGraphCapture(graph, pool=attempts.pool, stream=ctx.stream, capture_error_mode="thread_local")
        )
        try:
            # rng.attempt(): what an attempt draws on the host is undone, failed or not (the next attempt, or the
            # call's eager run, draws it as an eager call would)
            with attention_layouts.using_layouts(layouts), _generators_kept(debug, static), capture, rng.attempt():
                outputs = ctx.forward(*s_args, **s_kwargs)
        except Exception as exc:
            attempts.failed_s += time.perf_counter() - attempt
            given_up = _after_failure(attempts, exc)
            if given_up is not None:
                return given_up
            continue
        if rng.drew:
            return _drew_host_random(attempts, graph)
        return _captured(attempts, key, graph, static, outputs, attempt, (s_args, s_kwargs), reserved)


def _drew_host_random(attempts: _Attempts, graph: BreakableCUDAGraph) -> EagerFallback:
    """A capture that worked but drew random numbers on the host (:mod:`.host_random`): its graph is
    dropped and the key runs eagerly; the CPU generator was put back, so the call's eager run draws
    what an eager call draws."""
    graph.reset()
    narrowed = attempts.narrowed
    also = f" ({', '.join(narrowed)} had been made eager breaks after a failed attempt)" if narrowed else ""
    attempts.ctx.warn(
        f"bcg: capture of {attempts.name} found {host_random.REASON}{also}: torch's CPU generator moved while the step "
        "was captured, and a replay would repeat the numbers drawn at capture where an eager call draws new ones. "
        "This input shape now runs eagerly (the generator was put back: each call draws what eager code draws). "
        "Draw them on the device, or name the module that draws them in BCGConfig.eager_modules."
    )
    return EagerFallback(reason=host_random.REASON, capture_time_s=time.perf_counter() - attempts.start,
                         eager_modules=narrowed, phases={"retries": attempts.failed_s} if attempts.failed_s else {})


def _after_failure(attempts: _Attempts, exc: Exception) -> GraphEntry | None:
    """What a failed attempt leads to: ``None`` to try again (after evicting for memory, once as it
    is, or with one more part eager), or the entry of a key that runs eagerly or in module mode."""
    ctx, name = attempts.ctx, attempts.name
    if attempts.pool is not None and not ctx.config.debug:  # a failed capture's pool is not reused: retries get a fresh one
        attempts.pool = torch.cuda.graph_pool_handle()
    op = describe_failure(exc)
    if isinstance(exc, torch.OutOfMemoryError) and ctx.evict_all():
        return None
    if not attempts.retried:
        # Another thread's device-wide synchronisation (torch.cuda.synchronize, empty_cache)
        # invalidates any capture in the process: try once more as it is before narrowing.
        attempts.retried = True
        logger.info("bcg: capture of %s failed (%s); retrying once", name, op)
        return None
    narrowed = attempts.narrowed
    action, where = narrowing.narrow_safely(ctx, exc, narrowed)
    attempts.first_failure = attempts.first_failure or f"{where} ({op})"
    elapsed = time.perf_counter() - attempts.start
    also = f"; {', '.join(narrowed)} already ran as eager breaks" if narrowed else ""
    if action is narrowing.MODULE_MODE:
        ctx.warn(
            f"bcg: capture of {name} failed in its own forward ({op}){also}; its forward now runs eagerly and "
            "each call of its blocks and other submodules replays a graph of its own (module mode)."
        )
        return ModuleModeEntry(capture_time_s=elapsed, eager_modules=narrowed, phases={"retries": attempts.failed_s})
    if action is None:
        ctx.warn(
            f"bcg: capture of {name} failed{where} ({op}){also}; this input shape now runs eagerly. Name the "
            "module in BCGConfig.eager_modules, or use debug=True to investigate."
        )
        return EagerFallback(reason=op, capture_time_s=elapsed)
    narrowed.append(action)
    logger.info("bcg: capture of %s failed%s (%s); retrying with %s as an eager break", name, where, op, action)
    return None


def _captured(
    attempts: _Attempts, key: GraphKey, graph: BreakableCUDAGraph, static: list, outputs: Any, attempt: float,
    static_call: tuple, reserved_before: int,
) -> GraphEntry:
    """The entry of a capture that worked (in debug mode: ran), with its memory (what the device's
    reserved memory grew by during the attempt, its pool's new segments, plus the static inputs) and phases."""
    start, narrowed, failed_s = attempts.start, attempts.narrowed, attempts.failed_s
    if narrowed:
        attempts.ctx.warn(
            f"bcg: capture of {attempts.name} failed{attempts.first_failure}; {', '.join(narrowed)} now "
            f"{'runs as an eager break' if len(narrowed) == 1 else 'run as eager breaks'} and the rest is captured."
        )
    recorded = time.perf_counter()
    if attempts.ctx.config.debug:
        return DebugRun(
            graph=graph, static_inputs=static, static_call=static_call, capture_time_s=recorded - start,
            eager_modules=narrowed, phases={"record": recorded - attempt, **({"retries": failed_s} if failed_s else {})},
        )
    memory = max(_reserved_bytes(static) - reserved_before, 0) + sum(t.untyped_storage().nbytes() for t in static)
    elapsed = time.perf_counter() - start
    phases = dict(graph.capture_seconds)
    phases["record"] = recorded - attempt - phases.get("setup", 0.0) - phases.get("instantiate", 0.0)
    phases["accounting"] = elapsed - (recorded - start)
    if failed_s:
        phases["retries"] = failed_s
    logger.debug("bcg: captured %s: %r in %.3f s (%s)", key.summary(), graph, elapsed, phases)
    return CapturedGraph(graph=graph, static_inputs=static, outputs=outputs, capture_time_s=elapsed, memory_bytes=memory,
                         eager_modules=narrowed, phases=phases)


def _generators_kept(debug: bool, static: list) -> Any:
    """In debug mode, torch's generators as they were after the capture run, as after a real capture
    (which draws no numbers: its replays do), so that the replay after it draws what an eager call would."""
    if not debug:
        return contextlib.nullcontext()
    devices = sorted({t.device.index or 0 for t in static if isinstance(t, torch.Tensor) and t.is_cuda})
    return torch.random.fork_rng(devices=devices)


def describe_failure(exc: BaseException) -> str:
    """The exception and the first source line outside torch and bcg-diffusion (never raises)."""
    try:
        return _describe(exc)
    except Exception:  # noqa: BLE001 - describing a failure must not fail the call
        return type(exc).__name__


def _describe(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/torch/" in frame.filename or "/bcg_diffusion/" in frame.filename:
            continue
        return f"{type(exc).__name__}: {message} at `{(frame.line or '').strip()}` ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return f"{type(exc).__name__}: {message}"


def _reserved_bytes(static: list) -> int:
    """The CUDA caching allocator's reserved bytes on the device of the static inputs (0 off CUDA).

    A capture's memory is the growth of this across the attempt: a private pool never takes segments
    from another pool, so its new segments are what the capture added (in module mode, where units
    share a pool, each unit counts only what it added). This reads counters only: an allocator
    snapshot (``torch.cuda.memory_snapshot``) walks every block, and torch 2.11 segfaulted inside it
    here in GPU runs where many graphs had been released."""
    device = static[0].device if static and isinstance(static[0], torch.Tensor) else None
    if device is None or device.type != "cuda":
        return 0
    return torch.cuda.memory_reserved(device)


def warn_once(seen: set[str], message: str) -> None:
    if message in seen:
        return
    seen.add(message)
    warnings.warn(message, BCGCaptureWarning, stacklevel=5)


def _never() -> bool:
    return False


class Captures:
    """What the captures of one runner share: its config and eager parts, one capture stream, its
    watchers (told of each capture: :meth:`~.events.RunnerEvents.capturing` and ``captured``) and
    its counters (a capture that worked, or failed; one that made module mode is neither).
    ``evict_all`` frees the runner's other graphs when a capture of the transformer runs out of
    memory."""

    def __init__(
        self, config: BCGConfig, eager_modules: EagerModules, events: Any, counts: CallCounters,
        warn: Callable[[str], None], evict_all: Callable[[], bool],
    ) -> None:
        self.config = config
        self.eager_modules = eager_modules
        self.events = events
        self.counts = counts
        self.warn = warn
        self.evict_all = evict_all
        self._stream: torch.cuda.Stream | None = None

    def capture(
        self, module: torch.nn.Module, call: Call, key: GraphKey, layouts: list | None, *,
        root: torch.nn.Module | None = None, pool: Any = None,
    ) -> GraphEntry:
        """Capture ``call``, the forward of ``module`` on static inputs: the transformer's, or (with
        its ``root``) one of its units, into ``pool``; see :func:`capture_entry`."""
        if self._stream is None and call.device_type == "cuda":
            self._stream = torch.cuda.Stream(call.tensors[0].device)
        ctx = CaptureContext(
            module, call.forward, self.config, self.eager_modules, self._stream, self.warn,
            self.evict_all if root is None else _never,  # no eviction inside a call in module mode: its key's graphs run
            root=root, pool=pool,
        )
        entry = capture_entry(self.events.capturing(ctx), key, call.tensors, call.args, call.kwargs, layouts)
        entry = self.events.captured(entry)
        if isinstance(entry, EagerFallback):
            self.counts.failed_captures += 1
        elif isinstance(entry, CapturedGraph):
            self.counts.captures += 1
        return entry
