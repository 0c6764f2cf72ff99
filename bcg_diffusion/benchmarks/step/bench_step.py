"""Per-step latency benchmark: one transformer call, as a denoising step makes it, in several modes.

For each case (family, size, shape, batch) it builds the pipeline with random weights, records the inputs
of the first transformer call of one real denoising step, and times ``transformer(**those inputs)`` in
every mode, in one process, interleaved in rounds so that drift hits all modes alike. Default modes: eager,
bcg, whole_graph, compile, compile_bcg, reduce_overhead; more with --modes (bcg_break, compile_bcg_break,
compile_bcg_dynamic, compile_full_bcg, partition_ceiling; :mod:`bcg_diffusion.benchmarks.step.modes`; docs/benchmarks.md).
Case variants ``@fp8``, ``@fp8wo``, ``@int8wo``, ``@int8`` quantize the transformer; ``--cache-rows`` adds
step caches end to end; ``--first-image`` the time to the first image per mode. ``--processes K`` repeats
the whole run in K fresh processes and reports each ratio's median, spread and verdict. A case ending in
``:cp2`` (``:cp2r``: ring) runs the transformer with context parallelism under ``torchrun``.

Writes ``bench_step_<date>.json`` and ``.md`` into ``--out-dir`` (default ``outputs/bench/``; the committed results
are in ``bench_results/``), and the ``.png`` chart where matplotlib is installed (``pip install -e ".[bench]"``). The parts live in :mod:`bcg_diffusion.benchmarks`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from bcg_diffusion.benchmarks.step.names import DEFAULT_FIRST_IMAGE_MODES, DEFAULT_MODES, FIRST_IMAGE_MODE_NAMES
from bcg_diffusion.benchmarks.step.names import MODE_NAMES as MODES
from bcg_diffusion.benchmarks.timing_defaults import (
    AUTO_ROUND_S, DEFAULT_ITERS, DEFAULT_ROUNDS, DEFAULT_WARMUP, MIN_AUTO_ITERS)
from bcg_diffusion.toolkit.cache_spec import CACHE_HELP, CacheSpec
from bcg_diffusion.toolkit.choices import DTYPE_NAMES
from bcg_diffusion.toolkit.files import folder_problem
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.options import command_name, quiet_known_messages

#: What the ``--processes`` children run: this file itself (``python <file> ...``, or torchrun of it), which
#: is why this module imports absolutely (it runs as a file as well as ``bcg_diffusion.benchmarks.step.bench_step``).
SCRIPT = Path(__file__).resolve()

# The command, and the names of its parts it re-exports for readers and tests (those of torch-importing modules
# lazily, through __getattr__: the parser and --help import no torch).
__all__ = [
    "AUTO_ROUND_S", "CHART_NEEDS_MATPLOTLIB", "CUDA_ONLY", "DEFAULT_CASES", "DEFAULT_ITERS", "DEFAULT_MATRIX",
    "DEFAULT_MODES", "DEFAULT_OUT_DIR", "MIN_AUTO_ITERS", "MODES", "QUICK_MATRIX", "SCRIPT", "auto_iters",
    "build_parser", "check_options", "first_image_modes", "main", "matrix_entries", "parse_case", "parse_shard",
    "select_cases", "shard_cases",
]
_LAZY = {"DEFAULT_CASES": "cases", "DEFAULT_MATRIX": "cases", "QUICK_MATRIX": "cases", "matrix_entries": "cases",
         "parse_case": "cases", "parse_shard": "cases", "select_cases": "cases", "shard_cases": "cases",
         "CHART_NEEDS_MATPLOTLIB": "chart", "CUDA_ONLY": "modes", "auto_iters": "..timing",
         "environment": "..environment"}

#: Where results go without --out-dir: outside the committed bench_results/ (whose index lists every file in it).
DEFAULT_OUT_DIR = Path("outputs") / "bench"


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    relative = _LAZY[name]
    package = "bcg_diffusion.benchmarks" if relative.startswith("..") else "bcg_diffusion.benchmarks.step"
    return getattr(importlib.import_module(f"{package}.{relative.lstrip('.')}"), name)


def prog() -> str:
    """The command's name in usage and error lines: ``bcg-bench`` when run as that, else ``bench_step.py``."""
    return command_name("bench_step.py", "bcg-bench")


