"""What a load run measured: per-server summaries, the cross-check of two servers, the printed table."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from .run import ServerRun

__all__ = ["alone_check", "batching_during", "cross_check", "format_report", "latency_ratios", "percentile",
           "mean_ms", "queue_trend", "steady_throughput", "step_batching_during", "summarize", "throughput_ratio"]

MIB = 2**20


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between closest ranks; ``None`` for no values."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def _latencies(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99),
            "mean": statistics.fmean(values) if values else None, "max": max(values) if values else None}


def _memory(run: ServerRun, tolerance: float) -> dict[str, Any]:
    start, end = run.stats_start.get("gpu_memory"), run.stats_end.get("gpu_memory")
    if not start or not end:
        return {"start": None, "end": None, "max_polled_allocated_bytes": None, "change_pct": None,
                "within_tolerance": None, "tolerance_pct": 100 * tolerance}
    polled = [p["gpu_memory"]["allocated_bytes"] for p in run.polls if p.get("gpu_memory")]
    a0, a1 = start["allocated_bytes"], end["allocated_bytes"]
    change = 100.0 * (a1 - a0) / a0 if a0 else None
    return {"start": start, "end": end, "max_polled_allocated_bytes": max(polled + [a0, a1]),
            "change_pct": change, "tolerance_pct": 100 * tolerance,
            "within_tolerance": None if change is None else abs(change) <= 100 * tolerance}


def _captures(stats: dict[str, Any]) -> int | None:
    bcg = stats.get("bcg")
    return None if bcg is None else bcg.get("captures")


def _compiles(run: ServerRun) -> int | None:
    """Graphs torch.compile made in the server during the load (``/stats`` ``compiled_graphs``; ``None`` where the
    server does not say)."""
    start, end = run.stats_start.get("compiled_graphs"), run.stats_end.get("compiled_graphs")
    return None if start is None or end is None else end - start


def _consistency(run: ServerRun) -> dict[str, Any]:
    """Equal requests must have got bitwise equal images (the same PNG payloads)."""
    by_identity: dict[str, set] = defaultdict(set)
    counts: Counter = Counter()
    for o in run.outcomes:
        if o.ok:
            by_identity[o.identity].add(o.payload_hashes)
            counts[o.identity] += 1
    repeated = [i for i, c in counts.items() if c > 1]
    inconsistent = [i for i in repeated if len(by_identity[i]) > 1]
    return {"repeated_identities": len(repeated), "repeated_requests": sum(counts[i] for i in repeated),
            "inconsistent_identities": inconsistent}


def _histogram_delta(end: dict[str, int], start: dict[str, int]) -> dict[str, int]:
    keys = sorted(set(end) | set(start), key=int)
    delta = {k: end.get(k, 0) - start.get(k, 0) for k in keys}
    return {k: v for k, v in delta.items() if v}


def batching_during(run: ServerRun) -> dict[str, Any] | None:
    """What the server's batching did during the load (``/stats`` ``batching`` at the end minus the start):
    batched calls, requests per call (histogram, mean), filler rows, the time requests waited to be batched
    (mean; the max is the server's since start), why batches closed (``closed_by``) and how long the answered
    clients took to come back (``return_s``). ``None`` for a server without batching (or without the field)."""
    start, end = run.stats_start.get("batching") or {}, run.stats_end.get("batching") or {}
    if not end.get("enabled"):
        return None
    if end.get("mode") == "step":
        return step_batching_during(start, end)
    batches = end["batches"] - start.get("batches", 0)
    requests = end["batched_requests"] - start.get("batched_requests", 0)
    wait_start, wait_end = start.get("wait_s") or {}, end["wait_s"]
    waits = wait_end["count"] - wait_start.get("count", 0)
    wait_sum = wait_end["sum"] - wait_start.get("sum", 0.0)
    return {"max_batch": end["max_batch"], "window_ms": end["window_ms"], "batches": batches,
            "batched_requests": requests, "mean_requests_per_batch": requests / batches if batches else None,
            "requests_per_batch": _histogram_delta(end["requests_per_batch"], start.get("requests_per_batch", {})),
            "images_per_batch": _histogram_delta(end["images_per_batch"], start.get("images_per_batch", {})),
            "filler_rows": end["filler_rows"] - start.get("filler_rows", 0),
            "wait_s": {"count": waits, "sum": wait_sum, "mean": wait_sum / waits if waits else None,
                       "max_since_start": wait_end["max"]},
            "closed_by": {k: v - (start.get("closed_by") or {}).get(k, 0)
                          for k, v in (end.get("closed_by") or {}).items()},
            "return_s": _returns_delta(end.get("return_s"), start.get("return_s"))}


def _timing_delta(end: dict[str, Any], start: dict[str, Any] | None) -> dict[str, Any]:
    count = end["count"] - (start or {}).get("count", 0)
    total = (end["sum"] or 0.0) - ((start or {}).get("sum") or 0.0)
    return {"count": count, "mean": total / count if count else None, "p50_recent": end["p50"],
            "p99_recent": end["p99"], "max_since_start": end["max"]}


#: ``/stats`` timings of step batching besides the step and the wait, read where the server has them.
STEP_PART_TIMINGS = ("prepare_s", "finish_s", "step_launch_s", "predict_device_s", "advance_device_s")


def step_batching_during(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """What step batching did during the load (``/stats`` ``batching`` of ``--batching step``, end minus start):
    steps, slot occupancy (occupied slots / slots over those steps), active rows per step, the time per step (and
    where it went: :data:`STEP_PART_TIMINGS`), the wait from arrival to joining a running batch, the time to prepare
    and to finish a request, requests by outcome."""
    steps = end["steps"] - start.get("steps", 0)
    occupied = end["occupied_rows"] - start.get("occupied_rows", 0)
    requests = {k: v - (start.get("requests") or {}).get(k, 0) for k, v in end["requests"].items()}
    return {"mode": "step", "max_batch": end["rows"], "policy": end["policy"], "steps": steps,
            "occupancy": occupied / (steps * end["rows"]) if steps else None,
            "mean_rows_per_step": occupied / steps if steps else None,
            "active_rows_per_step": _histogram_delta(end["active_rows_per_step"], start.get("active_rows_per_step", {})),
            "step_s": _timing_delta(end["step_s"], start.get("step_s")),
            "wait_s": _timing_delta(end["queue_wait_s"], start.get("queue_wait_s")),
            **{name: _timing_delta(end[name], start.get(name)) for name in STEP_PART_TIMINGS if name in end},
            "requests": requests, "batches": steps, "batched_requests": requests.get("finished", 0),
            "mean_requests_per_batch": None}


def queue_trend(polls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The server's queue depth polled during the load: mean over the first and the last third, and the max (a
    queue that keeps growing under a constant offered load: the last third well above the first)."""
    depths = [p["queue_depth"] for p in polls if isinstance(p.get("queue_depth"), int)]
    if len(depths) < 3:
        return None
    third = len(depths) // 3
    first, last = depths[:third], depths[-third:]
    return {"polls": len(depths), "first_third_mean": sum(first) / len(first), "last_third_mean": sum(last) / len(last),
            "max": max(depths)}


def _returns_delta(end: dict | None, start: dict | None) -> dict[str, Any] | None:
    """``/stats`` ``batching.return_s`` during the load (count, mean; the max is the server's since start)."""
    if not end:
        return None
    count, total = end["count"] - (start or {}).get("count", 0), end["sum"] - (start or {}).get("sum", 0.0)
    return {"count": count, "mean": total / count if count else None, "max_since_start": end["max"]}


def alone_check(run: ServerRun) -> dict[str, Any] | None:
    """Each distinct request sent again alone after the load (:func:`.run.replay_alone`): were its images
    bitwise equal (decoded pixels) to every image the load got for it? ``None`` without a replay."""
    if not run.alone:
        return None
    loaded: dict[str, set] = defaultdict(set)
    for o in run.outcomes:
        if o.ok:
            loaded[o.identity].add(o.pixel_hashes)
    compared, mismatched, failed = 0, [], []
    for reply in run.alone:
        if not reply.ok or reply.identity not in loaded:
            failed.append(reply.index)
            continue
        compared += 1
        if loaded[reply.identity] != {reply.pixel_hashes}:
            mismatched.append(reply.index)
    return {"distinct": len(run.alone), "compared": compared, "equal": compared - len(mismatched),
            "mismatched": mismatched, "failed": failed}


def steady_throughput(outcomes: list, clients: int | None) -> float | None:
    """Answers per second with every client of a closed loop busy: from the ``clients``-th answer to the last
    request sent (the ``N - clients``-th answer), leaving out the fill at the start and the drain at the end, where
    a batching server runs part-empty batches for want of requests; a short run's whole-run rate counts them.
    ``None`` for an open loop, or with ``2 * clients + 1`` answers or fewer."""
    times = sorted(o.done_at for o in outcomes if o.done_at is not None)
    if not clients or len(times) <= 2 * clients + 1:
        return None
    first, last = times[clients], times[-1 - clients]
    return (len(times) - 1 - 2 * clients) / (last - first) if last > first else None


def summarize(run: ServerRun, memory_tolerance: float = 0.05) -> dict[str, Any]:
    """One server's numbers: counts, errors by status, latency percentiles (answered requests), throughput,
    GPU memory at start and end, graphs captured during the load, equal-request consistency, per size."""
    ok = [o for o in run.outcomes if o.ok]
    errors = Counter(str(o.status) if o.status else "no answer" for o in run.outcomes if not o.ok)
    server = run.stats_start.get("server", {})
    warmed = set((server.get("warmup") or {}).get("sizes") or [])
    per_size: dict[str, dict[str, Any]] = {}
    for size in sorted({o.size for o in run.outcomes}):
        lat = [o.latency_s for o in ok if o.size == size]
        per_size[size] = {"requests": sum(o.size == size for o in run.outcomes), "ok": len(lat),
                          "p50": percentile(lat, 50), "p99": percentile(lat, 99), "warmed": size in warmed}
    per_model: dict[str, dict[str, Any]] = {}
    for model in sorted({o.model or "" for o in run.outcomes}):
        lat = [o.latency_s for o in ok if (o.model or "") == model]
        per_model[model or "(base)"] = {"requests": sum((o.model or "") == model for o in run.outcomes),
                                        "ok": len(lat), "p50": percentile(lat, 50)}
    c0, c1 = _captures(run.stats_start), _captures(run.stats_end)
    images = sum(len(o.payload_hashes) for o in ok)
    return {
        "label": run.label, "url": run.url,
        "server": {k: server.get(k) for k in ("model", "family", "size", "pipeline", "device", "dtype", "bcg",
                                               "compile", "stack", "resolution_binning", "warmup", "default_steps")},
        "requests": len(run.outcomes), "ok": len(ok), "errors": dict(sorted(errors.items())),
        "error_examples": [f"#{o.index} {o.status}: {o.error}" for o in run.outcomes if not o.ok][:3],
        "timed_out": run.timed_out, "wall_s": run.wall_s,
        "latency_s": _latencies([o.latency_s for o in ok]),
        "pipeline_s": _latencies([o.pipeline_s for o in ok if o.pipeline_s is not None]),
        "queue_s": _latencies([o.queue_s for o in ok if o.queue_s is not None]),
        "throughput_rps": len(ok) / run.wall_s if run.wall_s > 0 else None,
        "throughput_steady_rps": steady_throughput(ok, run.concurrency),
        "images_per_s": images / run.wall_s if run.wall_s > 0 else None,
        "gpu_memory": _memory(run, memory_tolerance),
        "captures_during_load": None if c0 is None or c1 is None else c1 - c0, "compiles_during_load": _compiles(run),
        "consistency": _consistency(run),
        "per_size": per_size,
        "per_model": per_model,
        "adapters": run.stats_end.get("adapters"),
        **_batching_and_checks(run),
    }


def _batching_and_checks(run: ServerRun) -> dict[str, Any]:
    """The parts of a summary that exist only for some runs: batching, the alone check, the open loop's arrivals
    and the queue depth's trend."""
    return {"batching": batching_during(run), "alone_check": alone_check(run), "open_loop": run.open_loop,
            "queue_depth": queue_trend(run.polls)}


def cross_check(a: ServerRun, b: ServerRun) -> dict[str, Any]:
    """Request by request (same mix index), were both servers' decoded pixels bitwise equal?"""
    outcomes_b = {o.index: o for o in b.outcomes}
    compared, mismatched, not_compared = 0, [], []
    for oa in a.outcomes:
        ob = outcomes_b.get(oa.index)
        if ob is None or not (oa.ok and ob.ok):
            not_compared.append(oa.index)
            continue
        compared += 1
        if oa.pixel_hashes != ob.pixel_hashes:
            mismatched.append(oa.index)
    return {"compared": compared, "equal": compared - len(mismatched), "mismatched": mismatched,
            "not_compared": not_compared}


def latency_ratios(a: dict[str, Any], b: dict[str, Any], max_ratio: float | None) -> dict[str, Any]:
    """``b / a`` of p50 and p99 latency; with ``max_ratio``, whether both are at most that."""
    ratios = {}
    for q in ("p50", "p99"):
        la, lb = a["latency_s"][q], b["latency_s"][q]
        ratios[q] = lb / la if la and lb is not None else None
    passed = None
    if max_ratio is not None:
        passed = all(r is not None and r <= max_ratio for r in ratios.values())
    return {"ratios": ratios, "max_ratio": max_ratio, "passed": passed}


def throughput_ratio(a: dict[str, Any], b: dict[str, Any], min_ratio: float | None,
                     max_p99_ratio: float | None = None) -> dict[str, Any]:
    """``b / a`` of throughput (requests per second) and of p99 latency; with ``min_ratio``, whether the
    throughput ratio is at least that; with ``max_p99_ratio``, whether the p99 ratio is at most that."""
    ta, tb = a["throughput_rps"], b["throughput_rps"]
    pa, pb = a["latency_s"]["p99"], b["latency_s"]["p99"]
    ratio = tb / ta if ta and tb is not None else None
    p99 = pb / pa if pa and pb is not None else None
    passed = None
    if min_ratio is not None or max_p99_ratio is not None:
        passed = ((min_ratio is None or (ratio is not None and ratio >= min_ratio))
                  and (max_p99_ratio is None or (p99 is not None and p99 <= max_p99_ratio)))
    return {"throughput_ratio": ratio, "p99_ratio": p99, "min_throughput_ratio": min_ratio,
            "max_p99_ratio": max_p99_ratio, "passed": passed}


def _fmt(value, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    lat, mem = s["latency_s"], s["gpu_memory"]
    errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
    cons = s["consistency"]
    consistent = ("yes" if not cons["inconsistent_identities"] else f"NO ({len(cons['inconsistent_identities'])})")
    mib = (lambda m, key: None if m is None else m[key] / MIB)
    return [
        ("ok / requests", f"{s['ok']}/{s['requests']}" + (" (time limit)" if s["timed_out"] else "")),
        ("errors", errors),
        ("latency p50 s", _fmt(lat["p50"])), ("latency p95 s", _fmt(lat["p95"])),
        ("latency p99 s", _fmt(lat["p99"])), ("latency max s", _fmt(lat["max"])),
        ("pipeline p50 s", _fmt(s["pipeline_s"]["p50"])), ("queue p50 s", _fmt(s["queue_s"]["p50"])),
        ("throughput req/s", _fmt(s["throughput_rps"])), ("images/s", _fmt(s["images_per_s"])),
        ("wall s", _fmt(s["wall_s"], ".1f")),
        ("GPU allocated start MiB", _fmt(mib(mem["start"], "allocated_bytes"), ".0f")),
        ("GPU allocated end MiB", _fmt(mib(mem["end"], "allocated_bytes"), ".0f")),
        ("GPU reserved end MiB", _fmt(mib(mem["end"], "reserved_bytes"), ".0f")),
        ("GPU allocated change", _fmt(mem["change_pct"], "+.1f", " %")
         + ("" if mem["within_tolerance"] is None else (" (ok)" if mem["within_tolerance"] else " (OVER)"))),
        ("captures during load", _fmt(s["captures_during_load"], "d")),
        ("compiles during load", _fmt(s.get("compiles_during_load"), "d")),
        ("equal requests equal", f"{consistent} ({cons['repeated_identities']} repeated)"),
        ("batched calls (steps)", "off" if s.get("batching") is None else str(s["batching"]["batches"])),
        ("requests per batch mean", "-" if s.get("batching") is None
         else _fmt(s["batching"]["mean_requests_per_batch"], ".2f")),
        ("batch wait mean ms", "-" if s.get("batching") is None
         else _fmt(None if s["batching"]["wait_s"]["mean"] is None else 1000 * s["batching"]["wait_s"]["mean"], ".1f")),
        ("equal to alone", "-" if s.get("alone_check") is None
         else f"{s['alone_check']['equal']}/{s['alone_check']['distinct']}"),
    ]


def _batching_line(label: str, b: dict[str, Any]) -> str:
    """One line on what batching did: requests per call (request batching) or slot occupancy (step batching)."""
    if b.get("mode") == "step":
        return _step_line(label, b)
    hist = ", ".join(f"{k}: {v}" for k, v in b["requests_per_batch"].items())
    closed = ", ".join(f"{k} {v}" for k, v in (b.get("closed_by") or {}).items())
    returns = b.get("return_s") or {}
    back = ("" if not returns.get("count") else f"; returns after an answer: mean "
            f"{1000 * returns['mean']:.0f} ms, max {1000 * returns['max_since_start']:.0f} ms")
    return (f"  {label} requests per batched call: {hist or 'none'}; filler rows {b['filler_rows']}; closed by: "
            f"{closed or '-'}{back}")


def mean_ms(timing: dict[str, Any] | None) -> str:
    """A timing's mean in milliseconds, one decimal (``-`` without one)."""
    return _fmt(None if not timing or timing.get("mean") is None else 1000 * timing["mean"], ".1f")


def _step_line(label: str, b: dict[str, Any]) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in b["active_rows_per_step"].items())
    parts = ("" if not (b.get("predict_device_s") or {}).get("count") else
             f" (host {mean_ms(b.get('step_launch_s'))} ms to queue; device {mean_ms(b['predict_device_s'])} ms "
             f"model + {mean_ms(b.get('advance_device_s'))} ms rows' scheduler steps)")
    return (f"  {label} step batching ({b['max_batch']} slots, {b['policy']}): {b['steps']} steps, occupancy "
            f"{_fmt(b['occupancy'], '.2f')}, step mean {mean_ms(b['step_s'])} ms{parts}, "
            f"wait to join mean {mean_ms(b['wait_s'])} ms; active rows per step: {hist or 'none'}")


def format_report(summaries: list[dict[str, Any]], cross: dict[str, Any] | None = None,
                  ratios: dict[str, Any] | None = None, header: str = "",
                  throughput: dict[str, Any] | None = None) -> str:
    """The summaries side by side (a ratio column for two servers), per-size p50, the cross-check."""
    width = max(16, *(len(s["label"]) for s in summaries))
    lines = [header] if header else []
    lines += _table(summaries, width, ratios, throughput)
    lines += _per_size_and_model(summaries, width)
    for s in summaries:
        lines += _server_notes(s)
    lines += _verdicts([s["label"] for s in summaries], cross, ratios, throughput)
    return "\n".join(lines)


def _table(summaries: list[dict[str, Any]], width: int, ratios: dict[str, Any] | None,
           throughput: dict[str, Any] | None) -> list[str]:
    """The rows of :func:`_rows` side by side, with a ratio column for two servers."""
    labels = [s["label"] for s in summaries]
    rows = [_rows(s) for s in summaries]
    title = f"{'':<26}" + "".join(f"{lbl:>{width + 2}}" for lbl in labels)
    if len(summaries) == 2:
        title += f"{labels[1] + '/' + labels[0]:>{width + 2}}"
    lines = [title]
    for i, (name, _) in enumerate(rows[0]):
        line = f"{name:<26}" + "".join(f"{r[i][1]:>{width + 2}}" for r in rows)
        if len(summaries) == 2 and name in ("latency p50 s", "latency p99 s") and ratios:
            ratio = ratios["ratios"]["p50" if "p50" in name else "p99"]
            line += f"{_fmt(ratio, '.2f', 'x'):>{width + 2}}"
        if len(summaries) == 2 and name == "throughput req/s" and throughput:
            line += f"{_fmt(throughput['throughput_ratio'], '.2f', 'x'):>{width + 2}}"
        lines.append(line)
    return lines


def _per_size_and_model(summaries: list[dict[str, Any]], width: int) -> list[str]:
    """p50 per size (warmed sizes marked) and, where requests named models, the answers per model."""
    lines = []
    for size in sorted({size for s in summaries for size in s["per_size"]}):
        warmed = any(s["per_size"].get(size, {}).get("warmed") for s in summaries)
        name = f"p50 s at {size}" + (" (warmed)" if warmed else "")
        cells = [_fmt(s["per_size"].get(size, {}).get("p50")) for s in summaries]
        lines.append(f"{name:<26}" + "".join(f"{c:>{width + 2}}" for c in cells))
    models = sorted({m for s in summaries for m in s.get("per_model", {})})
    if models != ["(base)"]:
        for model in models:
            cells = [f"{s['per_model'].get(model, {}).get('ok', 0)}/{s['per_model'].get(model, {}).get('requests', 0)}"
                     for s in summaries]
            lines.append(f"{'ok at model ' + model:<26}" + "".join(f"{c:>{width + 2}}" for c in cells))
    return lines


def _server_notes(s: dict[str, Any]) -> list[str]:
    """One server's batching line, alone check and error examples."""
    lines = [_batching_line(s["label"], s["batching"])] if s.get("batching") else []
    check = s.get("alone_check")
    if check is not None:
        verdict = "bitwise equal" if not check["mismatched"] and not check["failed"] else "NOT all equal"
        lines.append(f"  {s['label']} alone check (each distinct request sent again alone): {check['equal']} of "
                     f"{check['distinct']} equal, {len(check['mismatched'])} mismatched, {len(check['failed'])} "
                     f"failed: {verdict}")
    return lines + [f"  {s['label']} error {example}" for example in s["error_examples"]]


def _verdicts(labels: list[str], cross: dict[str, Any] | None, ratios: dict[str, Any] | None,
              throughput: dict[str, Any] | None) -> list[str]:
    """The cross-check of two servers and the verdicts of the latency and throughput targets."""
    lines = []
    if cross is not None:
        verdict = "bitwise equal" if not cross["mismatched"] and not cross["not_compared"] else "NOT all equal"
        lines.append(f"cross-check ({labels[0]} vs {labels[1]}, decoded pixels per request): {cross['equal']} of "
                     f"{cross['compared']} compared equal, {len(cross['mismatched'])} mismatched, "
                     f"{len(cross['not_compared'])} not compared (failed on a server): {verdict}")
    if ratios is not None and ratios["max_ratio"] is not None:
        lines.append(f"latency target {labels[1]}/{labels[0]} <= {ratios['max_ratio']:.2f} at p50 and p99: "
                     f"{'PASS' if ratios['passed'] else 'FAIL'}")
    if throughput is not None and throughput["passed"] is not None:
        parts = []
        if throughput["min_throughput_ratio"] is not None:
            parts.append(f"throughput {labels[1]}/{labels[0]} {_fmt(throughput['throughput_ratio'], '.2f', 'x')} >= "
                         f"{throughput['min_throughput_ratio']:.2f}x")
        if throughput["max_p99_ratio"] is not None:
            parts.append(f"p99 {labels[1]}/{labels[0]} {_fmt(throughput['p99_ratio'], '.2f', 'x')} <= "
                         f"{throughput['max_p99_ratio']:.2f}x")
        lines.append(f"throughput target: {'; '.join(parts)}: {'PASS' if throughput['passed'] else 'FAIL'}")
    return lines
