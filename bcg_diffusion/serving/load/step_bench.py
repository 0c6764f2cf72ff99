"""The step batching benchmark of issue 46: a step-batching server against the unbatched graph server, side by side
in one run, with the bitwise checks.

PixArt-Sigma (full size, binning off, 20 steps), servers built at once on the one GPU: ``off`` (BCG, no batching),
``step`` (BCG, ``--batching step --max-batch 8 --batch-work-limit 0``) and, with ``--eager-check``, ``eager-step``
(the step server without BCG). Scenarios (``--scenarios``), each the same request mix against ``off`` then ``step``:

- ``mixed-c8``, ``mixed-c16``: 256x256 and 384x384 mixed, 8 and 16 closed-loop clients (targets: step >= 1.8x the
  requests per second of off, p99 <= 0.8x);
- ``s256-c8``: 256x256 alone, 8 clients (target >= 2.2x); ``s512-c8``: 512x512, 8 clients (target >= 1.25x);
- ``poisson``: open-loop Poisson arrivals of the mixed sizes at ``--poisson-load`` (0.9) x the step server's
  throughput in the mixed scenario with the most clients (its capacity), for ``--poisson-s`` seconds, step server
  only (targets: no growing queue, p99 <= 3x the
  latency of a request alone).

Checks: every answer 200; equal requests equal; after the first scenario each distinct request sent again alone to
``step`` gives the same image (the latencies of these lone requests are the "alone" time); with ``--eager-check``,
``eager-step`` gives every image of the first scenario bitwise; nothing captured during any load. Each target is
reported PASS or FAIL; the slot occupancy of every step run is reported. ``step_bench.json`` (every summary and
outcome) and ``step_bench.md`` go to ``--out-dir``, the servers' logs under it.

Example (the GPU run; about 3 minutes with the defaults: 40-60 s to build and warm both servers, at most 12 s per
closed-loop run (8 runs), the alone replay, 20 s of open-loop arrivals)::

    python -m bcg_diffusion.serving.load.step_bench --out-dir outputs/step_bench

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
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.sizes import sizes_argument

from .mix import DEFAULT_PROMPTS, MixSpec, build_mix

__all__ = ["SCENARIOS", "build_parser", "main"]

#: name -> (which sizes, clients, minimum throughput ratio step / off, maximum p99 ratio)
SCENARIOS = {"mixed-c8": ("mixed", 8, 1.8, 0.8), "mixed-c16": ("mixed", 16, 1.8, 0.8),
             "s256-c8": ("small", 8, 2.2, None), "s512-c8": ("large", 8, 1.25, None)}
ALL_SCENARIOS = (*SCENARIOS, "poisson")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bcg_diffusion.serving.load.step_bench",
                                description="Step batching against the unbatched graph server (issue 46), with the "
                                "bitwise checks; JSON and Markdown reports.")
    p.add_argument("--out-dir", type=Path, required=True, help="where step_bench.json, step_bench.md and logs go")
    p.add_argument("--scenarios", default=",".join(ALL_SCENARIOS), help=f"default: {','.join(ALL_SCENARIOS)}")
    p.add_argument("--size", choices=("tiny", "full"), default="full", help="model size (default: full)")
    p.add_argument("--device", default="cuda", help="the servers' --device (default: cuda)")
    p.add_argument("--sizes-mixed", type=sizes_argument, default="256x256,384x384", help="the mixed scenarios' sizes")
    p.add_argument("--size-small", type=sizes_argument, default="256x256", help="s256's size")
    p.add_argument("--size-large", type=sizes_argument, default="512x512", help="s512's size")
    p.add_argument("--steps", type=int, default=20, help="steps per request (default: 20)")
    p.add_argument("--max-batch", type=int, default=8, help="the step server's --max-batch (default: 8)")
    p.add_argument("--step-policy", default="round_robin", help="the step server's --step-policy")
    p.add_argument("--requests", type=int, default=64, help="requests per closed-loop run (default: 64)")
    p.add_argument("--time-limit", type=finite_float, default=12.0,
                   help="seconds per closed-loop run: no request is sent after it (default: 12)")
    p.add_argument("--poisson-s", type=finite_float, default=20.0, help="seconds of open-loop arrivals (default: 20)")
    p.add_argument("--poisson-load", type=finite_float, default=0.9, help="open-loop rate / measured capacity (default: 0.9)")
    p.add_argument("--eager-check", action="store_true",
                   help="also build an eager step server and compare the first scenario's images with it")
    p.add_argument("--seeds", type=int, default=4, help="seeds per prompt (default: 4)")
    p.add_argument("--request-timeout", type=finite_float, default=60.0, help="seconds per request (default: 60)")
    p.add_argument("--spawn-timeout", type=finite_float, default=300.0, help="seconds to build and warm (default: 300)")
    p.add_argument("--no-targets", action="store_true", help="report the ratios without judging them (CPU rehearsal)")
    return p


def server_args(role: str, args) -> str:
    """The ``bcg-serve`` options of ``off``, ``step`` or ``eager-step``."""
    warm = ",".join(dict.fromkeys([*args.sizes_mixed.split(","), args.size_small, args.size_large]))
    words = [f"--model pixart --size {args.size} --device {args.device} --steps {args.steps} --warmup {warm} "
             "--max-n 1 --no-resolution-binning --max-queue 256"]
    if args.size == "full" and args.device != "cuda":
        words.append("--yes")
    if role != "eager-step":
        words.append("--bcg")
    if role != "off":
        words.append(f"--max-batch {args.max_batch} --batching step --batch-work-limit 0 "
                     f"--step-policy {args.step_policy}")
    return " ".join(words)


def sizes_of(kind: str, args) -> tuple[str, ...]:
    return {"mixed": tuple(args.sizes_mixed.split(",")), "small": (args.size_small,),
            "large": (args.size_large,)}[kind]


def bodies_for(sizes: tuple[str, ...], count: int, args) -> list[dict[str, Any]]:
    return build_mix(MixSpec(sizes=sizes, prompts=DEFAULT_PROMPTS, seeds=args.seeds, mix_seed=0), count)


def _check(name: str, passed: bool | None, detail: str) -> dict[str, Any]:
    verdict = "INFO" if passed is None else ("PASS" if passed else "FAIL")
    print(f"  {verdict}  {name}: {detail}", flush=True)
    return {"name": name, "passed": passed, "detail": detail}


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


def run_scenario(name: str, urls: dict[str, str], args, first: bool) -> dict[str, Any]:
    """One closed-loop scenario against ``off`` then ``step`` (the first also replays alone and checks eager)."""
    from .report import cross_check, summarize, throughput_ratio
    from .run import replay_alone, run_load

    kind, clients, min_ratio, max_p99 = SCENARIOS[name]
    bodies = bodies_for(sizes_of(kind, args), args.requests, args)
    runs = {}
    for role in ("off", "step") + (("eager-step",) if first and "eager-step" in urls else ()):
        print(f"{name} {role}: {len(bodies)} requests from {clients} clients ...", flush=True)
        runs[role] = run_load(urls[role], bodies, label=f"{name} {role}", concurrency=clients,
                              time_limit_s=args.time_limit, request_timeout_s=args.request_timeout)
    if first:
        replay_alone(urls["step"], runs["step"], request_timeout_s=args.request_timeout, time_limit_s=args.time_limit)
    summaries = {role: summarize(run) for role, run in runs.items()}
    judged = not args.no_targets
    ratio = throughput_ratio(summaries["off"], summaries["step"], min_ratio if judged else None,
                             max_p99 if judged else None)
    result = {"scenario": name, "sizes": sizes_of(kind, args), "clients": clients, "summaries": summaries,
              "ratio": ratio, "checks": [], "outcomes": {r: [o.__dict__ for o in run.outcomes] for r, run in runs.items()},
              "alone": [o.__dict__ for o in runs["step"].alone]}
    checks = result["checks"]
    for role, run in runs.items():
        checks += run_checks(f"{name} {role}", run, summaries[role], len(bodies))
    checks.append(_check(f"{name}: throughput step/off >= {min_ratio}x" + (f", p99 <= {max_p99}x" if max_p99 else ""),
                         ratio["passed"], f"throughput {_x(ratio['throughput_ratio'])}, p99 {_x(ratio['p99_ratio'])}, "
                         f"occupancy {_f((summaries['step']['batching'] or {}).get('occupancy'))}"))
    if first:
        checks += first_checks(runs, summaries, cross_check)
    return result


def first_checks(runs, summaries, cross_check) -> list[dict[str, Any]]:
    """The first scenario's bitwise checks: each image == the same request alone; == the eager step server."""
    alone = summaries["step"]["alone_check"]
    checks = [_check("step: each image == the same request alone", bool(alone) and not alone["mismatched"]
                     and not alone["failed"] and alone["equal"] == alone["distinct"],
                     "no replay" if not alone else f"{alone['equal']} of {alone['distinct']} distinct equal")]
    if "eager-step" in runs:
        cross = cross_check(runs["step"], runs["eager-step"])
        checks.append(_check("step == eager-step, request by request", not cross["mismatched"]
                             and not cross["not_compared"], f"{cross['equal']} of {cross['compared']} equal, "
                             f"mismatched {cross['mismatched'][:10]}, not compared {len(cross['not_compared'])}"))
    return checks


