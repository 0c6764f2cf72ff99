"""Module mode: the transformer's own forward runs eagerly, each child call replays its own graph.

Some transformers do host work inline in their own ``forward`` (boolean-mask indexing of the
text, a Python branch on a tensor value, rotary tables built on the CPU): no break can cut that
code out, so a key whose capture fails there would run every call eagerly. In module mode the
forward's own code runs eagerly on every call, while each call of a direct child or of a block
(the modules of the transformer's ``ModuleList``s) replays a breakable graph captured for that
call, in call order. So the prelude and epilogue cost what they cost eagerly (usually a few dozen
kernels) and the blocks replay.

Contracts:

- A child call is replayed only when its inputs have the layout and values captured (the same
  key fields as a transformer call); otherwise, or where its own capture failed, it runs eagerly.
- Each child graph keeps its outputs alive, so later children never overwrite them; tensors a
  later child reads from an earlier child's outputs are read in place (no copy). Other inputs are
  copied into the child's static buffers before the replay.
- Children with hooks (step caches) run as they do outside module mode: eagerly.
- The transformer's outputs are cloned by the runner (they may alias a child graph's outputs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import attention_layouts
from .keys import GraphKey, UncacheableInput, flatten_inputs, rebuild_inputs

logger = logging.getLogger("bcg_diffusion")


def child_modules(root: torch.nn.Module, skip: set[str]) -> list[tuple[str, torch.nn.Module]]:
    """The direct children of ``root`` and the items of its ``ModuleList``s, minus ``skip``."""
    found = []
    for name, child in root.named_children():
        if isinstance(child, torch.nn.ModuleList):
            found += [(f"{name}.{i}", block) for i, block in enumerate(child) if f"{name}.{i}" not in skip]
        elif name not in skip:
            found.append((name, child))
    return found


@dataclass
class _Slot:
    """The child call at one position of the forward's call sequence."""

    path: str
    inputs: tuple
    calls: int = 0
    layouts: list | None = None
    entry: Any = None  # GraphEntry of the child's graph once captured
    borrowed: list[bool] = field(default_factory=list)  # per static input: another child's output, read in place


class ChildGraphs:
    """The child graphs of one key in module mode (see the module docstring).

    ``capture(path, chain, args, kwargs, key)`` is given by the runner: it captures ``chain`` on the
    static inputs it is handed and returns a GraphEntry (or one with ``fallback`` set).
    """

    def __init__(
        self, root: torch.nn.Module, skip: set[str], capture: Callable[..., Any], warmup_iters: int, device_type: str = "cuda"
    ) -> None:
        self.root = root
        self.device_type = device_type
        self.children = child_modules(root, skip)
        self.slots: dict[int, _Slot] = {}
        self._capture = capture
        self._warmup_iters = warmup_iters
        self._position = 0
        self._outputs: dict[int, int] = {}  # data_ptr of child outputs of this call -> slot position

    # -- stats ------------------------------------------------------------------------------
    def entries(self) -> list[Any]:
        return [s.entry for s in self.slots.values() if s.entry is not None]

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
        for slot in self.slots.values():
            if slot.entry is not None:
                slot.entry.release()
        self.slots.clear()

    # -- the call ---------------------------------------------------------------------------
    def run(self, forward: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the transformer in module mode."""
        self._position = 0
        self._outputs = {}
        undo = []
        try:
            for path, module in self.children:
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
            position = self._position
            self._position += 1
            return self._child_call(position, path, chain, args, kwargs)

        return call

    def _child_call(self, position: int, path: str, chain: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            inputs, tensors = flatten_inputs(args, kwargs, device_type=self.device_type)
        except UncacheableInput:
            return chain(*args, **kwargs)
        if not tensors:
            return chain(*args, **kwargs)
        slot = self.slots.get(position)
        if slot is None or slot.path != path or slot.inputs != inputs:
            if slot is not None and slot.entry is not None:
                slot.entry.release()
            slot = self.slots[position] = _Slot(path, inputs)
        if slot.entry is None:
            if slot.calls < self._warmup_iters:
                slot.calls += 1
                with attention_layouts.recording_layouts() as layouts:
                    out = chain(*args, **kwargs)
                slot.layouts = layouts
                return out
            self._capture_slot(slot, chain, args, kwargs, tensors)
        entry = slot.entry
        if entry.fallback is not None:
            return chain(*args, **kwargs)
        for static, live, borrowed in zip(entry.static_inputs, tensors, slot.borrowed):
            if _same_view(static, live):
                continue
            if borrowed:  # the captured input was another child's output: never write into it
                return chain(*args, **kwargs)
            static.copy_(live)
        entry.graph.replay()
        entry.hits += 1
        self._note_outputs(position, entry.outputs)
        return entry.outputs

    def _capture_slot(self, slot: _Slot, chain: Callable, args: tuple, kwargs: dict, tensors: list) -> None:
        static, borrowed = [], []
        for t in tensors:
            if t.untyped_storage().data_ptr() in self._outputs:
                static.append(t)  # graph memory of an earlier child: read in place
                borrowed.append(True)
            else:
                static.append(torch.empty_like(t).copy_(t))
                borrowed.append(False)
        s_args, s_kwargs = rebuild_inputs(args, kwargs, static, device_type=self.device_type)
        key = GraphKey(slot.inputs, (("module_mode_child", slot.path),), None)
        slot.entry = self._capture(slot.path, chain, key, static, s_args, s_kwargs, slot.layouts)
        slot.borrowed = borrowed
        if slot.entry.fallback is not None:
            logger.info("bcg: module mode: %s runs eagerly (%s)", slot.path, slot.entry.fallback)

    def _note_outputs(self, position: int, outputs: Any) -> None:
        from ..core.tree import walk

        for _, _, leaf in walk(outputs):
            if isinstance(leaf, torch.Tensor):
                self._outputs[leaf.untyped_storage().data_ptr()] = position


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())
