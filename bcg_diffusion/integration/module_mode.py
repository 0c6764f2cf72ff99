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
  ``transformer_blocks.3`` in one transformer call is another slot than the first), so Python
  that skips some units on some calls (a step cache) keeps the other slots' graphs.
- Each unit call keeps a slot per input layout and values (the key fields of a transformer call;
  :data:`MAX_LAYOUTS_PER_CALL` of them, least recently used dropped). A slot's first
  ``warmup_iters`` calls run eagerly (recording attention layouts), the next one captures; a
  slot whose capture failed runs eagerly.
- With ``fresh_outputs`` (opaque Python, which may keep what it is given across calls) a replay
  returns copies of its outputs, and copies every input into its static buffers. Without it
  (the transformer's own code), outputs are the graph's buffers, kept alive by the graph, and an
  input that is an earlier unit's output of the same call is read in place.
- A unit whose capture fails (host work in its own forward) joins the eager spine from its next
  call: its children become units.
- The transformer's outputs are cloned by the runner (they may alias a unit's outputs).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_layouts, sabotage
from ..core.tree import tree_map, walk
from .keys import GraphKey, UncacheableInput, flatten_inputs, rebuild_inputs

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


@dataclass
class _Slot:
    """One unit call: a unit's path and its occurrence in the transformer call."""

    path: str
    inputs: tuple
    calls: int = 0
    layouts: list | None = None
    entry: Any = None  # GraphEntry of the unit's graph once captured
    borrowed: list[bool] = field(default_factory=list)  # per static input: another unit's output, read in place


@dataclass
class ChildCounters:
    """How the unit calls of one key ran (see ``BCGStats``'s ``child_*`` fields)."""

    hits: int = 0
    warmup_calls: int = 0
    eager_calls: int = 0
    failed_captures: int = 0


