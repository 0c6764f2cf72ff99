"""The start-up check that a batched size keeps every image independent of its batch (request batching).

Request batching pads every call of a size to the same ``rows`` (the reproducibility rule: a fixed shape, so the same
kernels). A fixed shape is not always enough: on an H100, Sana 1.6B at 256x256 and 256x320 px, batched at 8 rows,
gave images that depended on what shared the call, eagerly as with graphs (the 2026-12-07 soak; its transformer alone
was found independent of the row order, so the dependence is elsewhere in the pipeline, not located yet). So before
the server listens, :func:`check_batched_sizes` runs each batched size twice on the worker thread: a probe request
alone in the call (slot 0, filler rows after it), then the same probe after ``rows - 1`` images of another request
(the last slot), and compares the probe's image bitwise (``output_type="np"``, before any rounding to 8 bits). A size
whose probe differs runs unbatched from then on (:meth:`.request_batching.BatchShapes.unbatch`), and the start-up log
says so. Passing is evidence, not a proof: one other companion and one other slot were tried.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.sizes import Size

from ..calls import Batch, PipelineCall
from ..worker import request_grad_mode

__all__ = ["CHECK_STEPS", "check_batched_sizes", "probe_differs"]

#: Denoising steps of the check's calls (at most: fewer where the request's default is fewer).
CHECK_STEPS = 2
COMPANION_PROMPT = "a different request sharing the call"


def _images(runner, call: PipelineCall, steps: int) -> np.ndarray:
    kwargs = {**call.kwargs, "output_type": "np"}
    if "num_inference_steps" in kwargs:
        kwargs["num_inference_steps"] = min(int(kwargs["num_inference_steps"]), steps)
    generators = [runner.generator(seed) for seed in call.seeds]
    with request_grad_mode():
        output = runner.pipe(**kwargs, generator=generators)
    return np.asarray(pipelines.generated(output))


def probe_differs(runner, planner, size: Size, rows: int, steps: int = CHECK_STEPS) -> bool:
    """Whether the probe request's image at slot 0 differs from its image at the last slot after ``rows - 1`` images of
    another request (see the module's docstring). Run it on the worker thread."""
    probe = planner.default_job(size, prompt="slot check")
    others = dataclasses.replace(probe, prompt=COMPANION_PROMPT, seed=probe.seed + 1, n=rows - 1)
    alone = _images(runner, Batch((probe,), rows).call(), steps)[0]
    last = _images(runner, Batch((others, probe), rows).call(), steps)[rows - 1]
    return alone.shape != last.shape or not np.array_equal(alone, last)


def check_batched_sizes(runner, planner, shapes, sizes: list[Size], worker) -> tuple[list[str], list[Size]]:
    """Check every size of ``sizes`` that ``shapes`` batches; unbatch those whose probe differs (or whose check
    fails). The log lines, and the sizes unbatched. The check's calls go around ``runner.run``, so the runner's
    stats (``/stats``) are refreshed once they are done: a request's counters then start from after the check."""
    try:
        return _check_sizes(runner, planner, shapes, sizes, worker)
    finally:
        worker.submit(runner.refresh_stats).result()


def _check_sizes(runner, planner, shapes, sizes: list[Size], worker) -> tuple[list[str], list[Size]]:
    lines: list[str] = []
    unbatched: list[Size] = []
    for size in sizes:
        job = planner.default_job(size)
        rows = shapes.rows_of(job)
        if rows <= 1:
            continue
        try:
            differs = worker.submit(lambda: probe_differs(runner, planner, size, rows)).result()
        except Exception as exc:  # noqa: BLE001 - unknown is treated as dependent: the size runs alone
            shapes.unbatch(size, f"the batch check could not run ({type(exc).__name__}: {exc})")
            unbatched.append(size)
            lines.append(f"{size}: NOT batched: the batch check failed ({type(exc).__name__}: {exc}); these requests "
                         "run alone")
            continue
        if differs:
            shapes.unbatch(size, "a request's image depended on what shared its batched call (checked at start)")
            unbatched.append(size)
            lines.append(f"{size}: NOT batched: a probe request's image at slot 0 and at slot {rows - 1} differed "
                         "bitwise, so batching would make images depend on their batch; these requests run alone")
        else:
            lines.append(f"{size}: batch check passed (a probe's image equal at slot 0 and slot {rows - 1})")
    return lines, unbatched
