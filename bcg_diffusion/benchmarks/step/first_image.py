"""The ``first_image`` row (``--first-image MODES``): what the first image costs in each mode.

For each mode, on the case's pipeline: a fresh weight-sharing copy of the transformer is swapped in and the
mode is set up on it (regional compile, ``accelerate_pipeline``, ``bcg_diffusion.warmup``), timed as
``setup_s``; then the **first** ``pipe(...)`` call is timed (compilation and capture happen there), then a
second one. Both are whole images (all steps, VAE decode). Per call: the seconds, the time of each
denoising step (CUDA events around the transformer calls) and the input the transformer ran.

- ``first_image_s`` = set-up + first call: from a built pipeline to the first image in this mode;
- ``one_off_s`` = set-up + first call - second call: what the mode costs once (compile, capture, warm-up);
- ``first_image_over_eager`` = ``first_image_s`` / eager's second call: the first image against an eager
  image (the target: BCG at Flux 512 px <= 0.7);
- ``first_step_over_median``: the first call's first step over its median later step (after
  ``warmup``, the target is <= 1.2).

Compiled modes compile into their own cache folder (:func:`.compile_cache_dirs.mode_cache`): cold where
the folder is new, warm where an earlier process filled it (``--processes 2 --compile-cache shared``).
Before the first mode, one untimed 1-step eager image at the case's shape initialises CUDA, cuBLAS,
cuDNN, the text encoders and the VAE, so that no mode pays the process's start. The row runs before the
per-step modes, so their compiles cannot warm it.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

import bcg_diffusion
from bcg_diffusion.toolkit.speedups import quiet_library_warnings, regional_compile, regional_compile_all

from ..compile_cache_dirs import mode_cache
from ..probe import CallTimer, first_step_summary, step_times
from ..timing import Clock
from ..trees import weight_sharing_copy
from .e2e_row import asked_size
from .names import DEFAULT_FIRST_IMAGE_MODES, FIRST_IMAGE_MODE_NAMES
from .row_base import Row, fmt, yes_no
from .seeded_images import SeededImages

SHAPE_KEYS = ("height", "width", "num_frames")
STATS_FIELDS = ("captures", "capture_time_s", "graph_memory_bytes", "hits", "misses", "eager_calls")
WARMUP_API = "warmup"  # bcg_diffusion.warmup(pipe, [dict(height=h, width=w)], **call) -> WarmupReport


@dataclass(frozen=True)
class FirstImageMode:
    """How a mode is set up on the pipeline (its transformer already a fresh copy)."""

    name: str
    description: str
    compile: Callable[..., str] | None = None  # regional_compile or regional_compile_all
    bcg: bool = False
    warmup: bool = False  # bcg_diffusion.warmup at the case's shape after accelerate_pipeline

    def unavailable(self, cuda: bool) -> str | None:
        """Why the mode cannot run here (``None`` if it can)."""
        if self.compile is not None and not cuda:
            return "needs CUDA"
        if self.warmup and not callable(getattr(bcg_diffusion, WARMUP_API, None)):
            return f"this bcg_diffusion has no {WARMUP_API}()"
        return None


FIRST_IMAGE_MODES: dict[str, FirstImageMode] = {m.name: m for m in (
    FirstImageMode("eager", "the pipeline as diffusers runs it"),
    FirstImageMode("bcg", "accelerate_pipeline (library defaults), no warm-up", bcg=True),
    FirstImageMode("bcg_warmup", "accelerate_pipeline, then bcg_diffusion.warmup at the case's shape", bcg=True,
                   warmup=True),
    FirstImageMode("compile", "regional torch.compile of the repeated blocks", compile=regional_compile),
    FirstImageMode("compile_bcg", "regional torch.compile, then accelerate_pipeline", compile=regional_compile,
                   bcg=True),
    FirstImageMode("compile_all", "regional torch.compile of the blocks and of every leftover child",
                   compile=regional_compile_all),
    FirstImageMode("compile_bcg_all", "regional torch.compile of the blocks and leftover children, then "
                   "accelerate_pipeline", compile=regional_compile_all, bcg=True),
)}
if tuple(FIRST_IMAGE_MODES) != FIRST_IMAGE_MODE_NAMES:  # the parser offers names.FIRST_IMAGE_MODE_NAMES
    raise RuntimeError(f"first_image.FIRST_IMAGE_MODES {tuple(FIRST_IMAGE_MODES)} and names.FIRST_IMAGE_MODE_NAMES "
                       f"{FIRST_IMAGE_MODE_NAMES} differ; keep them equal")


def parse_first_image_modes(text: str) -> tuple[str, ...]:
    """``--first-image`` -> mode names (``ValueError`` naming an unknown one)."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [n for n in names if n not in FIRST_IMAGE_MODES]
    if unknown or not names:
        raise ValueError(f"--first-image: unknown mode(s) {', '.join(unknown) or repr(text)}; choose from "
                         f"{', '.join(FIRST_IMAGE_MODES)}")
    return names


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


