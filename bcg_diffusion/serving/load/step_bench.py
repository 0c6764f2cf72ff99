"""The step batching benchmark of issue 46: step-batching servers against the unbatched graph server, side by side
in one run, with the bitwise checks.

PixArt-Sigma (full size, binning off, 20 steps), servers built at once on the one GPU and reused by every scenario:
``off`` (BCG, no batching), ``step`` (BCG, ``--batching step --max-batch 8 --batch-work-limit 0``), ``step-r4`` (the
same with ``--max-batch 4``, only when a chosen scenario runs at 4 rows) and, with ``--eager-check``, ``eager-step``
(the step server without BCG) and, with ``--with-request``, ``request`` (BCG, ``--batching request --max-batch 8
--batch-work-limit 0``: request batching, whose verdict issue 46 asks for). Scenarios (``--scenarios``), each the same
request mix against ``off``, then its step server (then ``request``):

- ``mixed-c8``, ``mixed-c16``: 256x256 and 384x384 mixed, 8 and 16 closed-loop clients (targets: step >= 1.8x the
  requests per second of off, p99 <= 0.8x); ``mixed-c8-r4``: the 8-client mix against ``step-r4`` (8 clients over
  two sizes keep about 4 rows per size busy);
- ``s256-c8``: 256x256 alone, 8 clients (target >= 2.2x); ``s512-c8``: 512x512, 8 clients (target >= 1.25x);
- ``poisson``: open-loop Poisson arrivals (seed 0) of the mixed sizes at ``--poisson-load`` (0.9) x the ``step``
  server's capacity (its best requests per second in a mixed scenario at ``--max-batch`` rows), for
  ``--poisson-s`` seconds (default 60), step server only (targets: no growing queue, p99 <= 3x the latency of a
  request alone; the report gives the queue depth's trend and p99 / alone).

Checks: every answer 200; equal requests equal; after the first scenario each distinct request sent again alone to
``step`` gives the same image (the latencies of these lone requests are the "alone" time); with ``--eager-check``,
``eager-step`` gives bitwise the images of the first ``--eager-requests`` requests of the first scenario; nothing
captured during any load. Each target is reported PASS or FAIL; the rows, slot occupancy, rows per step, step time,
queue wait and the prepare and finish times of every step run are reported. ``--time-budget`` bounds the whole run:
a scenario that no longer fits is skipped (reported), the open-loop run is shortened to what is left.
``step_bench.json`` (every summary and outcome) and ``step_bench.md`` go to ``--out-dir``, the servers' logs under it.

Example (the GPU run, about 6 minutes: 40-90 s to build and warm the servers, at most 12 s per closed-loop run (11
runs), the alone replay and the eager check, 60 s of open-loop arrivals)::

    python -m bcg_diffusion.serving.load.step_bench --out-dir outputs/step_bench --eager-check --time-budget 360

A CPU rehearsal (tiny model, seconds; the ratios mean nothing there): ``--size tiny --device cpu --sizes-mixed
64x64,64x128 --size-small 64x64 --size-large 128x128 --steps 2 --requests 12 --time-limit 20 --poisson-s 3
--no-targets``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.name_lists import name_list
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.sizes import sizes_argument

from .mix import DEFAULT_PROMPTS, MixSpec, build_mix
from .step_bench_report import check as _check
from .step_bench_report import markdown, skipped

__all__ = ["SCENARIOS", "Budget", "Scenario", "build_parser", "main", "roles_for"]


@dataclass(frozen=True)
class Scenario:
    """A closed-loop scenario: which sizes (``mixed``, ``small``, ``large``), clients, the least throughput ratio
    step / off and the largest p99 ratio (``None``: not judged), the step server's rows (``None``: ``--max-batch``)."""

    kind: str
    clients: int
    min_ratio: float
    max_p99: float | None = None
    rows: int | None = None


SCENARIOS = {"mixed-c8": Scenario("mixed", 8, 1.8, 0.8), "mixed-c16": Scenario("mixed", 16, 1.8, 0.8),
             "mixed-c8-r4": Scenario("mixed", 8, 1.8, 0.8, rows=4),
             "s256-c8": Scenario("small", 8, 2.2), "s256-c16": Scenario("small", 16, 2.2),
             "s512-c8": Scenario("large", 8, 1.25), "s512-c16": Scenario("large", 16, 1.25)}
ALL_SCENARIOS = (*SCENARIOS, "poisson")
#: Seconds a closed-loop run may take beyond ``--time-limit`` (the requests in flight finish), in the budget.
DRAIN_S = 4.0
#: The shortest open-loop run worth making (seconds of arrivals).
MIN_POISSON_S = 10.0


