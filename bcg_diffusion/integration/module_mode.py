"""Module mode: Python runs eagerly, the modules it calls replay graphs of their own.

Two kinds of Python cannot be replayed from one capture:

- host work inline in the transformer's own ``forward`` (boolean-mask indexing of the text, a
  branch on a tensor value, rotary tables built on the CPU): no break can cut it out;
- *opaque* Python (:mod:`.python_code`): a forward replaced by a user or a library (cache-dit, a
  TeaCache-style patch), a reassigned class forward, a custom attention processor. It may decide
  differently on every call.

In module mode that Python runs eagerly on every call, while each call of a *replay unit* replays
a breakable graph captured for that call. The units are the children of the transformer and of
every module on the *eager spine* (the opaque submodules and their ancestors), looking through
``ModuleList``/``ModuleDict`` containers; leaf modules (no submodules: a ``Linear``, a norm), the
spine itself and modules with hooks (step caches: they run as hooked modules do) run eagerly.

Contracts:

- A unit's call is identified by its path and its occurrence in the call (the second call of
  ``transformer_blocks.3`` in one transformer call is another unit call than the first), so Python
  that skips some units on some calls (a step cache) keeps the other unit calls' graphs.
- Each unit call keeps a :class:`~.slots.Slot` per input layout and values (the key fields of a
  transformer call; :data:`MAX_LAYOUTS_PER_CALL` of them, least recently used dropped), with the
  life of a transformer key's slot: ``warmup_iters`` eager calls (recording attention layouts),
  then a capture, then replays, or eager calls where the capture failed.
- With ``fresh_outputs`` (opaque Python, which may keep what it is given across calls) a replay
  returns copies of its outputs, and copies every input into its static buffers. Without it
  (the transformer's own code), outputs are the graph's buffers, kept alive by the graph, and an
  input that is an earlier unit's output of the same call is read in place.
- A unit's replay takes the runner's one replay path (:mod:`.replays`): a break whose output changed
  shape stops it, and that unit call falls back to eager with one warning, as a transformer call does.
- A unit whose capture fails (host work in its own forward) joins the eager spine from its next
  call: its children become units.
- The transformer's outputs are cloned by the runner (they may alias a unit's outputs).
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable

import torch

from ..config import BCGConfig
from ..core.tree import tree_map, walk
from ..stats import UnitCounters
from .breaks import units as unit_calls
from .entry_kinds import CapturedGraph, EagerFallback, GraphEntry
from .keys import Call, GraphKey
from .replays import Replayer
from .slots import CAPTURE, EAGER, FALLBACK, WARMUP, Slot
from .static_inputs import static_copy

logger = logging.getLogger("bcg_diffusion")

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)
# input layouts kept per unit call (a step cache feeds a block its own output on computed steps and
# a reused one, of other strides, on cached steps); the least recently used is dropped beyond it
MAX_LAYOUTS_PER_CALL = 4


def _children(module: torch.nn.Module, prefix: str) -> list[tuple[str, torch.nn.Module]]:
    """``module``'s children, looking through ModuleList / ModuleDict containers."""
    found = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, _CONTAINERS):
            found += _children(child, f"{path}.")
        else:
            found.append((path, child))
    return found


def replay_units(root: torch.nn.Module, spine: set[str], skip: set[str]) -> list[tuple[str, torch.nn.Module]]:
    """The replay units of ``root`` for an eager ``spine`` (paths, root excluded) and hooked
    modules ``skip`` (see the module docstring)."""
    units, seen = [], set()
    for owner in [""] + sorted(spine):
        module = root.get_submodule(owner) if owner else root
        # a container on the spine (``blocks``) lists the children its parent already looked through it for
        for path, child in _children(module, f"{owner}." if owner else ""):
            if path in spine or path in skip or path in seen or next(child.children(), None) is None:
                continue
            seen.add(path)
            units.append((path, child))
    return units


def spine_of(opaque_paths: list[str]) -> set[str]:
    """The opaque submodules and every ancestor of theirs (root excluded)."""
    spine = set()
    for path in opaque_paths:
        parts = path.split(".")
        spine.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return spine


class _TransformerCall:
    """One transformer call in module mode: how often each unit was called, and the storages of the
    unit outputs it made (read in place by later units)."""

    def __init__(self) -> None:
        self.occurrences: dict[str, int] = {}
        self.outputs: set[int] = set()

    def where(self, path: str) -> tuple[str, int]:
        occurrence = self.occurrences.get(path, 0)
        self.occurrences[path] = occurrence + 1
        return path, occurrence

    def note_outputs(self, outputs: Any) -> None:
        for _, _, leaf in walk(outputs):
            if isinstance(leaf, torch.Tensor):
                self.outputs.add(leaf.untyped_storage().data_ptr())


CaptureUnit = Callable[[torch.nn.Module, Call, GraphKey, "list | None", Any], GraphEntry]


