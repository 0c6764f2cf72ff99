"""The server's warm-up before it listens (what it warms: :func:`~..startup_warmup.plan_warmup`): every warmed size
run once on the worker thread, the base model's and, with adapters, once more with the first adapter in the slot
(both graph keys captured); with step batching the step-batched sizes through the step scheduler. Then what was
compiled is saved into ``--compile-cache``. A failed warm-up raises :class:`~bcg_diffusion.toolkit.options.Failure`.
"""

from __future__ import annotations

from typing import Any

from bcg_diffusion.toolkit.options import Failure
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.toolkit.stack import compiled_graphs

from ..batching.slot_check import check_batched_sizes
from ..batching.step_batching import StepBatcher
from ..errors import RequestError
from ..requests import RequestPlanner
from ..runner import CallRunner
from ..server_plan import ServerPlan, prog
from ..startup_warmup import WarmupPlan, make_room_to_compile, plan_warmup, run_warmup, warm_shapes
from ..worker import PipelineWorker
from .batching import Batching

__all__ = ["warm_server"]


def warm_server(plan: ServerPlan, planner: RequestPlanner, worker: PipelineWorker, runner: CallRunner,
                batching: Batching, compile_cache=None) -> dict[str, Any]:
    """Warm the server (see the module's docstring), then save the compile cache; the summary for ``/stats`` (the
    base model's pass, with ``compile_cache``: the saving's line, ``None`` without one)."""
    print_batched_sizes(plan, planner, batching)
    warming = plan_warmup(plan.warmup, planner.default_size, planner.default_steps, plan.stack)
    notes = list(warming.notes)
    if plan.stack.compile:
        bank = runner.adapters
        states = 2 if bank is not None and bank.names else 1  # an adapter in the slot: other code, other graphs
        notes.append(make_room_to_compile(states * warm_shapes(planner, list(warming.sizes), batching.shapes)))
    for note in filter(None, notes):
        print(f"  {note}", flush=True)
    summary = warm_pass(worker, runner, planner, warming, batching)
    summary["batch_check"] = check_batching(worker, runner, planner, warming, batching)
    bank = runner.adapters
    if bank is not None:
        if bank.names:
            worker.submit(lambda: bank.select(bank.names[0])).result()
            try:
                warm_pass(worker, runner, planner, warming, batching, adapter=bank.names[0])
            finally:
                worker.submit(lambda: bank.select(None)).result()
        runner.refresh_stats()
        bank.mark_ready(runner.bcg_stats)  # the adapters count from zero
        runner.refresh_stats()
    summary["compile_cache"] = save_compile_cache(compile_cache)
    return summary


def check_batching(worker: PipelineWorker, runner: CallRunner, planner: RequestPlanner, warming: WarmupPlan,
                   batching: Batching) -> list[str]:
    """With request batching: the warmed sizes' batch check (:mod:`..batching.slot_check`), printed; a size it unbatches
    is warmed again alone, so that no request captures. The printed lines (none without request batching)."""
    if batching.shapes is None or isinstance(batching.batcher, StepBatcher) or not warming.sizes:
        return []
    lines, alone = check_batched_sizes(runner, planner, batching.shapes, list(warming.sizes), worker)
    for line in lines:
        print(f"    {line}", flush=True)
    if alone:
        worker.submit(lambda: run_warmup(runner, planner, alone, batching.shapes, warming.steps)).result()
    return lines


def print_batched_sizes(plan: ServerPlan, planner: RequestPlanner, batching: Batching) -> None:
    """Per warmed size (or the default size), whether its calls are batched (nothing without batching)."""
    if batching.shapes is None:
        return
    try:
        for size in plan.warmup or [planner.default_size]:
            print(f"    {batching.shapes.describe(size, planner.default_job(size).call)}", flush=True)
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc


def warm_pass(worker: PipelineWorker, runner: CallRunner, planner: RequestPlanner, warming: WarmupPlan,
              batching: Batching, adapter: str | None = None) -> dict[str, Any]:
    """One warm-up of every size (with step batching, the step-batched sizes through the step scheduler) for
    ``adapter`` (``None``: the base model); print its report; its summary."""
    sizes = list(warming.sizes)
    if not sizes:
        return {"sizes": [], "total_s": 0.0, "captures": 0, "method": None, "steps": None}
    stepped = step_sizes(planner, sizes, batching.batcher)
    method = "bcg_diffusion.warmup"
    if stepped:
        method = "step scheduler" + (f" and {method}" if len(stepped) < len(sizes) else "")
    print(f"warming up {', '.join(map(str, sizes))} (WxH; {method}, {warming.steps} steps) ...", flush=True)
    try:
        rest = [size for size in sizes if size not in stepped]
        reports = [worker.submit(lambda: run_warmup(runner, planner, rest, batching.shapes, warming.steps, adapter)
                                 ).result()] if rest else []
        reports += [batching.batcher.warm(planner, stepped, adapter)] if stepped else []
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: warm-up failed: {type(exc).__name__}: {exc}") from exc
    for report in reports:
        print(str(report), flush=True)
    return {"sizes": [str(size) for size in sizes], "total_s": round(sum(float(r.total_s) for r in reports), 3),
            "captures": sum(int(r.captures) for r in reports), "method": method, "steps": warming.steps,
            "compiled_graphs": compiled_graphs()}


def step_sizes(planner: RequestPlanner, sizes: list[Size], batcher) -> list[Size]:
    """The sizes of ``sizes`` that ``batcher`` step-batches (none without step batching); ``Failure`` (2) for a
    size that is not a valid request."""
    if not isinstance(batcher, StepBatcher):
        return []
    try:
        return [size for size in sizes if batcher.batches(planner.default_job(size))]
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc


def save_compile_cache(cache) -> str | None:
    """After the warm-up: what was compiled saved into the compile cache, so that the next start loads it; the line
    printed (and shown in ``/stats``), ``None`` without ``--compile-cache``. A failed save is said, not fatal."""
    if cache is None:
        return None
    try:
        path = cache.save()
    except Exception as exc:  # noqa: BLE001 - the server serves either way
        line = f"compile cache: saving the artifacts failed: {type(exc).__name__}: {exc}"
    else:
        line = ("compile cache: nothing was compiled, nothing saved" if path is None
                else f"compile cache: saved the warm-up's compile artifacts to {path}")
    print(line, flush=True)
    return line