class Budget:
    """``--time-budget``: the seconds the whole run may take, from its start."""

    def __init__(self, total_s: float, clock=time.perf_counter):
        self.total_s, self._clock = total_s, clock
        self.started = clock()

    def left(self) -> float:
        return self.total_s - (self._clock() - self.started)

    def report(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "used_s": round(self._clock() - self.started, 1)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bcg_diffusion.serving.load.step_bench",
                                description="Step batching against the unbatched graph server (issue 46), with the "
                                "bitwise checks; JSON and Markdown reports.")
    p.add_argument("--out-dir", type=Path, required=True, help="where step_bench.json, step_bench.md and logs go")
    p.add_argument("--scenarios", type=name_list(ALL_SCENARIOS), default=ALL_SCENARIOS,
                   help=f"default: {','.join(ALL_SCENARIOS)}")
    p.add_argument("--size", choices=("tiny", "full"), default="full", help="model size (default: full)")
    p.add_argument("--device", default="cuda", help="the servers' --device (default: cuda)")
    p.add_argument("--sizes-mixed", type=sizes_argument, default="256x256,384x384", help="the mixed scenarios' sizes")
    p.add_argument("--size-small", type=sizes_argument, default="256x256", help="s256's size")
    p.add_argument("--size-large", type=sizes_argument, default="512x512", help="s512's size")
    p.add_argument("--steps", type=int, default=20, help="steps per request (default: 20)")
    p.add_argument("--max-batch", type=int, default=8, help="the step server's --max-batch (default: 8)")
    p.add_argument("--step-policy", default="round_robin", help="the step servers' --step-policy")
    p.add_argument("--requests", type=int, default=64, help="requests per closed-loop run (default: 64)")
    p.add_argument("--time-limit", type=finite_float, default=12.0,
                   help="seconds per closed-loop run: no request is sent after it (default: 12)")
    p.add_argument("--poisson-s", type=finite_float, default=60.0, help="seconds of open-loop arrivals (default: 60)")
    p.add_argument("--poisson-load", type=finite_float, default=0.9, help="open-loop rate / measured capacity (default: 0.9)")
    p.add_argument("--with-request", action="store_true",
                   help="also a request-batching server (--batching request at --max-batch rows) given every "
                        "closed-loop scenario's load: request/off and step/request beside step/off")
    p.add_argument("--eager-check", action="store_true",
                   help="also build an eager step server and compare the first scenario's images with it")
    p.add_argument("--eager-requests", type=int, default=16,
                   help="requests of the first scenario sent to the eager step server (default: 16)")
    p.add_argument("--time-budget", type=finite_float, default=600.0,
                   help="seconds for the whole run, servers' start included: scenarios that no longer fit are "
                   "skipped, the open-loop run shortened (default: 600)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per prompt (default: 4)")
    p.add_argument("--request-timeout", type=finite_float, default=60.0, help="seconds per request (default: 60)")
    p.add_argument("--spawn-timeout", type=finite_float, default=300.0, help="seconds to build and warm (default: 300)")
    p.add_argument("--stack", default="",
                   help="speed-stack options given to every server alike, e.g. --stack=--compile (default: none): the "
                        "ratios then compare the step and the unbatched server with the same stack")
    p.add_argument("--no-targets", action="store_true", help="report the ratios without judging them (CPU rehearsal)")
    return p


def step_role(rows: int | None, args) -> str:
    """The name of the step server with ``rows`` slots (``step`` at ``--max-batch``, else ``step-r<rows>``)."""
    return "step" if rows in (None, args.max_batch) else f"step-r{rows}"


def roles_for(names: list[str], args) -> list[str]:
    """The servers the chosen scenarios need: ``off``, ``step``, each other rows' step server, ``request``,
    ``eager-step``."""
    extra = [step_role(SCENARIOS[n].rows, args) for n in names if n in SCENARIOS]
    optional = (["request"] if args.with_request else []) + (["eager-step"] if args.eager_check else [])
    return ["off", "step", *dict.fromkeys(r for r in extra if r != "step"), *optional]