class ChildGraphs:
    """The unit graphs of one key in module mode (see the module docstring).

    ``capture(path, module, chain, key, static, s_args, s_kwargs, layouts)`` is given by the runner: it
    captures ``chain`` on the static inputs it is handed and returns a GraphEntry (``fallback``
    set when the capture failed); ``replay(entry, chain)`` replays one (its static inputs filled)
    and returns its outputs.
    """

    def __init__(
        self,
        units: list[tuple[str, torch.nn.Module]],
        capture: Callable[..., Any],
        warmup_iters: int,
        fresh_outputs: bool = False,
        device_type: str = "cuda",
        replay: Callable[[Any, Callable], Any] | None = None,
        skip: set[str] | None = None,
    ) -> None:
        self.units = units
        self._skip = skip or set()
        self._modules = dict(units)
        self.device_type = device_type
        self.fresh_outputs = fresh_outputs
        # per unit call (path, occurrence): its slots by input layout, most recently used last
        self.slots: dict[tuple[str, int], collections.OrderedDict[tuple, _Slot]] = {}
        self.counters = ChildCounters()
        self._capture = capture
        self._replay = replay or (lambda entry, chain: (sabotage.replay(entry.graph), entry.outputs)[1])
        self._warmup_iters = warmup_iters
        self._occurrences: dict[str, int] = {}
        self._outputs: set[int] = set()  # storages of unit outputs of this call (read in place)

    # -- stats ------------------------------------------------------------------------------
    def _all_slots(self) -> list[_Slot]:
        return [slot for variants in self.slots.values() for slot in variants.values()]

    def entries(self) -> list[Any]:
        return [s.entry for s in self._all_slots() if s.entry is not None and s.entry.fallback is None]

    @property
    def segments(self) -> int:
        return sum(e.segments for e in self.entries())

    @property
    def breaks(self) -> int:
        return sum(e.breaks for e in self.entries())

    @property
    def memory_bytes(self) -> int:
        return sum(e.memory_bytes for e in self.entries())

    def release(self) -> None:
        for slot in self._all_slots():
            if slot.entry is not None:
                slot.entry.release()
        self.slots.clear()

    # -- the call ---------------------------------------------------------------------------
    def run(self, forward: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the transformer in module mode: ``forward`` runs with the units intercepted."""
        self._occurrences = {}
        self._outputs = set()
        undo = []
        try:
            for path, module in self.units:
                attr = "_compiled_call_impl" if module.__dict__.get("_compiled_call_impl") is not None else "_call_impl"
                had = attr in module.__dict__
                previous = module.__dict__.get(attr)
                module.__dict__[attr] = self._interceptor(path, getattr(module, attr))
                undo.append((module, attr, had, previous))
            return forward(*args, **kwargs)
        finally:
            for module, attr, had, previous in reversed(undo):
                if had:
                    module.__dict__[attr] = previous
                else:
                    module.__dict__.pop(attr, None)

    def _interceptor(self, path: str, chain: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            occurrence = self._occurrences.get(path, 0)
            self._occurrences[path] = occurrence + 1
            return self._unit_call((path, occurrence), chain, args, kwargs)

        return call

    def _eager(self, chain: Callable, args: tuple, kwargs: dict) -> Any:
        self.counters.eager_calls += 1
        return chain(*args, **kwargs)

    def _unit_call(self, where: tuple[str, int], chain: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            inputs, tensors = flatten_inputs(args, kwargs, device_type=self.device_type)
        except UncacheableInput:
            return self._eager(chain, args, kwargs)
        if not tensors:
            return self._eager(chain, args, kwargs)
        variants = self.slots.setdefault(where, collections.OrderedDict())
        slot = variants.get(inputs)
        if slot is None:
            slot = variants[inputs] = _Slot(where[0], inputs)
            while len(variants) > MAX_LAYOUTS_PER_CALL:
                _, dropped = variants.popitem(last=False)
                if dropped.entry is not None:
                    dropped.entry.release()
        else:
            variants.move_to_end(inputs)
        if slot.entry is None:
            if slot.calls < self._warmup_iters:
                slot.calls += 1
                self.counters.warmup_calls += 1
                with attention_layouts.recording_layouts() as layouts:
                    out = chain(*args, **kwargs)
                slot.layouts = layouts
                return out
            self._capture_slot(slot, chain, args, kwargs, tensors)
        entry = slot.entry
        if entry.fallback is not None:
            return self._eager(chain, args, kwargs)
        refresh = not sabotage.stale_inputs()
        for static, live, borrowed in zip(entry.static_inputs, tensors, slot.borrowed):
            if _same_view(static, live):
                continue
            if borrowed:  # the captured input was another unit's output: never write into it
                return self._eager(chain, args, kwargs)
            if refresh:
                static.copy_(live)
        outputs = self._replay(entry, chain)
        entry.hits += 1
        self.counters.hits += 1
        if self.fresh_outputs:
            return tree_map(torch.Tensor.clone, outputs)
        self._note_outputs(outputs)
        return outputs

    def _capture_slot(self, slot: _Slot, chain: Callable, args: tuple, kwargs: dict, tensors: list) -> None:
        static, borrowed = [], []
        for t in tensors:
            if not self.fresh_outputs and t.untyped_storage().data_ptr() in self._outputs:
                static.append(t)  # graph memory of an earlier unit: read in place
                borrowed.append(True)
            else:
                static.append(torch.empty_like(t).copy_(t))
                borrowed.append(False)
        s_args, s_kwargs = rebuild_inputs(args, kwargs, static, device_type=self.device_type)
        key = GraphKey(slot.inputs, (("module_mode_child", slot.path),), None)
        slot.entry = self._capture(slot.path, self._modules[slot.path], chain, key, static, s_args, s_kwargs, slot.layouts)
        slot.borrowed = borrowed
        if slot.entry.fallback is not None:
            self.counters.failed_captures += 1
            if self._expand(slot.path):
                logger.info("bcg: module mode: %s does host work in its own forward (%s); its forward runs eagerly "
                            "from its next call and its submodules replay", slot.path, slot.entry.fallback)
            else:
                logger.info("bcg: module mode: %s runs eagerly (%s)", slot.path, slot.entry.fallback)

    def _expand(self, path: str) -> bool:
        """Put a unit whose capture failed on the eager spine: its children become units (from the
        next transformer call). False when it has none that could replay."""
        module = self._modules[path]
        children = [(p, c) for p, c in _children(module, f"{path}.")
                    if p not in self._skip and next(c.children(), None) is not None]
        if not children:
            return False
        self.units = [u for u in self.units if u[0] != path] + children
        self._modules.update(children)
        return True

    def _note_outputs(self, outputs: Any) -> None:
        for _, _, leaf in walk(outputs):
            if isinstance(leaf, torch.Tensor):
                self._outputs.add(leaf.untyped_storage().data_ptr())


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())
