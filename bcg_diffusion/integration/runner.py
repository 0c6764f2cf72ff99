"""The graph runner: one per accelerated transformer; dispatches each call on its key.

It sits at the bottom of the transformer's diffusers hook chain (``bcg_graphs`` hook), so every
other hook on the transformer runs on every call, and it is told by diffusers at the end of each
pipeline call (``reset_state``) to re-read the model's weights and structure.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import attention_breaks, attention_layouts, parallel
from ..config import BCGConfig
from ..core.copy_back import BreakOutputMismatchError
from ..core.tree import tree_map
from .eager_modules import EagerModules
from ..errors import AccelerationError
from .entries import CaptureContext, GraphEntry, capture_entry, capture_lock, warn_once
from ..families import TransformerInfo
from .hooked_modules import HookedModules
from .keys import GRAD_MODE_FIELDS, GraphKey, HostTensor, ObjectState, UncacheableInput, build_key, flatten_inputs, rebuild_inputs
from .model_state import ModelState, Structure
from .module_mode import ChildGraphs
from .static_inputs import static_copy
from .text_buckets import pad_text_to_bucket

logger = logging.getLogger("bcg_diffusion")
_SEEN_LIMIT = 64  # keys seen but not captured yet, kept for their next call (least recently used dropped)


@dataclass
class _Seen:
    """A key that ran eagerly but is not captured: its eager calls and their attention layouts."""

    calls: int = 0
    layouts: list | None = None
    mutates: str | None = None  # why the key runs eagerly: its calls change their own inputs


class GraphRunner:
    """Runs the transformer's forward: keys each call, captures new keys, replays known ones.

    Contract: the result of a call equals the eager ``forward`` (bitwise where the same kernels
    run); output tensors are fresh (a later replay does not overwrite them). Calls from several
    threads are serialised (one lock per transformer).
    """

    def __init__(self, module: torch.nn.Module, config: BCGConfig, info: TransformerInfo) -> None:
        self.module = module
        self.forward: Callable = module.forward
        self.config = config
        self.info = info
        self.entries: collections.OrderedDict[GraphKey, GraphEntry] = collections.OrderedDict()
        self.eager_modules = EagerModules(module)
        self.state = ModelState(module, every_call=config.check_weights == "every_call")
        self.hooked = HookedModules(module)
        self._seen: collections.OrderedDict[GraphKey, _Seen] = collections.OrderedDict()
        self.misses = 0
        self.warmup_calls = 0
        self.eager_calls = 0
        self.captures = 0
        self.structure_changes = 0
        self._structure: Structure | None = None
        self._undo_breaks: Callable[[], None] | None = None
        self._stream: torch.cuda.Stream | None = None
        self._last_stream: torch.cuda.Stream | None = None
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self._last_key: GraphKey | None = None
        self.ranks: parallel.NoRanks = parallel.NO_RANKS  # context parallelism: see integration/parallel.py
        for name in self.eager_modules.resolve(config.eager_modules):
            self.eager_modules.add(name)

    def bind(self, forward_below: Callable) -> "GraphRunner":
        """Use ``forward_below`` (the forward under our hook) as the eager forward (compiled whole
        with ``BCGConfig.compile``)."""
        self.forward = torch.compile(forward_below, dynamic=False) if self.config.compile else forward_below
        return self

    def on_pipeline_call_end(self) -> None:
        """Weights and structure are read again on the next call."""
        self.state.invalidate()

    # -- the call -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock, parallel.calling(self):  # context parallelism: a rank that raises tells the others
            self._follow_structure()
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        kwargs = pad_text_to_bucket(self.info, self.config.text_buckets, kwargs)
        try:
            inputs, tensors = flatten_inputs(args, kwargs, device_type="cuda")
        except UncacheableInput as exc:
            return self._eager(args, kwargs, f"uncacheable input: {exc}")
        if not tensors:
            return self._eager(args, kwargs, "no input tensor is on a CUDA device")
        self._follow_stream()
        keyed = time.perf_counter()
        key = build_key(self.module, self.info, kwargs, inputs, self.state.weights.current())
        key_s = time.perf_counter() - keyed
        self.ranks.agree_key(self, key)  # context parallelism: every rank takes this call's path
        entry = self.entries.get(key)
        if entry is None:
            seen = self._seen.get(key)
            if seen is not None and seen.mutates:
                return self._eager(args, kwargs, seen.mutates)
            if seen is None or seen.calls < self.config.warmup_iters:
                return self._first_call(key, seen, args, kwargs, inputs)
            entry = self._new_entry(key, args, kwargs, tensors, seen)
            entry.phases["key"] = key_s  # weights fingerprint (when due) and key building
        else:
            self.entries.move_to_end(key)
        if entry.fallback is not None:
            return self._eager(args, kwargs, None)
        if entry.module_mode:
            entry.hits += 1
            return tree_map(torch.Tensor.clone, entry.children.run(self.forward, args, kwargs))
        first = entry.hits == 0
        try:
            replay_start = time.perf_counter()
            out = self._run(entry, tensors)
            if first:
                entry.phases["first_replay"] = time.perf_counter() - replay_start
        except BreakOutputMismatchError as exc:
            # A break returned another shape than at capture: its output shape depends on values the
            # key does not hold. Never return a partial replay: this key runs eagerly from now on.
            self.ranks.replay_failed(exc)  # context parallelism: raises (the other ranks ran part of the call)
            self._warn(f"bcg: replay of {type(self.module).__name__} stopped: {exc}. This input shape now runs eagerly.")
            entry.release()
            entry.fallback = f"break output changed shape: {str(exc).splitlines()[0][:200]}"
            return self._eager(args, kwargs, None)
        entry.hits += 1
        return out

    def _follow_stream(self) -> None:
        """Calls on another stream than the last one wait for it (static buffers are shared)."""
        current = torch.cuda.current_stream()
        if self._last_stream is not None and current != self._last_stream:
            current.wait_stream(self._last_stream)
        self._last_stream = current

    def _follow_structure(self) -> None:
        self.ranks = parallel.follow(self)  # context parallelism enabled, changed or gone: integration/parallel.py
        structure = self.state.structure()
        if structure is self._structure:
            return
        if structure == self._structure:
            self._structure = structure
            return
        if self.config.compile and structure.hooked:
            raise AccelerationError(
                f"BCGConfig(compile=True) compiles {type(self.module).__name__}'s whole forward, which would trace "
                f"through the hooks on {', '.join(h.path for h in structure.hooked[:3])}; with hooks (step caches) "
                "compile the blocks (compile_repeated_blocks) and leave compile=False"
            )
        self.ranks.check_structure(self.module, self.eager_modules.names)  # context parallelism: refusals
        if self._structure is not None:
            self.structure_changes += 1
            logger.info(
                "bcg: %s changed (%s): its graphs are dropped and recaptured",
                type(self.module).__name__,
                structure.describe_difference(self._structure),
            )
        self.clear()
        self.hooked.apply(structure.hooked)
        undo_old = self._undo_breaks
        self._undo_breaks = attention_breaks.install(self.module, self.info.eager_functions)
        if undo_old is not None:
            undo_old()
        self._structure = structure

    def _eager(self, args: tuple, kwargs: dict, reason: str | None) -> Any:
        self.ranks.agree_eager(reason, args, kwargs)  # context parallelism: the plan of a call with no key (no-op after one)
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
            from ..core.capture import BreakableCUDAGraphCapture

            s_args, s_kwargs = entry.debug_inputs
            with attention_breaks.policy(self.config.attention), BreakableCUDAGraphCapture(entry.graph, debug=True):
                out = self.forward(*s_args, **s_kwargs)
            return tree_map(torch.Tensor.clone, out)
        entry.graph.replay()
        return tree_map(torch.Tensor.clone, entry.outputs)

    # -- new keys -------------------------------------------------------------------------
    def _first_call(self, key: GraphKey, seen: "_Seen | None", args: tuple, kwargs: dict, inputs: tuple) -> Any:
        """A call of a key not captured yet: it runs eagerly (the real call: its result is returned),
        warming lazy initialisation and compiled code, and records the attention output layouts the
        capture at the key's next call allocates from. A call that changes its own inputs (an input
        object it writes to, a host tensor) is never captured: its key runs eagerly."""
        if seen is None:
            self.misses += 1
            if self.config.log_misses and (self.entries or self._seen):
                closest = self._last_key or next(reversed(self.entries or self._seen))
                logger.info(
                    "bcg: %s new graph key (%d kept); changed %s",
                    type(self.module).__name__, len(self.entries), key.difference(closest),
                )
            self._last_key = key
            self._warn_grad_mode_twin(key)
            seen = self._seen[key] = _Seen()
            while len(self._seen) > _SEEN_LIMIT:
                self._seen.popitem(last=False)
        self._seen.move_to_end(key)
        self.warmup_calls += 1
        with attention_layouts.recording_layouts() as layouts:
            out = self.forward(*args, **kwargs)
        seen.calls += 1
        seen.layouts = layouts
        if any(isinstance(v, (ObjectState, HostTensor)) for _, v in inputs):
            after, _ = flatten_inputs(args, kwargs, device_type="cuda")
            if after != inputs:
                changed = GraphKey(after, (), None).difference(GraphKey(inputs, (), None))
                seen.mutates = f"the call changes its own inputs ({changed}), so it cannot be replayed"
        return out

    def _warn_grad_mode_twin(self, key: GraphKey) -> None:
        """Warn (once) when a new key equals a captured one but for grad or inference mode: most
        often a warm-up made outside ``torch.inference_mode()`` for calls made inside it."""
        for captured in reversed(self.entries):
            fields = key.differs_only_in(captured, GRAD_MODE_FIELDS)
            if fields:
                now = ", ".join(f"{name}={dict(key.state)[name]}" for name in fields)
                self._warn(
                    f"bcg: {type(self.module).__name__} captures a new graph for a call whose only difference from a "
                    f"captured one is the grad mode ({now} now): a capture is made per grad mode. Warm up and call "
                    "in the same mode (both inside torch.inference_mode(), or both outside it)."
                )
                return

    def _new_entry(self, key: GraphKey, args: tuple, kwargs: dict, tensors: list[torch.Tensor], seen: "_Seen") -> GraphEntry:
        del self._seen[key]
        self._evict(keep=self.config.max_graphs - 1)
        copied = time.perf_counter()
        static = [static_copy(t) for t in tensors]
        s_args, s_kwargs = rebuild_inputs(args, kwargs, static, device_type="cuda")
        if self._stream is None:
            self._stream = torch.cuda.Stream(static[0].device)
        ctx = CaptureContext(
            self.module, self.forward, self.config, self.eager_modules, self._stream, self._warn, self._evict_for_memory
        )
        ctx = self.ranks.capture_context(ctx)  # context parallelism: no narrowing, no eviction mid-capture
        static_s = time.perf_counter() - copied
        entry = capture_entry(ctx, key, static, s_args, s_kwargs, seen.layouts)
        self.ranks.agree_capture(entry)  # context parallelism: one failed rank makes every rank fall back
        entry.phases["static_inputs"] = static_s
        if entry.module_mode:
            entry.static_inputs = []  # the forward runs eagerly on the live inputs
            entry.children = ChildGraphs(
                self.module, {h.path for h in self._structure.hooked} if self._structure else set(),
                self._child_capturer(entry), self.config.warmup_iters,
            )
        self.captures += 1
        self.entries[key] = entry
        self._enforce_budget()
        return entry

    def _child_capturer(self, entry: GraphEntry) -> Callable[..., GraphEntry]:
        """How module mode captures one child call: into one memory pool per key, with the
        transformer's eager parts, narrowing inside the child where it fails."""
        pools = [torch.cuda.graph_pool_handle()]

        def capture(path: str, chain: Callable, key: GraphKey, static: list, s_args: tuple, s_kwargs: dict, layouts: list | None) -> GraphEntry:
            ctx = CaptureContext(
                self.module.get_submodule(path), chain, self.config, self.eager_modules, self._stream, self._warn,
                lambda: False, root=self.module, pool=pools[-1],  # no eviction mid-call: this key's entry is running
            )
            ctx = self.ranks.capture_context(ctx)  # context parallelism: as in _new_entry
            child = capture_entry(ctx, key, static, s_args, s_kwargs, layouts)
            self.ranks.agree_capture(child)  # context parallelism: as in _new_entry
            if "retries" in child.phases or child.fallback is not None:
                pools.append(torch.cuda.graph_pool_handle())  # later children do not share a failed capture's pool
            entry.capture_time_s += child.capture_time_s
            entry.memory_bytes += child.memory_bytes
            return child

        return capture

    def _warn(self, message: str) -> None:
        warn_once(self._warned, message)

    # -- memory ---------------------------------------------------------------------------
    def _evict_for_memory(self) -> bool:
        had = bool(self.entries)
        self._evict(keep=0)
        return had

    def _evict(self, keep: int, over_budget: int | None = None, forget: bool = False) -> None:
        """Release least recently used entries while more than ``keep`` are kept, and, with a
        budget, while the kept ones hold more than ``over_budget`` bytes (the newest always stays).
        An evicted key is captured again at its next call; with ``forget`` it starts anew (its first
        call runs eagerly), as after a structure change."""
        evicted = False
        while len(self.entries) > keep or (
            over_budget is not None
            and len(self.entries) > 1
            and sum(e.memory_bytes for e in self.entries.values()) > over_budget
        ):
            key, entry = self.entries.popitem(last=False)
            if forget:
                self._seen.pop(key, None)
            elif entry.fallback is None:  # it ran before: captured again at its next call
                self._seen[key] = _Seen(self.config.warmup_iters, entry.layouts)
            entry.release()
            evicted = True
        if evicted and torch.cuda.is_available():
            with capture_lock:  # emptying the cache synchronises the device, which breaks captures
                torch.cuda.empty_cache()

    def _enforce_budget(self) -> None:
        if self.config.memory_budget_bytes is not None:
            self._evict(keep=len(self.entries), over_budget=self.config.memory_budget_bytes)

    def clear(self) -> None:
        """Drop every captured graph and every key seen; each key runs eagerly once more, then is
        captured again."""
        with self._lock:
            self._evict(keep=0, forget=True)
            self._seen.clear()

    def close(self) -> None:
        """Free all graphs and undo every patch this runner made (hooked modules, eager modules,
        attention breaks)."""
        with self._lock:
            self.clear()
            self.hooked.clear()
            self.eager_modules.restore()
            self.ranks.close()  # context parallelism: undoes the gather break
            if self._undo_breaks is not None:
                self._undo_breaks()
                self._undo_breaks = None
            self._structure = None

    def cache_passes(self) -> tuple[int, int]:
        """(hooked calls replayed, of which the hooks computed the body) over this runner's
        step-cache modules; the difference is what the cache reused."""
        bodies = self.hooked.bodies
        return sum(b.calls for b in bodies), sum(b.computed for b in bodies)