def server_args(role: str, args) -> str:
    """The ``bcg-serve`` options of ``off``, ``step``, ``step-r<rows>``, ``request`` or ``eager-step``."""
    warm = ",".join(dict.fromkeys([*args.sizes_mixed.split(","), args.size_small, args.size_large]))
    words = [f"--model pixart --size {args.size} --device {args.device} --steps {args.steps} --warmup {warm} "
             "--max-n 1 --no-resolution-binning --max-queue 256"]
    if args.size == "full" and args.device != "cuda":
        words.append("--yes")
    if args.stack:
        words.append(args.stack)
    if role != "eager-step":
        words.append("--bcg")
    if role == "request":
        words.append(f"--max-batch {args.max_batch} --batching request --batch-work-limit 0")
    elif role != "off":
        rows = int(role[len("step-r"):]) if role.startswith("step-r") else args.max_batch
        words.append(f"--max-batch {rows} --batching step --batch-work-limit 0 --step-policy {args.step_policy}")
    return " ".join(words)


def sizes_of(kind: str, args) -> tuple[str, ...]:
    return {"mixed": tuple(args.sizes_mixed.split(",")), "small": (args.size_small,),
            "large": (args.size_large,)}[kind]


def bodies_for(sizes: tuple[str, ...], count: int, args) -> list[dict[str, Any]]:
    return build_mix(MixSpec(sizes=sizes, prompts=DEFAULT_PROMPTS, seeds=args.seeds, mix_seed=0), count)


def _moved(run) -> dict[str, int] | None:
    start, end = run.stats_start.get("bcg"), run.stats_end.get("bcg")
    if not start or not end:
        return None
    return {k: end[k] - start[k] for k in ("hits", "captures", "failed_captures", "eager_calls", "warmup_calls")}