def _jsonable(value):
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


class _Images(SeededImages):
    """Whole ``pipe(...)`` calls of the row, each timed, its transformer calls timed by ``timer``."""

    def timed(self, timer: CallTimer) -> tuple[dict[str, Any], np.ndarray]:
        timer.take()
        secs, out = self.clock.wall(self.image)
        transformer_input = timer.first_input
        calls = timer.take()
        steps = step_times(calls, self.call["num_inference_steps"])
        return {"s": secs, "transformer_calls": len(calls), "transformer_input": transformer_input,
                "step_ms": None if steps is None else [1e3 * s for s in steps], **first_step_summary(steps)}, out


def _set_up(mode: FirstImageMode, images: _Images, entry: dict[str, Any]) -> None:
    """Compile, accelerate and warm up the pipeline as ``mode`` says; notes go to ``entry``."""
    pipe, notes = images.pipe, entry.setdefault("notes", [])
    if mode.compile is not None:
        notes.append(mode.compile(pipe.transformer))
    if mode.bcg:
        with contextlib.nullcontext() if images.clock.cuda else quiet_library_warnings():  # no-CUDA no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig())
        notes.append("accelerate_pipeline (library defaults)")
    if mode.warmup:
        shape = {k: images.call[k] for k in SHAPE_KEYS if k in images.call}
        rest = {k: v for k, v in images.call.items() if k not in SHAPE_KEYS and k != "num_inference_steps"}
        with torch.inference_mode():  # the grad mode of the row's images (SeededImages): the same graph keys
            report = getattr(bcg_diffusion, WARMUP_API)(pipe, [shape], **rest)
        entry["warmup"] = {"total_s": _jsonable(getattr(report, "total_s", None)),
                           "captures": _jsonable(getattr(report, "captures", None)), "text": str(report)[:600]}
        notes.append(f"bcg_diffusion.warmup(pipe, [{shape}], **call) with its default steps")


def _tear_down(pipe, original, compiled: bool, cuda: bool) -> None:
    try:
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)
    finally:
        pipe.transformer = original
        gc.collect()
        if compiled:
            torch._dynamo.reset()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def run_mode(mode: FirstImageMode, images: _Images, case_label: str, settings, log) -> tuple[dict, np.ndarray | None]:
    """One mode of the row: set-up, first and second call. Returns its entry and the first call's image."""
    pipe, clock = images.pipe, images.clock
    entry: dict[str, Any] = {"status": "ok", "description": mode.description, "torch_compile": mode.compile is not None}
    reason = mode.unavailable(clock.cuda)
    if reason:
        entry.update(status="n/a", reason=reason)
        log(f"    first image {mode.name}: n/a: {reason}")
        return entry, None
    original, first_out = pipe.transformer, None
    cache_folder = (settings.compile_cache.first_image_folder(case_label, mode.name)
                    if mode.compile is not None and settings.compile_cache is not None else None)
    with mode_cache(cache_folder) if cache_folder is not None else contextlib.nullcontext() as cache_record:
        try:
            if mode.name != "eager":
                pipe.transformer = weight_sharing_copy(original)  # DiffusionPipeline.__setattr__ keeps its config
            clock.sync()
            t0 = time.perf_counter()
            _set_up(mode, images, entry)
            clock.sync()
            entry["setup_s"] = time.perf_counter() - t0
            timer = CallTimer(pipe.transformer, clock.cuda)
            try:
                entry["first_call"], first_out = images.timed(timer)
                entry["second_call"], second_out = images.timed(timer)
            finally:
                timer.remove()
            entry["repeatable"] = bool(np.array_equal(first_out, second_out))
            first_s, second_s = entry["first_call"]["s"], entry["second_call"]["s"]
            entry.update(first_image_s=entry["setup_s"] + first_s, one_off_s=entry["setup_s"] + first_s - second_s)
            stats = bcg_diffusion.get_stats(pipe)
            if stats.active:
                entry["bcg_stats"] = {k: getattr(stats, k, None) for k in STATS_FIELDS}
            if mode.bcg and not clock.cuda:
                entry["notes"].append("no CUDA: accelerate_pipeline is a no-op, so the BCG calls ran eagerly")
            log(f"    first image {mode.name}: set-up {entry['setup_s']:.2f} s, first call {first_s:.2f} s, second "
                f"{second_s:.2f} s (first step / later: {fmt(entry['first_call']['first_step_over_median'])})")
        except Exception as exc:  # noqa: BLE001 - one mode's failure must not stop the others
            entry.update(status="error", reason=_error(exc), traceback=traceback.format_exc(limit=8))
            log(f"    first image {mode.name}: error: {entry['reason']}")
        finally:
            _tear_down(pipe, original, mode.compile is not None, clock.cuda)
    if cache_record is not None:
        entry["compile_cache"] = cache_record
    return entry, first_out


