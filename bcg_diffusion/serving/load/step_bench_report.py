"""The step batching benchmark's verdicts and its Markdown report (:mod:`.step_bench` runs it)."""

from __future__ import annotations

import time
from typing import Any

from .report import mean_ms

__all__ = ["check", "markdown", "skipped"]

REQUEST_SERVER = " and the request-batching server (`--batching request`, rows `--max-batch`, its default window)"


def check(name: str, passed: bool | None, detail: str) -> dict[str, Any]:
    """One verdict (``None``: information, not judged), printed as it is made."""
    verdict = "INFO" if passed is None else ("PASS" if passed else "FAIL")
    print(f"  {verdict}  {name}: {detail}", flush=True)
    return {"name": name, "passed": passed, "detail": detail}


def skipped(name: str, needed_s: float, left_s: float) -> dict[str, Any]:
    """The result of a scenario the time budget had no room for."""
    return {"scenario": name, "skipped": True,
            "checks": [check(name, None, f"skipped: needs about {needed_s:.0f} s, {max(0.0, left_s):.0f} s of "
                                         "--time-budget left")]}


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _md_row(scenario: str, role: str, s: dict[str, Any]) -> str:
    lat, b = s["latency_s"], s.get("batching") or {}
    return (f"| {scenario} | {role} | {b.get('max_batch', '-')} | {s['ok']}/{s['requests']} | "
            f"{_f(s['throughput_rps'], '.2f')} | {_f(s.get('throughput_steady_rps'), '.2f')} | {_f(lat['p50'])} | "
            f"{_f(lat['p99'])} | {_f(b.get('occupancy'), '.2f')} | "
            f"{_f(b.get('mean_rows_per_step'), '.2f')} | {mean_ms(b.get('step_s'))} | {mean_ms(b.get('step_launch_s'))} | "
            f"{mean_ms(b.get('predict_device_s'))} | {mean_ms(b.get('advance_device_s'))} | {mean_ms(b.get('wait_s'))} | "
            f"{mean_ms(b.get('prepare_s'))} | {mean_ms(b.get('finish_s'))} |")


def _title(r: dict[str, Any]) -> str:
    ratio, request = r.get("ratio") or {}, r.get("request_ratio")
    if ratio:
        return (f"**{r['scenario']}** (step server rows {r.get('rows', '-')}): throughput step/off "
                f"{_x(ratio.get('throughput_ratio'))}, p99 step/off {_x(ratio.get('p99_ratio'))}"
                + (f"; request/off {_x(request.get('throughput_ratio'))}, p99 {_x(request.get('p99_ratio'))}"
                   if request else ""))
    if "rate" in r:
        return (f"**{r['scenario']}** at {_f(r['rate'], '.2f')} req/s for {_f(r.get('duration_s'), '.0f')} s: p99 / a "
                f"request alone {_x(r.get('p99_over_alone'))}")
    return f"**{r['scenario']}**"


def markdown(results: list[dict[str, Any]], args, budget: dict[str, Any]) -> str:
    """The table of every run (rows: the step server's slots per running batch; steady req/s: with every client
    busy; occupancy, rows per step, step ms, wait to join, prepare and finish ms from its ``/stats``; where a step's
    time went: host ms to queue it, and on CUDA the device's ms for its model part and its rows' scheduler steps),
    then each scenario's verdicts."""
    lines = [f"# Step batching benchmark ({time.strftime('%Y-%m-%d %H:%M:%S')})", "",
             f"PixArt-Sigma {args.size}, {args.steps} steps, step servers `--batching step --step-policy "
             f"{args.step_policy}` (rows: `--max-batch`; requests prepared and finished on the scheduler's host "
             f"threads) against the unbatched BCG server{REQUEST_SERVER if args.with_request else ''}, device "
             f"{args.device}"
             f"{', every server with `' + args.stack + '`' if args.stack else ''}. Time budget "
             f"{_f(budget.get('total_s'), '.0f')} s, used {_f(budget.get('used_s'), '.0f')} s.", "",
             "| scenario | server | rows | ok | req/s | steady req/s | p50 s | p99 s | occupancy | rows per step | "
             "step ms | host ms | device predict ms | device advance ms | wait to join ms | prepare ms | finish ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines += [_md_row(r["scenario"], role, s) for role, s in r.get("summaries", {}).items()]
    for r in results:
        lines += ["", _title(r), ""]
        lines += [f"- {'INFO' if c['passed'] is None else 'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}"
                  for c in r["checks"]]
    return "\n".join(lines) + "\n"
