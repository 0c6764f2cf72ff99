"""The batching benchmark of issue 35: batching on against off, side by side in one run, with the bitwise checks.

PixArt-Sigma (full size, 512x512, binning off, 20 steps, 8 clients, 128 requests by default), three servers built
at once on the one GPU: BCG with batching off, BCG with batching on (``--max-batch``), and an eager server with
the same batching settings. The same request mix runs against each in turn; then each distinct request is sent
once more, alone, to the batching BCG server. Targets (each reported PASS or FAIL):

- throughput with batching >= ``--min-throughput-ratio`` (1.8) x without, p99 latency no higher, 0 errors;
- every image of the batching server bitwise equal (decoded pixels) to (a) the same request served alone by that
  server and (b) the eager server with the same batching settings;
- the batching server captured no graph during the load and ran no transformer call eagerly (``/stats``).

Flux.1-dev (512x512, 8 steps, 64 requests by default), batching off and on: the gain, measured and reported
(no target). The JSON report (every summary and outcome) and a Markdown summary go to ``--out-dir``.

Example (the GPU run, about 5 minutes on an H200)::

    python -m bcg_diffusion.serving.load.batching_bench --out-dir outputs/batching

A small CPU rehearsal (tiny models, seconds per server): ``--size tiny --device cpu --image-size 64x64 --steps 2
--requests 16 --flux-requests 8 --min-throughput-ratio 0`` (the ratio means nothing there).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.name_lists import name_list
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.sizes import sizes_argument

from ..serve_defaults import DEFAULT_WINDOW_MS
from .mix import DEFAULT_PROMPTS, MixSpec, build_mix

__all__ = ["build_parser", "main"]

DEFAULT_MAX_BATCH = 8
#: ``--families``: PixArt-Sigma (the targets) and Flux (the gain).
FAMILIES = ("pixart", "flux")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bcg_diffusion.serving.load.batching_bench",
                                description="Batching on against off (issue 35), with the bitwise checks; "
                                "JSON and Markdown reports.")
    p.add_argument("--out-dir", type=Path, required=True, help="where batching.json, batching.md and logs go")
    p.add_argument("--families", type=name_list(FAMILIES), default=FAMILIES,
                   help="pixart (the targets), flux (the gain); default both")
    p.add_argument("--size", choices=("tiny", "full"), default="full", help="model size (default: full)")
    p.add_argument("--device", default="cuda", help="the servers' --device (default: cuda)")
    p.add_argument("--image-size", type=sizes_argument, default="512x512",
                   help="the requests' size, also warmed (default: 512x512)")
    p.add_argument("--steps", type=int, default=20, help="PixArt steps per request (default: 20)")
    p.add_argument("--flux-steps", type=int, default=8, help="Flux steps per request (default: 8)")
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                   help=f"the batching servers' --max-batch (default: {DEFAULT_MAX_BATCH})")
    p.add_argument("--batch-window-ms", type=finite_float, default=DEFAULT_WINDOW_MS,
                   help=f"the batching servers' --batch-window-ms (default: {DEFAULT_WINDOW_MS:g})")
    p.add_argument("--batch-work-limit", type=int, default=0,
                   help="the batching servers' --batch-work-limit (default: 0, batch every size: the benchmark "
                   "measures batching itself, also at sizes the server keeps unbatched by default)")
    p.add_argument("--requests", type=int, default=128, help="PixArt requests per server (default: 128)")
    p.add_argument("--flux-requests", type=int, default=64, help="Flux requests per server (default: 64)")
    p.add_argument("--concurrency", type=int, default=8, help="clients (default: 8)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per prompt: distinct requests = 6 prompts x SEEDS")
    p.add_argument("--min-throughput-ratio", type=finite_float, default=1.8,
                   help="PixArt target: batching throughput / no batching (default: 1.8; 0: report only)")
    p.add_argument("--time-limit", type=finite_float, default=150.0, help="seconds per server's load (default: 150)")
    p.add_argument("--request-timeout", type=finite_float, default=60.0, help="seconds per request (default: 60)")
    p.add_argument("--spawn-timeout", type=finite_float, default=300.0, help="seconds to build and warm (default: 300)")
    return p


def _server_args(family: str, args, steps: int, batching: bool, bcg: bool) -> str:
    words = [f"--model {family} --size {args.size} --device {args.device} --steps {steps} "
             f"--warmup {args.image_size} --max-n 1"]
    if family == "pixart":
        words.append("--no-resolution-binning")
    if args.size == "full" and args.device != "cuda":
        words.append("--yes")
    if bcg:
        words.append("--bcg")
    if batching:
        words.append(f"--max-batch {args.max_batch} --batch-window-ms {args.batch_window_ms:g}")
        words.append(f"--batch-work-limit {args.batch_work_limit}")
    return " ".join(words)


def _load(url: str, label: str, bodies, args, alone: bool = False):
    from .run import replay_alone, run_load

    print(f"{label}: {len(bodies)} requests from {args.concurrency} clients ...", flush=True)
    run = run_load(url, bodies, label=label, concurrency=args.concurrency, time_limit_s=args.time_limit,
                   request_timeout_s=args.request_timeout)
    print(f"{label}: done in {run.wall_s:.1f} s", flush=True)
    if alone:
        replies = replay_alone(url, run, request_timeout_s=args.request_timeout, time_limit_s=args.time_limit)
        print(f"{label}: {len(replies)} distinct requests sent again, alone", flush=True)
    return run


def _bcg_moved(run) -> dict[str, int] | None:
    """How the batching server's BCG counters moved during the load (``None`` without BCG)."""
    start, end = run.stats_start.get("bcg"), run.stats_end.get("bcg")
    if not start or not end:
        return None
    return {k: end[k] - start[k] for k in ("hits", "captures", "failed_captures", "eager_calls", "warmup_calls")}


