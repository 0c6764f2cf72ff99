"""Probe every class of the pipeline zoo (``bcg_pipelines.pipeline_zoo``) through ``accelerate_pipeline``.

Per class (:mod:`.pipeline_calls`): the tiny pipeline and an eager twin built with one seed; the twin called twice
(is eager repeatable?); ``accelerate_pipeline``; three calls with other seeds, one with two outputs per prompt and
one with a step-end callback that edits the latents, each compared bitwise with the twin's output; ``get_stats``
(captured keys, segments, breaks, narrowing, module mode, eager calls and why). The classes run in child
processes of ``--chunk`` classes each, so a native crash ends one class, not the run: the class a dead child was
running is reported as a crash with the exit code, and the next child goes on after it. ``--jobs N`` runs N such
children at once on the one device (the tiny classes leave it mostly idle: the host's Python is what takes the
time), each lane taking every N-th class; the records are reported in the cases' order whichever lane ran them. A
JSON and a Markdown report (:mod:`.pipeline_report`), ``pipeline_zoo_probe_<date>_<time>.{json,md}`` in ``--out``,
are written after every class, with the totals against issue 49's targets and the classes that have no case
(``bcg_pipelines.pipeline_zoo.NOT_BUILT`` and ``NOT_YET_BUILT``).

Without CUDA, ``accelerate_pipeline`` is a no-op: the run checks the builders, the calls and the plumbing only;
``--debug`` (``BCGConfig(debug=True)``) then runs the graph runner with segments executed eagerly.

Examples::

    python scripts/pipeline_zoo_probe.py --out bench_results/pipeline_zoo          # every class, bf16 on CUDA
    python scripts/pipeline_zoo_probe.py --jobs 4 --chunk 10 --time-budget 200      # four children at a time
    python scripts/pipeline_zoo_probe.py --classes FluxFillPipeline,WanVACEPipeline --chunk 0
    python scripts/pipeline_zoo_probe.py --device cpu --debug --classes FluxPipeline --out /tmp/pz
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from bcg_diffusion.toolkit.numbers import finite_float
from bcg_pipelines import pipeline_zoo

from ..environment import environment, output_base
from .pipeline_calls import ClassResult, Settings, as_dict, probe_class, release_generators
from .pipeline_report import summary, write_reports

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_OUT = Path("bench_results")
PREFIX = "pipeline_zoo_probe"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline_zoo_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--classes", help="comma-separated pipeline class names or family groups (default: every case)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON and Markdown reports")
    parser.add_argument("--time-budget", type=finite_float, default=340.0,
                        help="seconds; classes not started within it are reported as skipped (default 340)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps of every call (default: each case's)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the weights (both pipelines)")
    parser.add_argument("--debug", action="store_true", help="BCGConfig(debug=True): segments run eagerly")
    parser.add_argument("--deterministic", action="store_true",
                        help="torch's deterministic algorithms (warn only) and a fixed cuBLAS workspace, for classes "
                        "whose eager output does not repeat (atomic adds: Nucleus-MoE's expert routing)")
    parser.add_argument("--chunk", type=int, default=50,
                        help="classes per child process (default 50); 0 runs every class in this process")
    parser.add_argument("--jobs", type=int, default=1,
                        help="child processes running at once (default 1), each taking every N-th class; "
                        "needs --chunk > 0")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)  # a child's results file
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.chunk < 0:
        parser.error("--chunk must be >= 0")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.jobs > 1 and args.chunk == 0:
        parser.error("--jobs runs child processes: give --chunk > 0 with it")
    return args


def select_cases(names: str | None) -> list[pipeline_zoo.PipelineCase]:
    """Every case, or those whose class name or family group is in ``names`` (``SystemExit`` naming the unknown
    ones and the classes that have no case)."""
    cases = pipeline_zoo.pipeline_cases()
    if not names:
        return cases
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    groups = {case.pipeline: pipeline_zoo.group_of(case) for case in cases}
    unknown = [n for n in wanted if n not in groups and n not in groups.values()]
    if unknown:
        hint = [n for n in unknown if n in pipeline_zoo.NOT_BUILT or n in pipeline_zoo.NOT_YET_BUILT]
        raise SystemExit(f"pipeline_zoo_probe: no case for {', '.join(unknown)}"
                         + (f" ({', '.join(hint)}: see bcg_pipelines.pipeline_zoo.NOT_BUILT and NOT_YET_BUILT)"
                            if hint else "")
                         + "; the cases are: " + ", ".join(sorted(groups)))
    return [case for case in cases if case.pipeline in wanted or groups[case.pipeline] in wanted]


def _settings(args: argparse.Namespace) -> Settings:
    if args.deterministic:
        # before the first cuBLAS call; the child processes inherit it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return Settings(device, dtype, args.seed, args.steps, args.debug)


def _skipped(case, why: str) -> dict[str, Any]:
    return as_dict(ClassResult(case.pipeline, pipeline_zoo.group_of(case), case.note, status="skipped", error=why))


def line(record: dict[str, Any]) -> str:
    """The one line printed per class."""
    calls = "".join("-" if c["bitwise"] is None else ("=" if c["bitwise"] else "x") for c in record.get("calls", []))
    text = f"{record['name']}: {record['status']}" + (f" [{calls}]" if calls else "")
    detail = record.get("reason") or (f"{record['phase']}: {record['error']}" if record.get("error") else "")
    return text + (f" ({detail[:200]})" if detail else "") + f" {record.get('seconds', 0):.1f} s"


# -- in this process -----------------------------------------------------------------------------------------
def iter_in_process(cases, settings: Settings, budget: float) -> Iterator[dict[str, Any]]:
    """Each case's record, run here; after the budget, or once the CUDA context is lost, the rest are skipped."""
    start, alive = time.perf_counter(), True
    for case in cases:
        if not alive or time.perf_counter() - start > budget:
            yield _skipped(case, "CUDA context lost in an earlier class" if not alive else f"time budget {budget:.0f} s")
            continue
        result = probe_class(case, settings)
        if settings.device.type == "cuda" and result.status == "crash":
            release_generators()
            alive = _cuda_alive()
        yield as_dict(result)


