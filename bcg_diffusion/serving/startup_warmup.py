"""Start-up warm-up: run the sizes of ``--warmup`` once before the server listens.

Each size is warmed by ``bcg_diffusion.warmup(pipe, shapes, **call)``: ``shapes`` are ``dict(height=H, width=W)``
and ``call`` the settings of the pipeline call a request of that size with only a prompt makes, built as every
request's (:mod:`.calls`: a default job, alone or in its batch), less the size and steps: prompt, guidance,
``num_images_per_prompt=1``, ``use_resolution_binning`` where set, ... It runs through the server's
:class:`~.runner.CallRunner`, in the grad mode of the server's calls, on the worker thread: each call compiles
(``--compile``) and captures (``--bcg``) what that size needs.

With batching (:mod:`.batching`), a size whose calls are batched is warmed at its batch shape: a list of
``--max-batch`` prompts with one image each, as every batched call of that size runs, so its requests replay
whatever their ``n`` or their batch. A size whose calls run alone (no batching, or a size batching leaves alone) is
warmed once per ``n`` a request may ask for (1 .. ``--max-n``): a call alone makes its request's ``n`` images, and
each ``n`` is an input shape of its own (a graph, and compiled code), which a request would otherwise capture.
Sizes of one shape are warmed in one library call per shape.

The speed stack decides what is warmed and how long (:func:`plan_warmup`): with a step cache each warm-up call runs
the default step count (a cache reuses only after its own first steps, and a cached step may call a block at a
layout a computed step never makes: a new graph or compilation); with ``--compile`` or ``--cache`` and no
``--warmup`` the default size is warmed, so that requests of that size neither capture nor compile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bcg_diffusion.toolkit.sizes import Size

from .calls import Batch
from .requests import RequestPlanner
from .runner import CallRunner

logger = logging.getLogger(__name__)

__all__ = ["WARMUP_STEPS", "CombinedWarmupReport", "WarmupPlan", "make_room_to_compile", "most_warmup_keys",
           "plan_warmup", "run_warmup", "warm_shapes", "warms_default_size", "warmup_batches"]

#: Steps per warm-up call (the library's default), unless a step cache needs the default step count.
WARMUP_STEPS = 2


@dataclass(frozen=True)
class WarmupPlan:
    """What the start-up warms: ``sizes``, ``steps`` per warm-up call, and ``notes``: the lines that say what the
    stack changed (none when it changed nothing)."""

    sizes: tuple[Size, ...]
    steps: int = WARMUP_STEPS
    notes: tuple[str, ...] = ()


def plan_warmup(sizes: tuple[Size, ...], default_size: Size, default_steps: int, stack) -> WarmupPlan:
    """The warm-up of a server with ``--warmup`` ``sizes``, its default request (``default_size``,
    ``default_steps``) and its speed stack (a :class:`~bcg_diffusion.toolkit.stack_options.StackOptions`)."""
    notes = []
    if warms_default_size(sizes, stack):
        sizes = (default_size,)
        notes.append(f"warm-up: no --warmup given; the stack ({stack.describe()}) compiles or caches steps, so the "
                     f"default size {default_size} is warmed before listening")
    steps = WARMUP_STEPS
    if stack.cache is not None and sizes:
        steps = default_steps
        notes.append(f"warm-up: {steps} steps per size (the default step count), as the step cache "
                     f"({stack.cache.text}) reuses only after its first steps and a cached step may need graphs or "
                     "compiled code a computed step does not")
    return WarmupPlan(tuple(sizes), steps, tuple(notes))


def warms_default_size(sizes: tuple[Size, ...], stack) -> bool:
    """Whether the warm-up runs the default size: no ``--warmup`` sizes, and a stack that compiles or caches steps
    (so that requests of that size neither capture nor compile)."""
    return not sizes and (stack.compile or stack.cache is not None)


@dataclass
class CombinedWarmupReport:
    """The reports of several library warm-up calls (one per batch shape or ``n``), as one: ``total_s``,
    ``captures``, and ``str()``: one report, its totals first, then every shape's line (its settings say its size
    and ``num_images_per_prompt``)."""

    reports: list

    @property
    def total_s(self) -> float:
        return sum(float(r.total_s) for r in self.reports)

    @property
    def captures(self) -> int:
        return sum(int(r.captures) for r in self.reports)

    def __str__(self) -> str:
        shapes = sum(len(getattr(r, "shapes", ())) for r in self.reports)
        steps = "/".join(sorted({str(getattr(r, "num_inference_steps", "?")) for r in self.reports}))
        head = (f"warm-up: {shapes} shape(s), {self.captures} graph key(s) captured, {self.total_s:.2f} s "
                f"({steps} steps per call)")
        return "\n".join([head] + [line for r in self.reports for line in str(r).splitlines()[1:]])


def warmup_batches(planner: RequestPlanner, size: Size, shapes=None, adapter: str | None = None) -> list[Batch]:
    """The batches whose calls cover what requests of ``size`` with only a prompt (for ``adapter``; ``None``: the base
    model) run: the one at the rows its size is batched at (``shapes``: a
    :class:`.batching.request_batching.BatchShapes`; ``None``: no batching), else one alone per ``n`` from 1 to the
    planner's ``max_n``. ``RequestError`` where such a request is not valid."""
    job = planner.default_job(size, model=adapter)  # the same checks as a request of that size
    rows = shapes.rows_of(job) if shapes is not None else 1
    if rows > 1:
        return [Batch((job,), rows)]
    return [Batch.alone(job)] + [Batch.alone(planner.default_job(size, model=adapter, n=n))
                                 for n in range(2, planner.max_n + 1)]


