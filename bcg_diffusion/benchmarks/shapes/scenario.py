"""The new-shapes scenario of ``scripts/bench_shapes.py``: serving several resolutions in turn.

One pipeline; for each mode (its own weight-sharing copy of the transformer swapped into the pipeline),
the shapes are visited in order, ``passes`` times. At each visit: a full ``pipe(...)`` call (few steps)
timed from the start to the decoded image (the *time to the first image* at that shape; on the first pass
it includes compiling and capturing for the new shape), then ``calls - 1`` more calls at the same shape,
whose transformer calls give the *steady-state* time of one transformer call (median, CUDA events around
each call). The second pass finds every shape known: its first image shows what a return to a known
shape costs.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.speedups import quiet_library_warnings, regional_compile

from ..compile_cache_dirs import ENV_KEYS, point_inductor_at
from ..probe import CallTimer
from ..timing import Clock
from ..trees import weight_sharing_copy

PROMPT = "a lighthouse on a rocky coast at dusk, waves crashing, dramatic sky"
# Five image sizes between 512 and 1024 px, square and not, multiples of 16 (PixArt, SD3, Flux, Sana, ...).
DEFAULT_SHAPES = "512x512,640x768,768x768,896x640,1024x1024"
DEFAULT_FAMILY = "pixart"
NO_CUDA_NOTE = ("note: no CUDA GPU: the tiny model at small shapes, modes eager and bcg (a no-op without CUDA) only; "
                "the compile modes are n/a. CPU timings say nothing about BCG.")


@dataclass(frozen=True)
class ShapeMode:
    """``setup(pipe) -> (notes, teardown)`` makes ``pipe.transformer`` (a fresh copy) run in this mode; it may
    put another module in its place (a compiled wrapper), which the timer then hooks."""

    name: str
    description: str
    setup: Callable[[Any], tuple[list[str], Callable[[], None]]]
    needs_cuda: bool = False
    compiles: bool = False  # uses torch.compile (gets a fresh Inductor cache folder with --fresh-compile-cache)


def _accelerate(pipe) -> Callable[[], None]:
    cuda = pipe.transformer.device.type == "cuda"
    with contextlib.nullcontext() if cuda else quiet_library_warnings():  # the no-CUDA no-op was said once
        bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig())

    def undo():
        if bcg_diffusion.is_accelerated(pipe):
            bcg_diffusion.remove_acceleration(pipe)

    return undo


def setup_eager(pipe):
    return ["the pipeline as diffusers runs it"], lambda: None


def setup_bcg(pipe):
    return ["accelerate_pipeline (library defaults)"], _accelerate(pipe)


def _setup_compile_bcg(pipe, dynamic: bool):
    desc = regional_compile(pipe.transformer, dynamic=dynamic)
    return [desc + ", then accelerate_pipeline"], _accelerate(pipe)


def setup_compile_bcg(pipe):
    return _setup_compile_bcg(pipe, dynamic=False)


def setup_compile_bcg_dynamic(pipe):
    return _setup_compile_bcg(pipe, dynamic=True)


def setup_reduce_overhead(pipe):
    """``torch.compile(transformer, mode="reduce-overhead")`` of the whole module (as bench_step's mode),
    swapped into the pipeline (dynamo's default dynamic setting: the second shape recompiles with dynamic
    shapes; CUDA graph trees record each shape). Hooks on the compiled module, outside the compiled code,
    mark a new step before each call and clone its outputs after, so the pipeline may hold an output across
    calls (CFG as two calls)."""
    compiled = torch.compile(pipe.transformer, mode="reduce-overhead")
    handles = [
        compiled.register_forward_pre_hook(lambda _m, _a: torch.compiler.cudagraph_mark_step_begin()),
        compiled.register_forward_hook(
            lambda _m, _a, out: torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, out)),
    ]
    pipe.transformer = compiled

    def undo():
        for handle in handles:
            handle.remove()

    return ["torch.compile(transformer, mode='reduce-overhead') of the whole module; outputs cloned"], undo


SHAPE_MODES = {m.name: m for m in (
    ShapeMode("eager", "the pipeline as diffusers runs it (reference)", setup_eager),
    ShapeMode("bcg", "accelerate_pipeline: a capture per new shape", setup_bcg),
    ShapeMode("compile_bcg_dynamic", "regional torch.compile(dynamic=True), then accelerate_pipeline: one compile, "
              "a capture per new shape", setup_compile_bcg_dynamic, needs_cuda=True, compiles=True),
    ShapeMode("compile_bcg", "regional torch.compile(dynamic=False), then accelerate_pipeline: a compile and a capture "
              "per new shape", setup_compile_bcg, needs_cuda=True, compiles=True),
    ShapeMode("reduce_overhead", "torch.compile(mode='reduce-overhead') of the whole transformer (dynamo's default "
              "dynamic shapes: recompiles as dynamic at the second shape)", setup_reduce_overhead, needs_cuda=True,
              compiles=True),
)}
DEFAULT_MODES = "eager,bcg,compile_bcg_dynamic,compile_bcg,reduce_overhead"


def parse_shapes(text: str) -> list[tuple[int, int, int | None]]:
    """``"512x512,768x1024x33"`` -> ``[(512, 512, None), (768, 1024, 33)]`` (``ValueError`` saying why not)."""
    shapes = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        m = re.fullmatch(r"(\d+)x(\d+)(?:x(\d+))?", tok)
        if not m:
            raise ValueError(f"--shapes: cannot read {tok!r} (expected HxW or HxWxFRAMES)")
        shapes.append((int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None))
    if not shapes:
        raise ValueError(f"--shapes {text!r} names no shape; give e.g. {DEFAULT_SHAPES}")
    return shapes


def shape_label(shape: tuple[int, int, int | None]) -> str:
    h, w, f = shape
    return f"{h}x{w}" + (f"x{f}" if f else "")


def tiny_shapes(family: str) -> list[tuple[int, int, int | None]]:
    """Three small shapes for the tiny model (no CUDA): its default, one taller, one wider."""
    spec = pipelines.get_family(family)
    h, w, m = spec.tiny.height, spec.tiny.width, spec.spatial_multiple
    return [(h, w, spec.tiny.num_frames), (h + m, w, spec.tiny.num_frames), (h, w + m, spec.tiny.num_frames)]


def shape_call(pipe, family: str, size: str, shape, steps: int, batch: int) -> dict[str, Any]:
    h, w, f = shape
    call = pipelines.plan_call(family, size, prompt=PROMPT, height=h, width=w, num_frames=f, steps=steps)
    return pipelines.fit_call(pipe, call, batch=batch, exact_shape=True, clean_caption=False)[0]


def _image(pipe, call, seed: int, device: str):
    with torch.inference_mode():
        return pipe(**call, generator=torch.Generator(device).manual_seed(seed), output_type="np")


def visit(pipe, timer: CallTimer, call: dict[str, Any], settings, clock: Clock) -> dict[str, Any]:
    """One visit of a shape: the first image (wall time), then ``settings.calls - 1`` more images."""
    device = "cuda" if clock.cuda else "cpu"
    timer.take()
    first_s, _ = clock.wall(lambda: _image(pipe, call, settings.seed, device))
    first_calls = timer.take()
    later_s, steady = [], []
    for _ in range(settings.calls - 1):
        secs, _ = clock.wall(lambda: _image(pipe, call, settings.seed, device))
        later_s.append(secs)
        steady += timer.take()
    if not steady:  # one image per visit: the transformer calls after the first
        steady = first_calls[1:] or first_calls
    return {"first_image_s": first_s, "later_image_s": statistics.median(later_s) if later_s else None,
            "extra_s": first_s - statistics.median(later_s) if later_s else None,
            "first_call_ms": 1e3 * first_calls[0] if first_calls else None,
            "steady_call_ms": 1e3 * statistics.median(steady) if steady else None,
            "calls_per_image": len(first_calls), "images": settings.calls}


@dataclass
class ShapeSettings:
    family: str
    size: str
    shapes: list[tuple[int, int, int | None]]
    steps: int
    calls: int
    passes: int
    batch: int
    seed: int
    fresh_compile_cache: bool


def _fresh_compile_cache(root: str, mode: str) -> str:
    """Point Inductor's caches (its FX graphs, AOT autograd and Triton kernels) at an empty folder."""
    return point_inductor_at(Path(root) / mode)


def run_mode(pipe, original, name: str, settings: ShapeSettings, clock: Clock, log, cache_root: str | None) -> dict:
    """``name`` on a fresh copy of the transformer: its set-up, then every shape, ``passes`` times."""
    mode = SHAPE_MODES[name]
    res: dict[str, Any] = {"mode": name, "description": mode.description, "status": "ok", "visits": []}
    if mode.needs_cuda and not clock.cuda:
        res.update(status="n/a", reason="needs CUDA")
        return res
    if cache_root is not None and mode.compiles:
        res["inductor_cache_dir"] = _fresh_compile_cache(cache_root, name)
    copy = weight_sharing_copy(original)
    pipe.transformer = copy  # DiffusionPipeline.__setattr__ keeps its config in step
    timer = teardown = None
    t0 = time.perf_counter()
    try:
        res["notes"], teardown = mode.setup(pipe)
        res["setup_s"] = time.perf_counter() - t0
        timer = CallTimer(pipe.transformer, clock.cuda)  # the module the pipeline calls (the copy or its wrapper)
        for pass_no in range(1, settings.passes + 1):
            for shape in settings.shapes:
                call = shape_call(pipe, settings.family, settings.size, shape, settings.steps, settings.batch)
                v = {"pass": pass_no, "shape": shape_label(shape), **visit(pipe, timer, call, settings, clock)}
                res["visits"].append(v)
                log(f"    {name} pass {pass_no} {v['shape']}: first image {v['first_image_s']:.2f} s, steady call "
                    f"{v['steady_call_ms']:.2f} ms")
        stats = bcg_diffusion.get_stats(pipe) if bcg_diffusion.is_accelerated(pipe) else None
        if stats is not None:
            res["bcg"] = {"captures": stats.captures, "misses": stats.misses, "capture_time_s": stats.capture_time_s,
                          "eager_calls": stats.eager_calls, "text": str(stats)}
    except Exception as exc:  # noqa: BLE001 - a failed mode is recorded, the others run
        res.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:600], traceback=traceback.format_exc(limit=8))
        log(f"    {name}: error: {res['reason']}")
    finally:
        try:
            if timer is not None:
                timer.remove()
            if teardown is not None:
                teardown()
        finally:
            pipe.transformer = original
            del copy
            torch._dynamo.reset()
            if clock.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - t0
    return res