def run_first_image(pipe, call: dict[str, Any], seed: int, clock: Clock, log, *, case, settings) -> dict[str, Any]:
    """The row of a case: an untimed 1-step eager image, then :func:`run_mode` for each ``--first-image`` mode."""
    images = _Images(pipe, call, seed, clock)
    images.image(num_inference_steps=1)  # untimed: the process's start, paid by no mode
    res: dict[str, Any] = {"steps": call["num_inference_steps"], "asked": asked_size(case), "modes": {}}
    eager_out = None
    for name in settings.first_image:
        entry, out = run_mode(FIRST_IMAGE_MODES[name], images, case.label, settings, log)
        res["modes"][name] = entry
        if name == "eager":
            eager_out = out
        elif eager_out is not None and out is not None:
            entry["bitwise_equal_to_eager"] = bool(np.array_equal(out, eager_out))
    eager_image = (res["modes"].get("eager", {}).get("second_call") or {}).get("s")
    for entry in res["modes"].values():
        if eager_image and "first_image_s" in entry:
            entry["first_image_over_eager"] = entry["first_image_s"] / eager_image
            entry["second_over_eager"] = entry["second_call"]["s"] / eager_image
    return res


def _cache_text(entry: dict[str, Any]) -> str:
    record = entry.get("compile_cache")
    return "-" if not record else record["state"]


def first_image_markdown(cases: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cases if c.get("first_image")]
    if not rows:
        return []
    lines = ["", "## First image (set-up, then the first and the second full pipe call)", "",
             "`set-up s`: compile / accelerate / warm-up calls before the first call; `first image s` = set-up + "
             "first call; `x eager image` = first image / eager's second call; `one-off s` = set-up + first call - "
             "second call; `first step / later`: the first call's first denoising step over its median later step; "
             "`compile cache`: cold (a new folder) or warm (filled by an earlier process); `transformer input`: the "
             "`hidden_states` the transformer ran.", "",
             "| case | mode | compile cache | asked | transformer input | steps | set-up s | first call s | "
             "second call s | first image s | x eager image | one-off s | first step / later | = eager | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in rows:
        row = case["first_image"]
        if row.get("error"):
            lines.append(f"| {case['case']} | - | | | | | | | | | | | | | error: {row['error']} |")
            continue
        for name, e in row.get("modes", {}).items():
            first, second = e.get("first_call") or {}, e.get("second_call") or {}
            note = e.get("reason") or "; ".join(n for n in e.get("notes", []) if n.startswith(("no CUDA", "bcg_diffusion.warmup")))
            lines.append(
                f"| {case['case']} | {name} | {_cache_text(e)} | {row.get('asked', '-')} | "
                f"{first.get('transformer_input') or '-'} | {row.get('steps', '-')} | {fmt(e.get('setup_s'))} | "
                f"{fmt(first.get('s'))} | {fmt(second.get('s'))} | {fmt(e.get('first_image_s'))} | "
                f"{fmt(e.get('first_image_over_eager'))} | {fmt(e.get('one_off_s'))} | "
                f"{fmt(first.get('first_step_over_median'))} | {yes_no(e.get('bitwise_equal_to_eager'))} | "
                f"{e['status'] + ': ' if e['status'] != 'ok' else ''}{note} |".replace("\n", " "))
    return lines


FIRST_IMAGE_ROW = Row("first_image", run_first_image, first_image_markdown,
                      enabled=lambda case, settings: bool(settings.first_image) and not case.cp, before_modes=True)
