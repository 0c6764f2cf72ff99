"""Per-call benchmark of full-size LTX-2, HunyuanVideo 1.5 and HiDream-I1 transformers: eager, bcg, whole_graph.

These classes have no pipeline builder (their text encoders are 8-12B parameters), so one transformer call is
timed, with the inputs their pipelines pass (``pipelines.zoo.full``) at a launch-bound shape. Per case, in one
process, on one model object built on the device in bf16 (random weights, seeded):

- ``eager``: warm-up calls, then the median of N timed calls (CUDA events), and a ``torch.profiler`` pass of one
  call: kernels per call, GPU-busy ms (union of device intervals) and the **GPU-busy fraction** = busy / eager
  median. ``1 / fraction`` is the most any graph can gain over eager at that shape.
- ``bcg``: ``bcg_diffusion.accelerate_transformer`` on the same model (first call runs eagerly, the second
  captures), then N timed replays; every output compared bitwise with eager's; ``get_stats`` (keys, segments,
  breaks, eager parts, fallback reasons, capture phases). ``remove_acceleration`` then restores eager (checked).
- ``whole_graph``: one ``torch.cuda.CUDAGraph`` of the whole call (warm-up on a side stream, static inputs);
  where capture fails the reason is recorded ("not capturable: ..."), else replays are timed and compared.

Every case is caught on its own (an error is a result), the model is freed between cases, and
``zoo_bench_<date>_<time>.json`` and ``.md`` are written into ``--out`` after each case. Without CUDA the
small configs run in fp32 on the CPU: acceleration is a no-op there, so that checks the plumbing only.

Examples::

    python scripts/zoo_bench.py --cases ltx2,hunyuanvideo15,hidream --time-budget 240
    python scripts/zoo_bench.py --cases hidream:height=1024:width=1024 --iters 10   # a shape override
    python scripts/zoo_bench.py --size small --iters 2 --out /tmp/zoo                # CPU plumbing check
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import bcg_diffusion
from bcg_diffusion.core import reset_generator_capture_state
from bcg_pipelines.zoo import full
from bcg_diffusion.toolkit.numbers import finite_float

from ..environment import git_commit
from ..timing import Clock, profile_kernels, summarize
from .zoo_probe import compare, entry_summary, listening, snapshot, stats_dict

DEFAULT_OUT = Path("bench_results")
DEFAULT_CASES = ",".join(full.FULL_CASES)


@dataclass
class CaseResult:
    """One case. ``status``: ``ok``, ``error`` (``phase`` says where; later modes did not run), ``skipped``."""

    case: str
    class_name: str
    checkpoint: str = ""
    size: str = ""
    status: str = ""
    phase: str = ""
    error: str = ""
    shape: dict[str, Any] = field(default_factory=dict)
    shape_text: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    params_b: float | None = None
    build_s: float | None = None
    eager: dict[str, Any] = field(default_factory=dict)
    bcg: dict[str, Any] = field(default_factory=dict)
    whole_graph: dict[str, Any] = field(default_factory=dict)
    speedup: dict[str, float | None] = field(default_factory=dict)
    source: str = ""
    note: str = ""
    eager_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def error_text(exc: BaseException) -> str:
    """``Type: first line | file:line <- ...`` of an exception (its last three frames)."""
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames)
    return f"{type(exc).__name__}: {message}" + (f" | {where}" if where else "")


def capture_error_text(exc: BaseException) -> str:
    """The first error of a failed capture, where the model synchronised (the error ``capture_end`` raises on
    leaving ``torch.cuda.graph`` hides it as ``__context__``), then the one that ended the capture."""
    chain = [exc]
    while chain[-1].__context__ is not None and len(chain) < 5:
        chain.append(chain[-1].__context__)
    text = error_text(chain[-1])
    return text if len(chain) == 1 else f"{text} (then {type(exc).__name__}: {str(exc).strip()[:120]})"


# -- calls and timing ------------------------------------------------------------------------------------
def _call(model: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(**kwargs)


def calls_for(call_s: float, iters: int, mode_seconds: float) -> int:
    """Timed calls of a mode whose call takes ``call_s``: about ``mode_seconds`` of calls, at least 3 and at
    most ``iters`` (``iters`` itself when it is below 3)."""
    if call_s <= 0:
        return iters
    return min(iters, max(3, math.ceil(mode_seconds / call_s)))


def timed(clock: Clock, fn: Callable[[], Any], iters: int, mode_seconds: float, estimate_s: float) -> dict[str, Any]:
    n = calls_for(estimate_s, iters, mode_seconds)
    return summarize(clock.calls(fn, n))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# -- the three modes -------------------------------------------------------------------------------------
def run_eager(model, kwargs, clock: Clock, args, cuda: bool) -> tuple[dict[str, Any], list]:
    call = lambda: _call(model, kwargs)  # noqa: E731
    first_s, out = clock.wall(call)
    reference = snapshot(out)
    del out
    repeat_s, out = clock.wall(call)
    repeatable, max_diff = compare(reference, out)
    del out
    for _ in range(max(0, args.warmup - 2)):
        call()
    record: dict[str, Any] = {"first_call_s": first_s, "repeatable": repeatable, "repeat_max_diff": max_diff}
    record.update(timed(clock, call, args.iters, args.mode_seconds, repeat_s))
    if cuda:
        profile = profile_kernels(call, 1)
        record.update(kernels=profile["kernels"], memory_ops=profile["memory_ops"],
                      kernel_time_ms=profile["kernel_time_ms"], gpu_busy_ms=profile["gpu_busy_ms"])
        record["busy_fraction"] = profile["gpu_busy_ms"] / record["median_ms"]
        record["limit_speedup"] = record["median_ms"] / profile["gpu_busy_ms"] if profile["gpu_busy_ms"] else None
    return record, reference


def capture_status(stats: dict[str, Any] | None, accelerated: bool, bitwise: list[bool]) -> str:
    """``not accelerated``, ``mismatch``, ``no key``, ``fallback``, ``captured`` or ``partial`` (some calls after a
    key's first ran eagerly), as ``zoo_probe`` names them."""
    if not accelerated:
        return "not accelerated"
    if bitwise and not all(bitwise):
        return "mismatch"
    entries = (stats or {}).get("entries", ())
    if not entries:
        return "no key"
    if all(e["fallback"] for e in entries):
        return "fallback"
    return "captured" if stats.get("eager_calls", 0) == 0 else "partial"


def run_bcg(model, kwargs, reference, clock: Clock, args) -> dict[str, Any]:
    record: dict[str, Any] = {"check_weights": args.check_weights, "bitwise": [], "max_diff": []}
    call = lambda: _call(model, kwargs)  # noqa: E731

    def checked(label: str) -> float:
        seconds, out = clock.wall(call)
        equal, diff = compare(reference, out)
        record["bitwise"].append(equal)
        record["max_diff"].append(diff)
        record[f"{label}_s"] = seconds
        return seconds

    try:
        bcg_diffusion.accelerate_transformer(model, bcg_diffusion.BCGConfig(check_weights=args.check_weights))
        record["accelerated"] = accelerated = bcg_diffusion.is_accelerated(model)
        checked("first_call")  # a key's first call runs eagerly
        checked("capture_call")  # its second captures
        replay_s = checked("first_replay")
        record.update(timed(clock, call, args.iters, args.mode_seconds, replay_s))
        checked("last_call")
        record["stats"] = stats = stats_dict(model)
        record["status"] = capture_status(stats, accelerated, record["bitwise"])
        if stats:
            keys, segments, breaks, eager_parts, fallback = entry_summary(stats)
            record.update(keys=keys, segments=segments, breaks=breaks, eager_parts=eager_parts, fallback=fallback,
                          capture_phases=[dict(e["capture_phases"]) for e in stats["entries"]])
    except Exception as exc:  # noqa: BLE001 - a failed mode is a result
        record["status"], record["error"] = "error", error_text(exc)
        try:
            record["stats"] = stats_dict(model)
        except Exception:  # noqa: BLE001
            pass
    finally:
        try:
            bcg_diffusion.remove_acceleration(model)
        except Exception as exc:  # noqa: BLE001
            record["remove_error"] = error_text(exc)
    try:
        record["eager_restored"] = compare(reference, call())[0]
    except Exception as exc:  # noqa: BLE001
        record["eager_restored"], record["restore_error"] = False, error_text(exc)
    return record


def _clone_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def reset_generators() -> None:
    """After a failed ``torch.cuda.graph`` capture, torch's CUDA generators can still believe they capture,
    and every later random op (the next case's weight init) raises "Offset increment outside graph
    capture": the capture core's reset clears that."""
    try:
        reset_generator_capture_state()
    except Exception as exc:  # noqa: BLE001 - the next case reports its own error
        print(f"    could not reset the CUDA generators after the failed capture: {error_text(exc)}", flush=True)


def run_whole_graph(model, kwargs, reference, clock: Clock, args, cuda: bool) -> dict[str, Any]:
    """One ``torch.cuda.CUDAGraph`` of the whole call: warm-up on a side stream (as torch's docs say), capture
    with static inputs; each timed call copies the live inputs in and replays."""
    if not cuda:
        return {"status": "n/a", "reason": "needs CUDA"}
    static = _clone_inputs(kwargs)
    graph, static_out = None, None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                _call(model, static)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        torch._C._cuda_clearCublasWorkspaces()  # the graph owns its cuBLAS workspace (see bench/modes.py)
        t0 = time.perf_counter()
        try:
            with torch.cuda.graph(graph):
                static_out = _call(model, static)
        except Exception as exc:  # noqa: BLE001 - the expected outcome for these classes
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
            reset_generators()
            return {"status": "not capturable", "reason": f"not capturable: {capture_error_text(exc)}"}
        torch.cuda.synchronize()
        record: dict[str, Any] = {"status": "ok", "capture_s": time.perf_counter() - t0}

        def replay():
            for key, value in kwargs.items():
                if isinstance(value, torch.Tensor):
                    static[key].copy_(value)
            graph.replay()
            return static_out

        replay_s, out = clock.wall(replay)
        record["bitwise"], record["max_diff"] = compare(reference, out)
        record.update(timed(clock, replay, args.iters, args.mode_seconds, replay_s))
        record["bitwise_last"] = compare(reference, replay())[0]
        return record
    except Exception as exc:  # noqa: BLE001
        return {"status": "error", "reason": error_text(exc)}
    finally:
        graph = static_out = static = None  # noqa: F841 - frees the graph's pool and inputs


# -- one case --------------------------------------------------------------------------------------------
def run_case(spec: tuple[str, dict[str, Any]], args, device: torch.device, dtype: torch.dtype) -> CaseResult:
    """Build, time the three modes and free the model; never raises."""
    name, overrides = spec
    case = full.get_case(name)
    cuda = device.type == "cuda"
    clock = Clock(cuda)
    result = CaseResult(case=name, class_name=case.class_name, checkpoint=case.checkpoint, size=args.size,
                        source=case.source, note=case.note)
    start = time.perf_counter()
    model = kwargs = reference = None
    with listening() as heard:
        try:
            result.phase = "shape"
            config = case.config_for(args.size)
            result.shape = case.shape_for(args.size, **overrides)
            result.shape_text = case.describe(config, result.shape)
            result.tokens = case.tokens(config, result.shape)
            result.phase = "build"
            t0 = time.perf_counter()
            model = full.build_model(case, args.size, device, dtype, args.seed)
            clock.sync()
            result.build_s = time.perf_counter() - t0
            result.params_b = full.parameter_count(model) / 1e9
            result.phase = "inputs"
            maker = full.InputMaker(device, dtype, args.seed, config)
            kwargs = case.make_inputs(maker, result.shape)
            result.phase = "eager"
            result.eager, reference = run_eager(model, kwargs, clock, args, cuda)
            result.phase = "bcg"
            result.bcg = run_bcg(model, kwargs, reference, clock, args)
            result.phase = "whole_graph"
            result.whole_graph = run_whole_graph(model, kwargs, reference, clock, args, cuda)
            result.phase = ""
            result.status = "ok"
        except Exception as exc:  # noqa: BLE001 - a crash is a result
            result.status, result.error = "error", error_text(exc)
    result.eager_reasons, result.warnings = heard.eager_reasons, heard.warnings
    eager_ms = result.eager.get("median_ms")
    result.speedup = {
        "bcg": _ratio(eager_ms, result.bcg.get("median_ms")),
        "whole_graph": _ratio(eager_ms, result.whole_graph.get("median_ms")),
        "limit": result.eager.get("limit_speedup"),
    }
    del model, kwargs, reference
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    result.seconds = round(time.perf_counter() - start, 2)
    return result


# -- reports ---------------------------------------------------------------------------------------------
def _f(value: Any, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _params(value: float | None) -> str:
    return "" if value is None else (f"{value:.2f}" if value >= 0.01 else f"{value:.2g}")


def _cell(text: Any, limit: int = 140) -> str:
    text = str(text or "").replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bitwise(r: CaseResult) -> str:
    calls = r.bcg.get("bitwise") or []
    marks = "".join("=" if ok else "x" for ok in calls)
    if not calls:
        return ""
    return ("yes " if all(calls) else "NO ") + marks


def _whole_cell(r: CaseResult) -> str:
    wg = r.whole_graph
    if not wg:
        return ""
    if wg.get("status") == "ok":
        return f"{_f(wg.get('median_ms'))} ({_f(r.speedup.get('whole_graph'))}x, " + \
            ("bitwise" if wg.get("bitwise") else "NOT bitwise") + ")"
    return _cell(wg.get("reason") or wg.get("status"), 120)


def _parts_cell(r: CaseResult) -> str:
    b = r.bcg
    if not b.get("keys"):
        return _cell(b.get("status", ""))
    text = f"{b.get('status')}: keys {b['keys']}, segments {b.get('segments')}, breaks {b.get('breaks')}"
    if b.get("eager_parts"):
        text += f", eager {b['eager_parts']}"
    return _cell(text, 220)


def markdown(results: list[CaseResult], header: dict[str, Any]) -> str:
    lines = [
        f"# Zoo bench (per transformer call): {header['device']} {header['dtype']}, torch {header['torch']}, "
        f"diffusers {header['diffusers']}",
        "",
        f"{header['date']}, commit {header['git_commit']}; size {header['size']}; {header['done']} of "
        f"{header['total']} cases; up to {header['iters']} timed calls per mode (about {header['mode_seconds']} s), "
        f"BCG check_weights={header['check_weights']}. " + " ".join(header.get("notes", [])),
        "",
        "`GPU-busy fraction` = GPU-busy time of one profiled eager call / eager median; `limit` = its inverse, the "
        "most any graph can gain at this shape. `bitwise`: every BCG output (first eager call, capture, first "
        "replay, after timing) against eager's.",
        "",
        "| case | shape | tokens per call | params (B) | eager ms | eager kernels | GPU-busy fraction (limit) "
        "| bcg ms | bcg x eager | bitwise | whole_graph ms or reason | keys / segments / breaks / eager parts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.status != "ok":
            reason = r.error if r.status == "skipped" else f"{r.phase}: {r.error}"
            lines.append(f"| {r.case} | {_cell(r.shape_text, 90)} | | {_params(r.params_b)} "
                         f"| {r.status}: {_cell(reason)} | | | | | | | |")
            continue
        e = r.eager
        busy = "" if e.get("busy_fraction") is None else f"{e['busy_fraction']:.2f} ({_f(e.get('limit_speedup'))}x)"
        tokens = ", ".join(f"{k} {v}" for k, v in r.tokens.items())
        bcg_ms = _f(r.bcg.get("median_ms")) if r.bcg.get("status") != "error" else f"error: {_cell(r.bcg['error'])}"
        lines.append(
            f"| {r.case} | {_cell(r.shape_text, 120)} | {tokens} | {_params(r.params_b)} | {_f(e.get('median_ms'))} "
            f"| {e.get('kernels', '')} | {busy} | {bcg_ms} | {_f(r.speedup.get('bcg'))} | {_bitwise(r)} "
            f"| {_whole_cell(r)} | {_parts_cell(r)} |"
        )
    lines += ["", "## Per case", ""]
    for r in results:
        parts = [f"**{r.case}** ({r.class_name}, {r.checkpoint}): {r.note}.", f"Config: {r.source}."]
        if r.status == "ok":
            e, b = r.eager, r.bcg
            parts.append(f"Build {_f(r.build_s, 1)} s; eager first call {_f(e.get('first_call_s'), 3)} s, "
                         f"p10-p90 {_f(e.get('p10_ms'))}-{_f(e.get('p90_ms'))} ms over {e.get('n')} calls, "
                         f"repeatable {e.get('repeatable')}.")
            if b.get("status") not in (None, "error", "not accelerated"):
                phases = "; ".join(", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in p.items() if v >= 5e-4)
                                   for p in b.get("capture_phases", []))
                parts.append(f"BCG first call {_f(b.get('first_call_s'), 3)} s, capture call "
                             f"{_f(b.get('capture_call_s'), 3)} s ({phases}); eager restored after "
                             f"remove_acceleration: {b.get('eager_restored')}.")
            if b.get("fallback"):
                parts.append(f"Fallback: {b['fallback']}.")
        if r.eager_reasons:
            parts.append("Eager reasons: " + "; ".join(r.eager_reasons[:5]) + ".")
        parts.append(f"{r.seconds:.1f} s in all.")
        lines.append("- " + " ".join(parts))
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, stem: str, results: list[CaseResult], header: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    header = dict(header, done=sum(r.status == "ok" for r in results))
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({"header": header, "results": [dataclasses.asdict(r) for r in results]},
                                    indent=1, default=str))
    md_path.write_text(markdown(results, header))
    return json_path, md_path


# -- selection and main ----------------------------------------------------------------------------------
def parse_cases(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``"ltx2,hidream:height=1024:width=1024"`` -> ``[("ltx2", {}), ("hidream", {...})]``; ``SystemExit`` naming
    the known cases (or the shape keys) for a bad entry."""
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, rest = item.partition(":")
        if name not in full.FULL_CASES:
            raise SystemExit(f"zoo_bench: unknown case {name!r}; the known cases are: {', '.join(full.FULL_CASES)}")
        try:
            overrides = full.parse_shape_overrides(rest)
            full.FULL_CASES[name].shape_for("full", **overrides)
        except ValueError as exc:
            raise SystemExit(f"zoo_bench: {exc}") from None
        specs.append((name, overrides))
    if not specs:
        raise SystemExit(f"zoo_bench: no case given; the known cases are: {', '.join(full.FULL_CASES)}")
    return specs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help=f"comma-separated NAME[:KEY=VALUE...] (default {DEFAULT_CASES}); keys override the shape")
    parser.add_argument("--size", choices=full.SIZES, default="full",
                        help="published config (default) or the small one; without CUDA always small")
    parser.add_argument("--iters", type=int, default=20, help="at most this many timed calls per mode (default 20)")
    parser.add_argument("--mode-seconds", type=finite_float, default=3.0,
                        help="timed calls per mode: about this many seconds of calls, at least 3 (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="eager calls before timing (at least the 2 compared)")
    parser.add_argument("--time-budget", type=finite_float, default=900.0,
                        help="seconds; cases not started within it are reported as skipped (default 900)")
    parser.add_argument("--check-weights", default="per_pipeline_call",
                        choices=("per_pipeline_call", "every_call", "auto"),
                        help="BCGConfig.check_weights of the bcg mode. A bare transformer's library default ('auto') "
                        "recomputes the weight fingerprint on every call; inside a pipeline it is read once per "
                        "pipeline call, which the default here mimics, as bench_step.py does "
                        "(default: per_pipeline_call)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON and Markdown reports")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    specs = parse_cases(args.cases)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    notes = []
    if not cuda:
        if args.size != "small":
            notes.append(f"No CUDA: --size {args.size} replaced by small.")
        args.size = "small"
        notes.append("No CUDA: small configs in fp32 on the CPU; accelerate_transformer is a no-op there, so `bcg` "
                     "is eager and `whole_graph` n/a (this checks the script, not BCG).")
    import diffusers

    header = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu", "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "bcg_diffusion": bcg_diffusion.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"), "git_commit": git_commit(), "size": args.size,
        "total": len(specs), "iters": args.iters, "mode_seconds": args.mode_seconds, "warmup": args.warmup,
        "check_weights": args.check_weights, "time_budget_s": args.time_budget, "seed": args.seed, "notes": notes,
        "command": "python scripts/zoo_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    for note in notes:
        print(note, flush=True)
    stem = time.strftime("zoo_bench_%Y-%m-%d_%H%M%S")
    results: list[CaseResult] = []
    start = time.perf_counter()
    json_path = md_path = None
    for spec in specs:
        name = spec[0]
        if time.perf_counter() - start > args.time_budget:
            case = full.FULL_CASES[name]
            result = CaseResult(case=name, class_name=case.class_name, checkpoint=case.checkpoint, size=args.size,
                                status="skipped", error=f"time budget {args.time_budget:.0f} s spent")
        else:
            result = run_case(spec, args, device, dtype)
        results.append(result)
        json_path, md_path = write_reports(args.out, stem, results, header)
        print(summary_line(result), flush=True)
    print(f"wrote {json_path} and {md_path}")
    return 0


def summary_line(r: CaseResult) -> str:
    if r.status != "ok":
        return f"{r.case}: {r.status} ({r.phase + ': ' if r.phase else ''}{r.error})"
    e, b, wg = r.eager, r.bcg, r.whole_graph
    busy = f", GPU-busy fraction {e['busy_fraction']:.2f}" if e.get("busy_fraction") is not None else ""
    bcg = (f"bcg {_f(b.get('median_ms'))} ms ({_f(r.speedup.get('bcg'))}x, {b.get('status')}, "
           f"bitwise {all(b.get('bitwise') or [False])})" if b.get("status") != "error" else f"bcg error {b['error']}")
    whole = f"whole_graph {_f(wg.get('median_ms'))} ms" if wg.get("status") == "ok" else \
        f"whole_graph {wg.get('reason') or wg.get('status')}"
    return (f"{r.case}: {r.shape_text}; {_params(r.params_b)}B params, built in {r.build_s:.1f} s; eager "
            f"{_f(e.get('median_ms'))} ms{busy}; {bcg}; {whole[:160]}")


if __name__ == "__main__":
    raise SystemExit(main())
