"""The server's batching part: whether its requests are batched (``--max-batch`` > 1, no step cache, a pipeline that
makes several images per call), the batch shapes, and the batcher: request batching (:mod:`..batching.request_batching`)
or, with ``--batching step``, the step scheduler (:mod:`..batching.step_batching`). A server without batching runs
every request alone, one call each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bcg_diffusion.toolkit.options import Failure

from ..batching.request_batching import BatchPolicy, BatchShapes, BatchStats, RequestBatcher
from ..batching.step_batching import StepBatcher
from ..batching.stepping import StepError
from ..runner import CallRunner
from ..server_plan import ServerPlan, prog
from ..worker import PipelineWorker
from .model import BuiltModel

__all__ = ["CACHED_UNBATCHED", "Batching", "batching_off", "set_up_batching"]

#: Why a server with a step cache runs every request alone (``--max-batch`` > 1 notwithstanding).
CACHED_UNBATCHED = ("a step cache decides for a whole pipeline call (compute or reuse) from every row of it, so in a "
                    "batch a request's image would depend on its companions; with --cache every request runs alone, "
                    "one call each, as with --max-batch 1")


@dataclass
class Batching:
    """``off``: why nothing is batched (``""`` for ``--max-batch 1``; ``None`` where requests are batched, which caps
    ``n`` at ``--max-batch``); ``shapes`` and ``batcher`` where batched (else ``None``); ``notes``: the lines that
    say so."""

    off: str | None
    shapes: BatchShapes | None = None
    batcher: Any = None
    notes: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Stop the batcher's thread (if any)."""
        if self.batcher is not None:
            self.batcher.stop()


def set_up_batching(built: BuiltModel, plan: ServerPlan, worker: PipelineWorker, runner: CallRunner) -> Batching:
    """The batching of ``plan`` on ``built``: its batcher (its batches run as calls of ``runner`` on ``worker``)
    started where requests are batched; ``Failure`` (2) for a pipeline the step scheduler cannot split."""
    off = batching_off(built, plan)
    if off is not None:
        return Batching(off, notes=[f"batching: off: {off}"] if off else [])
    batching, rows = plan.batching, plan.batching.rows
    shapes = BatchShapes(built.pipe, BatchPolicy(rows, batching.window_ms / 1000.0, batching.work_limit),
                         built.granularity)
    notes = [f"batching: n is capped at --max-batch {rows} (was --max-n {plan.requests.max_n})"
             ] if plan.requests.max_n > rows else []
    if batching.step is None:
        notes.append(f"batching: up to {rows} images per call, window {batching.window_ms:g} ms; every batched "
                     f"call runs {rows} rows (a lone request pays for a full batch)")
        return Batching(None, shapes, RequestBatcher(worker, lambda batch: runner.run(batch.call()), shapes,
                                                     BatchStats(shapes.policy)), notes)
    notes.append(f"batching: step level, a running batch of {rows} slots per size (policy {batching.step.policy}); "
                 f"requests join at every step, every step runs {rows} rows (a lone request pays for a full batch)")
    try:
        return Batching(None, shapes, StepBatcher(worker, runner, shapes, batching.step), notes)
    except StepError as exc:
        raise Failure(2, f"{prog()}: error: --batching step: {exc}") from exc


def batching_off(built: BuiltModel, plan: ServerPlan) -> str | None:
    """Why this server batches nothing (``--max-batch 1``: ``""``; a step cache; a pipeline that makes one image per
    call), ``None`` where ``--max-batch`` batches."""
    if plan.batching.rows <= 1:
        return ""
    if plan.stack.cache is not None:
        return CACHED_UNBATCHED
    if not built.takes_batch:
        return f"{type(built.pipe).__name__} makes one image per call (no images-per-prompt argument)"
    return None
