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

from . import attention_breaks, attention_layouts, fingerprint, parallel, sabotage
from ..config import BCGConfig
from ..core.copy_back import BreakOutputMismatchError
from ..core.handles import RemovableHandle
from ..core.tree import tree_map
from .eager_modules import EagerModules
from ..errors import AccelerationError
from .entries import CaptureContext, GraphEntry, capture_entry, capture_lock, replay_entry, warn_once
from ..families import TransformerInfo
from .forward_chain import ForwardChain
from .hooked_modules import HookedModules
from .keys import GRAD_MODE_FIELDS, GraphKey, HostTensor, ObjectState, UncacheableInput, build_key, flatten_inputs, rebuild_inputs
from .model_state import ModelState, Structure
from .module_mode import ChildCounters, ChildGraphs, replay_units, spine_of
from .python_code import OpaqueCode, classify_forward, is_pure
from ..stats import BCGStats, GraphEntryStats
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
    threads are serialised (one lock per transformer). Whatever ``module.forward`` is at call time
    runs (see :mod:`.forward_chain`); Python the key cannot see (:mod:`.python_code`) runs eagerly
    on every call, and the modules it calls replay (module mode).

    Life cycle: :meth:`attach` (after the ``bcg_graphs`` hook is in the transformer's chain) puts
    the forward chain in place and reads the structure (refusals raise here); :meth:`close`
    frees everything and undoes every patch but the hook; :meth:`snapshot` reports.
    """

    def __init__(self, module: torch.nn.Module, config: BCGConfig, info: TransformerInfo) -> None:
        # the transformer is held once, by its state (``self.module`` reads it); the eager and
        # hooked modules are given it where they need it
        self.state = ModelState(module, every_call=config.check_weights == "every_call", pure_forwards=config.pure_forwards)
        self.config = config
        self.info = info
        self.entries: collections.OrderedDict[GraphKey, GraphEntry] = collections.OrderedDict()
        self.eager_modules = EagerModules()
        self.hooked = HookedModules()
        self.chain: ForwardChain | None = None
        self._seen: collections.OrderedDict[GraphKey, _Seen] = collections.OrderedDict()
        self.misses = 0
        self.warmup_calls = 0
        self.eager_calls = 0
        self.hits = 0
        self.captures = 0
        self.failed_captures = 0
        self.structure_changes = 0
        self._retired_children = ChildCounters()  # unit calls of keys no longer kept
        self._structure: Structure | None = None
        self._code: tuple | None = None  # the forward chain's levels and the class forward, as last planned
        self._root_opaque: dict[int, OpaqueCode | None] = {}
        self._spine: set[str] = set()
        self._compiled: tuple[Any, Callable] | None = None
        self._breaks: RemovableHandle | None = None  # the attention breaks this transformer needs
        self._stream: torch.cuda.Stream | None = None
        self._last_stream: torch.cuda.Stream | None = None
        self._lock = threading.RLock()
        self._local = threading.local()  # depth: inside a call of this runner in this thread
        self._closed = False
        # where inputs must live to be keyed and captured; "cpu" only for debug mode on a machine without CUDA
        self.device_type = "cuda" if torch.cuda.is_available() or not config.debug else "cpu"
        self._warned: set[str] = set()
        self._last_key: GraphKey | None = None
        sabotage.read_environment()
        self.ranks: parallel.NoRanks = parallel.NO_RANKS  # context parallelism: see integration/parallel.py
        for name in EagerModules.resolve(module, config.eager_modules):
            self.eager_modules.add(module, name)

    @property
    def module(self) -> torch.nn.Module:
        """The transformer this runner accelerates."""
        return self.state.root

    def attach(self, below: Callable, link: Callable, hook_ref: Any) -> None:
        """Start following the forward chain: ``below`` is what the ``bcg_graphs`` hook wraps,
        ``link`` what the hook put in the chain (``hook_ref`` its diffusers function reference).
        Reads the structure now, so that refusals (offloading, casting) raise at acceleration."""
        self.chain = ForwardChain(self.module, below, link, hook_ref, self.enter, self._forwards_changed)
        self._follow_structure()
        if self.config.compile and (self.opaque_root(0) is not None or self._spine):
            self._refuse_compile(self.opaque_root(0))
        self.state.invalidate()  # the first call reads again what changed since (a cache enabled now)

    def on_pipeline_call_end(self) -> None:
        """Weights and structure are read again on the next call."""
        self.state.invalidate()

    # -- the call -------------------------------------------------------------------------
    def enter(self, level: int, args: tuple, kwargs: dict) -> Any:
        """A call through the forward chain at ``level`` (0: through the ``bcg_graphs`` hook)."""
        if self._closed:
            return self.chain.forward_at(level)(*args, **kwargs)
        if getattr(self._local, "depth", 0):
            # a foreign forward calling the forward it replaced, inside this runner's eager call
            return self.chain.forward_at(level)(*args, **kwargs)
        # context parallelism: a rank that raises tells the others; forward_state: buffers the forward
        # reassigns are written in place (fingerprint.py)
        with self._lock, parallel.calling(self), fingerprint.forward_state():
            self._local.depth = 1
            try:
                self._follow_structure()
                return self._call(level, args, kwargs)
            finally:
                self._local.depth = 0

    def _forward_for(self, level: int) -> Callable:
        """What a call at ``level`` runs eagerly and captures (compiled whole with ``BCGConfig.compile``)."""
        forward = self.chain.forward_at(level)
        if not self.config.compile:
            return forward
        if self._compiled is None or self._compiled[0] != (level, self._code):
            self._compiled = ((level, self._code), torch.compile(forward, dynamic=False))
        return self._compiled[1]

    def opaque_root(self, level: int) -> OpaqueCode | None:
        """The transformer's own Python at ``level`` when the key cannot see it (cached per plan)."""
        if level not in self._root_opaque:
            if level > 0:
                forward = self.chain.forwards[level]
                opaque = None if is_pure(forward, self.config.pure_forwards) else OpaqueCode(
                    "", "forward replaced after acceleration", self.chain.describe(level)
                )
            else:
                opaque = classify_forward(self.module, self.chain.forward_at(0), "", self.config.pure_forwards)
            self._root_opaque[level] = opaque
            if opaque is not None:
                self._note_opaque(opaque)
        return self._root_opaque[level]

    def _note_opaque(self, opaque: OpaqueCode) -> None:
        message = opaque.describe(type(self.module).__name__)
        if message not in self._warned:
            self._warned.add(message)
            logger.info(
                "bcg: %s: its Python runs eagerly on every call and the modules it calls replay their graphs "
                "(module mode). If it decides nothing per call, name it in BCGConfig.pure_forwards to capture it.",
                message,
            )

    def _call(self, level: int, args: tuple, kwargs: dict) -> Any:
        forward = self._forward_for(level)
        kwargs = pad_text_to_bucket(self.info, self.config.text_buckets, kwargs)
        try:
            inputs, tensors = flatten_inputs(args, kwargs, device_type=self.device_type)
        except UncacheableInput as exc:
            return self._eager(forward, args, kwargs, f"uncacheable input: {exc}")
        if not tensors:
            return self._eager(forward, args, kwargs, f"no input tensor is on a {self.device_type.upper()} device")
        self._follow_stream()
        opaque = self.opaque_root(level)
        keyed = time.perf_counter()
        key = build_key(self.module, self.info, kwargs, inputs, self.state.weights.current(), (("forward_level", level),))
        key_s = time.perf_counter() - keyed
        self.ranks.agree_key(self, key)  # context parallelism: every rank takes this call's path
        entry = self.entries.get(key)
        if entry is None:
            seen = self._seen.get(key)
            if seen is not None and seen.mutates:
                return self._eager(forward, args, kwargs, seen.mutates)
            if opaque is not None or self._spine:
                return self._planned_module_mode(key, opaque, forward, args, kwargs)
            if seen is None or seen.calls < self.config.warmup_iters:
                return self._first_call(key, seen, forward, args, kwargs, inputs)
            entry = self._new_entry(key, forward, args, kwargs, tensors, seen)
            entry.phases["key"] = key_s  # weights fingerprint (when due) and key building
        else:
            self.entries.move_to_end(key)
        if entry.fallback is not None:
            return self._eager(forward, args, kwargs, None)
        if entry.module_mode:
            self.hits += 1
            entry.hits += 1
            return self._run_module_mode(entry, forward, args, kwargs)
        first = entry.hits == 0
        try:
            replay_start = time.perf_counter()
            out = self._run(entry, forward, tensors)
            if first:
                entry.phases["first_replay"] = time.perf_counter() - replay_start
        except BreakOutputMismatchError as exc:
            # A break returned another shape than at capture: its output shape depends on values the
            # key does not hold. Never return a partial replay: this key runs eagerly from now on.
            self.ranks.replay_failed(exc)  # context parallelism: raises (the other ranks ran part of the call)
            self._warn(f"bcg: replay of {type(self.module).__name__} stopped: {exc}. This input shape now runs eagerly.")
            entry.release()
            entry.fallback = f"break output changed shape: {str(exc).splitlines()[0][:200]}"
            self.failed_captures += 1
            return self._eager(forward, args, kwargs, None)
        entry.hits += 1
        self.hits += 1
        return out

    def _run_module_mode(self, entry: GraphEntry, forward: Callable, args: tuple, kwargs: dict) -> Any:
        with fingerprint.transient_registrations():  # block lists swapped for the call (cache-dit)
            out = entry.children.run(forward, args, kwargs)
        return out if entry.children.fresh_outputs else tree_map(torch.Tensor.clone, out)

    def _opaque_summary(self, opaque: OpaqueCode | None) -> str:
        """What runs eagerly and why, for stats: the transformer's own Python and opaque submodules."""
        name = type(self.module).__name__
        found = ([opaque] if opaque is not None else []) + list(self._structure.opaque if self._structure else ())
        shown = "; ".join(o.describe(name) for o in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        spine = f" ({len(self._spine)} modules on the eager spine)" if self._spine else ""
        return f"{shown}{more}{spine}"

    def _refuse_compile(self, opaque: OpaqueCode | None) -> None:
        where = opaque.describe(type(self.module).__name__) if opaque is not None else "replaced submodule forwards"
        raise AccelerationError(
            f"BCGConfig(compile=True) compiles {type(self.module).__name__}'s whole forward, but Python the graph key "
            f"cannot see runs in it ({where}): it must run eagerly on every call. Compile the blocks instead "
            "(transformer.compile_repeated_blocks()) and leave compile=False"
        )

    def _planned_module_mode(self, key: GraphKey, opaque: OpaqueCode | None, forward: Callable, args: tuple, kwargs: dict) -> Any:
        """The first call of a key whose Python the key cannot see: module mode from the start (its
        units warm up on this call and are captured at their next)."""
        if self.config.compile:
            self._refuse_compile(opaque)
        self.misses += 1
        self.warmup_calls += 1
        self._evict(keep=self.config.max_graphs - 1)
        skip = {h.path for h in self._structure.hooked} if self._structure else set()
        entry = GraphEntry(key, None, [], None, module_mode=True)
        entry.eager_reason = self._opaque_summary(opaque)
        entry.children = ChildGraphs(
            replay_units(self.module, self._spine, skip), self._child_capturer(entry), self.config.warmup_iters,
            fresh_outputs=True, device_type=self.device_type, replay=self._replay_child, skip=skip,
        )
        self.entries[key] = entry
        return self._run_module_mode(entry, forward, args, kwargs)

    def _follow_stream(self) -> None:
        """Calls on another stream than the last one wait for it (static buffers are shared)."""
        if self.device_type != "cuda":
            return
        current = torch.cuda.current_stream()
        if self._last_stream is not None and current != self._last_stream:
            current.wait_stream(self._last_stream)
        self._last_stream = current

    def _chain_state(self) -> tuple:
        return (tuple(map(id, self.chain.forwards)), id(type(self.module).forward))

    def _forwards_changed(self) -> None:
        """Called by the forward chain when ``module.forward`` was replaced or set back."""
        self.state.invalidate()

    def _replan(self, why: str) -> None:
        logger.info("bcg: %s: %s; its graphs are dropped and the call is planned again", type(self.module).__name__, why)
        self.clear()
        self._root_opaque = {}
        self._compiled = None
        self._code = self._chain_state()

    def _follow_structure(self) -> None:
        self.ranks = parallel.follow(self)  # context parallelism enabled, changed or gone: integration/parallel.py
        if self._code is None:
            self._code = self._chain_state()
        elif self._code != self._chain_state():
            self.structure_changes += 1
            self._replan("its forward was replaced, set back, or its class forward reassigned")
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
        self.hooked.apply(self.module, structure.hooked)
        old = self._breaks
        self._breaks = attention_breaks.install(self.module, self.info.eager_functions)
        if old is not None:
            old.remove()
        self._structure = structure
        self._spine = spine_of([o.path for o in structure.opaque])
        for opaque in structure.opaque:
            self._note_opaque(opaque)

    def _eager(self, forward: Callable, args: tuple, kwargs: dict, reason: str | None) -> Any:
        self.ranks.agree_eager(reason, args, kwargs)  # context parallelism: the plan of a call with no key (no-op after one)
        self.eager_calls += 1
        if reason is not None and reason not in self._warned:
            self._warned.add(reason)
            logger.info("bcg: %s runs eagerly: %s", type(self.module).__name__, reason)
        return forward(*args, **kwargs)

    def _run(self, entry: GraphEntry, forward: Callable, tensors: list[torch.Tensor]) -> Any:
        if not sabotage.stale_inputs():
            for static, live in zip(entry.static_inputs, tensors):
                if static is not live:
                    static.copy_(live)
        return tree_map(torch.Tensor.clone, replay_entry(entry, forward, self.config.attention))

    # -- new keys -------------------------------------------------------------------------
    def _first_call(self, key: GraphKey, seen: "_Seen | None", forward: Callable, args: tuple, kwargs: dict, inputs: tuple) -> Any:
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
            out = forward(*args, **kwargs)
        seen.calls += 1
        seen.layouts = layouts
        if any(isinstance(v, (ObjectState, HostTensor)) for _, v in inputs):
            after, _ = flatten_inputs(args, kwargs, device_type=self.device_type)
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

    def _new_entry(self, key: GraphKey, forward: Callable, args: tuple, kwargs: dict, tensors: list[torch.Tensor], seen: "_Seen") -> GraphEntry:
        del self._seen[key]
        self._evict(keep=self.config.max_graphs - 1)
        copied = time.perf_counter()
        static = [static_copy(t) for t in tensors]
        s_args, s_kwargs = rebuild_inputs(args, kwargs, static, device_type=self.device_type)
        if self._stream is None and self.device_type == "cuda":
            self._stream = torch.cuda.Stream(static[0].device)
        ctx = CaptureContext(
            self.module, forward, self.config, self.eager_modules, self._stream, self._warn, self._evict_for_memory
        )
        ctx = self.ranks.capture_context(ctx)  # context parallelism: no narrowing, no eviction mid-capture
        static_s = time.perf_counter() - copied
        entry = capture_entry(ctx, key, static, s_args, s_kwargs, seen.layouts)
        self.ranks.agree_capture(entry)  # context parallelism: one failed rank makes every rank fall back
        entry.phases["static_inputs"] = static_s
        if entry.module_mode:
            entry.static_inputs = []  # the forward runs eagerly on the live inputs
            entry.eager_reason = "host work inline in its forward"
            skip = {h.path for h in self._structure.hooked} if self._structure else set()
            entry.children = ChildGraphs(
                replay_units(self.module, set(), skip), self._child_capturer(entry), self.config.warmup_iters,
                device_type=self.device_type, replay=self._replay_child, skip=skip,
            )
        elif entry.fallback is not None:
            self.failed_captures += 1
        else:
            self.captures += 1
        self.entries[key] = entry
        self._enforce_budget()
        return entry

    def _replay_child(self, entry: GraphEntry, chain: Callable) -> Any:
        return replay_entry(entry, chain, self.config.attention)

    def _child_capturer(self, entry: GraphEntry) -> Callable[..., GraphEntry]:
        """How module mode captures one child call: into one memory pool per key, with the
        transformer's eager parts, narrowing inside the child where it fails."""
        cuda = self.device_type == "cuda"
        pools = [torch.cuda.graph_pool_handle() if cuda else None]
        if cuda and self._stream is None:
            self._stream = torch.cuda.Stream()

        def capture(
            path: str, module: torch.nn.Module, chain: Callable, key: GraphKey, static: list, s_args: tuple,
            s_kwargs: dict, layouts: list | None,
        ) -> GraphEntry:
            ctx = CaptureContext(
                module, chain, self.config, self.eager_modules, self._stream, self._warn,
                lambda: False, root=self.module, pool=pools[-1],  # no eviction mid-call: this key's entry is running
            )
            ctx = self.ranks.capture_context(ctx)  # context parallelism: as in _new_entry
            child = capture_entry(ctx, key, static, s_args, s_kwargs, layouts)
            self.ranks.agree_capture(child)  # context parallelism: as in _new_entry
            if child.fallback is not None:
                self.failed_captures += 1
            else:
                self.captures += 1
            if cuda and ("retries" in child.phases or child.fallback is not None):
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
            if entry.children is not None:
                retired, counted = self._retired_children, entry.children.counters
                for name in vars(retired):
                    setattr(retired, name, getattr(retired, name) + getattr(counted, name))
            if forget:
                self._seen.pop(key, None)
            elif entry.fallback is None and not entry.module_mode:  # it ran before: captured again at its next call
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
        attention breaks); from now on every call through the forward chain runs eagerly. The
        chain itself is removed by :meth:`detach` (after the ``bcg_graphs`` hook is out)."""
        with self._lock:
            self._closed = True
            self.clear()
            self.hooked.clear(self.module)
            self.eager_modules.restore()
            self.ranks.close()  # context parallelism: undoes the gather break
            if self._breaks is not None:
                self._breaks.remove()
                self._breaks = None
            self._structure = None

    def detach(self) -> None:
        """Take the forward chain's guard out; ``module.forward`` becomes what eager code would run."""
        if self.chain is not None:
            self.chain.remove()

    def snapshot(self) -> BCGStats:
        """This transformer's statistics now (see :class:`~bcg_diffusion.BCGStats`)."""
        with self._lock:
            entries = [self._entry_stats(e) for e in self.entries.values()]
            children = ChildCounters(**vars(self._retired_children))
            for entry in self.entries.values():
                if entry.children is not None:
                    for name in vars(children):
                        setattr(children, name, getattr(children, name) + getattr(entry.children.counters, name))
            calls, computed = self.cache_passes()
            return BCGStats(
                transformer=type(self.module).__name__,
                debug=self.config.debug,
                hits=self.hits,
                misses=self.misses,
                captures=self.captures,
                eager_calls=self.eager_calls,
                capture_time_s=sum(e.capture_time_s for e in entries),
                graph_memory_bytes=sum(e.memory_bytes for e in entries),
                entries=tuple(entries),
                structure_changes=self.structure_changes,
                warmup_calls=self.warmup_calls,
                hooked_module_calls=calls,
                hooked_module_computed=computed,
                failed_captures=self.failed_captures,
                child_hits=children.hits,
                child_warmup_calls=children.warmup_calls,
                child_eager_calls=children.eager_calls,
            )

    @staticmethod
    def _entry_stats(entry: GraphEntry) -> GraphEntryStats:
        counters = entry.children.counters if entry.children is not None else ChildCounters()
        return GraphEntryStats(
            key=entry.key.summary(),
            segments=entry.segments,
            breaks=entry.breaks,
            capture_time_s=entry.capture_time_s,
            memory_bytes=entry.memory_bytes,
            hits=entry.hits,
            fallback=entry.fallback,
            eager_modules=tuple(entry.eager_modules),
            capture_phases=tuple(entry.phases.items()),
            module_mode=entry.module_mode,
            eager_reason=entry.eager_reason,
            child_graphs=len(entry.children.entries()) if entry.children is not None else 0,
            child_hits=counters.hits,
            child_warmup_calls=counters.warmup_calls,
            child_eager_calls=counters.eager_calls,
            child_failed_captures=counters.failed_captures,
        )

    def cache_passes(self) -> tuple[int, int]:
        """(hooked calls replayed, of which the hooks computed the body) over this runner's
        step-cache modules; the difference is what the cache reused."""
        bodies = self.hooked.bodies
        return sum(b.calls for b in bodies), sum(b.computed for b in bodies)