def _cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - an illegal access poisons the context for every later class
        return False


def run_child(args: argparse.Namespace) -> int:
    """``--child FILE``: run ``--classes`` here, appending ``{"started": name}`` and then each record to FILE."""
    cases = select_cases(args.classes)
    with args.child.open("a") as out:
        for case in cases:
            out.write(json.dumps({"started": case.pipeline}) + "\n")
            out.flush()
            record = next(iter_in_process([case], _settings(args), args.time_budget))
            out.write(json.dumps({"record": record}, default=str) + "\n")
            out.flush()
            print(line(record), flush=True)
            args.time_budget -= record.get("seconds", 0)
    return 0


# -- in child processes ----------------------------------------------------------------------------------------
def _child_command(args: argparse.Namespace, names: list[str], budget: float, results: Path) -> list[str]:
    command = [sys.executable, "-m", "bcg_diffusion.benchmarks.zoo.pipeline_probe", "--child", str(results),
               "--classes", ",".join(names), "--time-budget", f"{budget:.1f}", "--seed", str(args.seed),
               "--chunk", "0"]
    for flag, value in (("--device", args.device), ("--dtype", args.dtype), ("--steps", args.steps)):
        if value is not None:
            command += [flag, str(value)]
    return command + (["--debug"] if args.debug else []) + (["--deterministic"] if args.deterministic else [])


def _read_child(results: Path, returncode: int) -> tuple[list[dict[str, Any]], str | None]:
    """The records a child wrote, and the class it was running when it died (``None`` when it finished)."""
    records, running = [], None
    for text in results.read_text().splitlines() if results.exists() else []:
        entry = json.loads(text)
        if "started" in entry:
            running = entry["started"]
        else:
            records.append(entry["record"])
            running = None
    return records, (running if returncode != 0 else None)


