"""The checks of a soak (:mod:`.soak`) and its reports, ``soak.json`` and ``soak.md``.

The checks: every request answered (a client that disconnects excepted) and ``/stats`` balanced (requests = ok
+ errors, every request sent counted); every answer the one its kind expects (images 200, bad requests their
4xx, the injected faults their 5xx); no 5xx but the injected faults, seen by the clients and counted by the
server; equal requests equal during the load and equal to the same request sent alone; GPU memory at the idle
checkpoints after the warm-up phase within ``gpu_tolerance`` of the first one, resident memory within
``host_tolerance`` (not measured: no GPU, or no ``/proc``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .report import percentile

__all__ = ["checks_of", "memory_drift", "report", "write_reports"]

MIB = 2**20
LISTED = 20  # unexpected answers listed in full (all are counted)
FAULT_KINDS = ("fault_error", "fault_oom")


def by_kind(outcomes: list, kinds: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per kind (of ``kinds``): requests sent, answered, as expected, and the statuses seen."""
    out = {}
    for kind in kinds:
        mine = [o for o in outcomes if o.kind == kind]
        out[kind] = {"sent": len(mine), "answered": sum(o.status != 0 for o in mine),
                     "as_expected": sum(o.as_expected for o in mine),
                     "statuses": dict(sorted(Counter(str(o.status) for o in mine).items()))}
    return out


def unexpected(outcomes: list, requests: list) -> list[dict[str, Any]]:
    what = {r.index: r.what for r in requests}
    return [{"index": o.index, "kind": o.kind, "status": o.status, "expected": list(o.expect), "error": o.error,
             "bad_request": what.get(o.index) or None} for o in outcomes if not o.as_expected][:LISTED]


def server_counters(run: Any) -> dict[str, Any]:
    """``/stats`` counters over the soak: requests, ok, errors by status; balanced when requests = ok + errors."""
    start, end = run.stats_start.get("counters", {}), run.stats_end.get("counters", {})
    errors = {k: v - start.get("errors", {}).get(k, 0) for k, v in end.get("errors", {}).items()}
    errors = {k: v for k, v in errors.items() if v}
    requests, ok = end.get("requests", 0) - start.get("requests", 0), end.get("ok", 0) - start.get("ok", 0)
    return {"requests": requests, "ok": ok, "errors": errors, "balanced": requests == ok + sum(errors.values()),
            "idle_at_end": run.stats_end.get("idle"), "error": run.stats_end.get("error")}


def image_checks(run: Any) -> dict[str, Any]:
    """Equal requests during the load, and each against the same request sent alone (decoded pixels)."""
    loaded: dict[str, set] = defaultdict(set)
    for o in run.outcomes:
        if o.identity and o.status == 200 and not o.error:
            loaded[o.identity].add(o.pixel_hashes)
    inconsistent = [i for i, seen in loaded.items() if len(seen) > 1]
    mismatched = [a.index for a in run.alone if a.status == 200 and loaded.get(a.identity) != {a.pixel_hashes}]
    failed = [a.index for a in run.alone if a.status != 200 or a.error]
    return {"distinct_answered": len(loaded), "inconsistent_identities": len(inconsistent),
            "alone_sent": len(run.alone), "alone_equal": len(run.alone) - len(mismatched) - len(failed),
            "alone_mismatched": mismatched, "alone_failed": failed}