def mixed_capacity(results: list[dict[str, Any]]) -> float | None:
    """The step server's requests per second on the mixed sizes with the most clients run (its capacity there)."""
    mixed = [r for r in results if r["scenario"].startswith("mixed")]
    best = max(mixed, key=lambda r: r["clients"], default=None)
    return None if best is None else best["summaries"]["step"]["throughput_rps"]


def alone_latency(results: list[dict[str, Any]]) -> float | None:
    """The mean latency of the requests sent alone to the step server (the first scenario's replay)."""
    latencies = [o["latency_s"] for r in results for o in r.get("alone", []) if o.get("status") == 200]
    return sum(latencies) / len(latencies) if latencies else None


def run_poisson(url: str, args, capacity: float | None, alone_s: float | None) -> dict[str, Any]:
    """Open-loop arrivals at ``poisson_load`` x ``capacity`` for ``poisson_s`` seconds against the step server."""
    from .report import summarize
    from .run import run_open_loop

    if not capacity:
        return {"scenario": "poisson", "checks": [_check("poisson", False, "no measured capacity to offer 90 % of")]}
    rate = args.poisson_load * capacity
    bodies = bodies_for(tuple(args.sizes_mixed.split(",")), max(1, math.ceil(rate * args.poisson_s)), args)
    print(f"poisson step: {len(bodies)} requests at {rate:.2f}/s ...", flush=True)
    run = run_open_loop(url, bodies, label="poisson step", rate=rate, seed=0, time_limit_s=3 * args.poisson_s + 5,
                        request_timeout_s=args.request_timeout)
    summary = summarize(run)
    trend, p99 = summary["queue_depth"], summary["latency_s"]["p99"]
    growing = None if trend is None else trend["last_third_mean"] > 2 * trend["first_third_mean"] + 2
    checks = run_checks("poisson step", run, summary, len(bodies))
    checks.append(_check("poisson: no growing queue", None if args.no_targets or growing is None else not growing,
                         f"queue depth {trend}"))
    checks.append(_check("poisson: p99 <= 3x a request alone", None if args.no_targets or not alone_s or p99 is None
                         else p99 <= 3 * alone_s, f"p99 {_f(p99)} s, alone {_f(alone_s)} s"))
    return {"scenario": "poisson", "rate": rate, "capacity": capacity, "summaries": {"step": summary},
            "checks": checks, "outcomes": {"step": [o.__dict__ for o in run.outcomes]}}


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else f"{value:{spec}}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _md_row(scenario: str, role: str, s: dict[str, Any]) -> str:
    lat, b = s["latency_s"], s.get("batching") or {}
    return (f"| {scenario} | {role} | {s['ok']}/{s['requests']} | {_f(s['throughput_rps'], '.2f')} | {_f(lat['p50'])} | "
            f"{_f(lat['p99'])} | {_f(b.get('occupancy'), '.2f')} | {_f(b.get('mean_rows_per_step'), '.2f')} | "
            f"{_f(None if not b else 1000 * (b['step_s']['mean'] or 0), '.1f')} | "
            f"{_f(None if not b or b['wait_s']['mean'] is None else 1000 * b['wait_s']['mean'], '.1f')} |")


