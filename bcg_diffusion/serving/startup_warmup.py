"""Start-up warm-up: run the sizes of ``--warmup`` once before the server listens.

Where the library has ``bcg_diffusion.warmup(pipe, shapes, **call)`` it is used: ``shapes`` are
``dict(height=H, width=W)`` and ``call`` the settings of a default request (prompt, guidance,
``num_images_per_prompt=1``, ``use_resolution_binning`` where set, ...). Otherwise the server makes
one 2-step call per size itself, with the same settings and a generator of its own (the documented
equivalent): each call compiles (``--compile``) and captures (``--bcg``) what that size needs.
Both run in the grad mode of the server's calls, on the worker thread.

With batching (:mod:`.batching`), a size whose calls are batched is warmed at its batch shape: a list of
``--max-batch`` prompts with one image each, as every batched call of that size runs, so its requests replay
whatever their ``n`` or their batch. Sizes of different shapes are warmed in one library call per shape.

The speed stack decides what is warmed and how long (:func:`plan_warmup`): with a step cache each warm-up call runs
the default step count (a cache reuses only after its own first steps, and a cached step may call a block at a
layout a computed step never makes: a new graph or compilation); with ``--compile`` or ``--cache`` and no
``--warmup`` the default size is warmed, so that requests of that size neither capture nor compile.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import bcg_diffusion

from bcg_pipelines.calls import BATCH_KWARGS

from .requests import RequestPlanner
from .worker import ImageGenerator, request_grad_mode

logger = logging.getLogger(__name__)

__all__ = ["WARMUP_STEPS", "CombinedWarmupReport", "ServerWarmupReport", "WarmupPlan", "WarmupShape", "plan_warmup",
           "run_warmup", "warmup_call"]

WARMUP_STEPS = 2
#: Keys of a request's call that the warm-up sets per shape (or leaves to the warm-up's default).
PER_SHAPE_KEYS = ("height", "width", "num_inference_steps")


@dataclass(frozen=True)
class WarmupPlan:
    """What the start-up warms: ``sizes`` (``(width, height)``), ``steps`` per warm-up call, and ``notes``: the
    lines that say what the stack changed (none when it changed nothing)."""

    sizes: tuple[tuple[int, int], ...]
    steps: int = WARMUP_STEPS
    notes: tuple[str, ...] = ()


def plan_warmup(sizes: tuple[tuple[int, int], ...], default_size: tuple[int, int], default_steps: int,
                stack) -> WarmupPlan:
    """The warm-up of a server with ``--warmup`` ``sizes``, its default request (``default_size``,
    ``default_steps``) and its speed stack (a :class:`~bcg_diffusion.toolkit.stack_options.StackOptions`)."""
    notes = []
    if not sizes and (stack.compile or stack.cache is not None):
        sizes = (default_size,)
        notes.append(f"warm-up: no --warmup given; the stack ({stack.describe()}) compiles or caches steps, so the "
                     f"default size {default_size[0]}x{default_size[1]} is warmed before listening")
    steps = WARMUP_STEPS
    if stack.cache is not None and sizes:
        steps = default_steps
        notes.append(f"warm-up: {steps} steps per size (the default step count), as the step cache "
                     f"({stack.cache.text}) reuses only after its first steps and a cached step may need graphs or "
                     "compiled code a computed step does not")
    return WarmupPlan(tuple(sizes), steps, tuple(notes))


@dataclass(frozen=True)
class WarmupShape:
    """One warmed size: how long its call took and how many graphs it captured."""

    width: int
    height: int
    seconds: float
    captures: int


@dataclass
class ServerWarmupReport:
    """The report of the server's own warm-up (when ``bcg_diffusion.warmup`` does not exist); the same
    ``total_s`` and ``captures`` as the library's report, and a table as ``str()``."""

    shapes: list[WarmupShape] = field(default_factory=list)
    steps: int = WARMUP_STEPS

    @property
    def total_s(self) -> float:
        return sum(s.seconds for s in self.shapes)

    @property
    def captures(self) -> int:
        return sum(s.captures for s in self.shapes)

    def __str__(self) -> str:
        lines = [f"warm-up: one {self.steps}-step call per size (the server's own; bcg_diffusion.warmup "
                 "is not available)", f"  {'size':<12} {'seconds':>8} {'captures':>9}"]
        lines += [f"  {f'{s.width}x{s.height}':<12} {s.seconds:>8.2f} {s.captures:>9}" for s in self.shapes]
        lines.append(f"  {'total':<12} {self.total_s:>8.2f} {self.captures:>9}")
        return "\n".join(lines)


