"""Probe every zoo transformer (``pipelines.zoo``) through ``bcg_diffusion.accelerate_transformer``.

For each case: build the tiny model (random weights, seed 0) on the device, run the eager forward twice
(is eager repeatable?), accelerate it with ``BCGConfig(allow_unknown=True)``, call it three times with the
same inputs and once with a fresh copy of them (other tensor objects, same values), compare every output
bitwise with the first eager output, and read ``get_stats``: what was captured (keys, segments, breaks,
eager modules), why a key fell back, how many calls ran eagerly and why (the runner events, through
``bcg_diffusion.toolkit.listening``).
Every failure is caught per case and recorded as a result. A JSON file and a Markdown table are written
after each case. Without CUDA, acceleration is a no-op: the probe then checks eager determinism and the
plumbing only. ``--sync-scan`` (CUDA) also lists every host synchronisation one eager forward makes
(``torch.cuda.set_sync_debug_mode``), with the first source line outside torch.

Examples::

    python scripts/zoo_probe.py                                   # every case, bf16 on CUDA
    python scripts/zoo_probe.py --classes LTX2VideoTransformer3DModel,HiDreamImageTransformer2DModel --sync-scan
    python scripts/zoo_probe.py --dtype fp32 --out bench_results/zoo_fp32 --time-budget 500
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

import bcg_diffusion
from bcg_diffusion.core import walk
from bcg_diffusion.toolkit.listening import listening
from bcg_pipelines import zoo
from bcg_diffusion.toolkit.numbers import finite_float

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_OUT = Path("bench_results")
# calls with the same inputs (a key's first call runs eagerly, the second captures, the third replays),
# then one with a fresh copy of them
ACCELERATED_CALLS = 3


@dataclass
class CaseResult:
    """What one case did. ``status``: ``captured`` (every accelerated call but a key's first, which runs
    eagerly by design, replayed a graph; ``(module mode)``: the forward ran eagerly and its children
    replayed), ``partial`` (some calls replayed, some ran eagerly), ``fallback`` (keys were made but fell
    back), ``no key`` (every call ran eagerly before keying), ``not accelerated`` (no CUDA), ``mismatch``
    (an accelerated output differed from eager), ``crash`` (an exception; ``phase`` says where),
    ``skipped`` (time budget or a lost CUDA context)."""

    case: str
    class_name: str
    note: str = ""
    status: str = ""
    phase: str = ""
    error: str = ""
    eager_repeatable: bool | None = None
    eager_max_diff: float | None = None
    bitwise: list[bool] = field(default_factory=list)  # per accelerated call, the last one on fresh inputs
    max_diff: list[float | None] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    eager_reasons: list[str] = field(default_factory=list)  # why calls ran eagerly (the runner events)
    warnings: list[str] = field(default_factory=list)
    sync_sites: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


# -- comparing outputs -------------------------------------------------------------------------------
def output_tensors(out: Any) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in a forward's output, in walk order."""
    return [(path, value) for path, desc, value in walk(out, "out") if desc is None and isinstance(value, torch.Tensor)]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.contiguous().view(torch.uint8)


def compare(reference: list[tuple[str, torch.Tensor]], out: Any) -> tuple[bool, float | None]:
    """(bitwise equal, max absolute difference or ``None`` when structures differ) of ``out`` against
    ``reference``'s tensors."""
    tensors = output_tensors(out)
    if [p for p, _ in tensors] != [p for p, _ in reference] or any(
        a.shape != b.shape or a.dtype != b.dtype for (_, a), (_, b) in zip(tensors, reference)
    ):
        return False, None
    equal, diff = True, 0.0
    for (_, ref), (_, got) in zip(reference, tensors):
        if not torch.equal(_bits(ref), _bits(got)):
            equal = False
        if ref.is_floating_point() or ref.is_complex():
            delta = (got.detach().to(torch.complex128 if ref.is_complex() else torch.float64)
                     - ref.detach().to(torch.complex128 if ref.is_complex() else torch.float64)).abs()
            finite = delta[torch.isfinite(delta)]
            diff = max(diff, float(finite.max()) if finite.numel() else 0.0)
        elif not torch.equal(ref, got):
            diff = float("inf")
    return equal, diff


def snapshot(out: Any) -> list[tuple[str, torch.Tensor]]:
    return [(path, tensor.detach().clone()) for path, tensor in output_tensors(out)]


def stats_dict(model: torch.nn.Module) -> dict[str, Any] | None:
    stats = bcg_diffusion.get_stats(model)
    if not stats.active:
        return None
    record = dataclasses.asdict(stats)
    record["module_mode_keys"] = sum(e.module_mode for e in stats.entries)  # forward eager, children replay
    record["text"] = str(stats)
    return record