def warm_up(pipe, settings: ShapeSettings, clock: Clock) -> None:
    """One untimed eager 1-step call per shape: CUDA, cuDNN and the VAE at each shape, text encoders."""
    device = "cuda" if clock.cuda else "cpu"
    for shape in settings.shapes:
        call = shape_call(pipe, settings.family, settings.size, shape, 1, settings.batch)
        clock.wall(lambda: _image(pipe, call, settings.seed, device))


def run_modes(pipe, modes: list[str], settings: ShapeSettings, clock: Clock, log, report: dict,
              time_budget: float | None, on_mode_done: Callable[[], None]) -> None:
    """Each mode in turn into ``report["modes"]``; after ``time_budget`` seconds start no new mode (the first
    always runs) and list the rest in ``report["not_run"]``."""
    original = pipe.transformer
    needs_cache = settings.fresh_compile_cache and clock.cuda and any(SHAPE_MODES[m].compiles for m in modes)
    cache_root = tempfile.mkdtemp(prefix="bench_shapes_inductor_") if needs_cache else None
    cache_env = {key: os.environ.get(key) for key in ENV_KEYS}
    t_start = time.perf_counter()
    try:
        for i, name in enumerate(modes):
            elapsed = time.perf_counter() - t_start
            if time_budget is not None and i > 0 and elapsed > time_budget:
                report["not_run"] = modes[i:]
                log(f"time budget of {time_budget:.0f} s spent after {elapsed:.0f} s: not running {', '.join(modes[i:])}")
                break
            log(f"[{i + 1}/{len(modes)}] {name}: {SHAPE_MODES[name].description}")
            report["modes"].append(run_mode(pipe, original, name, settings, clock, log, cache_root))
            report["total_s"] = time.perf_counter() - t_start
            on_mode_done()
    finally:
        if cache_root is not None:  # the process's own cache folders again
            for key, value in cache_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    report["total_s"] = time.perf_counter() - t_start


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def summary(res: dict[str, Any], shapes: list[str]) -> dict[str, Any]:
    """Per mode: the first shape's first image (set-up included), the extra cost of each later new shape on
    the first pass (first image minus a later image at that shape), the second pass's first images."""
    first = [v for v in res["visits"] if v["pass"] == 1]
    second = [v for v in res["visits"] if v["pass"] == 2]
    extras = [v["extra_s"] for v in first[1:] if v.get("extra_s") is not None]
    steady = [v["steady_call_ms"] for v in (second or first) if v.get("steady_call_ms") is not None]
    return {
        "first_shape_first_image_s": first[0]["first_image_s"] + res.get("setup_s", 0.0) if first else None,
        "new_shape_extra_median_s": statistics.median(extras) if extras else None,
        "new_shape_extra_max_s": max(extras) if extras else None,
        "second_pass_first_image_median_s": statistics.median([v["first_image_s"] for v in second]) if second else None,
        "steady_call_ms": dict(zip(shapes, steady)) if len(steady) == len(shapes) else None,
    }