QUICK_ITERS, QUICK_ROUNDS = 10, 3
NO_CUDA_NOTE = ("note: no CUDA GPU: running eager, bcg and bcg_break (BCG is a no-op without CUDA) on tiny models to "
                "test the code path; whole_graph and the compile modes are n/a (needs CUDA). CPU timings say nothing "
                "about BCG.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Per-step latency of a DiT transformer call in eager, BCG, whole-graph and compiled modes, "
        "measured interleaved in one process. See docs/benchmarks.md.",
        allow_abbrev=False,  # --processes rewrites the command line of its children option by option
    )
    p.add_argument("--cases", default=None,
                   help="comma-separated cases family[:size][:HxW][:fFRAMES][:bBATCH][:bin][:cpN[r]][@VARIANT], e.g. "
                   "'pixart:full:512x512:b1,flux:full:1024x1024:b1@fp8' (variants: fp8, fp8wo, int8wo, int8, "
                   "torchao quantization; bin: the pipeline's resolution binning on; cp2: context parallelism of "
                   "degree 2, Ulysses, cp2r: ring, under torchrun; default: the full matrix; --quick: a small one)")
    p.add_argument("--modes", default=None,
                   help=f"comma-separated modes out of {','.join(MODES)}, or 'none' (only the whole-pipeline rows) "
                   f"(default: the matrix's, else {','.join(DEFAULT_MODES)})")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed calls per mode per round (default: enough for about {AUTO_ROUND_S} s, "
                   f"{MIN_AUTO_ITERS} to {DEFAULT_ITERS} calls; --quick: {QUICK_ITERS})")
    p.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds (default {DEFAULT_ROUNDS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls per mode after set-up (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="a preset that finishes in under 5 minutes on one H200: PixArt and SD3.5 at 512 px, "
                   f"modes eager/bcg/whole_graph (+ compile on PixArt), {QUICK_ITERS} x {QUICK_ROUNDS} calls")
    p.add_argument("--e2e", action=argparse.BooleanOptionalAction, default=None,
                   help="also time a full pipe(...) call eager vs BCG (first call with capture, then a second). "
                   "Default: on for --cases and --quick, and for the launch-bound cases of the default matrix")
    p.add_argument("--e2e-steps", type=int, default=None,
                   help="steps of the end-to-end and cache calls (default: the family's)")
    p.add_argument("--cache-rows", default=None, metavar="SPEC[,SPEC...]",
                   help=f"add the whole-pipeline cache row for each step cache: {CACHE_HELP}. Per spec: eager + "
                   "cache, BCG + cache (first and second call), BCG alone, the passes computed and reused, and "
                   "whether BCG + cache equals eager + cache bitwise (runs whatever --e2e says)")
    p.add_argument("--first-image", nargs="?", const=",".join(DEFAULT_FIRST_IMAGE_MODES), default=None,
                   metavar="MODES",
                   help="add the first-image row: per mode, set-up, then the first and the second full pipe call "
                   f"(modes out of {','.join(FIRST_IMAGE_MODE_NAMES)}; without a value: "
                   f"{','.join(DEFAULT_FIRST_IMAGE_MODES)}); runs before the per-step modes, with --e2e-steps steps")
    p.add_argument("--processes", type=int, default=None, metavar="K",
                   help="repeat the whole run in K fresh processes, one after another, and report per case the median "
                   "and spread (min-max) of every ratio over the processes, with a verdict (level with / ahead of / "
                   "behind); each child's files go to OUT_DIR/<run>_processes/pI/")
    p.add_argument("--compile-cache", default=None, metavar="fresh|shared|DIR",
                   help="Inductor's compile caches: 'fresh' (a new empty folder per process; the default with "
                   "--processes), 'shared' (with --processes: one new folder for all, so process 1 compiles cold and "
                   "the later ones warm) or a folder (kept; may be warm). Not given: Inductor's own folder for the "
                   "per-step modes, a new one per first-image mode")
    p.add_argument("--process-index", default=None, help=argparse.SUPPRESS)  # i/K, set by --processes for its children
    p.add_argument("--cache-compile", action="store_true",
                   help="with --cache-rows: also time regional torch.compile + the cache (no BCG)")
    p.add_argument("--check-weights", choices=("per_pipeline_call", "every_call", "auto"), default="per_pipeline_call",
                   help="BCGConfig.check_weights of the bcg modes. The benchmark calls a bare transformer, for which "
                   "the library default ('auto') recomputes the weight fingerprint on every call; inside a pipeline "
                   "it is read once per pipeline call, which the default here mimics (default: per_pipeline_call)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs, 0 <= seed < 2**64")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                   help=f"where the result files go (default: {DEFAULT_OUT_DIR}/; the project's committed results are "
                   "in bench_results/, whose index lists every file: --out-dir bench_results to add one)")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only shard K of N of the chosen cases (families dealt out round-robin, so each family "
                   "runs whole in one shard); combine the shards' JSON files afterwards with --merge")
    p.add_argument("--time-budget", type=finite_float, default=None, metavar="SECONDS",
                   help="start no new case after this many seconds (the first always runs; the rest are reported "
                   "as not run); results are written after every case, so a run stopped from outside keeps the "
                   "finished cases")
    p.add_argument("--setup-timeout", type=finite_float, default=None, metavar="SECONDS",
                   help="give up a mode whose set-up (compile, capture, first calls) takes longer than this; it is "
                   "reported as n/a and the other modes are still timed (a slow compile cannot cost the run)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="measure nothing: combine result files (e.g. the shards of one matrix, same GPU, versions and "
                   "commit) into one JSON, Markdown table and chart")
    p.add_argument("--allow-different-commits", action="store_true",
                   help="with --merge: accept files from different commits of this project (each file's commit "
                   "is listed in the result)")
    return p


def check_options(opts, parser: argparse.ArgumentParser) -> list[str] | None:
    """``parser.error`` (exit 2) for a bad number, mode, shard or output folder; return the ``--modes`` list (or
    None)."""
    check_numbers(opts, parser)
    check_outputs(opts, parser)
    from bcg_diffusion.benchmarks.step import processes
    from bcg_diffusion.benchmarks.step.cases import parse_shard
    from bcg_diffusion.benchmarks.step.first_image import parse_first_image_modes

    try:
        if opts.shard:
            parse_shard(opts.shard)
        if opts.first_image is not None:
            parse_first_image_modes(opts.first_image)
        if opts.process_index is not None:
            processes.parse_process_index(opts.process_index)
    except ValueError as exc:
        parser.error(str(exc))
    if opts.cache_compile and not opts.cache_rows:
        parser.error("--cache-compile needs --cache-rows")
    if opts.compile_cache == "shared" and not opts.processes:
        parser.error("--compile-cache shared needs --processes K (one folder shared by the K processes); give a "
                     "folder to share one across separate runs")
    try:
        opts.cache_specs = cache_specs(opts.cache_rows)  # read once: CacheSpec values from here on
    except ValueError as exc:
        parser.error(f"--cache-rows: {exc}")
    if opts.cache_rows is not None and not opts.cache_specs:
        parser.error(f"--cache-rows {opts.cache_rows!r} names no cache; give e.g. fbc:0.5,taylorseer:2")
    return chosen_modes(opts, parser)


def check_numbers(opts, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a count, time or seed out of range."""
    for name in ("iters", "rounds", "e2e_steps", "warmup", "processes"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if opts.time_budget is not None and opts.time_budget <= 0:
        parser.error(f"--time-budget must be > 0 seconds (got {opts.time_budget})")
    if opts.setup_timeout is not None and opts.setup_timeout <= 0:
        parser.error(f"--setup-timeout must be > 0 seconds (got {opts.setup_timeout})")
    if not 0 <= opts.seed < 2**64:
        parser.error(f"--seed must be in 0 .. 2**64 - 1 (got {opts.seed})")


def check_outputs(opts, parser: argparse.ArgumentParser) -> None:
    """``--out-dir`` and a ``--compile-cache`` folder must take files: checked before any measuring (a run of hours
    must not end in a traceback that loses its results)."""
    problem = folder_problem(opts.out_dir, longest_name="bench_step_2026-01-01_000000_99_processes.json")
    if problem:
        parser.error(f"--out-dir {str(opts.out_dir)!r} cannot take the result files: {problem}")
    if opts.compile_cache not in (None, "fresh", "shared"):
        problem = folder_problem(Path(opts.compile_cache))
        if problem:
            parser.error(f"--compile-cache {opts.compile_cache!r} cannot be the compile caches' folder: {problem}")


def chosen_modes(opts, parser: argparse.ArgumentParser) -> list[str] | None:
    """The ``--modes`` list: ``None`` without it (each case's own), ``[]`` for ``none``; ``parser.error`` for an
    unknown mode."""
    if not opts.modes:
        return None
    if opts.modes.strip() == "none":
        return []
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown mode(s) {', '.join(unknown) or repr(opts.modes)}; choose from {', '.join(MODES)}")
    return modes


def cache_specs(text: str | None) -> tuple[CacheSpec, ...]:
    """``--cache-rows fbc:0.5,taylorseer:2`` as :class:`CacheSpec` values; ``ValueError`` for one that is not."""
    return tuple(CacheSpec.parse(t.strip()) for t in (text or "").split(",") if t.strip())


def choose_cases(opts, parser: argparse.ArgumentParser, cuda: bool):
    """The cases to run and those skipped (``parser.error`` for a bad ``--cases``, a variant that cannot run here
    among them, or an empty shard)."""
    from bcg_diffusion.benchmarks.step.cases import matrix_entries, parse_shard, select_cases, shard_cases

    try:
        entries = matrix_entries(opts.cases, opts.quick)
        if opts.shard:
            entries = [entries[i] for i in shard_cases([e[0] for e in entries], *parse_shard(opts.shard))]
            if not entries:
                raise ValueError(f"--shard {opts.shard}: no cases in this shard (fewer families than shards)")
        return select_cases(entries, cuda, strict=bool(opts.cases))
    except ValueError as exc:
        parser.error(str(exc))


def first_image_modes(opts) -> tuple[str, ...]:
    from bcg_diffusion.benchmarks.step.first_image import parse_first_image_modes

    return parse_first_image_modes(opts.first_image) if opts.first_image is not None else ()


def new_report(opts, argv, device, dtype, cuda: bool, skipped) -> dict:
    from bcg_diffusion.benchmarks.environment import environment
    from bcg_diffusion.benchmarks.step.modes import MODE_REGISTRY

    settings = {"iters": opts.iters, "rounds": opts.rounds, "warmup": opts.warmup, "e2e": opts.e2e,
                "e2e_steps": opts.e2e_steps, "first_image": list(first_image_modes(opts)),
                "cache_rows": [spec.text for spec in opts.cache_specs],
                "cache_compile": opts.cache_compile, "seed": opts.seed, "quick": opts.quick, "shard": opts.shard,
                "time_budget_s": opts.time_budget, "setup_timeout_s": opts.setup_timeout,
                "bcg_config_of_step_modes": {"check_weights": opts.check_weights},
                "argv": sys.argv[1:] if argv is None else list(argv),
                "timing": "CUDA events per call" if cuda else "perf_counter per call (no CUDA)"}
    return {"environment": environment(device, dtype, cuda), "settings": settings,
            "modes": {m.name: {"description": m.description, "torch_compile": m.torch_compile}
                      for m in MODE_REGISTRY.values()},
            "cases": [], "skipped_cases": skipped}


def write_results(report: dict, base: Path, **how) -> int:
    """Write the result files (:func:`~.report.write_report`, each file whole or not at all) and print their paths;
    1 with one line saying why when the disk refuses them, else 0."""
    from bcg_diffusion.benchmarks.step.report import write_report

    try:
        paths = write_report(report, base, log=print, **how)
    except OSError as exc:
        print(f"error: writing the results to {base.parent} failed: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"wrote {path}")
    return 0


def main_merge(paths: list[Path], out_dir: Path, allow_different_commits: bool = False) -> int:
    from bcg_diffusion.benchmarks.environment import output_base
    from bcg_diffusion.benchmarks.step.merge import merge_reports

    try:
        report = merge_reports(paths, allow_different_commits)
    except ValueError as exc:
        print(f"error: --merge: {exc}", file=sys.stderr)
        return 2
    return write_results(report, output_base(out_dir), chart=True)


def main_processes(opts, argv: list[str], cases) -> int:
    """``--processes K``: run this script K times with the same options, then combine their results."""
    from bcg_diffusion.benchmarks.environment import output_base
    from bcg_diffusion.benchmarks.step import parallel, processes
    from bcg_diffusion.benchmarks.step.across import across_markdown, combine_processes

    count = opts.processes
    base = output_base(opts.out_dir)
    root = base.parent / f"{base.name}_processes"
    folders, to_remove = processes.cache_folders(opts.compile_cache, count)
    out_dirs = [root / f"p{i}" for i in range(1, count + 1)]
    degree = parallel.cp_degree(cases)
    commands = [processes.child_command(SCRIPT, processes.child_argv(argv, i, count, out_dirs[i - 1], folders[i - 1]),
                                        degree) for i in range(1, count + 1)]
    print(f"bench_step: {count} process(es) in turn, results of each under {root}", flush=True)
    try:
        runs = processes.run_children(commands, out_dirs, lambda msg: print(msg, flush=True))
    finally:
        processes.remove_folders(to_remove)
    try:
        processes.check_runs(runs)
    except ValueError as exc:
        print(f"error: --processes: the processes' results do not match: {exc}", file=sys.stderr)
        return 2
    settings = {"processes": count, "compile_cache": opts.compile_cache or "fresh", "argv": argv,
                "children": [" ".join(c) for c in commands]}
    report = combine_processes(runs, settings)
    code = write_results(report, base, chart=False, markdown=across_markdown)
    return code or (0 if any(run.get("report") for run in runs) else 1)


def main(argv: list[str] | None = None) -> int:
    """The command: parse and check every option before torch is imported (``--help`` answers at once), then
    measure. Exit code 0; 1 when a case failed or the results could not be written; 2 for a bad option."""
    quiet_known_messages()
    parser = build_parser()
    try:
        opts = parser.parse_args(argv)
        if opts.merge:
            if opts.processes:
                parser.error("--merge measures nothing; it cannot take --processes")
            check_outputs(opts, parser)
            return main_merge(opts.merge, opts.out_dir, opts.allow_different_commits)
        mode_override = check_options(opts, parser)
        import torch

        from bcg_diffusion.benchmarks.step import parallel

        cuda = torch.cuda.is_available()
        cases, skipped = choose_cases(opts, parser, cuda)
        problem = parallel.mix_problem(cases) if opts.processes else parallel.launch_problem(cases)
        if problem:
            parser.error(problem)
    except SystemExit as exc:
        return int(exc.code or 0)
    if any(c.cp for c in cases):
        parallel.multicast_off()  # before any NCCL communicator exists, here or in the children
    if opts.processes:
        return main_processes(opts, list(sys.argv[1:] if argv is None else argv), cases)
    ranks = parallel.TorchRanks(cuda) if any(c.cp for c in cases) else parallel.Ranks()
    try:
        return measure_run(opts, argv, cases, skipped, mode_override, cuda, ranks)
    finally:
        ranks.close()


def measure_run(opts, argv, cases, skipped, mode_override, cuda: bool, ranks) -> int:
    """Measure ``cases`` in this process (one rank of a context-parallel launch: rank 0 logs and writes). Exit
    code 1 when a case failed (its error is in the results) or the results could not be written."""
    import torch

    import bcg_pipelines as pipelines
    from bcg_diffusion.benchmarks.compile_cache_dirs import open_process_cache
    from bcg_diffusion.benchmarks.environment import output_base
    from bcg_diffusion.benchmarks.step.measure import Settings, run_cases
    from bcg_diffusion.benchmarks.timing import Clock

    opts.iters = opts.iters or (QUICK_ITERS if opts.quick else None)  # None: auto_iters per mode
    opts.rounds = opts.rounds or (QUICK_ROUNDS if opts.quick else DEFAULT_ROUNDS)
    device = torch.device("cuda" if cuda else "cpu")
    if cuda and ranks.world > 1:
        device = torch.device("cuda", ranks.local_rank)  # this rank's GPU (also its current device)
    dtype = pipelines.resolve_dtype(opts.dtype, device)
    log = (lambda msg: print(msg, flush=True)) if ranks.is_main else (lambda msg: None)
    if not cuda:
        log(NO_CUDA_NOTE)
    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)  # one per block copy
    compile_cache = open_process_cache(opts.compile_cache)
    try:
        report = new_report(opts, argv, device, dtype, cuda, skipped)
        report["compile_cache"] = compile_cache.describe()
        describe_run(opts, report, ranks, cases, log)
        base = output_base(opts.out_dir) if ranks.is_main else None
        settings = Settings(opts.iters, opts.rounds, opts.warmup, opts.seed, opts.e2e, opts.e2e_steps,
                            {"check_weights": opts.check_weights}, opts.cache_specs, opts.cache_compile,
                            opts.setup_timeout, first_image_modes(opts), compile_cache)
        run_cases(cases, mode_override, settings, device, dtype, Clock(cuda), log, report, opts.time_budget,
                  lambda: ranks.is_main and write_partial(report, base, log), ranks)
    finally:
        compile_cache.close()
    log(f"done in {report['total_s']:.0f} s")
    failed = [c["case"] for c in report["cases"] if c.get("error")]
    if not ranks.is_main:
        return 1 if failed else 0
    timed = any("median_ms" in m for c in report["cases"] for m in c["modes"].values())
    code = write_results(report, base, chart=timed)  # a chart of per-step speedups, if any
    if failed:
        print(f"error: {len(failed)} of {len(report['cases'])} case(s) failed: {', '.join(failed)} (their errors are "
              "in the results)", file=sys.stderr)
    return code or (1 if failed else 0)


def describe_run(opts, report: dict, ranks, cases, log) -> None:
    """The run's process and ranks in ``report``, the skipped cases and the first line in the log."""
    from bcg_diffusion.benchmarks.step import processes

    if opts.process_index:
        index, count = processes.parse_process_index(opts.process_index)
        report["process"] = {"index": index, "count": count}
    if ranks.describe():
        report["ranks"] = ranks.describe()
    for s in report["skipped_cases"]:
        log(f"skipping {s['case']}: {s['error']}")
    env = report["environment"]
    log(f"bench_step: {len(cases)} case(s) on {env['gpu'] or 'CPU'}, torch {env['torch']}, diffusers "
        f"{env['diffusers']}" + (f", shard {opts.shard}" if opts.shard else "")
        + (f", process {opts.process_index}" if opts.process_index else ""))


def write_partial(report: dict, base: Path, log) -> None:
    """The results so far, after each case (a run stopped from outside keeps the finished cases); a write the disk
    refuses is said in one line and tried again after the next case."""
    from bcg_diffusion.benchmarks.step.report import write_report

    try:
        write_report(report, base, chart=False)
    except OSError as exc:
        log(f"error: writing the results so far to {base.parent} failed: {exc}; the run goes on and tries again")


if __name__ == "__main__":
    sys.exit(main())