def markdown(results: list[dict[str, Any]], args) -> str:
    lines = [f"# Step batching benchmark ({time.strftime('%Y-%m-%d %H:%M:%S')})", "",
             f"PixArt-Sigma {args.size}, {args.steps} steps, step server `--max-batch {args.max_batch} --batching step "
             f"--step-policy {args.step_policy}` against the unbatched BCG server, device {args.device}.", "",
             "| scenario | server | ok | req/s | p50 s | p99 s | occupancy | rows per step | step ms | wait to join ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines += [_md_row(r["scenario"], role, s) for role, s in r.get("summaries", {}).items()]
    for r in results:
        ratio = r.get("ratio") or {}
        title = f"**{r['scenario']}**" + (f": throughput step/off {_x(ratio.get('throughput_ratio'))}, p99 step/off "
                                          f"{_x(ratio.get('p99_ratio'))}" if ratio else
                                          f" at {_f(r.get('rate'), '.2f')} req/s" if "rate" in r else "")
        lines += ["", title, ""]
        lines += [f"- {'INFO' if c['passed'] is None else 'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}"
                  for c in r["checks"]]
    return "\n".join(lines) + "\n"


def run_all(args, names: list[str]) -> list[dict[str, Any]]:
    from .spawn import spawned_servers

    roles = ["off", "step"] + (["eager-step"] if args.eager_check else [])
    started = time.perf_counter()
    with spawned_servers([server_args(r, args) for r in roles], args.out_dir / "logs", args.spawn_timeout) as servers:
        print(f"servers listening after {time.perf_counter() - started:.1f} s", flush=True)
        urls = dict(zip(roles, (s.url for s in servers)))
        results = [run_scenario(name, urls, args, first=index == 0)
                   for index, name in enumerate(n for n in names if n in SCENARIOS)]
        if "poisson" in names:
            results.append(run_poisson(urls["step"], args, mixed_capacity(results), alone_latency(results)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    if not names or any(n not in ALL_SCENARIOS for n in names):
        parser.error(f"--scenarios: some of {', '.join(ALL_SCENARIOS)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        results = run_all(args, names)
    except Exception as exc:  # noqa: BLE001 - e.g. a server that did not start: reported
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        results = [{"scenario": "start", "checks": [_check("servers ran", False, f"{type(exc).__name__}: {exc}")]}]
    passed = all(c["passed"] is not False for r in results for c in r["checks"])
    (args.out_dir / "step_bench.json").write_text(json.dumps({"results": results, "passed": passed,
                                                              "args": vars(args)}, indent=1, default=str))
    (args.out_dir / "step_bench.md").write_text(markdown(results, args))
    print(f"wrote {args.out_dir / 'step_bench.json'} and {args.out_dir / 'step_bench.md'}")
    print(f"result: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