def markdown(report: dict[str, Any]) -> str:
    env, s = report["environment"], report["settings"]
    shapes = s["shapes"]
    lines = [
        f"# bench_shapes results, {env['date']}", "",
        f"GPU: {env['gpu'] or 'none (CPU run: code-path check only, timings mean nothing for BCG)'}; torch "
        f"{env['torch']}, CUDA {env['cuda']}, diffusers {env['diffusers']}, dtype {env['dtype']}, commit "
        f"{env.get('git_commit')}.",
        f"{s['family']} ({s['size']}), batch {s['batch']}, {s['steps']} steps per image, shapes {', '.join(shapes)} "
        f"visited in order {s['passes']} times, {s['calls']} images per visit. Inductor caches: "
        f"{'a fresh folder per mode' if s['fresh_compile_cache'] else 'the default folder (may be warm)'}.",
        "",
        "`first image`: wall time of the first full pipe call at a shape (on the first pass: compile and capture for "
        "that shape included). `extra`: first image minus a later image at the same shape. `steady call`: median "
        "time of one transformer call at that shape after its first image.",
    ]
    if report.get("note"):
        lines += ["", report["note"]]
    if report.get("not_run"):
        lines += ["", "Not run (time budget spent): " + ", ".join(report["not_run"]) + "."]
    lines += ["", "## Summary", "",
              "| mode | set-up s | first shape: first image s (with set-up) | later new shapes: extra s, median (max) | "
              "second pass: first image s, median | steady call ms per shape (second pass) | notes |",
              "|---|---|---|---|---|---|---|"]
    for res in report["modes"]:
        if res["status"] != "ok":
            lines.append(f"| {res['mode']} | | | | | | {res['status']}: {res.get('reason', '')} |".replace("\n", " "))
            continue
        sm = summary(res, shapes)
        steady = sm["steady_call_ms"]
        steady_text = ", ".join(f"{k}: {v:.2f}" for k, v in steady.items()) if steady else "-"
        lines.append(f"| {res['mode']} | {_f(res.get('setup_s'))} | {_f(sm['first_shape_first_image_s'])} | "
                     f"{_f(sm['new_shape_extra_median_s'])} ({_f(sm['new_shape_extra_max_s'])}) | "
                     f"{_f(sm['second_pass_first_image_median_s'])} | {steady_text} | {'; '.join(res.get('notes', []))} |")
    lines += ["", "## Per shape", "",
              "| mode | pass | shape | first image s | later image s | extra s | first call ms | steady call ms | "
              "calls per image |", "|---|---|---|---|---|---|---|---|---|"]
    for res in report["modes"]:
        for v in res.get("visits", []):
            lines.append(f"| {res['mode']} | {v['pass']} | {v['shape']} | {_f(v['first_image_s'])} | "
                         f"{_f(v.get('later_image_s'))} | {_f(v.get('extra_s'))} | {_f(v.get('first_call_ms'))} | "
                         f"{_f(v.get('steady_call_ms'))} | {v.get('calls_per_image')} |")
    lines += ["", "Modes:", ""] + [f"- `{m.name}`: {m.description}" for m in SHAPE_MODES.values()]
    return "\n".join(lines) + "\n"