def classify(result: CaseResult, accelerated: bool) -> str:
    if not accelerated:
        return "not accelerated"
    if result.bitwise and not all(result.bitwise):
        return "mismatch"
    stats = result.stats or {}
    entries = stats.get("entries", ())
    if not entries:
        return "no key"
    if all(e["fallback"] for e in entries):
        return "fallback"
    status = "captured" if stats.get("eager_calls", 0) == 0 else "partial"
    captured = sum(not e["fallback"] for e in entries)
    return f"{status} (module mode)" if stats.get("module_mode_keys") == captured else status


# -- host synchronisations of one eager forward (CUDA) -----------------------------------------------
def _first_frame_outside_torch(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame of model code: not torch, bcg_diffusion, this script or the warnings module."""
    skipped = (__file__, warnings.__file__)
    for frame in reversed(stack):
        if "/torch/" in frame.filename or "/bcg_diffusion/" in frame.filename or frame.filename in skipped:
            continue
        return frame
    return None


def sync_sites(model: torch.nn.Module, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Every distinct source line (outside torch) that synchronised the host with the device during one
    eager forward, with its function and a count, in first-seen order."""
    sites: dict[tuple[str, int], dict[str, Any]] = {}
    previous = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001 - warnings API
        frame = _first_frame_outside_torch(traceback.extract_stack()[:-1])
        where = (frame.filename, frame.lineno) if frame else (filename, lineno)
        site = sites.setdefault(where, {
            "file": where[0].split("site-packages/")[-1], "line": where[1], "function": frame.name if frame else "",
            "code": (frame.line or "").strip() if frame else "", "count": 0, "message": str(message)[:120]})
        site["count"] += 1

    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        try:
            torch.cuda.set_sync_debug_mode("warn")
            with torch.no_grad():
                model(**kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(mode)
            warnings.showwarning = previous
    torch.cuda.synchronize()
    return list(sites.values())


# -- one case ------------------------------------------------------------------------------------------
def _call(model: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(**kwargs)


def probe_case(case: zoo.ZooCase, device: torch.device, dtype: torch.dtype, seed: int, scan_syncs: bool) -> CaseResult:
    """Run one case (see the module docstring); never raises."""
    result = CaseResult(case=case.name, class_name=case.class_name, note=case.note)
    start = time.perf_counter()
    model = None
    accelerated = False
    with listening() as heard:
        try:
            result.phase = "build"
            model = zoo.build_tiny(case, device, dtype, seed)
            kwargs = zoo.tiny_inputs(case, device, dtype, seed)
            result.phase = "eager"
            reference = snapshot(_call(model, kwargs))
            result.eager_repeatable, result.eager_max_diff = compare(reference, _call(model, kwargs))
            if scan_syncs and device.type == "cuda":
                result.phase = "sync scan"
                result.sync_sites = sync_sites(model, kwargs)
            result.phase = "accelerate"
            bcg_diffusion.accelerate_transformer(model, bcg_diffusion.BCGConfig(allow_unknown=True))
            accelerated = bcg_diffusion.is_accelerated(model)
            result.phase = "accelerated calls"
            for fresh in [False] * ACCELERATED_CALLS + [True]:
                equal, diff = compare(reference, _call(model, copy.deepcopy(kwargs) if fresh else kwargs))
                result.bitwise.append(equal)
                result.max_diff.append(diff)
            result.phase = ""
            result.stats = stats_dict(model)
            result.status = classify(result, accelerated)
        except Exception as exc:  # noqa: BLE001 - a crash is a result
            result.status = "crash"
            result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
            frames = traceback.extract_tb(exc.__traceback__)[-3:]
            result.error += " | " + " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames)
            if model is not None:
                try:
                    result.stats = stats_dict(model)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            if model is not None:
                try:
                    bcg_diffusion.remove_acceleration(model)
                except Exception:  # noqa: BLE001 - cleanup must not mask the result
                    pass
    result.eager_reasons = heard.eager_reasons
    result.warnings = [line[:300] for line in heard.warnings]
    result.seconds = round(time.perf_counter() - start, 3)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# -- reports ---------------------------------------------------------------------------------------------
def entry_summary(stats: dict[str, Any] | None) -> tuple[str, str, str, str, str]:
    """(keys, segments, breaks, eager modules, fallback reasons) cells."""
    if not stats:
        return "", "", "", "", ""
    entries = stats["entries"]
    captured = [e for e in entries if not e["fallback"]]
    modules = sorted({m for e in entries for m in e["eager_modules"]})
    module_mode = stats.get("module_mode_keys")
    return (
        f"{len(captured)}/{len(entries)}" + (f" ({module_mode} module mode)" if module_mode else ""),
        ", ".join(str(e["segments"]) for e in captured),
        ", ".join(str(e["breaks"]) for e in captured),
        ", ".join(modules),
        "; ".join(sorted({e["fallback"] for e in entries if e["fallback"]})),
    )


def _cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markdown(results: list[CaseResult], header: dict[str, Any]) -> str:
    lines = [
        f"# Zoo probe: {header['device']} {header['dtype']}, torch {header['torch']}, diffusers {header['diffusers']}",
        "",
        f"{header['date']}; {header['done']} of {header['total']} cases; status counts: "
        + ", ".join(f"{k} {v}" for k, v in header["counts"].items()),
        "",
        "| case | status | eager repeatable | accelerated calls bitwise (3 same, 1 fresh) | captured keys | segments "
        "| breaks | eager modules | first / eager calls | fallback / eager reason | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        keys, segments, breaks, modules, fallback = entry_summary(r.stats)
        reason = fallback or "; ".join(r.eager_reasons) or (f"{r.phase}: {r.error}" if r.error else "")
        calls = "".join("=" if ok else "x" for ok in r.bitwise)
        eager_calls = "" if not r.stats else f"{r.stats.get('warmup_calls', 0)} / {r.stats['eager_calls']}"
        lines.append(
            f"| {r.case} | {r.status} | {'' if r.eager_repeatable is None else ('yes' if r.eager_repeatable else 'NO')} "
            f"| {calls} | {keys} | {segments} | {breaks} | {_cell(modules, 80)} | {eager_calls} | {_cell(reason)} "
            f"| {r.seconds:.1f} |"
        )
    scanned = [r for r in results if r.sync_sites]
    if scanned:
        lines += ["", "## Host synchronisations of one eager forward", ""]
        for r in scanned:
            sites = [f"`{s['file']}:{s['line']}` {s['function']} ({s['count']}x): `{_cell(s['code'], 90)}`"
                     for s in r.sync_sites]
            lines.append(f"- **{r.case}**: " + "; ".join(sites))
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, stem: str, results: list[CaseResult], header: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    header = dict(header, done=sum(r.status != "skipped" for r in results), counts=counts)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({"header": header, "results": [dataclasses.asdict(r) for r in results]}, indent=1))
    md_path.write_text(markdown(results, header))
    return json_path, md_path


# -- selection and main ----------------------------------------------------------------------------------
def select_cases(names: str | None) -> list[zoo.ZooCase]:
    """All zoo cases, or those whose class name or case name is in the comma-separated ``names``
    (``SystemExit`` naming the unknown ones)."""
    cases = zoo.zoo_cases()
    if not names:
        return cases
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(n in (c.class_name, c.name) for c in cases)]
    if unknown:
        raise SystemExit(f"zoo_probe: no zoo case for {', '.join(unknown)}; the classes are: "
                         + ", ".join(sorted({c.class_name for c in cases})))
    return [c for c in cases if c.class_name in wanted or c.name in wanted]


def _cuda_context_alive() -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - an illegal access poisons the context for every later case
        return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", help="comma-separated class or case names (default: every case)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON and Markdown reports")
    parser.add_argument("--time-budget", type=finite_float, default=540.0,
                        help="seconds; cases not started within it are reported as skipped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-scan", action="store_true",
                        help="CUDA: list every host synchronisation of one eager forward per case")
    return parser.parse_args(argv)


def iter_results(cases: list[zoo.ZooCase], args: argparse.Namespace, device: torch.device) -> Iterator[CaseResult]:
    start = time.perf_counter()
    alive = True
    for case in cases:
        if not alive or time.perf_counter() - start > args.time_budget:
            why = "CUDA context lost in an earlier case" if not alive else f"time budget {args.time_budget:.0f} s"
            yield CaseResult(case=case.name, class_name=case.class_name, note=case.note, status="skipped", error=why)
            continue
        result = probe_case(case, device, DTYPES[args.dtype], args.seed, args.sync_scan)
        if device.type == "cuda" and result.status == "crash":
            alive = _cuda_context_alive()
        yield result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cases = select_cases(args.classes)
    import diffusers

    header = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype, "torch": torch.__version__, "diffusers": diffusers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"), "total": len(cases), "seed": args.seed,
    }
    stem = f"zoo_probe_{args.dtype}"
    results: list[CaseResult] = []
    for result in iter_results(cases, args, device):
        results.append(result)
        json_path, md_path = write_reports(args.out, stem, results, header)
        print(f"{result.case}: {result.status}" + (f" ({result.error})" if result.error else ""), flush=True)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