def warm_shapes(planner: RequestPlanner, sizes: list[Size], shapes=None) -> int:
    """The input shapes the warm-up's calls of ``sizes`` make (:func:`warmup_batches`: a batch shape, or each ``n``)."""
    return sum(len(warmup_batches(planner, size, shapes)) for size in sizes)


def most_warmup_keys(sizes: int, max_n: int, batched: bool, adapters: bool) -> int:
    """The most graph keys the warm-up of ``sizes`` sizes captures: per size its batch shape (``batched``: batching
    on) and a call alone per ``n`` from 1 to ``max_n`` (a size batching leaves alone, or the batch check unbatches),
    each twice with ``adapters`` (the slot enabled and disabled are two keys)."""
    return sizes * (max_n + (1 if batched else 0)) * (2 if adapters else 1)


def make_room_to_compile(count: int) -> str | None:
    """With ``--compile``: torch compiles at most ``torch._dynamo.config.recompile_limit`` input shapes per block class
    and runs the others uncompiled; raise it to ``count`` (the warm-up's shapes) where it is lower. The line to print,
    ``None`` when the limit was enough."""
    import torch._dynamo

    limit = torch._dynamo.config.recompile_limit
    if count <= limit:
        return None
    torch._dynamo.config.recompile_limit = count
    return (f"compile: the warm-up makes {count} input shapes (sizes x n, x2 with adapters); torch's recompile_limit "
            f"raised from {limit} to {count}, so that each of them is compiled")


def run_warmup(runner: CallRunner, planner: RequestPlanner, sizes: list[Size], shapes=None,
               steps: int = WARMUP_STEPS, adapter: str | None = None):
    """Warm every size of ``sizes`` (validated as requests first: ``RequestError``) with calls of
    ``steps`` steps, each with the call its requests make (:func:`warmup_batches`; sizes of one batch shape in one
    library call); the library's report (a :class:`CombinedWarmupReport` of them for several shapes). Call it on the
    worker thread."""
    groups: dict[tuple[int | None, int], tuple[Batch, list[Size]]] = {}
    for size in sizes:
        for batch in warmup_batches(planner, size, shapes, adapter):
            groups.setdefault((batch.rows, batch.jobs[0].n), (batch, []))[1].append(size)
    reports = [runner.warm(batch.call(), group, None if steps == WARMUP_STEPS else steps)
               for batch, group in groups.values()]
    return reports[0] if len(reports) == 1 else CombinedWarmupReport(reports)
