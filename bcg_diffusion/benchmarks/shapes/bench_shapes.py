"""New shapes: serve several resolutions in turn and measure what each new shape costs, per mode.

For one family (default PixArt-Sigma, full size) and a list of shapes (default five image sizes between
512 and 1024 px), each mode visits every shape in order, twice: the time to the first image at each shape
(a full pipe call of a few steps; on the first pass it includes compiling and capturing for that shape) and
the steady-state time of one transformer call at that shape. Modes: eager, bcg, compile_bcg_dynamic
(regional compile with dynamic=True + BCG), compile_bcg (static regional compile + BCG), reduce_overhead.

Writes ``bench_shapes_<date>.json`` and ``.md`` into ``--out-dir`` after every mode. Without CUDA it runs
the tiny model at three small shapes, eager and bcg only, to test its code path. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.options import quiet_known_messages

from ..environment import environment, output_base
from ..timing import Clock
from .scenario import (
    DEFAULT_FAMILY, DEFAULT_MODES, DEFAULT_SHAPES, NO_CUDA_NOTE, SHAPE_MODES, ShapeSettings, markdown, parse_shapes,
    run_modes, shape_label, tiny_shapes, warm_up)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_shapes.py", description=__doc__.split("\n\n")[0],
                                epilog="See docs/benchmarks.md.")
    p.add_argument("--family", default=DEFAULT_FAMILY, help=f"a family of the pipelines registry (default {DEFAULT_FAMILY})")
    p.add_argument("--size", choices=pipelines.SIZES, default=None,
                   help="full (default with CUDA) or tiny (always without CUDA)")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated HxW (or HxWxFRAMES for video families), visited in this order "
                   f"(default {DEFAULT_SHAPES}; without CUDA: three small shapes of the tiny model)")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, out of {','.join(SHAPE_MODES)} "
                   f"(default {DEFAULT_MODES})")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per image (default 4)")
    p.add_argument("--calls", type=int, default=2,
                   help="images per visit of a shape: the first is the time to the first image, the transformer "
                   "calls of the others give the steady-state time (default 2)")
    p.add_argument("--passes", type=int, default=2, help="times the list of shapes is visited (default 2)")
    p.add_argument("--batch", type=int, default=1, help="images per prompt (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=pipelines.DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--fresh-compile-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="give each mode an empty Inductor cache folder (TORCHINDUCTOR_CACHE_DIR), so compile times "
                   "are cold (default: on)")
    p.add_argument("--time-budget", type=finite_float, default=None, metavar="SECONDS",
                   help="start no new mode after this many seconds (the first always runs); results are written "
                   "after every mode")
    p.add_argument("--out-dir", type=Path, default=Path("outputs") / "bench",
                   help="default: outputs/bench/ (bench_results/ holds the committed results and their index)")
    return p


def make_settings(opts, parser: argparse.ArgumentParser, cuda: bool) -> tuple[ShapeSettings, list[str], str | None]:
    """Validated settings and modes (``parser.error``, exit 2, for anything wrong), and a note for CPU runs."""
    for name in ("steps", "calls", "passes", "batch"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name} must be >= 1 (got {getattr(opts, name)})")
    if opts.time_budget is not None and opts.time_budget <= 0:
        parser.error(f"--time-budget must be > 0 seconds (got {opts.time_budget})")
    if opts.family not in pipelines.list_families():
        parser.error(f"--family: unknown family {opts.family!r}; known families: {', '.join(pipelines.list_families())}")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SHAPE_MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown mode(s) {', '.join(unknown) or repr(opts.modes)}; choose from {', '.join(SHAPE_MODES)}")
    size, note = opts.size or ("full" if cuda else "tiny"), None
    try:
        shapes = parse_shapes(opts.shapes or DEFAULT_SHAPES)
        for h, w, f in shapes:
            pipelines.check_call(opts.family, h, w, f, size=size)
    except ValueError as exc:
        parser.error(str(exc))
    if not cuda and not (size == "tiny" and opts.shapes):
        size, shapes = "tiny", tiny_shapes(opts.family)
        note = f"no CUDA: ran the tiny {opts.family} model at {', '.join(map(shape_label, shapes))}"
    settings = ShapeSettings(opts.family, size, shapes, opts.steps, opts.calls, opts.passes, opts.batch, opts.seed,
                             opts.fresh_compile_cache)
    return settings, modes, note


def write(report: dict, base: Path) -> list[Path]:
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown(report))
    return [json_path, md_path]


def main(argv: list[str] | None = None) -> int:
    quiet_known_messages()
    parser = build_parser()
    cuda = torch.cuda.is_available()
    try:
        opts = parser.parse_args(argv)
        settings, modes, note = make_settings(opts, parser, cuda)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not cuda:
        print(NO_CUDA_NOTE, flush=True)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = pipelines.resolve_dtype(opts.dtype, device)
    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)  # a static compile per shape
    report = {"environment": environment(device, dtype, cuda),
              "settings": {"family": settings.family, "size": settings.size,
                           "shapes": [shape_label(s) for s in settings.shapes], "modes": modes, "steps": settings.steps,
                           "calls": settings.calls, "passes": settings.passes, "batch": settings.batch,
                           "seed": settings.seed, "fresh_compile_cache": settings.fresh_compile_cache,
                           "time_budget_s": opts.time_budget, "argv": sys.argv[1:] if argv is None else list(argv),
                           "timing": "CUDA events per transformer call" if cuda else "perf_counter (no CUDA)"},
              "note": note, "modes": []}
    base = output_base(opts.out_dir, prefix="bench_shapes")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    log(f"bench_shapes: {settings.family} ({settings.size}) on {report['environment']['gpu'] or 'CPU'}, shapes "
        f"{', '.join(report['settings']['shapes'])}, modes {', '.join(modes)}")
    t0 = time.perf_counter()
    pipe = pipelines.build_pipeline(settings.family, size=settings.size, device=device, dtype=dtype, seed=settings.seed)
    pipe.set_progress_bar_config(disable=True)
    report["build_s"] = time.perf_counter() - t0
    log(f"built in {report['build_s']:.1f} s; warm-up: one eager 1-step image per shape")
    warm_up(pipe, settings, Clock(cuda))
    run_modes(pipe, modes, settings, Clock(cuda), log, report, opts.time_budget, lambda: write(report, base))
    for path in write(report, base):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
