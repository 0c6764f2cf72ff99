"""The planting harness: work a graph cannot hold or must not bake in, planted at seeded sites of the
zoo's models, each planted model checked against an eager twin with the same plant.

Each plant is one kind of work (:mod:`.planting_kinds`) at one site (:mod:`.planting_sites`) of one
zoo model (``bcg_pipelines.zoo``: a tiny config of a diffusers transformer class, one model built per
class and a deep copy of it as the twin, both reused and every plant undone). The twin makes ``calls``
eager calls on latents that change from call to call; then the model is accelerated
(``accelerate_transformer``; on the CPU in debug mode, where the host-read kinds raise what CUDA
raises) and makes the same calls, Python ``random``, torch's generators and the plant's counter
seeded alike. The verdict per plant:

- ``crash``: an exception reached the caller of the accelerated model (the twin did not raise);
- ``equal`` per call: bitwise equal to the twin;
- ``replayed``: in how many calls a graph replayed (a whole-call replay, or in module mode a child
  graph), from ``get_stats``;
- ``named``: where the library had to act on the plant (a capture that failed where the plant ran
  inside a segment; Python it cannot see at a module, processor or class site), what the library tells
  names the place (the innermost module the plant ran in, or the site): a capture warning, a capture
  outcome of the runner events, or why module mode runs Python eagerly (``get_stats``); read through
  ``bcg_diffusion.toolkit.listening``, no log line below WARNING;
- ``assumption``: hidden state (Python ``random``, a call counter) in a free function or a torch
  function patched process-wide: code the library takes for the class's own, which a replay assumes
  decides nothing per call (docs/accelerate.md, What a replay assumes). Reported apart, never a failure.

A plant whose twin raised or never ran the plant is ``invalid`` (the harness's problem, listed apart).
Plants are drawn from the seed (the same seed gives the same plants), spread over classes and over every
(site kind, kind) pair, and run in that order until the time budget ends. With ``--jobs N`` the plan runs in
child processes (N at a time, ``--chunk`` plants each): a native crash (a signal) is then reported as that
plant's ``crash`` instead of ending the run. With ``--in-process`` every plant runs in this one process, as a
long-lived server's captures do, and the progress is written as it goes (:mod:`.planting_progress`): a native
crash ends the run, the plant it happened in stays on disk, and ``--rebuild-report`` writes the reports of
the dead run.

Command line::

    python -m bcg_diffusion.checks.planting --seed 0 --plants 600 --out bench_results/planting --time-budget 300 --jobs 3
    python -m bcg_diffusion.checks.planting --seed 0 --plants 1000 --out DIR --time-budget 480 --in-process
    python -m bcg_diffusion.checks.planting --out DIR --rebuild-report   # after an --in-process run died
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import random
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import bcg_diffusion
from bcg_diffusion.core import walk
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.provenance import checkout_commit
from bcg_pipelines import zoo

from bcg_diffusion.toolkit.listening import listening

from .planting_processes import result_from_dict, run_in_processes
from .planting_progress import ProgressLog, rebuild
from .planting_kinds import HIDDEN_STATE, HOST_READ, KINDS, PlantState
from .planting_report import write_reports
from .planting_sites import OPAQUE_SITES, SITE_KINDS, Plant, Site, Survey, install, survey, train_mode

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Zoo cases that run every call eagerly by design (their class is planted through another case, if any).
NOT_CAPTURED = frozenset({"LuminaNextDiT2DModel", "WanAnimate2Transformer3DModel[extract]"})
CALLS = 4  # the key's first call (eager), its capture, two replays
#: Log lines that mean the library itself went wrong (not the plant): a plant with one fails.
SUSPICIOUS = ("nested BreakableCUDAGraphCapture", "did not work", "replay of", "Traceback")
#: ``get_stats``' fallback reason of a key whose capture drew host random numbers (the library's words).
HOST_RANDOM = "host random numbers in the step"


@dataclass(frozen=True)
class PlantSpec:
    """Plant number ``index``: a case, a site kind and a kind; the site itself is drawn from the case's
    survey with a generator seeded by ``(seed, index)``."""

    index: int
    case: str
    site_kind: str
    kind: str


@dataclass
class PlantResult:
    index: int
    case: str
    site_kind: str
    kind: str
    family: str
    site: str = ""
    assumption: bool = False
    status: str = ""  # ok, different, crash, unrepeatable (planting_report.RAN), invalid, skipped
    equal: list[bool] = field(default_factory=list)
    max_diff: float | None = None
    replayed_calls: int = 0
    named: bool | None = None  # None: nothing to name
    fired: int = 0
    fired_in_capture: int = 0
    places: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    suspicious: list[str] = field(default_factory=list)  # lines of SUSPICIOUS
    eager_modules: list[str] = field(default_factory=list)
    module_mode: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    host_random: bool = False  # a key ran eagerly because its capture drew host random numbers (no replay owed)
    error: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """No crash, equal to the twin (unless an assumption), some replay (or a key the library ran eagerly
        because its capture drew host random numbers: a replay would repeat them), named where it must be, no
        line saying the library itself went wrong."""
        return (self.status in ("ok", "different") and (self.assumption or self.status == "ok")
                and (self.replayed_calls > 0 or self.host_random) and self.named is not False and not self.suspicious)


# -- plans ----------------------------------------------------------------------------------------------
def planted_cases(classes: str | None = None) -> list[zoo.ZooCase]:
    """One case per transformer class (the first that is captured by default), optionally only the
    comma-separated class or case names of ``classes``."""
    wanted = {n.strip() for n in classes.split(",")} if classes else None
    chosen: dict[str, zoo.ZooCase] = {}
    for case in zoo.zoo_cases():
        if case.name in NOT_CAPTURED or case.class_name in chosen:
            continue
        if wanted is None or case.class_name in wanted or case.name in wanted:
            chosen[case.class_name] = case
    if wanted is not None and not chosen:
        raise SystemExit(f"planting: no zoo case for {classes}")
    return list(chosen.values())


def plan(seed: int, plants: int, cases: list[zoo.ZooCase]) -> list[PlantSpec]:
    """``plants`` plant specs from ``seed``: cases in a seeded order, round robin, and every (site kind,
    kind) pair in a seeded order, round robin."""
    rng = random.Random(seed)
    order = [case.name for case in cases]
    rng.shuffle(order)
    pairs = [(s, k) for s in SITE_KINDS for k in KINDS]
    rng.shuffle(pairs)
    return [PlantSpec(i, order[i % len(order)], *pairs[i % len(pairs)]) for i in range(plants)]


def choose_site(spec: PlantSpec, found: Survey, seed: int) -> Site | None:
    """The site of ``spec``: one of its site kind in ``found``, drawn with ``(seed, index)``; another
    site kind of the case when it has none of that one; ``None`` when it has no site at all."""
    rng = random.Random(f"{seed}:{spec.index}")
    sites = found.of(spec.site_kind)
    if not sites:
        kinds = [k for k in SITE_KINDS if found.of(k)]
        if not kinds:
            return None
        sites = found.of(rng.choice(kinds))
    return rng.choice(sites)


# -- models -----------------------------------------------------------------------------------------------
@dataclass
class Bundle:
    """One class's model, its twin, their inputs, latents per call and survey."""

    case: zoo.ZooCase
    model: torch.nn.Module
    twin: torch.nn.Module
    inputs: dict[str, Any]
    latents: torch.Tensor
    variants: list[torch.Tensor]
    survey: Survey
    paths: dict[int, str]


