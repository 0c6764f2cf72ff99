"""Capturing one graph key: warm-up, capture with narrowing on failure, the :class:`GraphEntry`."""

from __future__ import annotations

import logging
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_breaks, attention_layouts
from ..config import BCGConfig
from ..core.capture import BreakableCUDAGraphCapture
from ..core.graph import BreakableCUDAGraph
from ..core.nonowning import pool_segments
from .eager_modules import EagerModules
from .keys import GraphKey

logger = logging.getLogger("bcg_diffusion")

# One capture at a time in the process: captures are rare, and serialising them keeps two threads'
# captures from interleaving their generator and cuBLAS-workspace set-up (and our own empty_cache
# calls out of captures: a device-wide synchronisation invalidates any capture). Replays and eager
# work in other threads go on (captures use capture_error_mode="thread_local").
capture_lock = threading.RLock()


class BCGCaptureWarning(RuntimeWarning):
    """A capture failed; the warning names the module and the op, and what now runs eagerly."""


@dataclass
class GraphEntry:
    """One captured key: the graph, its static inputs and outputs, and its counters."""

    key: GraphKey
    graph: BreakableCUDAGraph | None
    static_inputs: list[torch.Tensor]
    outputs: Any
    fallback: str | None = None
    capture_time_s: float = 0.0
    memory_bytes: int = 0
    hits: int = 0
    eager_modules: list[str] = field(default_factory=list)
    debug_inputs: tuple | None = None  # debug mode: the static (args, kwargs) the forward reruns on
    layouts: list | None = None  # attention output layouts recorded by the key's first (eager) calls
    # host seconds of the capture by phase (see :func:`capture_entry`); "first_replay" added by the runner
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def segments(self) -> int:
        return self.graph.num_segments if self.graph is not None else 0

    @property
    def breaks(self) -> int:
        return self.graph.num_breaks if self.graph is not None else 0

    def release(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.static_inputs = []
        self.outputs = None


class _ModuleTracker:
    """During capture: which candidate module (a transformer block or a direct child) is running."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.stack: list[str] = []
        self._handles: list[Any] = []
        for name, child in root.named_children():
            if _is_compiled(child):
                continue  # hooks on a compiled module would make dynamo recompile mid-capture
            if isinstance(child, torch.nn.ModuleList):
                for index, block in enumerate(child):
                    if not _is_compiled(block):
                        self._watch(f"{name}.{index}", block)
            else:
                self._watch(name, child)

    def _watch(self, name: str, module: torch.nn.Module) -> None:
        def enter(*_: Any) -> None:
            self.stack.append(name)

        def leave(*_: Any) -> None:  # must return None: a forward hook's result replaces the output
            if self.stack:
                self.stack.pop()

        self._handles.append(module.register_forward_pre_hook(enter))
        self._handles.append(module.register_forward_hook(leave))

    def culprit(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@dataclass
class CaptureContext:
    """What a capture needs from its runner."""

    module: torch.nn.Module
    forward: Callable
    config: BCGConfig
    eager_modules: EagerModules
    stream: torch.cuda.Stream
    warn: Callable[[str], None]
    evict_all: Callable[[], bool]


def capture_entry(
    ctx: CaptureContext, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict, layouts: list | None
) -> GraphEntry:
    """Capture ``ctx.forward(*s_args, **s_kwargs)`` on ``ctx.stream``, and on failure make the
    module that was running an eager break and retry (``config.max_narrowing`` times), then fall
    back to eager for this key. There is no warm-up run here: the key's first calls ran eagerly
    (lazy initialisation, compiled code) and recorded ``layouts`` (attention output layouts).
    Hooks of hooked modules do not run here (their state must advance once per real call): the
    caller replays the entry for the call's result.

    The entry's ``phases`` give the host seconds of the capture: ``setup`` (capture stream,
    library handles and, within it, ``blas_workspace``), ``record`` (the forward under capture),
    ``instantiate`` (ending each segment's capture: instantiation of its graph), ``accounting``
    (graph memory), and ``retries`` (failed attempts before the one kept)."""
    with capture_lock, attention_breaks.policy(ctx.config.attention):
        return _capture(ctx, key, static, s_args, s_kwargs, layouts)


def _capture(
    ctx: CaptureContext, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict, layouts: list | None
) -> GraphEntry:
    name = type(ctx.module).__name__
    stream = ctx.stream
    start = time.perf_counter()
    if ctx.config.debug:
        graph = BreakableCUDAGraph()
        with BreakableCUDAGraphCapture(graph, debug=True):
            ctx.forward(*s_args, **s_kwargs)
        elapsed = time.perf_counter() - start
        return GraphEntry(
            key, graph, static, None, capture_time_s=elapsed, debug_inputs=(s_args, s_kwargs), layouts=layouts,
            phases={"record": elapsed},
        )
    narrowed: list[str] = []
    retried = False
    while True:
        graph = BreakableCUDAGraph()
        tracker = _ModuleTracker(ctx.module)
        attempt = time.perf_counter()
        try:
            with attention_layouts.using_layouts(layouts), BreakableCUDAGraphCapture(
                graph, stream=stream, capture_error_mode="thread_local"
            ):
                outputs = ctx.forward(*s_args, **s_kwargs)
        except Exception as exc:
            culprit = tracker.culprit()
            tracker.remove()
            op = describe_failure(exc)
            if isinstance(exc, torch.OutOfMemoryError) and ctx.evict_all():
                continue
            if not retried:
                # Another thread's device-wide synchronisation (torch.cuda.synchronize, empty_cache)
                # invalidates any capture in the process: try once more as it is before narrowing.
                retried = True
                logger.info("bcg: capture of %s failed (%s); retrying once", name, op)
                continue
            if culprit is None or culprit in ctx.eager_modules.names or len(narrowed) >= ctx.config.max_narrowing:
                where = f" in {culprit}" if culprit else ""
                ctx.warn(
                    f"bcg: capture of {name} failed{where} ({op}); this input shape now runs eagerly. Name the "
                    "module in BCGConfig.eager_modules, or use debug=True to investigate."
                )
                return GraphEntry(key, None, [], None, fallback=op, capture_time_s=time.perf_counter() - start, layouts=layouts)
            ctx.eager_modules.add(culprit)
            narrowed.append(culprit)
            ctx.warn(
                f"bcg: capture of {name} failed in {culprit} ({type(ctx.module.get_submodule(culprit)).__name__}): "
                f"{op}; {culprit} now runs as an eager break of its own and the rest is captured."
            )
            continue
        tracker.remove()
        break
    recorded = time.perf_counter()
    memory = pool_bytes(graph, static[0].device) + sum(t.untyped_storage().nbytes() for t in static)
    elapsed = time.perf_counter() - start
    phases = dict(graph.capture_seconds)
    phases["record"] = recorded - attempt - phases.get("setup", 0.0) - phases.get("instantiate", 0.0)
    phases["accounting"] = elapsed - (recorded - start)
    if attempt > start:
        phases["retries"] = attempt - start
    logger.debug("bcg: captured %s: %r in %.3f s (%s)", key.summary(), graph, elapsed, phases)
    return GraphEntry(
        key, graph, static, outputs, capture_time_s=elapsed, memory_bytes=memory, eager_modules=narrowed,
        layouts=layouts, phases=phases,
    )


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")


def describe_failure(exc: BaseException) -> str:
    """The exception and the first source line outside torch and bcg-diffusion."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/torch/" in frame.filename or "/bcg_diffusion/" in frame.filename:
            continue
        return f"{type(exc).__name__}: {message} at `{(frame.line or '').strip()}` ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return f"{type(exc).__name__}: {message}"


def pool_bytes(graph: BreakableCUDAGraph, device: torch.device) -> int:
    if graph.pool is None:
        return 0
    try:
        return sum(s["total_size"] for s in pool_segments(graph.pool, device))
    except Exception:  # noqa: BLE001 - memory accounting is best effort
        return 0


def warn_once(seen: set[str], message: str) -> None:
    if message in seen:
        return
    seen.add(message)
    warnings.warn(message, BCGCaptureWarning, stacklevel=5)
