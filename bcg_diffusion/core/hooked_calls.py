"""Hooked calls: a break whose eager Python may replay a captured body.

Some calls wrap a body of capturable work in host logic that must run on every call: a step
cache's hook decides on the host whether a transformer block runs or a cached result is reused,
and keeps tensors between calls. :func:`hooked_call` makes such a call a break of the enclosing
capture whose eager function is the *chain* (the hooks), while the *body* is captured once, in
the same pool, as a sub-graph. At replay the chain runs for real; when it calls the body (through
the :class:`CapturedBody` installed where the chain expects the body), the sub-graph replays
instead of running eagerly, provided the body is called with the captured arguments (same
addresses, shapes, strides and values); otherwise the body runs eagerly, which is always correct.

Contracts:

- Outside a capture, and during warm-up under :func:`bypassing_hooks`, nothing is captured:
  the chain runs (or, bypassing, the body alone).
- At capture the chain does not run (its state must advance once per real call, and the data
  seen at capture are placeholders); the body's outputs become the bridge buffer.
- Results the body returns at replay are the sub-graph's own buffers, unless the call was made
  with ``fresh_outputs=True`` (for chains that keep results across calls): then they are fresh
  copies, which the next replay cannot overwrite.
- With ``retain_args=True`` the break holds its argument tensors strongly, so that a chain that
  keeps its inputs until later in the same call (a cache comparing a block's input with a later
  output) never sees them overwritten by later segments.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .active_capture import ACTIVE_CAPTURE
from .boxing import box_tuple
from .copy_back import copy_into
from .tree import tree_map, walk

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar["HookedCallStep | None"] = contextvars.ContextVar("bcg_hooked_call", default=None)
_BYPASS: contextvars.ContextVar[bool] = contextvars.ContextVar("bcg_bypass_hooks", default=False)


def argument_signature(args: tuple, kwargs: dict) -> tuple:
    """What a captured body baked in about its arguments: tensor addresses and layouts, and the
    values of everything else (objects by identity)."""
    fields = []
    for path, descriptor, value in walk((args, kwargs)):
        if descriptor is not None:
            fields.append((path, descriptor))
        elif isinstance(value, torch.Tensor):
            fields.append((path, value.data_ptr(), tuple(value.shape), value.stride(), value.dtype))
        elif isinstance(value, (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)):
            fields.append((path, type(value), value))
        else:
            fields.append((path, "id", id(value)))
    return tuple(fields)


class CapturedBody:
    """The body of hooked calls: install it where the chain calls the body.

    Calling it runs ``fn`` eagerly, except while the chain of a :class:`HookedCallStep` whose
    body it is runs at replay: then the step's sub-graph replays (see the module docstring).
    ``calls`` counts hooked calls of this body (replayed or eager) and ``computed`` the calls in
    which the hooks ran the body; the difference is what a cache reused.
    """

    def __init__(self, fn: Callable, name: str) -> None:
        self.fn = fn
        self.name = name
        self.calls = 0
        self.computed = 0
        self._warned = False
        self._eager_call = False  # inside an eager (not replayed) hooked call of this body

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        step = _ACTIVE.get()
        if step is None or step.body is not self:
            if self._eager_call:  # an eager hooked call (no replay): counted as computed too
                self.computed += 1
            return self.fn(*args, **kwargs)
        self.computed += 1
        if step.sub is None or not step.replay_body or argument_signature(args, kwargs) != step.signature:
            if step.replay_body and step.sub is not None and not self._warned:
                self._warned = True
                logger.info("bcg: %s was called with other arguments than at capture; it runs eagerly", self.name)
            return self.fn(*args, **kwargs)
        token = _ACTIVE.set(None)
        try:
            step.sub.replay()
        finally:
            _ACTIVE.reset(token)
        if step.fresh_outputs:
            step.last_fresh = tree_map(torch.Tensor.clone, step.body_outputs)
            return step.last_fresh
        return step.body_outputs

    def __deepcopy__(self, memo: dict) -> Any:
        raise TypeError(
            "a module holding a bcg-diffusion captured body cannot be deep-copied; call "
            "bcg_diffusion.remove_acceleration() first, copy, then accelerate the copy"
        )


@dataclass
class HookedCallStep:
    """A graph step: run the chain eagerly, let it replay the body's sub-graph, copy its result
    into the bridge buffer (skipped where the result already is the bridge)."""

    chain: Callable
    body: CapturedBody
    sub: Any  # BreakableCUDAGraph of the body, or None in debug mode
    args: tuple
    kwargs: dict
    signature: tuple
    output: Any  # the bridge buffer: the boxed outputs of the body's sub-graph
    body_outputs: Any
    name: str
    fresh_outputs: bool = False
    replay_body: bool = True
    last_fresh: Any = field(default=None, repr=False)

    def run(self) -> None:
        self.body.calls += 1
        token = _ACTIVE.set(self)
        try:
            result = self.chain(*self.args, **self.kwargs)
        finally:
            _ACTIVE.reset(token)
        if result is not None and result is self.last_fresh:
            self.last_fresh = None  # the bridge already holds these values: they were copied from it
            return
        self.last_fresh = None
        copy_into(self.output, box_tuple(result), path=f"result of hooked call {self.name}")


def hooked_call(
    chain: Callable,
    body: CapturedBody,
    args: tuple,
    kwargs: dict,
    *,
    fresh_outputs: bool = False,
    retain_args: bool = False,
    replay_body: bool = True,
) -> Any:
    """Call ``chain(*args, **kwargs)``, which eventually calls ``body``; under a breakable capture,
    record a :class:`HookedCallStep` instead (see the module docstring)."""
    if _BYPASS.get():
        return body.fn(*args, **kwargs)
    state = ACTIVE_CAPTURE.get()
    if state is None:
        # an eager call (a key's first call, a fallback, module mode's eager forward): its passes count too
        body.calls += 1
        outer, body._eager_call = body._eager_call, True
        try:
            return chain(*args, **kwargs)
        finally:
            body._eager_call = outer
    return state.run_hooked(
        chain, body, args, kwargs, fresh_outputs=fresh_outputs, retain_args=retain_args, replay_body=replay_body
    )


@contextlib.contextmanager
def bypassing_hooks() -> Iterator[None]:
    """Hooked calls in the block run their body only (warm-up runs: hook state must not advance)."""
    token = _BYPASS.set(True)
    try:
        yield
    finally:
        _BYPASS.reset(token)