def memory_drift(checkpoints: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """``name`` at the idle checkpoints after the warm-up phase against the first of them (the end of the
    warm-up): the largest relative change. ``None`` when it was not read."""
    values = [c.get(name) for c in checkpoints[1:]]
    if len(values) < 2 or any(v is None for v in values) or not values[0]:
        return None
    base = values[0]
    return {"after_warmup": base, "values": values, "max_change": max(abs(v - base) / base for v in values[1:])}


def checks_of(summary: dict[str, Any], gpu_tolerance: float, host_tolerance: float) -> dict[str, bool | None]:
    """Each check by name (``None``: not measured)."""
    kinds, counters, images = summary["by_kind"], summary["server_counters"], summary["images"]
    faults = sum(kinds[k]["sent"] for k in FAULT_KINDS)
    server_5xx = sum(v for k, v in counters["errors"].items() if k.startswith("5"))
    gpu, host = summary["gpu_memory"], summary["host_memory"]
    return {
        "the server answered to the end": not summary["server_counters"]["error"],
        "every request sent": summary["not_sent"] == 0,
        "0 lost requests: every request answered": summary["lost"] == 0,
        "0 lost requests: /stats requests = ok + errors": counters["balanced"],
        "every request sent counted by the server": counters["requests"] == summary["sent"],
        "every answer as its kind expects": summary["unexpected_count"] == 0,
        "no 5xx but the injected faults (clients)": summary["client_5xx_not_injected"] == 0,
        "no 5xx but the injected faults (server)": server_5xx == faults,
        "equal requests equal during the load": images["inconsistent_identities"] == 0,
        "every image equal to the same request alone": (images["alone_sent"] > 0 and not images["alone_mismatched"]
                                                        and not images["alone_failed"]),
        # what the warm-up promises: every request replays (a new key captured while serving keeps its graph's memory)
        "nothing captured while serving (BCG: 0 new keys, 0 captures)": None if summary["bcg"] is None
        else summary["bcg"]["captures"] == 0 and summary["bcg"]["misses"] == 0,
        f"GPU memory after warm-up within {100 * gpu_tolerance:g} %": None if gpu is None
        else gpu["max_change"] <= gpu_tolerance,
        f"host memory after warm-up within {100 * host_tolerance:g} %": None if host is None
        else host["max_change"] <= host_tolerance,
    }


def report(run: Any, requests: list, header: dict[str, Any], *, kinds: tuple[str, ...], gpu_tolerance: float,
           host_tolerance: float) -> dict[str, Any]:
    """Everything the soak measured and checked, JSON-ready: ``run`` is a :class:`.soak.SoakRun` of ``requests``
    (:class:`.soak.SoakRequest`), ``kinds`` the request kinds in the order to report them."""
    latencies = [o.latency_s for o in run.outcomes if o.kind == "image" and o.status == 200]
    summary = {
        "header": {**header, "date": time.strftime("%Y-%m-%d %H:%M")},
        "sent": len(run.outcomes) + len(run.alone), "not_sent": run.not_sent, "wall_s": run.wall_s,
        "by_kind": by_kind(run.outcomes, kinds),
        "lost": sum(1 for o in run.outcomes if o.expect and o.status == 0),
        "unexpected_count": sum(not o.as_expected for o in run.outcomes),
        "unexpected": unexpected(run.outcomes, requests),
        "client_5xx_not_injected": sum(o.status >= 500 and o.kind not in FAULT_KINDS for o in run.outcomes),
        "server_counters": server_counters(run), "images": image_checks(run),
        "latency_s": {q: percentile(latencies, n) for q, n in (("p50", 50), ("p99", 99), ("max", 100))},
        "gpu_memory": memory_drift(run.checkpoints, "gpu_allocated"),
        "host_memory": memory_drift(run.checkpoints, "rss"),
        "checkpoints": run.checkpoints, "samples": run.samples,
        "batching": (run.stats_end.get("batching") or {}), "bcg": _bcg(run), "bcg_new_keys": _new_keys(run),
    }
    summary["checks"] = checks_of(summary, gpu_tolerance, host_tolerance)
    summary["passed"] = all(v is not False for v in summary["checks"].values())
    summary["outcomes"] = [dataclasses.asdict(o) for o in run.outcomes]
    return summary


def _bcg(run: Any) -> dict[str, Any] | None:
    """BCG's counters over the soak (``None`` for an eager server)."""
    start, end = run.stats_start.get("bcg"), run.stats_end.get("bcg")
    if not start or not end:
        return None
    return {n: end.get(n, 0) - start.get(n, 0) for n in ("hits", "captures", "failed_captures", "eager_calls", "misses")}


def _new_keys(run: Any) -> list[dict[str, Any]]:
    """The graph keys met while serving, each as ``/stats`` describes it (``key``) with its graph memory
    (``memory_bytes``); none for an eager server."""
    start, end = run.stats_start.get("bcg") or {}, run.stats_end.get("bcg") or {}
    known = {e.get("key") for e in start.get("entries") or ()}
    return [{"key": e.get("key"), "memory_bytes": e.get("memory_bytes")}
            for e in end.get("entries") or () if e.get("key") not in known]


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def markdown(s: dict[str, Any]) -> str:
    h, counters, images = s["header"], s["server_counters"], s["images"]
    lines = [
        f"# Server soak: {s['sent']} requests, {s['wall_s']:.0f} s", "",
        f"{h['date']}; server `bcg-serve {' '.join(h.get('server_args') or []) or h.get('url')}`; "
        f"{h['concurrency']} clients, time limit {h['time_limit_s']:.0f} s. {h.get('note') or ''}", "",
        f"- result: {'PASS' if s['passed'] else 'FAIL'}",
        "- requests by kind: " + ", ".join(f"{k} {v['sent']}" for k, v in s["by_kind"].items()),
        f"- lost (no answer, not a disconnecting client): {s['lost']}; not sent (time limit): {s['not_sent']}",
        f"- /stats: {counters['requests']} requests = {counters['ok']} ok + errors {counters['errors']}",
        f"- answers not as their kind expects: {s['unexpected_count']}; 5xx not injected: {s['client_5xx_not_injected']}",
        f"- images: {images['distinct_answered']} distinct requests, {images['alone_equal']} of {images['alone_sent']} "
        f"equal alone; equal requests different during the load: {images['inconsistent_identities']}",
        f"- image latency p50 {s['latency_s']['p50'] or 0:.3f} s, p99 {s['latency_s']['p99'] or 0:.3f} s; BCG: {s['bcg']}",
        "", "## Checks", "", "| check | passed |", "|---|---|",
        *[f"| {name} | {'not measured' if ok is None else 'yes' if ok else 'NO'} |" for name, ok in s["checks"].items()],
        "", "## Memory at the idle checkpoints (the first after the warm-up phase is the reference)", "",
        "| requests sent | idle | GPU allocated MiB | GPU reserved MiB | server RSS MiB |", "|---|---|---|---|---|",
        *[f"| {c['sent']} | {c['idle']} | {_mib(c['gpu_allocated'])} | {_mib(c['gpu_reserved'])} | {_mib(c['rss'])} |"
          for c in s["checkpoints"]],
    ]
    if s.get("bcg_new_keys"):
        lines += ["", "## Graph keys met while serving", "",
                  *[f"- `{k['key']}`: {_mib(k['memory_bytes'])} MiB of graph memory" for k in s["bcg_new_keys"]]]
    if s["unexpected"]:
        lines += ["", f"## Answers not as expected (first {LISTED})", "", *[f"- {json.dumps(u)}" for u in s["unexpected"]]]
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    """``soak.json`` (everything, every outcome) and ``soak.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "soak.json", out_dir / "soak.md"
    json_path.write_text(json.dumps(summary, indent=1, default=str))
    md_path.write_text(markdown(summary))
    return json_path, md_path
