"""The ``e2e`` row (``--e2e``): a full ``pipe(...)`` call (all steps, VAE decode) eagerly, then after
``accelerate_pipeline`` a first call (warm-up and capture included) and a second (replay only), with the
size asked for and the input the transformer actually ran."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.speedups import quiet_library_warnings

from ..probe import CallTimer
from ..timing import Clock
from .row_base import Row, fmt, yes_no

E2E_STATS_FIELDS = ("hits", "misses", "captures", "capture_time_s", "graph_memory_bytes")


def asked_size(case) -> str:
    """The size a case asks for: ``HxW`` (``xFRAMES`` for video), ``, binned`` where resolution binning is on."""
    text = f"{case.height}x{case.width}" + (f"x{case.frames}" if case.frames else "")
    return text + (", binned" if getattr(case, "binning", False) else "")


def run_e2e(pipe, call: dict[str, Any], seed: int, clock: Clock, log, *, case=None, **_) -> dict[str, Any]:
    """Eager, then BCG's first call (capture) and a second; the transformer's input noted during the eager call."""
    device = "cuda" if clock.cuda else "cpu"

    def one():
        with torch.inference_mode():
            out = pipe(**call, generator=torch.Generator(device).manual_seed(seed), output_type="np")
        return np.asarray(pipelines.generated(out))

    res: dict[str, Any] = {"steps": call["num_inference_steps"]}
    if case is not None:
        res["asked"] = asked_size(case)
    warm_call = dict(call, num_inference_steps=min(2, call["num_inference_steps"]))
    with torch.inference_mode():  # untimed warm-up of text encoders, VAE decode, cuDNN
        pipe(**warm_call, generator=torch.Generator(device).manual_seed(seed), output_type="np")
    timer = CallTimer(pipe.transformer, clock.cuda)
    try:
        res["eager_s"], ref = clock.wall(one)
        res["transformer_input"] = timer.first_input
        timer.take()
    finally:
        timer.remove()
    log(f"    e2e eager: {res['eager_s']:.2f} s for {res['steps']} steps (transformer input {res['transformer_input']})")
    try:
        with contextlib.nullcontext() if clock.cuda else quiet_library_warnings():  # no-CUDA no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig())
        res["bcg_first_s"], first = clock.wall(one)
        res["bcg_second_s"], second = clock.wall(one)
        res["bitwise_equal_to_eager"] = bool(np.array_equal(ref, second) and np.array_equal(ref, first))
        res["speedup_second_vs_eager"] = res["eager_s"] / res["bcg_second_s"]
        res["capture_overhead_s"] = res["bcg_first_s"] - res["bcg_second_s"]
        stats = bcg_diffusion.get_stats(pipe)
        res["bcg_stats"] = {k: getattr(stats, k, None) for k in E2E_STATS_FIELDS} if stats.active else None
        if not clock.cuda:
            res["note"] = "no CUDA: accelerate_pipeline is a no-op, so the BCG calls ran eagerly"
        first = "with capture" if clock.cuda else "eager: no CUDA, nothing is captured"
        log(f"    e2e bcg: first call {res['bcg_first_s']:.2f} s ({first}), second {res['bcg_second_s']:.2f} s, "
            f"identical to eager: {res['bitwise_equal_to_eager']}")
    except Exception as exc:  # noqa: BLE001 - the eager time is still worth reporting
        res["bcg_error"] = f"{type(exc).__name__}: {exc}"
        log(f"    e2e bcg: error: {res['bcg_error']}")
    finally:
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)
    return res


def e2e_markdown(cases: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cases if c.get("e2e")]
    if not rows:
        return []
    lines = ["", "## End to end (full pipe call: all steps and VAE decode)", "",
             "`asked`: the size the case asks for; `transformer input`: the `hidden_states` the transformer ran "
             "(latents or packed tokens), recorded during the eager call.", "",
             "| case | asked | transformer input | steps | eager s | BCG first call s (with capture) | "
             "BCG later call s | x eager (later) | = eager | notes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for case in rows:
        e = case["e2e"]
        note = e.get("error") or e.get("bcg_error") or e.get("note") or ""
        lines.append(f"| {case['case']} | {e.get('asked', '-')} | {e.get('transformer_input') or '-'} | "
                     f"{e.get('steps', '-')} | {fmt(e.get('eager_s'))} | {fmt(e.get('bcg_first_s'))} | "
                     f"{fmt(e.get('bcg_second_s'))} | {fmt(e.get('speedup_second_vs_eager'))} | "
                     f"{yes_no(e.get('bitwise_equal_to_eager'))} | {note} |")
    return lines


E2E_ROW = Row("e2e", run_e2e, e2e_markdown)