def iter_in_children(cases, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Each case's record, from child processes of ``args.chunk`` classes; a dead child's class is a crash."""
    start, remaining = time.perf_counter(), list(cases)
    while remaining:
        budget = args.time_budget - (time.perf_counter() - start)
        if budget <= 0:
            yield from _printed(_skipped(case, f"time budget {args.time_budget:.0f} s") for case in remaining)
            return
        chunk = remaining[: args.chunk]
        with tempfile.TemporaryDirectory() as folder:
            results = Path(folder) / "results.jsonl"
            code = subprocess.run(_child_command(args, [c.pipeline for c in chunk], budget, results)).returncode
            records, died = _read_child(results, code)
        yield from records
        done = len(records)
        if died is not None:
            case = chunk[done]
            yield from _printed([as_dict(ClassResult(case.pipeline, pipeline_zoo.group_of(case), case.note,
                                                     status="crash", phase="process",
                                                     error=f"the child process died (exit code {code})"))])
            done += 1
        elif done < len(chunk):  # it ended without a record of the class it had not started
            yield from _printed(_skipped(case, f"the child process ended (exit code {code})") for case in chunk[done:])
            done = len(chunk)
        remaining = remaining[done:]


def iter_in_lanes(cases, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Each case's record from ``args.jobs`` lanes at once, lane ``i`` running cases ``i, i + jobs, ...`` through
    :func:`iter_in_children`; records in the order they finish."""
    finished: queue.Queue = queue.Queue()
    done = object()

    def lane(share) -> None:
        try:
            for record in iter_in_children(share, args):
                finished.put(record)
        finally:
            finished.put(done)

    lanes = [cases[i::args.jobs] for i in range(args.jobs) if cases[i::args.jobs]]
    for share in lanes:
        threading.Thread(target=lane, args=(share,), name="pipeline-probe-lane", daemon=True).start()
    open_lanes = len(lanes)
    while open_lanes:
        record = finished.get()
        if record is done:
            open_lanes -= 1
        else:
            yield record


def _printed(records) -> Iterator[dict[str, Any]]:
    """The records the parent makes itself (a child prints its own), printed as they go."""
    for record in records:
        print(line(record), flush=True)
        yield record


# -- main ------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return run_child(args)
    cases = select_cases(args.classes)
    settings = _settings(args)
    header = environment(settings.device, settings.dtype, settings.device.type == "cuda")
    header.update(command="python scripts/pipeline_zoo_probe.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  derived_classes=len(pipeline_zoo.transformer_pipelines()), steps=args.steps, debug=args.debug,
                  time_budget_s=args.time_budget, chunk=args.chunk, jobs=args.jobs, deterministic=args.deterministic)
    not_built = {**pipeline_zoo.NOT_BUILT, **pipeline_zoo.NOT_YET_BUILT} if not args.classes else {}
    records: list[dict[str, Any]] = []
    if args.jobs > 1:
        results = iter_in_lanes(cases, args)
    else:
        results = iter_in_children(cases, args) if args.chunk else iter_in_process(cases, settings, args.time_budget)
    order = {case.pipeline: i for i, case in enumerate(cases)}
    stem = output_base(args.out, PREFIX).name
    json_path = md_path = None
    for record in results:
        records.append(record)
        records.sort(key=lambda r: order.get(r["name"], len(order)))
        json_path, md_path = write_reports(args.out, stem, records, header, not_built)
        if args.chunk == 0:
            print(line(record), flush=True)
    totals = summary(records, header["derived_classes"], not_built)
    print(f"built and ran {totals['built_and_ran']} of {totals['derived_classes']} derived classes; wrong outputs "
          f"{totals['wrong_outputs']}, crashes {totals['crashes']}, replayed {totals['replayed']} of the classes "
          f"that ran; statuses {totals['status_counts']}")
    skipped = [r["name"] for r in records if r["status"] == "skipped"]
    if skipped:
        print(f"{len(skipped)} classes skipped; run them with --classes {','.join(skipped)}")
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
