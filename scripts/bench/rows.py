"""Whole-pipeline rows of a case: full ``pipe(...)`` calls, measured after the per-step modes.

A row is a registry entry: ``run(pipe, call, seed, clock, log, *, case, settings) -> dict`` stored under
the case's ``row.name`` key, ``markdown(cases) -> lines`` for the report, and ``enabled(case, settings)``
saying whether it runs for a case. To add one, write them and :func:`register` a :class:`Row`. Rows:
``e2e`` (eager vs BCG end to end; ``--e2e``) and ``cache`` (step caches end to end; ``--cache-rows``, in
:mod:`bench.cache_row`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

import bcg_diffusion
import pipelines
from speedups import quiet_library_warnings

from .timing import Clock

E2E_STATS_FIELDS = ("hits", "misses", "captures", "capture_time_s", "graph_memory_bytes")


def _rows_setting(case, settings) -> bool:
    """The end-to-end setting: ``--e2e`` / ``--no-e2e``, else the case's own (the default matrix's)."""
    return bool(case.rows if settings.rows is None else settings.rows)


@dataclass(frozen=True)
class Row:
    name: str
    run: Callable[..., dict[str, Any]]
    markdown: Callable[[list[dict[str, Any]]], list[str]]
    enabled: Callable[[Any, Any], bool] = _rows_setting


ROW_REGISTRY: dict[str, Row] = {}


def register(row: Row) -> Row:
    ROW_REGISTRY[row.name] = row
    return row


def run_e2e(pipe, call: dict[str, Any], seed: int, clock: Clock, log, **_) -> dict[str, Any]:
    """A full ``pipe(...)`` call (all steps, VAE decode): eager, then BCG's first call (capture) and a second."""
    device = "cuda" if clock.cuda else "cpu"

    def one():
        with torch.inference_mode():
            out = pipe(**call, generator=torch.Generator(device).manual_seed(seed), output_type="np")
        return np.asarray(pipelines.generated(out))

    res: dict[str, Any] = {"steps": call["num_inference_steps"]}
    warm_call = dict(call, num_inference_steps=min(2, call["num_inference_steps"]))
    with torch.inference_mode():  # untimed warm-up of text encoders, VAE decode, cuDNN
        pipe(**warm_call, generator=torch.Generator(device).manual_seed(seed), output_type="np")
    res["eager_s"], ref = clock.wall(one)
    log(f"    e2e eager: {res['eager_s']:.2f} s for {res['steps']} steps")
    try:
        with contextlib.nullcontext() if clock.cuda else quiet_library_warnings():  # no-CUDA no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig())
        res["bcg_first_s"], first = clock.wall(one)
        res["bcg_second_s"], second = clock.wall(one)
        res["bitwise_equal_to_eager"] = bool(np.array_equal(ref, second) and np.array_equal(ref, first))
        res["speedup_second_vs_eager"] = res["eager_s"] / res["bcg_second_s"]
        res["capture_overhead_s"] = res["bcg_first_s"] - res["bcg_second_s"]
        stats = bcg_diffusion.get_stats(pipe)
        res["bcg_stats"] = None if stats is None else {k: getattr(stats, k, None) for k in E2E_STATS_FIELDS}
        if not clock.cuda:
            res["note"] = "no CUDA: accelerate_pipeline is a no-op, so the BCG calls ran eagerly"
        log(f"    e2e bcg: first call {res['bcg_first_s']:.2f} s (with capture), second {res['bcg_second_s']:.2f} s, "
            f"identical to eager: {res['bitwise_equal_to_eager']}")
    except Exception as exc:  # noqa: BLE001 - the eager time is still worth reporting
        res["bcg_error"] = f"{type(exc).__name__}: {exc}"
        log(f"    e2e bcg: error: {res['bcg_error']}")
    finally:
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)
    return res


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def e2e_markdown(cases: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cases if c.get("e2e")]
    if not rows:
        return []
    lines = ["", "## End to end (full pipe call: all steps and VAE decode)", "",
             "| case | steps | eager s | BCG first call s (with capture) | BCG later call s | x eager (later) | "
             "= eager | notes |", "|---|---|---|---|---|---|---|---|"]
    for case in rows:
        e = case["e2e"]
        note = e.get("error") or e.get("bcg_error") or e.get("note") or ""
        eq = e.get("bitwise_equal_to_eager")
        lines.append(f"| {case['case']} | {e.get('steps', '-')} | {_f(e.get('eager_s'))} | {_f(e.get('bcg_first_s'))} | "
                     f"{_f(e.get('bcg_second_s'))} | {_f(e.get('speedup_second_vs_eager'))} | "
                     f"{'-' if eq is None else ('yes' if eq else 'no')} | {note} |")
    return lines


register(Row("e2e", run_e2e, e2e_markdown))

from . import cache_row  # noqa: E402,F401  (registers the cache row after e2e)
