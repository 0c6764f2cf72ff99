"""One case: build, record a real step's transformer inputs, set up every mode, time them interleaved.

Modes are timed in rounds (mode A x N, mode B x N, ..., repeated R times) so that drift hits all alike.
BCG patches attention functions process-wide while any module is accelerated, which would give eager
calls an extra wrapper and the compiled modes the attention custom ops: so BCG modes (and
``partition_ceiling``, which installs the same wrappers) run last in each round and are deactivated while
the others run (and reactivated, i.e. recaptured with untimed warm-up calls, before their own turn).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

import bcg_pipelines as pipelines

from ..timing import Clock, auto_iters, profile_kernels, summarize
from ..trees import clone_tree, describe_tree
from .cases import VARIANTS, Case
from .modes import (
    COMPILED, DEFAULT_MODES, EXCLUSIVE_MODES, MODE_REGISTRY, ModeUnavailable, Runner, StepContext, bcg_stats_dict)
from .parallel import Ranks, combine_ranks, prepare_module
from .report import case_ratios
from .rows import ROW_REGISTRY

PROMPT = "a lighthouse on a rocky coast at dusk, waves crashing, dramatic sky"


@dataclass
class Settings:
    """How to measure (from the command line)."""

    iters: int | None  # timed calls per mode per round; None: auto_iters
    rounds: int
    warmup: int
    seed: int
    rows: bool | None  # whole-pipeline rows: None means each case's own setting
    e2e_steps: int | None
    bcg_options: dict[str, Any]
    cache_rows: tuple = ()  # --cache-rows: the step caches (CacheSpec, or their text) of the cache row (empty: none)
    cache_compile: bool = False  # --cache-compile: the cache row also runs regional compile + cache
    setup_timeout: float | None = None  # --setup-timeout: seconds a mode's set-up may take (None: no limit)
    first_image: tuple[str, ...] = ()  # --first-image: the modes of the first-image row (empty: no such row)
    compile_cache: Any = None  # the process's compile_cache_dirs.ProcessCompileCache (None: Inductor's default)


class SetupTimeout(BaseException):
    """A mode's set-up ran past ``--setup-timeout`` (a ``BaseException``, so that no ``except Exception`` in
    torch.compile's code swallows it on the way out)."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`SetupTimeout` in the main thread once ``seconds`` have passed (``None``: no limit)."""
    if seconds is None:
        yield
        return

    def expire(_signum, _frame):
        raise SetupTimeout(f"set-up took longer than {seconds:g} s (--setup-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


def case_call(pipe, case: Case, steps: int) -> dict[str, Any]:
    """The pipeline call of ``case``: its exact shape (resolution binning off, unless the case says ``bin``)
    and batch, ``steps`` steps, no caption cleaning."""
    call = pipelines.plan_call(case.family, case.size, prompt=PROMPT, height=case.height, width=case.width,
                               num_frames=case.frames, steps=steps)
    return pipelines.fit_call(pipe, call, batch=case.batch, exact_shape=not case.binning, clean_caption=False)[0]


def record_step_inputs(pipe, call: dict[str, Any], seed: int, device: str) -> tuple[tuple, dict, int]:
    """Run one denoising step; return the (cloned) args and kwargs of its first transformer call and the
    number of transformer calls it made."""
    seen: dict[str, Any] = {"n": 0}

    def hook(_module, args, kwargs):
        if seen["n"] == 0:
            seen["args"], seen["kwargs"] = clone_tree(args), clone_tree(kwargs)
        seen["n"] += 1

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            pipe(**call, generator=torch.Generator(device).manual_seed(seed), output_type="latent")
    finally:
        handle.remove()
    if not seen["n"]:
        raise RuntimeError("the pipeline never called its transformer")
    return seen["args"], seen["kwargs"], seen["n"]


def free_memory(cuda: bool, dynamo: bool = False) -> None:
    gc.collect()
    if dynamo:
        torch._dynamo.reset()
        gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _safe_deactivate(runner: Runner) -> None:
    try:
        runner.deactivate()
    except Exception:  # noqa: BLE001 - cleanup must not mask the result
        pass


def _safe_close(runner: Runner) -> None:
    try:
        runner.close()
    except Exception:  # noqa: BLE001 - cleanup must not mask the result
        pass


class _Memory:
    """Peak and retained CUDA memory of a mode's set-up (nothing without CUDA)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.alloc, self.reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    def report(self) -> dict[str, int]:
        if not self.cuda:
            return {}
        torch.cuda.synchronize()
        return {"peak_alloc_delta_bytes": torch.cuda.max_memory_allocated() - self.alloc,
                "retained_alloc_bytes": torch.cuda.memory_allocated() - self.alloc,
                "retained_reserved_bytes": torch.cuda.memory_reserved() - self.reserved}


def set_up_mode(name: str, ctx: StepContext, settings: Settings, clock: Clock, res: dict[str, Any]):
    """Set ``name`` up and make its untimed first and warm-up calls; fill ``res``; return the runner
    and its first output."""
    memory = _Memory(ctx.cuda)
    with torch.inference_mode():
        t0 = time.perf_counter()
        runner = MODE_REGISTRY[name].setup(ctx)
        construct_s = time.perf_counter() - t0
        try:
            first_s, out = clock.wall(runner.fn)
            out = out.detach().clone()
            warm = [clock.wall(runner.fn)[0] for _ in range(settings.warmup - 1)]
            if name == "eager":  # is eager itself bitwise repeatable? (else "= eager" cannot hold)
                res["repeatable"] = bool(torch.equal(runner.fn(), out))
        except BaseException:
            _safe_close(runner)
            raise
    runner.iters = ctx.agree(settings.iters or auto_iters(min(warm) if warm else first_s))  # rank 0's on all ranks
    res.update(iters_per_round=runner.iters, construct_s=construct_s, first_call_s=first_s, warmup_s=warm,
               notes=list(runner.notes), **memory.report())
    res.update({k: v for k, v in runner.extra.items() if isinstance(v, (int, float))})
    if runner.is_bcg:
        res["bcg_config"] = dict(runner.bcg_options)
        res["bcg_stats_after_setup"] = bcg_stats_dict(runner.module)
    return runner, out


def set_up_modes(ctx, modes, settings, clock, log) -> tuple[dict[str, dict], dict[str, Runner]]:
    """Results (status, set-up times, memory, equality to eager) and runners of the modes that are ready."""
    results: dict[str, dict[str, Any]] = {}
    runners: dict[str, Runner] = {}
    reference = None
    for name in [m for m in modes if m not in EXCLUSIVE_MODES] + [m for m in modes if m in EXCLUSIVE_MODES]:
        mode = MODE_REGISTRY[name]
        res = results[name] = {"status": "ok", "torch_compile": mode.torch_compile, "description": mode.description}
        if mode.needs_cuda and not ctx.cuda:
            res.update(status="n/a", reason="needs CUDA")
            continue
        if ctx.parallel and not mode.with_context_parallel:
            res.update(status="n/a", reason="not measured with context parallelism")
            continue
        try:
            with time_limit(None if ctx.parallel else settings.setup_timeout):  # no rank may give up alone
                runners[name], out = set_up_mode(name, ctx, settings, clock, res)
        except (Exception, SetupTimeout) as exc:  # noqa: BLE001 - one mode's failure must not stop the others
            expected = isinstance(exc, (ModeUnavailable, SetupTimeout))  # said plainly, without a traceback
            res.update(status="n/a" if expected or name == "whole_graph" else "error", reason=err_text(exc))
            if not expected:
                res["traceback"] = traceback.format_exc(limit=8)
            log(f"    {name}: {res['status']}: {res['reason']}")
            free_memory(ctx.cuda)
            continue
        if name == "eager":
            reference = out  # the reference itself: no equality claimed for its own row
        elif reference is not None:
            same = out.shape == reference.shape and torch.equal(out, reference)
            res["bitwise_equal_to_eager"] = bool(same)
            res["max_abs_diff_vs_eager"] = 0.0 if same else float((out.float() - reference.float()).abs().max())
        log(f"    {name}: ready (set-up {res['construct_s']:.2f} s, first call {res['first_call_s']:.3f} s)")
    return results, runners


def time_rounds(runners: dict[str, Runner], results, settings: Settings, clock: Clock, log) -> dict[str, list]:
    """Interleaved rounds; a mode that fails is dropped from ``runners`` with its error in ``results``."""
    times: dict[str, list[float]] = {m: [] for m in runners}
    for rnd in range(settings.rounds if runners else 0):
        parts = []
        for name in list(runners):
            runner = runners[name]
            try:
                with torch.inference_mode():
                    if runner.patches_attention and not runner.accelerated:
                        runner.activate(clock.cuda)
                        for _ in range(settings.warmup):  # recapture and settle, untimed
                            runner.fn()
                    elif not runner.patches_attention:
                        for other in runners.values():
                            _safe_deactivate(other)
                    chunk = clock.calls(runner.fn, runner.iters)
                times[name] += chunk
                parts.append(f"{name} {1e3 * statistics.median(chunk):.2f}")
            except Exception as exc:  # noqa: BLE001
                results[name].update(status="error", reason=f"during timing: {err_text(exc)}")
                _safe_close(runners.pop(name))
                parts.append(f"{name} error")
        log(f"    round {rnd + 1}/{settings.rounds} (median ms): " + ", ".join(parts))
    return times


def summarize_modes(runners: dict[str, Runner], results, times) -> None:
    """Latency summaries, set-up time, BCG statistics and ratios to eager and to the whole-step graph."""
    for name, runner in runners.items():
        res = results[name]
        res.update(summarize(times[name]))
        res["setup_s"] = max(0.0, res["construct_s"] + res["first_call_s"] - res["median_ms"] / 1e3)
        if runner.is_bcg:
            res["bcg_stats"] = stats = bcg_stats_dict(runner.module)
            res["captures_in_rounds"] = max(0, runner.activations - 1)
            if (stats or {}).get("eager_calls"):
                res["notes"].append(f"BCG ran {stats['eager_calls']} call(s) eagerly (fallback)")
            res["notes"] += [f"BCG key fell back to eager: {e['fallback']}"
                             for e in (stats or {}).get("entries") or [] if e.get("fallback")]
    add_relative_fields(results)


def add_relative_fields(results: dict[str, dict[str, Any]]) -> None:
    """Each timed mode's speedup over eager, ratio to the whole-step graph and extra peak memory over eager."""
    eager = results.get("eager", {}).get("median_ms")
    floor = results.get("whole_graph", {}).get("median_ms")
    eager_peak = results.get("eager", {}).get("peak_alloc_delta_bytes")
    for res in (r for r in results.values() if "median_ms" in r):
        res["speedup_vs_eager"] = eager / res["median_ms"] if eager else None
        res["ratio_to_whole_graph"] = res["median_ms"] / floor if floor else None
        if eager_peak is not None and res.get("peak_alloc_delta_bytes") is not None:
            res["extra_peak_vs_eager_bytes"] = res["peak_alloc_delta_bytes"] - eager_peak


def profile_eager(runner: Runner, res: dict[str, Any], log, calls: int = 1) -> None:
    """Kernels and GPU-busy time of eager calls (``torch.profiler``, ``calls`` calls), and the GPU-busy fraction
    of a step: busy time over the median step time (1.0: compute-bound; well below: launch-bound)."""
    try:
        with torch.inference_mode():
            res["profile"] = prof = profile_kernels(runner.fn, calls)
        step_ms = res.get("median_ms")
        prof["gpu_busy_fraction"] = prof["gpu_busy_ms"] / step_ms if step_ms else None  # union of device intervals
        prof["kernel_time_fraction"] = prof["kernel_time_ms"] / step_ms if step_ms else None  # sum of kernel times
        log(f"    eager profile: {prof['kernels']} kernels, GPU busy {prof['gpu_busy_ms']:.2f} ms of "
            f"{res['median_ms']:.2f} ms")
    except Exception as exc:  # noqa: BLE001
        res["profile"] = {"error": err_text(exc)}


def run_modes(ctx: StepContext, modes: list[str], settings: Settings, clock: Clock, log,
              profile_calls: int = 1) -> dict[str, dict]:
    """Set up each mode (timing its first call and memory), then time all of them interleaved in rounds."""
    results, runners = set_up_modes(ctx, modes, settings, clock, log)
    times = time_rounds(runners, results, settings, clock, log)
    summarize_modes(runners, results, times)
    for runner in runners.values():
        _safe_deactivate(runner)
    if ctx.cuda and "eager" in runners:
        profile_eager(runners["eager"], results["eager"], log, profile_calls)
    for runner in runners.values():
        _safe_close(runner)
    return results


def case_header(case: Case, spec) -> dict[str, Any]:
    header = {"case": case.label, "family": case.family, "title": spec.title, "size": case.size,
              "height": case.height, "width": case.width, "frames": case.frames, "batch": case.batch,
              "cfg_mode": spec.cfg_mode, "modes": {}, "e2e": None, "error": None}
    if case.variant:
        header["variant"] = case.variant
    if case.binning:
        header["resolution_binning"] = True
    if case.cp:
        header["context_parallel"] = {"degree": case.cp, "kind": case.cp_kind}
    if case.note:
        header["note"] = case.note
    return header


def _run_rows(rows, pipe, call, case: Case, settings: Settings, clock: Clock, log, result) -> None:
    for row in rows:
        try:
            result[row.name] = row.run(pipe, call, settings.seed, clock, log, case=case, settings=settings)
        except Exception as exc:  # noqa: BLE001
            result[row.name] = {"error": err_text(exc)}
            log(f"    {row.name}: error: {result[row.name]['error']}")


def measure_modes(ctx: StepContext, case: Case, modes: list[str], settings: Settings, clock: Clock, log,
                  ranks: Ranks) -> dict[str, dict]:
    """The per-step modes of the case; on a context-parallel case every rank's results, combined (the
    slowest rank's numbers: :func:`.parallel.combine_ranks`)."""
    if not case.cp:
        return run_modes(ctx, modes, settings, clock, log)
    results = combine_ranks(ranks.gather(run_modes(ctx, modes, settings, clock, log, profile_calls=3)))
    add_relative_fields(results)
    return results


def measure_case(pipe, case: Case, modes: list[str], settings: Settings, clock: Clock, log, result,
                 ranks: Ranks | None = None) -> None:
    """Fill ``result`` with the case's step inputs, its whole-pipeline rows (those ``before_modes`` first)
    and its modes. Context-parallel cases run the modes only."""
    ranks = ranks or Ranks()
    device = "cuda" if clock.cuda else "cpu"
    args, kwargs, ncalls = record_step_inputs(pipe, case_call(pipe, case, steps=1), settings.seed, device)
    hs = kwargs.get("hidden_states", args[0] if args else None)
    result.update(calls_per_step=ncalls,
                  step_inputs=describe_tree({**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}),
                  transformer_batch=int(hs.shape[0]) if isinstance(hs, torch.Tensor) else None)
    log(f"    step inputs: hidden_states {describe_tree(hs)}, {ncalls} transformer call(s) per step")
    rows = [] if case.cp else [row for row in ROW_REGISTRY.values() if row.enabled(case, settings)]
    if case.cp:
        result["rows_note"] = "context-parallel case: per-step modes only, no whole-pipeline rows"
    call = case_call(pipe, case, settings.e2e_steps or pipelines.get_family(case.family).default_steps) if rows else None
    _run_rows([r for r in rows if r.before_modes], pipe, call, case, settings, clock, log, result)
    prepare = (lambda module: prepare_module(module, case)) if case.cp else None
    ctx = StepContext(pipe.transformer, args, kwargs, clock.cuda, settings.bcg_options, prepare=prepare,
                      agree=ranks.agree)
    result["modes"] = measure_modes(ctx, case, modes, settings, clock, log, ranks)
    result["ratios"] = case_ratios(result["modes"])
    del ctx
    free_memory(clock.cuda, dynamo=any(m in COMPILED for m in modes))
    _run_rows([r for r in rows if not r.before_modes], pipe, call, case, settings, clock, log, result)


def run_case(case: Case, modes: list[str], settings: Settings, device, dtype, clock: Clock, log,
             ranks: Ranks | None = None) -> dict[str, Any]:
    """Build the case's pipeline and measure it; a failure is recorded in the result, never raised."""
    result = case_header(case, pipelines.get_family(case.family))
    pipe = None
    try:
        t0 = time.perf_counter()
        pipe = pipelines.build_pipeline(case.family, size=case.size, device=device, dtype=dtype, seed=settings.seed)
        if case.variant:
            result["variant_note"] = VARIANTS[case.variant](pipe)
        result["build_s"] = time.perf_counter() - t0
        log(f"    built in {result['build_s']:.1f} s")
        measure_case(pipe, case, modes, settings, clock, log, result, ranks)
    except Exception as exc:  # noqa: BLE001 - a broken case is recorded and the run goes on
        result["error"] = err_text(exc)
        result["traceback"] = traceback.format_exc(limit=8)
        log(f"    case failed: {result['error']}")
    finally:
        del pipe
        free_memory(clock.cuda, dynamo=any(m in COMPILED for m in modes))
    return result


def run_cases(cases: list[Case], mode_override, settings: Settings, device, dtype, clock, log,
              report: dict[str, Any], time_budget: float | None, on_case_done: Callable[[], None],
              ranks: Ranks | None = None) -> None:
    """Run ``cases`` in order into ``report["cases"]``; after ``time_budget`` seconds start no new case
    (the first always runs; across ranks rank 0 decides) and list the rest in ``report["not_run"]``.
    ``mode_override``: the ``--modes`` list (may be empty: no per-step modes), else each case's own."""
    ranks = ranks or Ranks()
    t_start = time.perf_counter()
    for i, case in enumerate(cases, 1):
        elapsed = time.perf_counter() - t_start
        if ranks.agree(time_budget is not None and i > 1 and elapsed > time_budget):
            report["not_run"] = [c.label for c in cases[i - 1:]]
            log(f"time budget of {time_budget:.0f} s spent after {elapsed:.0f} s: not running "
                + ", ".join(report["not_run"]))
            break
        modes = list(mode_override if mode_override is not None else (case.modes or DEFAULT_MODES))
        log(f"[{i}/{len(cases)}] {case.label}: modes {', '.join(modes) or 'none'}"
            + (f" ({case.note})" if case.note else ""))
        report["cases"].append(run_case(case, modes, settings, device, dtype, clock, log, ranks))
        report["total_s"] = time.perf_counter() - t_start
        on_case_done()  # a run stopped from outside keeps the finished cases
    report["total_s"] = time.perf_counter() - t_start
