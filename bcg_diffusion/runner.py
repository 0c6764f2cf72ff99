"""The graph runner: one per accelerated transformer; keys, captures, replays, falls back."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_breaks
from .capture import BreakableCUDAGraphCapture
from .copy_back import BreakOutputMismatchError
from .config import BCGConfig
from .descriptor import GraphKey, UncacheableInput, execution_state, flatten_inputs, rebuild_inputs
from .eager_modules import EagerModules
from .families import TransformerInfo
from .fingerprint import WeightsFingerprint
from .graph import BreakableCUDAGraph
from .nonowning import pool_segments
from .text_buckets import pad_text_to_bucket

logger = logging.getLogger("bcg_diffusion")


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


class GraphRunner:
    """Replaces ``module.forward``: keys each call, captures new keys, replays known ones.

    Contract: the result of a call equals the eager ``forward`` (bitwise where the same kernels
    run); output tensors are fresh (a later replay does not overwrite them).
    """

    def __init__(self, module: torch.nn.Module, forward: Callable, config: BCGConfig, info: TransformerInfo) -> None:
        self.module = module
        self.forward = forward
        self.config = config
        self.info = info
        self.entries: collections.OrderedDict[GraphKey, GraphEntry] = collections.OrderedDict()
        self.eager_modules = EagerModules(module)
        self.fingerprint = WeightsFingerprint(module, every_call=config.check_weights == "every_call")
        self.misses = 0
        self.eager_calls = 0
        self.captures = 0
        self._stream: torch.cuda.Stream | None = None
        self._warned: set[str] = set()
        self._last_key: GraphKey | None = None
        for name in self.eager_modules.resolve(config.eager_modules):
            self.eager_modules.add(name)

    # -- the call -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs = pad_text_to_bucket(self.info, self.config.text_buckets, kwargs)
        try:
            inputs, tensors = flatten_inputs(args, kwargs)
        except UncacheableInput as exc:
            return self._eager(args, kwargs, f"uncacheable input: {exc}")
        if not tensors or not all(t.is_cuda for t in tensors):
            return self._eager(args, kwargs, "inputs are not all on a CUDA device")
        inputs += self._value_fields(kwargs)
        key = GraphKey(inputs, execution_state(self.module), self.fingerprint.current())
        entry = self.entries.get(key)
        if entry is None:
            entry = self._new_entry(key, args, kwargs, tensors)
        else:
            self.entries.move_to_end(key)
        if entry.fallback is not None:
            return self._eager(args, kwargs, None)
        try:
            out = self._run(entry, tensors)
        except BreakOutputMismatchError as exc:
            # A break returned another shape than at capture: its output shape depends on values the
            # key does not hold. Never return a partial replay: this key runs eagerly from now on.
            self._warn(
                f"bcg: replay of {type(self.module).__name__} stopped: {exc}. This input shape now runs eagerly."
            )
            entry.release()
            entry.fallback = f"break output changed shape: {str(exc).splitlines()[0][:200]}"
            return self._eager(args, kwargs, None)
        entry.hits += 1
        return out

    def _value_fields(self, kwargs: dict) -> tuple:
        """Key fields for masks whose values decide shapes inside the model (per-row token counts)."""
        fields = []
        for name in self.info.value_keyed:
            mask = kwargs.get(name)
            if isinstance(mask, torch.Tensor):
                fields.append((f"{name}.sum(-1)", tuple(mask.sum(-1).flatten().tolist())))
        return tuple(fields)

    def _eager(self, args: tuple, kwargs: dict, reason: str | None) -> Any:
        self.eager_calls += 1
        if reason is not None and reason not in self._warned:
            self._warned.add(reason)
            logger.info("bcg: %s runs eagerly: %s", type(self.module).__name__, reason)
        return self.forward(*args, **kwargs)

    def _run(self, entry: GraphEntry, tensors: list[torch.Tensor]) -> Any:
        for static, live in zip(entry.static_inputs, tensors):
            if static is not live:
                static.copy_(live)
        if self.config.debug:
            s_args, s_kwargs = entry.debug_inputs
            with BreakableCUDAGraphCapture(entry.graph, debug=True):
                out = self.forward(*s_args, **s_kwargs)
            return _fresh_copy(out)
        entry.graph.replay()
        return _fresh_copy(entry.outputs)

    # -- new keys -------------------------------------------------------------------------
    def _new_entry(self, key: GraphKey, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> GraphEntry:
        self.misses += 1
        if self.config.log_misses and self.entries:
            closest = self._last_key or next(reversed(self.entries))
            logger.info(
                "bcg: %s new graph key (%d kept); changed %s",
                type(self.module).__name__, len(self.entries), key.difference(closest),
            )
        self._last_key = key
        self._evict(keep=self.config.max_graphs - 1)
        static = [torch.empty_like(t).copy_(t) for t in tensors]  # same strides where dense; expanded inputs get dense buffers
        s_args, s_kwargs = rebuild_inputs(args, kwargs, static)
        entry = self._capture(key, static, s_args, s_kwargs)
        self.entries[key] = entry
        self._enforce_budget()
        return entry

    def _capture(self, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict) -> GraphEntry:
        if self._stream is None:
            self._stream = torch.cuda.Stream(static[0].device)
        stream, current = self._stream, torch.cuda.current_stream()
        start = time.perf_counter()
        stream.wait_stream(current)
        try:
            with torch.cuda.stream(stream), attention_breaks.recording_layouts() as layouts:
                for _ in range(self.config.warmup_iters):
                    self.forward(*s_args, **s_kwargs)
        except Exception as exc:
            current.wait_stream(stream)
            raise RuntimeError(
                f"{type(self.module).__name__} failed in its eager warm-up run before capture; this is an error "
                "of the model call itself (it would fail without bcg-diffusion too)"
            ) from exc
        current.wait_stream(stream)
        if self.config.debug:
            graph = BreakableCUDAGraph()
            with BreakableCUDAGraphCapture(graph, debug=True):
                self.forward(*s_args, **s_kwargs)
            self.captures += 1
            return GraphEntry(
                key, graph, static, None, capture_time_s=time.perf_counter() - start, debug_inputs=(s_args, s_kwargs)
            )
        narrowed: list[str] = []
        for attempt in range(self.config.max_narrowing + 1):
            graph = BreakableCUDAGraph()
            tracker = _ModuleTracker(self.module)
            try:
                with attention_breaks.using_layouts(layouts), BreakableCUDAGraphCapture(graph, stream=stream):
                    outputs = self.forward(*s_args, **s_kwargs)
            except Exception as exc:
                culprit = tracker.culprit()
                tracker.remove()
                op = _describe_failure(exc)
                if isinstance(exc, torch.OutOfMemoryError) and len(self.entries) > 0:
                    self._evict(keep=0)
                    continue
                if culprit is None or culprit in self.eager_modules.names or attempt == self.config.max_narrowing:
                    where = f" in {culprit}" if culprit else ""
                    self._warn(
                        f"bcg: capture of {type(self.module).__name__} failed{where} ({op}); this input shape now runs "
                        "eagerly. Name the module in BCGConfig.eager_modules, or use debug=True to investigate."
                    )
                    self.captures += 1
                    return GraphEntry(key, None, [], None, fallback=op, capture_time_s=time.perf_counter() - start)
                self.eager_modules.add(culprit)
                narrowed.append(culprit)
                self._warn(
                    f"bcg: capture of {type(self.module).__name__} failed in {culprit} "
                    f"({type(self.module.get_submodule(culprit)).__name__}): {op}; {culprit} now runs as an eager "
                    "break of its own and the rest is captured."
                )
                continue
            tracker.remove()
            break
        graph.replay()  # the call's result comes from the graph, like every later call
        self.captures += 1
        memory = _pool_bytes(graph, static[0].device) + sum(t.untyped_storage().nbytes() for t in static)
        elapsed = time.perf_counter() - start
        logger.debug("bcg: captured %s: %r in %.3f s", key.summary(), graph, elapsed)
        return GraphEntry(key, graph, static, outputs, capture_time_s=elapsed, memory_bytes=memory, eager_modules=narrowed)

    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        warnings.warn(message, BCGCaptureWarning, stacklevel=4)

    # -- memory ---------------------------------------------------------------------------
    def _evict(self, keep: int, over_budget: int | None = None) -> None:
        """Release least recently used entries while more than ``keep`` are kept, and, with a
        budget, while the kept ones hold more than ``over_budget`` bytes (the newest always stays)."""
        evicted = False
        while len(self.entries) > keep or (
            over_budget is not None
            and len(self.entries) > 1
            and sum(e.memory_bytes for e in self.entries.values()) > over_budget
        ):
            _, entry = self.entries.popitem(last=False)
            entry.release()
            evicted = True
        if evicted:
            torch.cuda.empty_cache()

    def _enforce_budget(self) -> None:
        if self.config.memory_budget_bytes is not None:
            self._evict(keep=len(self.entries), over_budget=self.config.memory_budget_bytes)

    def clear(self) -> None:
        """Drop every captured graph (they are recaptured on the next calls)."""
        self._evict(keep=0)

    def close(self) -> None:
        """Free all graphs and undo the eager-module patches."""
        self.clear()
        self.eager_modules.restore()


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")


def _describe_failure(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/torch/" in frame.filename or "/bcg_diffusion/" in frame.filename:
            continue
        return f"{type(exc).__name__}: {message} at `{(frame.line or '').strip()}` ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
    return f"{type(exc).__name__}: {message}"


def _pool_bytes(graph: BreakableCUDAGraph, device: torch.device) -> int:
    if graph.pool is None:
        return 0
    try:
        return sum(s["total_size"] for s in pool_segments(graph.pool, device))
    except Exception:  # noqa: BLE001 - memory accounting is best effort
        return 0


def _fresh_copy(value: Any) -> Any:
    """A copy of the output structure whose tensors the next replay cannot overwrite."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        items = [_fresh_copy(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return [_fresh_copy(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(**{f.name: _fresh_copy(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return type(value)((k, _fresh_copy(v)) for k, v in value.items())
    return value
