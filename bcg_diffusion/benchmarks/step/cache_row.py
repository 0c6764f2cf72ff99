"""The ``cache`` row: diffusers step caches end to end (full ``pipe(...)`` calls), with and without BCG.

For each spec of ``--cache-rows`` (``fbc:0.5``, ``taylorseer:2``, ...; see :mod:`bcg_diffusion.toolkit.cache_option`), on the
case's pipeline and in this order:

1. eager + cache (timed);
2. ``accelerate_pipeline`` (library defaults), BCG + cache: a first call (warm-up and capture included)
   and a second call (replay), both compared bitwise with eager + cache;
3. the cache disabled, BCG alone: an untimed call (the structure changed, so it recaptures), then a
   timed second call, so that both BCG times sit side by side in one row;
4. with ``--cache-compile`` (CUDA only): regional ``torch.compile`` of a weight-sharing copy of the
   transformer with the same cache, no BCG (first call with compilation, then a second).

Every timed call starts from a fresh cache state and counts the module passes the cache computed and
reused (``bcg_diffusion.step_caches.count_cache_passes``). A spec that cannot run on the family (see
``bcg_diffusion.toolkit.cache_option.CACHE_FAMILIES``) is reported ``n/a`` with the reason. Afterwards the cache is disabled
and the acceleration removed, so later rows and cases are unaffected.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

import bcg_diffusion
from bcg_diffusion.toolkit.cache_option import (
    CacheSpec, apply_cache, cache_passes, cache_unsupported_reason, disable_cache, reset_cache_state)
from bcg_diffusion.toolkit.speedups import quiet_library_warnings, regional_compile

from ..timing import Clock
from ..trees import weight_sharing_copy
from .row_base import Row, fmt, yes_no
from .seeded_images import SeededImages

STATS_FIELDS = ("captures", "capture_time_s", "graph_memory_bytes", "hooked_module_calls", "hooked_module_computed",
                "hooked_module_reused", "structure_changes", "eager_calls")


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


def _passes(p) -> dict[str, int] | None:
    return None if p is None else {"calls": p.calls, "computed": p.computed, "reused": p.reused}


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("nan")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


class _Calls(SeededImages):
    """Full ``pipe(...)`` calls of the row: same call and seed each time, decoded output as numpy."""

    def timed(self, counted: bool = True) -> tuple[float, np.ndarray, dict[str, int] | None]:
        """Seconds, output and cache passes of one call from a fresh cache state."""
        transformer = self.pipe.transformer
        reset_cache_state(transformer)
        with cache_passes(transformer, counted) as passes:
            secs, out = self.clock.wall(self.image)
        return secs, out, _passes(passes)


def _bcg_stats(pipe) -> dict[str, Any] | None:
    stats = bcg_diffusion.get_stats(pipe)
    return {k: getattr(stats, k, None) for k in STATS_FIELDS} if stats.active else None


def _bcg_with_and_without_cache(calls: _Calls, entry: dict[str, Any], ref: np.ndarray, log) -> None:
    """Steps 2 and 3: BCG + cache (first and second call), then the cache disabled, BCG alone."""
    pipe = calls.pipe
    with contextlib.nullcontext() if calls.clock.cuda else quiet_library_warnings():  # no-CUDA no-op: said once
        bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig())
    entry["bcg_cache_first_s"], first, entry["bcg_first_passes"] = calls.timed()
    entry["bcg_cache_second_s"], second, entry["bcg_passes"] = calls.timed()
    same = bool(np.array_equal(ref, first) and np.array_equal(ref, second))
    entry["bitwise_equal_to_eager_cache"] = same
    if not same:
        entry["max_abs_diff_vs_eager_cache"] = max(_max_diff(ref, first), _max_diff(ref, second))
    entry["capture_overhead_s"] = entry["bcg_cache_first_s"] - entry["bcg_cache_second_s"]
    entry["bcg_stats"] = _bcg_stats(pipe)
    log(f"    cache {entry['spec']}: bcg + cache first {entry['bcg_cache_first_s']:.2f} s, second "
        f"{entry['bcg_cache_second_s']:.2f} s ({_passes_text(entry['bcg_passes'])}), identical to eager + cache: {same}")
    disable_cache(pipe.transformer)
    calls.timed(counted=False)  # untimed: the structure changed, so this call recaptures without the cache
    entry["bcg_alone_second_s"] = calls.timed(counted=False)[0]
    log(f"    cache {entry['spec']}: bcg alone (second call) {entry['bcg_alone_second_s']:.2f} s")


def _compile_with_cache(calls: _Calls, spec: CacheSpec | str, family: str, steps: int, ref: np.ndarray, log) -> dict[str, Any]:
    """Step 4: regional compile of a weight-sharing copy (swapped into the pipeline) with the same cache, no BCG."""
    if not calls.clock.cuda:
        return {"status": "n/a", "reason": "needs CUDA"}
    pipe = calls.pipe
    original = pipe.transformer
    copy = weight_sharing_copy(original)
    res: dict[str, Any] = {}
    try:
        res["compile"] = regional_compile(copy)
        pipe.transformer = copy
        apply_cache(pipe, spec, family, steps)
        res["first_s"], _, _ = calls.timed()  # compiles
        res["second_s"], out, res["passes"] = calls.timed()
        res["max_abs_diff_vs_eager_cache"] = _max_diff(ref, out)
        res["status"] = "ok"
        log(f"    cache {spec}: compile + cache first {res['first_s']:.2f} s, second {res['second_s']:.2f} s")
    except Exception as exc:  # noqa: BLE001 - the row's other numbers stand
        res.update(status="error", reason=_error(exc))
        log(f"    cache {spec}: compile + cache: error: {res['reason']}")
    finally:
        disable_cache(copy)
        pipe.transformer = original
        del copy
        torch._dynamo.reset()
    return res


def _passes_text(p: dict[str, int] | None) -> str:
    return "-" if not p else f"{p['computed']} computed, {p['reused']} reused of {p['calls']}"


def run_spec(calls: _Calls, spec: CacheSpec | str, family: str, steps: int, settings, log) -> dict[str, Any]:
    """One step cache on the case's pipeline (steps 1-4 of the module docstring)."""
    entry: dict[str, Any] = {"spec": str(spec)}
    reason = cache_unsupported_reason(spec, family)
    if reason:
        entry.update(status="n/a", reason=reason)
        log(f"    cache {spec}: n/a: {reason}")
        return entry
    pipe, ref = calls.pipe, None
    try:
        entry["config"] = apply_cache(pipe, spec, family, steps)
        entry["eager_cache_s"], ref, entry["eager_passes"] = calls.timed()
        log(f"    cache {spec}: eager + cache {entry['eager_cache_s']:.2f} s ({_passes_text(entry['eager_passes'])})")
        _bcg_with_and_without_cache(calls, entry, ref, log)
        entry["status"] = "ok"
        entry["eager_cache_over_bcg_cache"] = entry["eager_cache_s"] / entry["bcg_cache_second_s"]
        entry["bcg_alone_over_bcg_cache"] = entry["bcg_alone_second_s"] / entry["bcg_cache_second_s"]
        if not calls.clock.cuda:
            entry["note"] = "no CUDA: accelerate_pipeline is a no-op, so the BCG calls ran eagerly"
    except Exception as exc:  # noqa: BLE001 - one spec's failure must not stop the others
        entry.update(status="error", reason=_error(exc))
        log(f"    cache {spec}: error: {entry['reason']}")
    finally:
        disable_cache(pipe.transformer)
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)
    if settings.cache_compile and ref is not None:
        entry["compile_cache"] = _compile_with_cache(calls, spec, family, steps, ref, log)
    return entry