def _latents(inputs: dict[str, Any]) -> torch.Tensor:
    floats = [v for _, desc, v in walk(inputs, "x") if desc is None and isinstance(v, torch.Tensor) and v.is_floating_point()]
    return max(floats, key=torch.Tensor.numel)


def build_bundle(case: zoo.ZooCase, device: torch.device, dtype: torch.dtype, calls: int) -> Bundle:
    model = zoo.build_tiny(case, device, dtype, 0)
    twin = copy.deepcopy(model)
    inputs = zoo.tiny_inputs(case, device, dtype, 0)
    latents = _latents(inputs)
    g = torch.Generator("cpu").manual_seed(1)
    variants = [latents.clone()] + [
        latents + 0.25 * torch.randn(latents.shape, generator=g).to(latents.device, latents.dtype) for _ in range(calls - 1)]
    latents.copy_(variants[0])
    found = survey(twin, lambda: twin(**inputs))
    paths = {id(m): p for p, m in model.named_modules()} | {id(m): p for p, m in twin.named_modules()}
    return Bundle(case, model, twin, inputs, latents, variants, found, paths)


# -- one plant ----------------------------------------------------------------------------------------------
def _seed_call(i: int) -> None:
    torch.manual_seed(1000 + i)
    random.seed(1000 + i)