class UnitGraphs:
    """The unit graphs of one key in module mode (see the module docstring).

    ``capture(module, call, key, layouts, pool)`` is given by the runner: it captures ``call`` (its
    forward on static inputs) of the unit ``module`` into the memory ``pool`` and returns a
    :class:`~.entry_kinds.GraphEntry` (an :class:`~.entry_kinds.EagerFallback` when the capture failed);
    ``replayer`` is the runner's replay path. ``reason`` says why the transformer's own Python runs
    eagerly (``GraphEntryStats.eager_reason``).
    """

    def __init__(
        self,
        units: list[tuple[str, torch.nn.Module]],
        capture: CaptureUnit,
        config: BCGConfig,
        *,
        replayer: Replayer,
        reason: str,
        fresh_outputs: bool = False,
        device_type: str = "cuda",
        skip: set[str] | None = None,
    ) -> None:
        self.units = dict(units)
        self.reason = reason
        self.fresh_outputs = fresh_outputs
        self.counters = UnitCounters()
        self.capture_time_s = 0.0  # of every unit capture made, kept or not
        self.memory_bytes = 0  # of every unit capture made, as counted at capture
        # per unit call (path, occurrence): its slots by input layout, most recently used last
        self._slots: dict[tuple[str, int], collections.OrderedDict[tuple, Slot]] = {}
        self._capture = capture
        self._replayer = replayer
        self._config = config
        self._device_type = device_type
        self._skip = skip or set()
        # one memory pool for the unit graphs of the key, a new one after a failed capture
        self._pool = torch.cuda.graph_pool_handle() if device_type == "cuda" else None
        self._call = _TransformerCall()

    # -- stats ------------------------------------------------------------------------------
    def _all_slots(self) -> list[Slot]:
        return [slot for variants in self._slots.values() for slot in variants.values()]

    def entries(self) -> list[CapturedGraph]:
        """The unit graphs captured and kept."""
        return [s.entry for s in self._all_slots() if isinstance(s.entry, CapturedGraph)]

    @property
    def segments(self) -> int:
        return sum(e.segments for e in self.entries())

    @property
    def breaks(self) -> int:
        return sum(e.breaks for e in self.entries())

    def release(self) -> None:
        for slot in self._all_slots():
            slot.release()
        self._slots.clear()

    # -- the call ---------------------------------------------------------------------------
    def run(self, forward: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the transformer in module mode: ``forward`` runs with the units intercepted."""
        self._call = _TransformerCall()
        with unit_calls.intercept(self.units, self._route):
            return forward(*args, **kwargs)

    def _route(self, path: str, chain: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._unit_call(self._call.where(path), Call.read(chain, args, kwargs, self._device_type))

        return call

    def _unit_call(self, where: tuple[str, int], call: Call) -> Any:
        if call.unkeyed is not None:
            return self._eager(call)
        slot = self._slot(where, call.fields)
        path = slot.path(self._config.warmup_iters)
        if path == WARMUP:
            self.counters.warmup_calls += 1
            out = slot.warm_up(call.run)
            slot.refused = call.refusal(out)  # it changes its inputs, or returns an object: never captured
            return out
        if path == CAPTURE:
            path = self._capture_slot(where[0], slot, call)
        if path in (FALLBACK, EAGER):
            return self._eager(call)
        return self._replay(where[0], slot, call)

    def _eager(self, call: Call) -> Any:
        self.counters.eager_calls += 1
        return call.run()

    def _replay(self, path: str, slot: Slot, call: Call) -> Any:
        what = f"{path} ({type(self.units[path]).__name__}) in module mode" if path in self.units else path
        outputs, replayed = self._replayer.replay(slot, call, self.counters, what)
        if not replayed:  # run eagerly: a borrowed input elsewhere, or the replay stopped
            return outputs
        if self.fresh_outputs:
            return tree_map(torch.Tensor.clone, outputs)
        self._call.note_outputs(outputs)
        return outputs

    def _slot(self, where: tuple[str, int], inputs: tuple) -> Slot:
        variants = self._slots.setdefault(where, collections.OrderedDict())
        slot = variants.get(inputs)
        if slot is not None:
            variants.move_to_end(inputs)
            return slot
        slot = variants[inputs] = Slot(GraphKey(inputs, (("module_mode_unit", where[0]),), None))
        while len(variants) > MAX_LAYOUTS_PER_CALL:
            variants.popitem(last=False)[1].release()
        return slot

    def _capture_slot(self, path: str, slot: Slot, call: Call) -> str:
        static, borrowed = self._static_inputs(call.tensors)
        entry = self._capture(self.units[path], call.on(static), slot.key, slot.layouts, self._pool)
        if self._pool is not None and ("retries" in entry.phases or isinstance(entry, EagerFallback)):
            self._pool = torch.cuda.graph_pool_handle()  # later units do not share a failed capture's pool
        self.capture_time_s += entry.capture_time_s
        self.memory_bytes += entry.memory_bytes
        slot.entry = entry
        if isinstance(entry, CapturedGraph):
            entry.borrowed = borrowed
        if isinstance(entry, EagerFallback):
            self.counters.failed_captures += 1
            if self._expand(path):
                logger.info("bcg: module mode: %s does host work in its own forward (%s); its forward runs eagerly "
                            "from its next call and its submodules replay", path, entry.reason)
            else:
                logger.info("bcg: module mode: %s runs eagerly (%s)", path, entry.reason)
        return slot.path(self._config.warmup_iters)

    def _static_inputs(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], frozenset[int]]:
        """Static buffers for a unit's capture (copies with the live tensors' strides, as a transformer
        key's: :func:`~.static_inputs.static_copy`), and which of them are read in place (an earlier
        unit's output of this call: graph memory)."""
        static, borrowed = [], set()
        for i, t in enumerate(tensors):
            if not self.fresh_outputs and t.untyped_storage().data_ptr() in self._call.outputs:
                static.append(t)
                borrowed.add(i)
            else:
                static.append(static_copy(t))
        return static, frozenset(borrowed)

    def _expand(self, path: str) -> bool:
        """Put a unit whose capture failed on the eager spine: its children become units (from the
        next transformer call). False when it has none that could replay."""
        children = [(p, c) for p, c in _children(self.units[path], f"{path}.")
                    if p not in self._skip and next(c.children(), None) is not None]
        if not children:
            return False
        del self.units[path]
        self.units.update(children)
        return True
