"""Watching a pipeline's transformer during whole-pipeline calls: the time of each call and the input it ran.

:class:`CallTimer` hooks a module (forward pre/post hooks, outside whatever runs inside it: BCG's runner,
compiled regions): CUDA events on the current stream, or ``perf_counter`` without CUDA, and the shape of the
first call's ``hidden_states``: the size the transformer actually ran (after resolution binning, patching
or packing), which can differ from the size asked for.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from .trees import describe_tree


def hidden_states_of(args: tuple, kwargs: dict[str, Any]):
    """The ``hidden_states`` of a transformer call (keyword, else the first positional argument)."""
    return kwargs.get("hidden_states", args[0] if args else None)


class CallTimer:
    """Times every call of ``module`` and notes the ``hidden_states`` of the first call after each ``take``."""

    def __init__(self, module: torch.nn.Module, cuda: bool):
        self.cuda = cuda
        self.spans: list[tuple[Any, Any]] = []
        self.first_input: str | None = None  # e.g. "bfloat16[2, 4, 64, 64]"
        self._start: Any = None
        self._handles = [module.register_forward_pre_hook(self._pre, with_kwargs=True),
                         module.register_forward_hook(self._post)]

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _pre(self, _module, args, kwargs):
        if not self.spans and self.first_input is None:
            hs = hidden_states_of(args, kwargs)
            self.first_input = describe_tree(hs) if isinstance(hs, torch.Tensor) else None
        self._start = self._stamp()

    def _post(self, _module, _args, _out):
        self.spans.append((self._start, self._stamp()))

    def take(self) -> list[float]:
        """Seconds of the calls since the last ``take`` (and forget them and the noted input)."""
        if self.cuda:
            torch.cuda.synchronize()
            secs = [a.elapsed_time(b) / 1e3 for a, b in self.spans]
        else:
            secs = [b - a for a, b in self.spans]
        self.spans = []
        self.first_input = None
        return secs

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def step_times(call_s: list[float], steps: int) -> list[float] | None:
    """Seconds per denoising step from the transformer calls of one pipeline call (``steps`` steps, the
    same number of calls each); ``None`` when the calls do not divide into the steps."""
    if steps < 1 or not call_s or len(call_s) % steps:
        return None
    per = len(call_s) // steps
    return [sum(call_s[i * per:(i + 1) * per]) for i in range(steps)]


def first_step_summary(step_s: list[float] | None) -> dict[str, float | None]:
    """The first step, the median of the later ones (ms) and their ratio (the cost of the first step)."""
    if not step_s:
        return {"first_step_ms": None, "median_later_step_ms": None, "first_step_over_median": None}
    later = step_s[1:] or step_s
    median = statistics.median(later)
    return {"first_step_ms": 1e3 * step_s[0], "median_later_step_ms": 1e3 * median,
            "first_step_over_median": step_s[0] / median if median > 0 else None}