def _tensors(out: Any) -> list[torch.Tensor]:
    return [v.detach().clone() for _, desc, v in walk(out, "out") if desc is None and isinstance(v, torch.Tensor)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bitwise equality (NaNs with the same bits are equal), tensor by tensor."""
    def raw(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1)
        flat = torch.view_as_real(flat).reshape(-1) if flat.is_complex() else flat
        return flat.contiguous().view(torch.uint8)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(raw(x), raw(y)) for x, y in zip(a, b))


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    diffs = [(x.double() - y.double()).abs().nan_to_num(0.0).max().item() for x, y in zip(a, b)
             if x.is_floating_point() and x.numel()]
    return max(diffs, default=0.0)


def _calls(model: torch.nn.Module, bundle: Bundle, on_call=None) -> list[list[torch.Tensor]]:
    """The calls of the plant, one per latents variant; under torch's deterministic algorithms for a class that adds
    with atomics (:meth:`ZooCase.determinism`), twin and accelerated model alike."""
    outs = []
    for i, variant in enumerate(bundle.variants):
        bundle.latents.copy_(variant)
        _seed_call(i)
        with torch.no_grad(), bundle.case.determinism():
            outs.append(_tensors(model(**bundle.inputs)))
        if on_call is not None:
            on_call()
    return outs


def _twin_repeats(bundle: Bundle, state: PlantState, expected: list[list[torch.Tensor]]) -> bool:
    """Whether the eager twin gives the same bits on a second run of the same calls (the plant's state reset)."""
    state.reset()
    try:
        again = _calls(bundle.twin, bundle)
    except Exception:  # noqa: BLE001 - a twin that raises now is not repeatable
        return False
    return all(_same(a, b) for a, b in zip(again, expected))


def _replays(model: torch.nn.Module) -> int:
    """Graph replays so far: whole-call hits of keys not in module mode, and child-graph hits."""
    stats = bcg_diffusion.get_stats(model)
    return sum(e.hits for e in stats.entries if not e.module_mode) + stats.child_hits


def _named(result: PlantResult, class_name: str, messages: list[str]) -> bool:
    places = [p for p in result.places if p != "?"]
    needles = [p for p in places if p] + ([class_name] if "" in places else []) + [result.site.split(":", 1)[1].split(" at ")[0]]
    return any(needle in message for needle in needles for message in messages)


def _error(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames)
    return f"{type(exc).__name__}: {message} | {where}"


def _accelerated_calls(bundle: Bundle, device: torch.device, result: PlantResult) -> tuple[list, Any, list[str]]:
    """Accelerate the model and make the calls, listening; an exception that reaches the caller makes
    ``result`` a crash. Notes in ``result`` in how many calls a graph replayed. Returns the outputs, the
    stats and what the library said: its capture warnings, why module mode runs Python eagerly (the stats),
    the capture outcomes, its problems and eager reasons (:func:`~bcg_diffusion.toolkit.listening.listening`)."""
    per_call: list[int] = []
    got: list = []
    with listening() as heard:
        try:
            bcg_diffusion.accelerate_transformer(
                bundle.model, bcg_diffusion.BCGConfig(allow_unknown=True, debug=device.type != "cuda"))
            got = _calls(bundle.model, bundle, on_call=lambda: per_call.append(_replays(bundle.model)))
        except Exception as exc:  # noqa: BLE001 - an exception reaching the caller is the verdict
            result.status, result.error = "crash", _error(exc)
        stats = bcg_diffusion.get_stats(bundle.model)
    result.replayed_calls = sum(b > a for a, b in zip([0] + per_call, per_call))
    module_mode = [e.eager_reason for e in stats.entries if e.eager_reason]
    said = [*heard.capture_warnings, *module_mode, *heard.outcomes, *heard.problems, *heard.eager_reasons]
    return got, stats, list(dict.fromkeys(said))


def run_plant(spec: PlantSpec, bundle: Bundle, seed: int, device: torch.device, site: Site | None = None) -> PlantResult:
    """Plant (at ``site``, default: drawn for ``spec``), run the twin and the accelerated model, undo;
    never raises."""
    kind = KINDS[spec.kind]
    result = PlantResult(spec.index, spec.case, spec.site_kind, spec.kind, kind.family)
    start = time.perf_counter()
    site = site or choose_site(spec, bundle.survey, seed)
    if site is None:
        result.status, result.error = "invalid", "the case has no site"
        return result
    result.site, result.site_kind = site.label(), site.kind
    result.assumption = site.kind not in OPAQUE_SITES and kind.family == HIDDEN_STATE
    state = PlantState()
    plant = Plant(kind, state, bundle.paths)
    models = (bundle.model, bundle.twin)
    undos = [install(site, plant, models)]
    if kind.name == "dropout":
        undos.append(train_mode(site, models))
    accelerated = False
    try:
        try:
            expected = _calls(bundle.twin, bundle)
        except Exception as exc:  # noqa: BLE001 - the plant broke the model itself
            result.status, result.error = "invalid", f"the twin raised: {_error(exc)}"
            return result
        if state.fired == 0:
            result.status, result.error = "invalid", "the plant never ran in the twin's calls"
            return result
        state.reset()
        accelerated = True  # from here on, remove_acceleration runs (a no-op if it did not happen)
        got, stats, said = _accelerated_calls(bundle, device, result)
        result.messages = said[:20]
        result.suspicious = [line for line in said if any(mark in line for mark in SUSPICIOUS)]
        result.eager_modules = sorted({m for e in stats.entries for m in e.eager_modules})
        result.module_mode = any(e.module_mode for e in stats.entries)
        result.host_random = any(e.fallback == HOST_RANDOM for e in stats.entries)
        result.counters = {n: getattr(stats, n) for n in (
            "hits", "misses", "captures", "failed_captures", "eager_calls", "warmup_calls", "child_hits", "child_eager_calls")}
        result.fired, result.fired_in_capture = state.fired, state.fired_in_capture
        result.places = sorted(state.places)
        if result.status != "crash":
            result.equal = [_same(a, b) for a, b in zip(got, expected)]
            result.max_diff = max((_max_diff(a, b) or 0.0 for a, b in zip(got, expected)), default=0.0)
            result.status = "ok" if all(result.equal) else "different"
            if result.status == "different" and not _twin_repeats(bundle, state, expected):
                result.status = "unrepeatable"
                result.error = "the eager twin gave other bits on a second run (a nondeterministic kernel): no verdict"
        must_name = (site.kind in OPAQUE_SITES and site.kind != "hook") or (
            kind.family == HOST_READ and result.fired_in_capture > 0)
        if must_name:
            result.named = _named(result, type(bundle.model).__name__, said)
    except Exception as exc:  # noqa: BLE001 - the harness itself failed: the plant is invalid
        result.status, result.error = "invalid", f"harness: {_error(exc)}"
    finally:
        if accelerated:
            with contextlib.suppress(Exception):
                bcg_diffusion.remove_acceleration(bundle.model)
        for undo in reversed(undos):
            undo()
        result.seconds = round(time.perf_counter() - start, 3)
    return result


# -- the run --------------------------------------------------------------------------------------------------
def _cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - an illegal access poisons the context for every later plant
        return False


def run(seed: int, plants: int, device: torch.device, dtype: torch.dtype, time_budget: float,
        classes: str | None = None, calls: int = CALLS, on_result=None, on_start=None,
        only: set[int] | None = None) -> list[PlantResult]:
    """Plan ``plants`` plants from ``seed`` and run them in order (only the indices in ``only``, if
    given: the plan stays the same) until ``time_budget`` seconds have passed (the rest are ``skipped``)."""
    cases = {c.name: c for c in planted_cases(classes)}
    specs = [s for s in plan(seed, plants, list(cases.values())) if only is None or s.index in only]
    bundles: dict[str, Bundle | str] = {}
    results = []
    start = time.perf_counter()
    alive = True
    for spec in specs:
        if not alive or time.perf_counter() - start > time_budget:
            why = "CUDA context lost" if not alive else f"time budget {time_budget:.0f} s"
            result = PlantResult(spec.index, spec.case, spec.site_kind, spec.kind, KINDS[spec.kind].family,
                                 status="skipped", error=why)
        else:
            if on_start is not None:  # before the case is built: a death while building it is this plant's
                on_start(spec)
            if spec.case not in bundles:
                try:
                    bundles[spec.case] = build_bundle(cases[spec.case], device, dtype, calls)
                except Exception as exc:  # noqa: BLE001 - a case that cannot be built is reported per plant
                    bundles[spec.case] = f"building the case failed: {_error(exc)}"
            bundle = bundles[spec.case]
            if isinstance(bundle, str):
                result = PlantResult(spec.index, spec.case, spec.site_kind, spec.kind, KINDS[spec.kind].family,
                                     status="invalid", error=bundle)
            else:
                result = run_plant(spec, bundle, seed, device)
            if device.type == "cuda" and result.status == "crash":
                alive = _cuda_alive()
        results.append(result)
        if on_result is not None:
            on_result(result)
    bundles.clear()
    gc.collect()
    return results


def current_commit() -> str:
    """The checkout's commit (:func:`~bcg_diffusion.toolkit.provenance.checkout_commit`: ``BENCH_GIT_COMMIT`` where
    set, else git's); ``"unknown"`` where neither says."""
    return checkout_commit() or "unknown"


def parse_indices(text: str) -> set[int]:
    """``"3,10-12"`` -> ``{3, 10, 11, 12}``."""
    indices: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        indices.update(range(int(first), int(last or first) + 1))
    return indices


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plants", type=int, default=600)
    parser.add_argument("--out", type=Path, required=True, help="folder of planting.json and planting.md")
    parser.add_argument("--time-budget", type=finite_float, default=300.0, help="seconds; plants not started by then are skipped")
    parser.add_argument("--classes", help="comma-separated class or case names (default: one case per class)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu (debug mode)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--calls", type=int, default=CALLS, help="calls per plant (the first runs eagerly, the second captures)")
    parser.add_argument("--commit", default=None, help="the commit to report (default: git rev-parse HEAD)")
    parser.add_argument("--progress", action="store_true", help="print each plant to stderr as it starts")
    parser.add_argument("--jobs", type=int, default=0,
                        help="run the plan in child processes, this many at a time (0: in this process); a child "
                             "that dies costs only the plant it was running, reported as a crash")
    parser.add_argument("--chunk", type=int, default=100, help="plants per child process (with --jobs)")
    parser.add_argument("--in-process", action="store_true",
                        help="run every plant in this one process and write the progress as it goes "
                             "(planting_running.json, planting.jsonl, planting_fault.txt): a native crash ends "
                             "the run, and the plant it happened in is known")
    parser.add_argument("--rebuild-report", action="store_true",
                        help="write planting.json and planting.md in --out from the progress files of an "
                             "--in-process run that died (its running plant a crash, the rest skipped)")
    parser.add_argument("--results-jsonl", type=Path, default=None, help=argparse.SUPPRESS)  # a child's results
    parser.add_argument("--only", help="plant indices to run, of the same plan (e.g. 3,10-12): to reproduce one")
    return parser.parse_args(argv)


def _header(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    import diffusers

    return {
        "commit": args.commit or current_commit(), "seed": args.seed, "plants": args.plants,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (debug mode)",
        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__, "diffusers": diffusers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"), "time_budget_s": args.time_budget, "calls": args.calls,
    }


def _result_of(plant: dict, status: str, error: str) -> PlantResult:
    """A result with no run behind it (a crash, a skip) for a plant of the plan (a spec or its dict)."""
    return PlantResult(plant["index"], plant["case"], plant["site_kind"], plant["kind"], KINDS[plant["kind"]].family,
                       status=status, error=error)


def rebuild_report(out: Path) -> int:
    """``--rebuild-report``: the reports of an ``--in-process`` run that died, from its progress files."""
    try:
        header, results = rebuild(out, _result_of, lambda d: result_from_dict(PlantResult, d))
    except FileNotFoundError as exc:
        print(f"planting: {exc}", file=sys.stderr)
        return 2
    json_path, md_path = write_reports(out, results, header)
    print(f"the run died in plant {header['died_in_plant']}; wrote {json_path} and {md_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rebuild_report:
        return rebuild_report(args.out)
    if args.in_process and args.jobs > 0:
        print("planting: --in-process runs every plant in this process; leave out --jobs", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # models' own notes, once per call, would bury the results
    warnings.simplefilter("ignore")  # outside the accelerated calls (which record every warning)
    header = _header(args, device, dtype)
    started = time.perf_counter()
    results: list[PlantResult] = []
    only = parse_indices(args.only) if args.only else None
    progress = None
    if args.in_process:
        header["process"] = "one process (--in-process)"
        specs = [s for s in plan(args.seed, args.plants, planted_cases(args.classes)) if only is None or s.index in only]
        progress = ProgressLog(args.out, header, specs)

    def report(result: PlantResult) -> None:
        results.append(result)
        if progress is not None:
            progress.result(result)
        if args.results_jsonl is not None:
            with args.results_jsonl.open("a") as f:
                f.write(json.dumps(dataclasses.asdict(result)) + "\n")
        if result.status != "skipped" and not result.passed:
            print(f"{result.index} {result.case} {result.site} {result.kind}: {result.status}"
                  f"{' (assumption)' if result.assumption else ''}, replayed in {result.replayed_calls} calls, "
                  f"named {result.named} {result.error or '; '.join(result.suspicious)[:300]}", flush=True)
        if len(results) % 25 == 0:
            write_reports(args.out, results, dict(header, seconds=round(time.perf_counter() - started, 1)))

    def starting(spec: PlantSpec) -> None:
        if progress is not None:
            progress.start(spec)
        if args.progress:
            print(f"plant {spec.index}: {spec.case} {spec.site_kind} {spec.kind} "
                  f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)

    if args.jobs > 0:
        specs = plan(args.seed, args.plants, planted_cases(args.classes))
        header.update(jobs=args.jobs, chunk=args.chunk)
        run_in_processes(args, [s.index for s in specs if only is None or s.index in only],
                         lambda i, status, error: _result_of(dataclasses.asdict(specs[i]), status, error),
                         lambda d: result_from_dict(PlantResult, d), report)
    else:
        run(args.seed, args.plants, device, dtype, args.time_budget, args.classes, args.calls, on_result=report,
            on_start=starting if args.progress or progress is not None else None, only=only)
    json_path, md_path = write_reports(args.out, results, dict(header, seconds=round(time.perf_counter() - started, 1)))
    if progress is not None:
        progress.finish()
    print("\n".join(md_path.read_text().split("\n## ")[0].splitlines()[4:14]))  # the totals
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