@dataclass
class CombinedWarmupReport:
    """The reports of several warm-up calls (one per batch shape), as one: ``total_s``, ``captures``, ``str()``."""

    reports: list

    @property
    def total_s(self) -> float:
        return sum(float(r.total_s) for r in self.reports)

    @property
    def captures(self) -> int:
        return sum(int(r.captures) for r in self.reports)

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.reports)


def warmup_call(planner: RequestPlanner, width: int, height: int, rows: int = 1) -> dict[str, Any]:
    """The call settings of a default request at this size, without the per-shape keys; with ``rows`` > 1, those
    of a batched call of that many rows (a list of prompts, one image each)."""
    call = planner.default_job(width, height).call
    call = {k: v for k, v in call.items() if k not in PER_SHAPE_KEYS}
    if rows > 1:
        call["prompt"] = [call["prompt"]] * rows
        for key in BATCH_KWARGS:
            if key in call:
                call[key] = 1
    return call


def _captures(pipe) -> int:
    stats = bcg_diffusion.get_stats(pipe)
    return stats.captures


def run_warmup(generator: ImageGenerator, planner: RequestPlanner, sizes: list[tuple[int, int]], shapes=None,
               steps: int = WARMUP_STEPS):
    """Warm every ``(width, height)`` in ``sizes`` (validated as requests first: ``RequestError``) with calls of
    ``steps`` steps, each at the rows its calls run (``shapes``: a :class:`.batching.BatchShapes`; ``None``: 1);
    returns the library's report or a :class:`ServerWarmupReport` (a :class:`CombinedWarmupReport` of them for sizes
    of several batch shapes). Call it on the worker thread."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for width, height in sizes:
        job = planner.default_job(width, height)  # the same checks as a request of that size
        rows = shapes.rows_of(job) if shapes is not None else 1
        groups.setdefault(rows, []).append((width, height))
    reports = [_warm(generator, planner, group, rows, steps) for rows, group in groups.items()]
    return reports[0] if len(reports) == 1 else CombinedWarmupReport(reports)


def _warm(generator: ImageGenerator, planner: RequestPlanner, sizes: list[tuple[int, int]], rows: int, steps: int):
    pipe = generator.pipe
    call = warmup_call(planner, *sizes[0], rows=rows)
    library_warmup = getattr(bcg_diffusion, "warmup", None)
    try:
        with request_grad_mode():
            if library_warmup is not None:
                extra = {} if steps == WARMUP_STEPS else {"num_inference_steps": steps}  # else the library's default
                return library_warmup(pipe, [dict(height=h, width=w) for w, h in sizes], **extra, **call)
            report = ServerWarmupReport(steps=steps)
            for width, height in sizes:
                before = _captures(pipe)
                start = time.perf_counter()
                pipe(**call, height=height, width=width, num_inference_steps=steps,
                     generator=generator.generator(0))
                if generator.device.type == "cuda":
                    torch.cuda.synchronize(generator.device)
                report.shapes.append(WarmupShape(width, height, time.perf_counter() - start, _captures(pipe) - before))
                logger.info("warmed %dx%d in %.2f s", width, height, report.shapes[-1].seconds)
            return report
    finally:
        generator.refresh_stats()