def run_cache_rows(pipe, call: dict[str, Any], seed: int, clock: Clock, log, *, case, settings) -> dict[str, Any]:
    """The cache row of a case: :func:`run_spec` for each spec of ``settings.cache_rows``."""
    calls = _Calls(pipe, call, seed, clock)
    steps = call["num_inference_steps"]
    calls.image(num_inference_steps=min(2, steps))  # untimed warm-up of text encoders, VAE decode, cuDNN
    return {"steps": steps, "specs": [run_spec(calls, spec, case.family, steps, settings, log)
                                      for spec in settings.cache_rows]}


def cache_markdown(cases: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cases if c.get("cache")]
    if not rows:
        return []
    lines = ["", "## Step caches end to end (full pipe call: all steps and VAE decode)", "",
             "Each call starts from a fresh cache state. BCG: accelerate_pipeline with the library defaults; "
             "`BCG alone`: the same pipeline with the cache disabled (second call after its recapture). "
             "`= eager+cache`: BCG + cache output (first and second call) bitwise equal to eager + cache.", "",
             "| case | cache | steps | eager+cache s | BCG+cache first s | BCG+cache later s | BCG alone later s | "
             "eager+cache / BCG+cache | BCG alone / BCG+cache | compile+cache later s | passes eager | passes BCG | "
             "= eager+cache | notes |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in rows:
        row = case["cache"]
        if row.get("error"):
            lines.append(f"| {case['case']} | - | - | | | | | | | | | | | error: {row['error']} |")
            continue
        for e in row.get("specs", []):
            comp = e.get("compile_cache") or {}
            comp_text = fmt(comp.get("second_s")) if comp.get("status") == "ok" else (comp.get("status") or "-")
            note = e.get("reason") or e.get("note") or ""
            if comp.get("status") in ("error", "n/a"):
                note += f"{'; ' if note else ''}compile + cache: {comp.get('reason')}"
            lines.append(
                f"| {case['case']} | {e['spec']} | {row.get('steps', '-')} | {fmt(e.get('eager_cache_s'))} | "
                f"{fmt(e.get('bcg_cache_first_s'))} | {fmt(e.get('bcg_cache_second_s'))} | "
                f"{fmt(e.get('bcg_alone_second_s'))} | {fmt(e.get('eager_cache_over_bcg_cache'))} | "
                f"{fmt(e.get('bcg_alone_over_bcg_cache'))} | {comp_text} | {_passes_text(e.get('eager_passes'))} | "
                f"{_passes_text(e.get('bcg_passes'))} | {yes_no(e.get('bitwise_equal_to_eager_cache'))} | "
                f"{note} |".replace("\n", " "))
    return lines


CACHE_ROW = Row("cache", run_cache_rows, cache_markdown, enabled=lambda case, settings: bool(settings.cache_rows))