def _check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    print(f"  {'PASS' if passed else 'FAIL'}  {name}: {detail}", flush=True)
    return {"name": name, "passed": passed, "detail": detail}


def run_family(family: str, args, log_dir: Path) -> dict[str, Any]:
    """One family's servers, loads and checks."""
    from .report import summarize, throughput_ratio
    from .spawn import spawned_servers

    targets = family == "pixart"
    steps = args.steps if family == "pixart" else args.flux_steps
    count = args.requests if family == "pixart" else args.flux_requests
    roles = {"off": _server_args(family, args, steps, batching=False, bcg=True),
             "on": _server_args(family, args, steps, batching=True, bcg=True)}
    if targets:
        roles["eager-on"] = _server_args(family, args, steps, batching=True, bcg=False)
    bodies = build_mix(MixSpec(sizes=(args.image_size,), prompts=DEFAULT_PROMPTS, seeds=args.seeds, mix_seed=0), count)
    print(f"{family}: starting {len(roles)} servers ({', '.join(roles)}); logs in {log_dir / family}", flush=True)
    started = time.perf_counter()
    with spawned_servers(list(roles.values()), log_dir / family, args.spawn_timeout) as servers:
        print(f"{family}: listening after {time.perf_counter() - started:.1f} s", flush=True)
        urls = dict(zip(roles, (s.url for s in servers)))
        runs = {role: _load(urls[role], f"{family} {role}", bodies, args, alone=(role == "on" and targets))
                for role in roles}
    summaries = {role: summarize(run) for role, run in runs.items()}
    ratio = throughput_ratio(summaries["off"], summaries["on"],
                             args.min_throughput_ratio if targets and args.min_throughput_ratio > 0 else None,
                             1.0 if targets else None)
    result: dict[str, Any] = {"family": family, "steps": steps, "requests": count, "server_args": roles,
                              "summaries": summaries, "ratio": ratio, "checks": [],
                              "outcomes": {role: [o.__dict__ for o in run.outcomes] for role, run in runs.items()},
                              "alone": {role: [o.__dict__ for o in run.alone] for role, run in runs.items() if run.alone}}
    print(f"{family}: throughput on/off {ratio['throughput_ratio']:.2f}x, p99 on/off {ratio['p99_ratio']:.2f}x"
          if ratio["throughput_ratio"] and ratio["p99_ratio"] else f"{family}: ratios unavailable", flush=True)
    result["checks"] = _load_checks(summaries, count)
    if targets:
        result["checks"] += _target_checks(result, runs, summaries, args, count)
    return result