def run_checks(label: str, run, summary: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Every answer 200, equal requests equal, nothing captured or eager during the load (with BCG)."""
    checks = [_check(f"{label}: every request sent answered 200", summary["ok"] == summary["requests"] > 0,
                     f"{summary['ok']}/{summary['requests']} sent of {count} planned (the rest after the time "
                     f"limit), errors {summary['errors'] or 'none'}"),
              _check(f"{label}: equal requests equal", not summary["consistency"]["inconsistent_identities"],
                     f"{summary['consistency']['repeated_identities']} repeated identities")]
    moved = _moved(run)
    if moved is not None:
        checks.append(_check(f"{label}: replayed, nothing captured or eager", moved["captures"] == 0
                             and moved["eager_calls"] == 0 and moved["failed_captures"] == 0
                             and moved["warmup_calls"] == 0, str(moved)))
    return checks


def scenario_cost(name: str, args, first: bool) -> float:
    """Seconds a closed-loop scenario may take at most: ``off``, its step server and ``request``, and for the first
    the eager server's run and the alone replay (each bounded by ``--time-limit``, plus :data:`DRAIN_S`)."""
    runs = 2 + (1 if args.with_request else 0) + (2 if first else 0)
    return runs * (args.time_limit + DRAIN_S)


def _load_runs(name: str, urls: dict[str, str], args, first: bool) -> dict[str, Any]:
    """The scenario's closed-loop runs: ``off``, its step server (as ``step``), ``request`` where it runs and, for
    the first, ``eager-step`` (its first ``--eager-requests`` requests)."""
    from .run import replay_alone, run_load

    scenario = SCENARIOS[name]
    bodies = bodies_for(sizes_of(scenario.kind, args), args.requests, args)
    servers = {"off": urls["off"], "step": urls[step_role(scenario.rows, args)]}
    if "request" in urls:
        servers["request"] = urls["request"]
    if first and "eager-step" in urls:
        servers["eager-step"] = urls["eager-step"]
    runs = {}
    for role, url in servers.items():
        sent = bodies[:args.eager_requests] if role == "eager-step" else bodies
        print(f"{name} {role}: {len(sent)} requests from {scenario.clients} clients ...", flush=True)
        runs[role] = run_load(url, sent, label=f"{name} {role}", concurrency=scenario.clients,
                              time_limit_s=args.time_limit, request_timeout_s=args.request_timeout)
    if first:
        replay_alone(urls["step"], runs["step"], request_timeout_s=args.request_timeout, time_limit_s=args.time_limit)
    return runs


def run_scenario(name: str, urls: dict[str, str], args, first: bool) -> dict[str, Any]:
    """One closed-loop scenario against ``off`` then its step server (the first also replays alone and checks eager)."""
    from .report import cross_check, summarize, throughput_ratio

    scenario = SCENARIOS[name]
    runs = _load_runs(name, urls, args, first)
    summaries = {role: summarize(run) for role, run in runs.items()}
    judged = not args.no_targets
    ratio = throughput_ratio(summaries["off"], summaries["step"], scenario.min_ratio if judged else None,
                             scenario.max_p99 if judged else None)
    batching = summaries["step"]["batching"] or {}
    result = {"scenario": name, "sizes": sizes_of(scenario.kind, args), "clients": scenario.clients,
              "rows": scenario.rows or args.max_batch, "server": step_role(scenario.rows, args),
              "summaries": summaries, "ratio": ratio, "checks": [],
              "outcomes": {r: [o.__dict__ for o in run.outcomes] for r, run in runs.items()},
              "alone": [o.__dict__ for o in runs["step"].alone]}
    checks = result["checks"]
    for role, run in runs.items():
        planned = min(args.eager_requests, args.requests) if role == "eager-step" else args.requests
        checks += run_checks(f"{name} {role}", run, summaries[role], planned)
    target = f">= {scenario.min_ratio}x" + (f", p99 <= {scenario.max_p99}x" if scenario.max_p99 else "")
    checks.append(_check(f"{name}: throughput step/off {target}", ratio["passed"],
                         f"throughput {_x(ratio['throughput_ratio'])}, p99 {_x(ratio['p99_ratio'])}, rows "
                         f"{result['rows']}, occupancy {_f(batching.get('occupancy'))}"))
    if "request" in summaries:
        result["request_ratio"], verdict = request_verdict(name, summaries)
        checks.append(verdict)
    checks.append(steady_verdict(name, summaries, scenario.clients))
    if first:
        checks += first_checks(runs, summaries, cross_check)
    return result


def request_verdict(name: str, summaries: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Request batching against ``off`` and against the step server on the same load (information, not a target):
    its ratios to ``off`` and the line that states them."""
    from .report import throughput_ratio

    to_off = throughput_ratio(summaries["off"], summaries["request"], None)
    step_over = throughput_ratio(summaries["request"], summaries["step"], None)
    per_call = (summaries["request"]["batching"] or {}).get("mean_requests_per_batch")
    return to_off, _check(f"{name}: request batching", None,
                          f"request/off throughput {_x(to_off['throughput_ratio'])}, p99 {_x(to_off['p99_ratio'])}; "
                          f"step/request throughput {_x(step_over['throughput_ratio'])}, p99 "
                          f"{_x(step_over['p99_ratio'])}; requests per call {_f(per_call, '.2f')}")


def steady_verdict(name: str, summaries: dict[str, Any], clients: int) -> dict[str, Any]:
    """Each batching server's throughput over the unbatched one's with every client busy (the first and last
    ``clients`` answers of each run left out: ``report.steady_throughput``); information, not the target."""
    off = summaries["off"].get("throughput_steady_rps")
    parts = [f"{role}/off {_x(s['throughput_steady_rps'] / off if off and s.get('throughput_steady_rps') else None)}"
             for role, s in summaries.items() if role in ("step", "request")]
    return _check(f"{name}: steady state (first and last {clients} answers left out)", None,
                  f"throughput {', '.join(parts)}; off {_f(off, '.2f')} req/s")


def first_checks(runs, summaries, cross_check) -> list[dict[str, Any]]:
    """The first scenario's bitwise checks: each image == the same request alone; each image the eager step server
    made (its first ``--eager-requests`` requests) == the step server's."""
    alone = summaries["step"]["alone_check"]
    checks = [_check("step: each image == the same request alone", bool(alone) and not alone["mismatched"]
                     and not alone["failed"] and alone["equal"] == alone["distinct"],
                     "no replay" if not alone else f"{alone['equal']} of {alone['distinct']} distinct equal")]
    if "eager-step" in runs:
        cross = cross_check(runs["eager-step"], runs["step"])  # each request the eager server answered
        checks.append(_check("step == eager-step, request by request", cross["compared"] > 0 and not cross["mismatched"]
                             and not cross["not_compared"], f"{cross['equal']} of {cross['compared']} equal, "
                             f"mismatched {cross['mismatched'][:10]}, not compared {len(cross['not_compared'])}"))
    return checks


def mixed_capacity(results: list[dict[str, Any]], args) -> float | None:
    """The ``step`` server's best requests per second on the mixed sizes (its capacity there)."""
    rates = [r["summaries"]["step"]["throughput_rps"] for r in results
             if not r.get("skipped") and r["scenario"] in SCENARIOS and SCENARIOS[r["scenario"]].kind == "mixed"
             and r.get("server") == "step" and r["summaries"]["step"]["throughput_rps"]]
    return max(rates, default=None)


def alone_latency(results: list[dict[str, Any]]) -> float | None:
    """The mean latency of the requests sent alone to the step server (the first scenario's replay)."""
    latencies = [o["latency_s"] for r in results for o in r.get("alone", []) if o.get("status") == 200]
    return sum(latencies) / len(latencies) if latencies else None


def run_poisson(url: str, args, capacity: float | None, alone_s: float | None, duration_s: float) -> dict[str, Any]:
    """Open-loop arrivals at ``poisson_load`` x ``capacity`` for ``duration_s`` seconds against the step server."""
    from .report import summarize
    from .run import run_open_loop

    if not capacity:
        return {"scenario": "poisson", "checks": [_check("poisson", False, "no measured capacity to offer 90 % of")]}
    rate = args.poisson_load * capacity
    bodies = bodies_for(tuple(args.sizes_mixed.split(",")), max(1, math.ceil(rate * duration_s)), args)
    print(f"poisson step: {len(bodies)} requests at {rate:.2f}/s for {duration_s:.0f} s ...", flush=True)
    run = run_open_loop(url, bodies, label="poisson step", rate=rate, seed=0, time_limit_s=duration_s + DRAIN_S,
                        request_timeout_s=args.request_timeout)
    summary = summarize(run)
    trend, p99 = summary["queue_depth"], summary["latency_s"]["p99"]
    growing = None if trend is None else trend["last_third_mean"] > 2 * trend["first_third_mean"] + 2
    over_alone = p99 / alone_s if alone_s and p99 is not None else None
    checks = run_checks("poisson step", run, summary, len(bodies))
    checks.append(_check("poisson: no growing queue", None if args.no_targets or growing is None else not growing,
                         f"queue depth {trend}"))
    checks.append(_check("poisson: p99 <= 3x a request alone", None if args.no_targets or over_alone is None
                         else over_alone <= 3, f"p99 {_f(p99)} s, alone {_f(alone_s)} s: {_x(over_alone)}"))
    return {"scenario": "poisson", "rate": rate, "capacity": capacity, "duration_s": duration_s,
            "p99_over_alone": over_alone, "summaries": {"step": summary}, "checks": checks,
            "outcomes": {"step": [o.__dict__ for o in run.outcomes]}}


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def run_scenarios(names: list[str], urls: dict[str, str], args, budget: Budget) -> list[dict[str, Any]]:
    """The chosen closed-loop scenarios in order, then the open-loop one, each if the budget still has room."""
    results: list[dict[str, Any]] = []
    for name in (n for n in names if n in SCENARIOS):
        first = not any(not r.get("skipped") for r in results)
        cost = scenario_cost(name, args, first)
        results.append(run_scenario(name, urls, args, first) if cost <= budget.left()
                       else skipped(name, cost, budget.left()))
    if "poisson" in names:
        duration = min(args.poisson_s, budget.left() - 2 * DRAIN_S)
        results.append(run_poisson(urls["step"], args, mixed_capacity(results, args), alone_latency(results), duration)
                       if duration >= min(MIN_POISSON_S, args.poisson_s) else
                       skipped("poisson", args.poisson_s + 2 * DRAIN_S, budget.left()))
    return results


def run_all(args, names: list[str], budget: Budget) -> list[dict[str, Any]]:
    from .spawn import spawned_servers

    roles = roles_for(names, args)
    started = time.perf_counter()
    with spawned_servers([server_args(r, args) for r in roles], args.out_dir / "logs",
                         min(args.spawn_timeout, max(1.0, budget.left()))) as servers:
        print(f"servers {', '.join(roles)} listening after {time.perf_counter() - started:.1f} s", flush=True)
        return run_scenarios(names, dict(zip(roles, (s.url for s in servers))), args, budget)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    names = list(args.scenarios)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.time_budget)
    try:
        results = run_all(args, names, budget)
    except Exception as exc:  # noqa: BLE001 - e.g. a server that did not start: reported
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        results = [{"scenario": "start", "checks": [_check("servers ran", False, f"{type(exc).__name__}: {exc}")]}]
    passed = all(c["passed"] is not False for r in results for c in r["checks"])
    (args.out_dir / "step_bench.json").write_text(json.dumps({"results": results, "passed": passed,
                                                              "budget": budget.report(), "args": vars(args)},
                                                             indent=1, default=str))
    (args.out_dir / "step_bench.md").write_text(markdown(results, args, budget.report()))
    print(f"wrote {args.out_dir / 'step_bench.json'} and {args.out_dir / 'step_bench.md'}")
    print(f"result: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
