"""The graph runner: one per accelerated transformer; dispatches each call on its key.

It sits at the bottom of the transformer's diffusers hook chain (``bcg_graphs`` hook), so every
other hook on the transformer runs on every call, and it is told by diffusers at the end of each
pipeline call (``reset_state``) to re-read the model's weights and structure.

A call is read once (:class:`~.keys.Call`), keyed, and takes the path of its key's
:class:`~.slots.Slot`: warm-up, capture (then replay, fallback or module mode), replay, module
mode, or eager. What the runner holds is split by what it is about: the slots in the
:class:`~.graph_cache.GraphCache`, what a call runs besides its inputs in the
:class:`~.structure_watch.StructureWatch`, the captures' common set-up in
:class:`~.entries.Captures`, the one replay path of its keys and units in :class:`~.replays.Replayer`,
the counters in :class:`~bcg_diffusion.stats.CallCounters`, and its
watchers (context parallelism, tests) in :class:`~.events.RunnerEvents`.

One name per idea: a *key* (:class:`~.keys.GraphKey`) is what a capture bakes in; its *slot* is
where the key stands; an *entry* (:class:`~.entry_kinds.GraphEntry`, one class per kind) is what one capture made; a *unit*
is a module that replays a graph of its own in module mode, and a *unit call* one call of it in a
transformer call (``BCGStats``' ``child_*`` counters count unit calls); a *break* is anything that
runs eagerly between segments (:mod:`.breaks`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import torch

from . import fingerprint
from ..config import BCGConfig
from ..core.tree import tree_map
from .breaks.installed import InstalledBreaks
from .entries import Captures, warn_once
from .entry_kinds import GraphEntry, ModuleModeEntry
from .device_inputs import move_device_inputs
from .events import RunnerEvents
from ..families import TransformerInfo
from .graph_cache import GraphCache
from .keys import GRAD_MODE_FIELDS, Call, GraphKey, build_key
from .model_state import ModelState
from .module_mode import UnitGraphs
from .replays import Replayer
from .slots import CAPTURE, MODULE, REPLAY, WARMUP, Slot
from ..stats import BCGStats, CallCounters
from .static_inputs import static_copy
from .structure_watch import StructureWatch
from .text_buckets import pad_text_to_bucket

logger = logging.getLogger("bcg_diffusion")
_FIRST_UNITS = "first_units"  # the first call of a key in module mode from the start: its units warm up


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
        # the transformer is held once, by its state (``self.module`` reads it)
        self.state = ModelState(module, every_call=config.check_weights == "every_call", pure_forwards=config.pure_forwards)
        self.config = config
        self.info = info
        # where inputs must live to be keyed and captured; "cpu" only for debug mode on a machine without CUDA
        self.device_type = "cuda" if torch.cuda.is_available() or not config.debug else "cpu"
        self.events = RunnerEvents()
        self.counts = CallCounters()
        self.cache = GraphCache(config)
        breaks = InstalledBreaks(module, config.eager_modules, info.eager_functions)
        self.watch = StructureWatch(self.state, config, breaks, self.events, self.counts, self.clear)
        self.captures = Captures(config, breaks.eager, self.events, self.counts, self._warn, self.cache.evict_all)
        self.replayer = Replayer(self.events, self._warn, config.attention)
        self._last_stream: torch.cuda.Stream | None = None
        self._lock = threading.RLock()
        self._local = threading.local()  # depth: inside a call of this runner in this thread
        self._closed = False
        self._warned: set[str] = set()

    @property
    def module(self) -> torch.nn.Module:
        """The transformer this runner accelerates."""
        return self.state.root

    def attach(self, below: Callable, link: Callable, hook_ref: Any) -> None:
        """Start following the forward chain: ``below`` is what the ``bcg_graphs`` hook wraps,
        ``link`` what the hook put in the chain (``hook_ref`` its diffusers function reference).
        Reads the structure now, so that refusals (offloading, casting) raise at acceleration."""
        self.watch.attach(below, link, hook_ref, self.enter)

    def on_pipeline_call_end(self) -> None:
        """Weights and structure are read again on the next call."""
        self.state.invalidate()

    # -- the call -------------------------------------------------------------------------
    def enter(self, level: int, args: tuple, kwargs: dict) -> Any:
        """A call through the forward chain at ``level`` (0: through the ``bcg_graphs`` hook)."""
        if self._closed or getattr(self._local, "depth", 0):
            # closed, or a foreign forward calling the forward it replaced, inside this runner's eager call
            return self._pass_through(level, args, kwargs)
        # context parallelism: a rank that raises tells the others; forward_state: buffers the forward
        # reassigns are written in place (fingerprint.py)
        with self._lock, self.events.calling(), fingerprint.forward_state():
            self._local.depth = 1
            try:
                return self._call(level, args, kwargs)
            finally:
                self._local.depth = 0

    def _pass_through(self, level: int, args: tuple, kwargs: dict) -> Any:
        return self.watch.chain.forward_at(level)(*args, **kwargs)

    def _call(self, level: int, args: tuple, kwargs: dict) -> Any:
        self.watch.follow()  # parallelism, forward chain and structure: a change drops the graphs
        kwargs = pad_text_to_bucket(self.info, self.config.text_buckets, kwargs)
        kwargs = move_device_inputs(self.info, kwargs, self.device_type)
        call = Call.read(self.watch.forward_for(level), args, kwargs, self.device_type)
        if call.unkeyed is not None:
            self.events.planned_eager(call.unkeyed, call.args, call.kwargs)
            if call.unkeyed.startswith("uncacheable input"):  # the caller can change it: one warning says how
                self._warn(f"bcg: {type(self.module).__name__} runs eagerly: {call.unkeyed}")
            return self._eager(call, call.unkeyed)
        self._follow_stream()
        keyed = time.perf_counter()
        key = build_key(self.module, self.info, call, self.state.weights.current(), (("forward_level", level),))
        key_s = time.perf_counter() - keyed
        slot, path = self._plan(key, level)
        self.events.planned(path, key)  # context parallelism: every rank takes this call's path
        if path == CAPTURE:
            path = self._capture(slot, call, key_s)
        elif path == MODULE and slot.entry is None:
            path = self._start_module_mode(slot, level)
        return self._run(path, slot, call)

    def _plan(self, key: GraphKey, level: int) -> tuple[Slot, str]:
        """The slot of ``key`` and the path of this call (a new key's slot is made here). A key not
        captured yet whose Python the key cannot see runs in module mode from its first call."""
        slot = self.cache.find(key)
        path = slot.path(self.config.warmup_iters) if slot is not None else WARMUP
        if path in (WARMUP, CAPTURE) and self.watch.in_module_mode(level):
            return slot or Slot(key), MODULE
        return slot or self._new_key(key), path

    def _run(self, path: str, slot: Slot, call: Call) -> Any:
        if path == WARMUP:
            return self._warm_up(slot, call)
        if path == REPLAY:
            return self._replay(slot, call)
        if path == MODULE:
            slot.entry.hits += 1
            self.counts.hits += 1
            return self._run_units(slot, call)
        if path == _FIRST_UNITS:
            return self._run_units(slot, call)
        return self._eager(call, slot.refused)  # eager (why is logged once), or a fallback

    def _eager(self, call: Call, reason: str | None) -> Any:
        self.counts.eager_calls += 1
        if reason is not None:
            self.events.ran_eagerly(reason)
            if reason not in self._warned:
                self._warned.add(reason)
                logger.info("bcg: %s runs eagerly: %s", type(self.module).__name__, reason)
        return call.run()

    def _replay(self, slot: Slot, call: Call) -> Any:
        """The one replay path (:mod:`.replays`); the outputs are copied out of the graph's buffers."""
        out, replayed = self.replayer.replay(slot, call, self.counts, type(self.module).__name__)
        return tree_map(torch.Tensor.clone, out) if replayed else out

    def _run_units(self, slot: Slot, call: Call) -> Any:
        with fingerprint.transient_registrations():  # block lists swapped for the call (cache-dit)
            out = slot.units.run(call.forward, call.args, call.kwargs)
        return out if slot.units.fresh_outputs else tree_map(torch.Tensor.clone, out)

    def _follow_stream(self) -> None:
        """Calls on another stream than the last one wait for it (static buffers are shared)."""
        if self.device_type != "cuda":
            return
        current = torch.cuda.current_stream()
        if self._last_stream is not None and current != self._last_stream:
            current.wait_stream(self._last_stream)
        self._last_stream = current

    # -- new keys -------------------------------------------------------------------------
    def _new_key(self, key: GraphKey) -> Slot:
        """A key met for the first time: counted as a miss, logged, and warmed up from this call."""
        self.counts.misses += 1
        closest = self.cache.closest()
        if self.config.log_misses and closest is not None:  # not the first key since the last clear
            logger.info(
                "bcg: %s new graph key (%d kept); changed %s",
                type(self.module).__name__, len(self.cache.captured), key.difference(closest),
            )
        self._warn_grad_mode_twin(key)
        return self.cache.new(key)

    def _warm_up(self, slot: Slot, call: Call) -> Any:
        """A call of a key not captured yet: it runs eagerly (the real call: its result is returned),
        warming lazy initialisation and compiled code, and records the attention output layouts the
        capture at the key's next call allocates from. A call that changes its own inputs (an input
        object it writes to, a host tensor) or returns an object its forward made is never captured:
        its key runs eagerly, with one warning that says why (:meth:`~.keys.Call.refusal`)."""
        self.counts.warmup_calls += 1
        out = slot.warm_up(call.run)
        slot.refused = call.refusal(out)
        if slot.refused is not None:
            self._warn(f"bcg: {type(self.module).__name__}: {slot.refused}")
        return out

    def _warn_grad_mode_twin(self, key: GraphKey) -> None:
        """Warn (once) when a new key equals a captured one but for grad or inference mode: most
        often a warm-up made outside ``torch.inference_mode()`` for calls made inside it."""
        for captured in reversed(self.cache.captured):
            fields = key.differs_only_in(captured, GRAD_MODE_FIELDS)
            if fields:
                now = ", ".join(f"{name}={dict(key.state)[name]}" for name in fields)
                self._warn(
                    f"bcg: {type(self.module).__name__} captures a new graph for a call whose only difference from a "
                    f"captured one is the grad mode ({now} now): a capture is made per grad mode. Warm up and call "
                    "in the same mode (both inside torch.inference_mode(), or both outside it)."
                )
                return

    def _capture(self, slot: Slot, call: Call, key_s: float) -> str:
        """Capture the key on static copies of this call's inputs; returns the path the call goes on
        with (replay, fallback, or module mode when the capture failed in the transformer's own forward)."""
        self.cache.make_room()
        copied = time.perf_counter()
        static = call.on([static_copy(t) for t in call.tensors])
        static_s = time.perf_counter() - copied
        entry = self.captures.capture(self.module, static, slot.key, slot.layouts)
        entry.phases["static_inputs"] = static_s
        entry.phases["key"] = key_s  # weights fingerprint (when due) and key building
        slot.entry = entry
        if isinstance(entry, ModuleModeEntry):
            entry.units = self._unit_graphs("host work inline in its forward", fresh_outputs=False)
        self.cache.keep(slot)
        return slot.path(self.config.warmup_iters)

    def _start_module_mode(self, slot: Slot, level: int) -> str:
        """The first call of a key whose Python the key cannot see: module mode from the start (its
        units warm up on this call and are captured at their next)."""
        if self.config.compile:
            self.watch.refuse_compile(self.watch.opaque_root(level))
        self.counts.misses += 1
        self.counts.warmup_calls += 1
        self.cache.make_room()
        slot.entry = ModuleModeEntry(units=self._unit_graphs(self.watch.opaque_summary(level), fresh_outputs=True))
        self.cache.keep(slot, within_budget=False)
        return _FIRST_UNITS

    def _unit_graphs(self, reason: str, fresh_outputs: bool) -> UnitGraphs:
        """Module mode for one key: its units capture into one memory pool, with the transformer's
        eager parts, narrowing inside a unit where it fails."""
        return UnitGraphs(
            self.watch.units(), self._capture_unit, self.config, replayer=self.replayer, reason=reason,
            fresh_outputs=fresh_outputs, device_type=self.device_type, skip=self.watch.hooked_paths(),
        )

    def _capture_unit(self, module: torch.nn.Module, call: Call, key: GraphKey, layouts: list | None, pool: Any) -> GraphEntry:
        return self.captures.capture(module, call, key, layouts, root=self.module, pool=pool)

    def _warn(self, message: str) -> None:
        warn_once(self._warned, message)

    # -- life cycle and stats -------------------------------------------------------------
    def clear(self) -> None:
        """Drop every captured graph and every key seen; each key runs eagerly once more, then is
        captured again."""
        with self._lock:
            self.cache.clear()

    def close(self) -> None:
        """Free all graphs and undo every patch this runner made (hooked modules, eager modules,
        attention breaks, the lockstep's gather break); from now on every call through the forward
        chain runs eagerly. The chain itself is removed by :meth:`detach` (after the ``bcg_graphs``
        hook is out)."""
        with self._lock:
            self._closed = True
            self.clear()
            self.watch.close()

    def detach(self) -> None:
        """Take the forward chain's guard out; ``module.forward`` becomes what eager code would run."""
        self.watch.detach()

    def snapshot(self) -> BCGStats:
        """This transformer's statistics now (see :class:`~bcg_diffusion.BCGStats`)."""
        with self._lock:
            entries = tuple(slot.stats() for slot in self.cache.slots())
            return BCGStats.of(
                type(self.module).__name__, self.config.debug, self.counts, self.cache.unit_counters(), entries,
                self.cache_passes(),
            )

    def cache_passes(self) -> tuple[int, int]:
        """(hooked calls replayed, of which the hooks computed the body) over this runner's
        step-cache modules; the difference is what the cache reused."""
        bodies = self.watch.breaks.hooked.bodies
        return sum(b.calls for b in bodies), sum(b.computed for b in bodies)