def _load_checks(summaries: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Every server answered every request, equal requests equal; the batching server shared calls."""
    checks = []
    for role, s in summaries.items():
        checks.append(_check(f"{role}: every request answered 200", s["ok"] == s["requests"] == count,
                             f"{s['ok']}/{s['requests']} of {count}, errors {s['errors'] or 'none'}"))
        checks.append(_check(f"{role}: equal requests equal", not s["consistency"]["inconsistent_identities"],
                             f"{s['consistency']['repeated_identities']} repeated identities"))
    batching = summaries["on"]["batching"]
    checks.append(_check("on: requests shared calls", bool(batching) and batching["batches"] < count,
                         "no batching numbers" if not batching else
                         f"{batching['batches']} calls for {batching['batched_requests']} requests, per call "
                         f"{batching['requests_per_batch']}"))
    return checks


def _target_checks(result: dict[str, Any], runs: dict[str, Any], summaries: dict[str, Any], args,
                   count: int) -> list[dict[str, Any]]:
    """The targets (PixArt): the throughput ratio, (a) each image equal to the same request alone, (b) batched BCG
    equal to batched eager request by request, and (CUDA) every call of the load a replay."""
    from .report import cross_check

    ratio, alone = result["ratio"], summaries["on"]["alone_check"]
    checks = [_check(f"throughput on/off >= {args.min_throughput_ratio}x and p99 on <= off", ratio["passed"] is not False,
                     f"throughput {ratio['throughput_ratio']}, p99 {ratio['p99_ratio']}"),
              _check("(a) on: each image == the same request alone", bool(alone) and not alone["mismatched"]
                     and not alone["failed"] and alone["equal"] == alone["distinct"],
                     "no replay" if not alone else f"{alone['equal']} of {alone['distinct']} distinct equal, "
                     f"mismatched {alone['mismatched']}, failed {alone['failed']}")]
    cross = result["cross_check_eager"] = cross_check(runs["on"], runs["eager-on"])
    checks.append(_check("(b) on == eager-on, request by request", not cross["mismatched"] and not cross["not_compared"]
                         and cross["equal"] == count,
                         f"{cross['equal']} of {cross['compared']} equal, mismatched {cross['mismatched'][:10]}, "
                         f"not compared {len(cross['not_compared'])}"))
    moved = result["bcg_moved_on"] = _bcg_moved(runs["on"])
    if args.device == "cuda":
        checks.append(_check("on: replayed, nothing captured or eager during the load", bool(moved)
                             and moved["hits"] > 0 and moved["captures"] == 0 and moved["eager_calls"] == 0
                             and moved["failed_captures"] == 0 and moved["warmup_calls"] == 0, f"{moved}"))
    return checks


def _row(family: str, role: str, s: dict[str, Any]) -> str:
    lat, b = s["latency_s"], s.get("batching")
    fmt = (lambda v, spec=".3f": "-" if v is None else f"{v:{spec}}")
    batches = "-" if not b else f"{b['batches']} ({fmt(b['mean_requests_per_batch'], '.2f')})"
    wait = "-" if not b or b["wait_s"]["mean"] is None else f"{1000 * b['wait_s']['mean']:.1f}"
    closed = "-" if not b or not b.get("closed_by") else "/".join(str(b["closed_by"].get(k, 0))
                                                                 for k in ("full", "returns", "window"))
    back = (b or {}).get("return_s") or {}
    returns = ("-" if not back.get("count") else
               f"{1000 * back['mean']:.0f} / {1000 * back['max_since_start']:.0f}")
    return (f"| {family} | {role} | {s['ok']}/{s['requests']} | {fmt(lat['p50'])} | {fmt(lat['p95'])} | "
            f"{fmt(lat['p99'])} | {fmt(s['throughput_rps'], '.2f')} | {batches} | {wait} | {closed} | {returns} |")


def markdown(results: list[dict[str, Any]], args) -> str:
    lines = [f"# Batching benchmark ({time.strftime('%Y-%m-%d %H:%M:%S')})", "",
             f"`--max-batch {args.max_batch} --batch-window-ms {args.batch_window_ms:g} --batch-work-limit "
             f"{args.batch_work_limit}`, {args.concurrency} clients, size {args.image_size}, model size {args.size}, "
             f"device {args.device}.", "",
             "| family | server | ok | p50 s | p95 s | p99 s | req/s | batched calls (requests per call) | "
             "batch wait mean ms | closed by full/returns/window | return mean / max ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines += [_row(r["family"], role, s) for role, s in r["summaries"].items()]
    for r in results:
        ratio = r["ratio"]
        fmt = (lambda v: "-" if v is None else f"{v:.2f}x")
        lines += ["", f"**{r['family']}** ({r['steps']} steps, {r['requests']} requests): throughput on/off "
                  f"{fmt(ratio['throughput_ratio'])}, p99 on/off {fmt(ratio['p99_ratio'])}", ""]
        lines += [f"- {'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}" for c in r["checks"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for family in args.families:
        try:
            results.append(run_family(family, args, args.out_dir / "logs"))
        except Exception as exc:  # noqa: BLE001 - e.g. a server that did not start: reported, then the next
            print(f"error: {family}: {type(exc).__name__}: {exc}", file=sys.stderr)
            results.append({"family": family, "error": f"{type(exc).__name__}: {exc}", "summaries": {},
                            "ratio": {"throughput_ratio": None, "p99_ratio": None}, "steps": None,
                            "requests": None, "checks": [{"name": "ran", "passed": False, "detail": str(exc)}]})
    passed = all(c["passed"] for r in results for c in r["checks"])
    (args.out_dir / "batching.json").write_text(json.dumps({"results": results, "passed": passed}, indent=1,
                                                           default=str))
    (args.out_dir / "batching.md").write_text(markdown(results, args))
    print(f"wrote {args.out_dir / 'batching.json'} and {args.out_dir / 'batching.md'}")
    print(f"result: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
