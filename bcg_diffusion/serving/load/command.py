"""Bounded load test of one or two ``scripts/serve.py`` servers on 127.0.0.1.

C client threads send N requests (a deterministic mix of sizes, prompts and seeds) within a time limit (or,
with ``--arrival-rate R``, the requests arrive at R per second, a seeded Poisson process: an open loop),
and the script reports p50/p95/p99 latency, throughput, errors by status, GPU memory at start and end
(from ``/stats``), and whether equal requests got bitwise equal images. With two servers (``--compare``,
two ``--url`` or two ``--spawn``) the same mix runs against each in turn, the numbers are printed side
by side, and every request's decoded pixels are compared across the servers. See ``docs/serving.md``.

Examples::

    python scripts/load.py --url http://127.0.0.1:8000 --requests 20 --concurrency 2
    python scripts/load.py --compare http://127.0.0.1:8000 http://127.0.0.1:8001 --out load.json
    python scripts/load.py --spawn "--model pixart --size full --no-resolution-binning --warmup 512x512" \\
                           --spawn "--model pixart --size full --no-resolution-binning --warmup 512x512 --bcg"

With ``--models a,b`` each request names one of those models (the base model's id, adapters); the report
counts them per model. A server that batches (``serve.py --max-batch``) adds its batching numbers from
``/stats`` (batched calls, requests per call, time waiting to be batched); ``--check-alone`` sends each
distinct request once more, alone, after the load, and requires its images to equal the load's (an image must
not depend on what it was batched with). ``--min-throughput-ratio`` / ``--max-p99-ratio`` compare two servers'
throughput and p99 (e.g. batching on against off, whose images differ: ``--no-cross-check``).

Exit code 0 when every request was answered 200, equal requests were equal and (two servers) both
servers' images were equal (unless ``--no-cross-check``), and the ratio targets given and ``--check-alone`` held;
1 otherwise; 2 for bad arguments, including a server that is not on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.files import why_not_writable, write_text_atomically
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.options import command_name
from bcg_diffusion.toolkit.sizes import Size

from .mix import DEFAULT_PROMPTS, DEFAULT_SIZES, MixSpec, build_mix  # stdlib only

try:
    from .run import check_loopback, get_stats, run_load  # httpx: the serve extra
except ModuleNotFoundError as exc:
    if exc.name != "httpx":
        raise
    MISSING: str | None = f"{exc}; install the load test's packages with: pip install -e \".[serve]\""
else:
    MISSING = None
    from .report import cross_check, format_report, latency_ratios, summarize, throughput_ratio
    from .run import replay_alone, run_open_loop
    from .spawn import SpawnError, spawned_servers, start_server, stop_server, wait_ready


class MixMismatch(ValueError):
    """The mix asks a server for what it refuses (a size off its granularity or above its limits): said before any
    traffic, as a usage error (exit code 2)."""


def prog() -> str:
    """The command's name in usage and error lines: ``bcg-load`` when run as that, else ``load.py``."""
    return command_name("load.py", "bcg-load")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Bounded load test of scripts/serve.py servers on 127.0.0.1 (one, or two side by side).",
        epilog="See docs/serving.md for the PixArt and Flux runs.",
    )
    for add_group in (add_server_arguments, add_load_arguments, add_mix_arguments, add_check_arguments,
                      add_spawn_arguments):
        add_group(p)
    return p


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("servers (one of)")
    g.add_argument("--url", action="append", default=[], metavar="URL",
                   help="a running server, http://127.0.0.1:PORT; twice for two servers")
    g.add_argument("--compare", nargs=2, metavar=("URL_A", "URL_B"), help="two running servers, side by side")
    g.add_argument("--spawn", action="append", default=[], metavar="ARGS",
                   help="start 'scripts/serve.py ARGS --host 127.0.0.1 --port 0' for the run and stop it after; "
                   "twice for two servers")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="send 'Authorization: Bearer KEY' (servers started with serve.py --api-key); default: the "
                   "environment variable BCG_API_KEY. Servers of --spawn get the same key")
    g.add_argument("--labels", default=None, metavar="A[,B]",
                   help="names of the servers in the report (default: eager/bcg and the stack, e.g. bcg+fp8+compile, from "
                   "their /stats)")


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load")
    g.add_argument("--requests", type=int, default=200, help="requests per server (default: 200)")
    g.add_argument("--concurrency", type=int, default=4, help="concurrent clients (default: 4)")
    g.add_argument("--time-limit", type=finite_float, default=600.0,
                   help="seconds per server after which no new request is sent (default: 600)")
    g.add_argument("--request-timeout", type=finite_float, default=300.0, help="seconds per request (default: 300)")
    add_open_loop_arguments(g)


def add_mix_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("request mix")
    g.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                   help=f"sizes WxH drawn per request (default: {','.join(DEFAULT_SIZES)}; warm the first three)")
    g.add_argument("--prompts", default=None, metavar="P1|P2|...",
                   help=f"prompts drawn per request, separated by '|' (default: {len(DEFAULT_PROMPTS)} built-in)")
    g.add_argument("--seeds", type=int, default=4, help="seeds drawn per request from 0 .. SEEDS-1 (default: 4)")
    g.add_argument("--mix-seed", type=int, default=0, help="seed of the mix itself (default: 0)")
    g.add_argument("--steps", type=int, default=None, help="num_inference_steps of every request (default: server's)")
    g.add_argument("--guidance", type=finite_float, default=None, help="guidance_scale of every request (default: server's)")
    g.add_argument("--negative-prompt", default=None, help="negative_prompt of every request")
    g.add_argument("--n", type=int, default=1, help="images per request (default: 1)")
    g.add_argument("--models", default=None, metavar="A,B,...",
                   help="model ids drawn per request as its 'model' field (the base model's id, adapters: GET "
                   "/v1/models lists them); default: no model field")


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checks and output")
    g.add_argument("--memory-tolerance", type=finite_float, default=0.05,
                   help="GPU memory allocated at the end may differ from the start by this fraction (default: 0.05)")
    g.add_argument("--max-latency-ratio", type=finite_float, default=None, metavar="R",
                   help="two servers: pass only if the second's p50 and p99 latency are <= R x the first's")
    g.add_argument("--min-throughput-ratio", type=finite_float, default=None, metavar="R",
                   help="two servers: pass only if the second's throughput is >= R x the first's")
    g.add_argument("--max-p99-ratio", type=finite_float, default=None, metavar="R",
                   help="two servers: pass only if the second's p99 latency is <= R x the first's")
    g.add_argument("--no-cross-check", action="store_true",
                   help="two servers whose images differ by design (batching on against off): do not compare them")
    g.add_argument("--check-alone", action="store_true",
                   help="after each server's load, send each distinct request once more, alone, and pass only if its "
                   "images equal the load's (a batching server: an image must not depend on its batch)")
    g.add_argument("--out", type=Path, default=None, help="write the results (and every request's outcome) as JSON")


def add_spawn_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spawned servers")
    g.add_argument("--spawn-timeout", type=finite_float, default=900.0,
                   help="seconds for spawned servers to build, warm up and listen (default: 900)")
    g.add_argument("--spawn-mode", choices=("together", "sequential"), default="together",
                   help="together: start every server at once (less wall time); sequential: one server on the "
                   "machine at a time (less memory; default: together)")
    g.add_argument("--spawn-log-dir", type=Path, default=None, help="where the servers' logs go (default: a temp dir)")


def add_open_loop_arguments(g) -> None:
    g.add_argument("--arrival-rate", type=finite_float, default=None, metavar="R",
                   help="open loop: requests arrive at R per second (a Poisson process, --arrival-seed) whatever the "
                   "answers, instead of --concurrency closed-loop clients; latency counts from each arrival")
    g.add_argument("--arrival-seed", type=int, default=0, help="seed of the open loop's arrivals (default: 0)")
    g.add_argument("--max-in-flight", type=int, default=256,
                   help="open loop: requests in flight at most; a later arrival waits for one (default: 256)")


def check_rates(args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a step count below 1 or an arrival rate that is not positive."""
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1 (got {args.steps})")
    if args.arrival_rate is not None and args.arrival_rate <= 0:
        parser.error(f"--arrival-rate must be > 0 requests per second (got {args.arrival_rate})")


def check_arguments(args, parser: argparse.ArgumentParser) -> None:
    targets = [bool(args.url), bool(args.compare), bool(args.spawn)]
    if sum(targets) != 1:
        parser.error("give exactly one of --url, --compare or --spawn")
    if len(args.url) > 2 or len(args.spawn) > 2:
        parser.error("at most two servers (two --url or two --spawn)")
    servers = len(args.url) or len(args.spawn) or 2
    if args.labels and len(args.labels.split(",")) != servers:
        parser.error(f"--labels {args.labels!r}: give one name per server ({servers})")
    for arg_string in args.spawn:
        words = arg_string.split()
        if any(w == flag or w.startswith(flag + "=") for w in words for flag in ("--host", "--port")):
            parser.error(f"--spawn {arg_string!r}: leave --host and --port out; spawned servers listen on "
                         "127.0.0.1 on a free port")
    for url in args.url + list(args.compare or []):
        try:
            check_loopback(url)
        except ValueError as exc:
            parser.error(str(exc))
    if (args.min_throughput_ratio is not None or args.max_p99_ratio is not None) and servers != 2:
        parser.error("--min-throughput-ratio and --max-p99-ratio compare two servers")
    check_numbers(args, parser)
    check_mix_texts(args, parser)
    if args.out is not None and (problem := why_not_writable(args.out)):
        parser.error(f"--out {str(args.out)!r} cannot be written: {problem}")


def check_numbers(args, parser: argparse.ArgumentParser) -> None:
    """Counts, times, ratios and the memory tolerance in range (every float is finite already: its type)."""
    for name in ("requests", "concurrency", "seeds", "n", "max_in_flight"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    check_rates(args, parser)
    for name in ("time_limit", "request_timeout", "spawn_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("min_throughput_ratio", "max_p99_ratio", "max_latency_ratio"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.models is not None:
        args.models = ",".join(m.strip() for m in args.models.split(","))
        if not all(args.models.split(",")):
            parser.error(f"--models {args.models!r}: give model ids separated by commas, none empty")
    if not 0 <= args.memory_tolerance:
        parser.error("--memory-tolerance must be >= 0")


def check_mix_texts(args, parser: argparse.ArgumentParser) -> None:
    """``--sizes`` written as sizes and ``--prompts`` holding no empty prompt: ``parser.error`` otherwise."""
    args.sizes = ",".join(size.strip() for size in args.sizes.split(","))
    for size in args.sizes.split(","):
        try:
            Size.parse(size, "--sizes")
        except ValueError as exc:
            parser.error(str(exc))
    if args.prompts is not None:
        prompts = args.prompts.split("|")
        if not any(text.strip() for text in prompts):
            parser.error(f"--prompts {args.prompts!r} holds no prompt; give prompts separated by '|', e.g. 'a fox|a cat'")
        empty = [i for i, text in enumerate(prompts, 1) if not text.strip()]
        if empty:
            parser.error(f"--prompts {args.prompts!r}: prompt {empty[0]} is empty; give prompts separated by '|', none "
                         "empty")


def mix_problem(stats: dict[str, Any], sizes: list[str]) -> str | None:
    """Why a server (its ``/stats``) would refuse a size of the mix, or ``None``: a side not a multiple of its
    pixel granularity or above its largest side, more pixels than its ``--max-pixels``."""
    server = stats.get("server", {})
    granularity, max_pixels, max_side = (server.get(k) for k in ("granularity", "max_pixels", "max_side"))
    for size in map(Size.parse, sizes):
        if granularity and (size.width % granularity or size.height % granularity):
            return f"--sizes {size}: the server takes multiples of {granularity} px (its model's VAE scale x patch size)"
        if max_side and max(size.width, size.height) > max_side:
            return f"--sizes {size}: the server's model runs at most {max_side} px per side"
        if max_pixels and size.pixels > max_pixels:
            return f"--sizes {size}: {size.pixels} pixels, above the server's --max-pixels {max_pixels}"
    return None


def mix_spec(args) -> MixSpec:
    prompts = tuple(p for p in args.prompts.split("|") if p.strip()) if args.prompts else DEFAULT_PROMPTS
    return MixSpec(sizes=tuple(args.sizes.split(",")), prompts=prompts, seeds=args.seeds, n=args.n,
                   steps=args.steps, guidance=args.guidance, negative_prompt=args.negative_prompt,
                   mix_seed=args.mix_seed, models=tuple(args.models.split(",")) if args.models else ())


def default_label(stats: dict[str, Any]) -> str:
    """``eager`` or ``bcg``, then the server's stack: ``bcg+fp8+compile+dbcache``."""
    server = stats.get("server", {})
    label = "bcg" if server.get("bcg") else "eager"
    stack = server.get("stack") or {}
    if not stack:  # a server from before the stack options
        return label + ("+compile" if server.get("compile") else "")
    parts = [stack.get("quant"), stack.get("attention_backend"), "compile" if stack.get("compile") else None,
             stack.get("cache")]
    return "+".join([label, *(p for p in parts if p)])


def labels_for(urls: list[str], args) -> list[str]:
    if args.labels:
        return args.labels.split(",")
    labels = [default_label(get_stats(u)) for u in urls]
    if len(set(labels)) < len(labels):
        labels = [f"{lbl}-{chr(ord('A') + i)}" for i, lbl in enumerate(labels)]
    return labels


def load_one(url: str, label: str, bodies, args) -> Any:
    rate = getattr(args, "arrival_rate", None)
    if rate is not None:
        print(f"{label}: {len(bodies)} requests to {url} arriving at {rate:g}/s (Poisson, seed "
              f"{args.arrival_seed}) ...", flush=True)
        run = run_open_loop(url, bodies, label=label, rate=rate, seed=args.arrival_seed, time_limit_s=args.time_limit,
                            request_timeout_s=args.request_timeout, max_in_flight=args.max_in_flight)
    else:
        print(f"{label}: {len(bodies)} requests to {url} from {args.concurrency} clients ...", flush=True)
        run = run_load(url, bodies, label=label, concurrency=args.concurrency, time_limit_s=args.time_limit,
                       request_timeout_s=args.request_timeout)
    print(f"{label}: done in {run.wall_s:.1f} s", flush=True)
    if getattr(args, "check_alone", False):
        replies = replay_alone(url, run, request_timeout_s=args.request_timeout, time_limit_s=args.time_limit)
        print(f"{label}: sent {len(replies)} distinct requests again, alone", flush=True)
    return run


def run_against_urls(urls: list[str], args, bodies) -> list[Any]:
    """The load against each server in turn, after checking that every server takes every size of the mix."""
    for url in urls:
        problem = mix_problem(get_stats(url), args.sizes.split(","))
        if problem:
            raise MixMismatch(f"{problem}; no request was sent ({url})")
    labels = labels_for(urls, args)
    return [load_one(url, label, bodies, args) for url, label in zip(urls, labels)]


def run_spawned(args, bodies) -> list[Any]:
    log_dir = args.spawn_log_dir or Path(tempfile.mkdtemp(prefix="bcg-load-"))
    print(f"starting {len(args.spawn)} server(s) ({args.spawn_mode}); logs in {log_dir}", flush=True)
    if args.spawn_mode == "together":
        start = time.perf_counter()
        with spawned_servers(args.spawn, log_dir, args.spawn_timeout) as servers:
            print(f"servers listening after {time.perf_counter() - start:.1f} s: "
                  f"{', '.join(s.url for s in servers)}", flush=True)
            return run_against_urls([s.url for s in servers], args, bodies)
    runs = []
    given = args.labels.split(",") if args.labels else []
    for i, arg_string in enumerate(args.spawn):
        server = start_server(arg_string, log_dir / f"server{i}.log")
        try:
            wait_ready([server], args.spawn_timeout)
            label = given[i] if len(given) == len(args.spawn) else default_label(get_stats(server.url))
            if any(r.label == label for r in runs):
                label = f"{label}-{chr(ord('A') + i)}"
            runs.append(load_one(server.url, label, bodies, args))
        finally:
            stop_server(server)
    return runs


def report(runs, args, spec: MixSpec) -> tuple[str, dict[str, Any], bool]:
    summaries = [summarize(r, args.memory_tolerance) for r in runs]
    cross = cross_check(runs[0], runs[1]) if len(runs) == 2 and not args.no_cross_check else None
    ratios = latency_ratios(summaries[0], summaries[1], args.max_latency_ratio) if len(runs) == 2 else None
    throughput = (throughput_ratio(summaries[0], summaries[1], args.min_throughput_ratio, args.max_p99_ratio)
                  if len(runs) == 2 else None)
    warmed = set((summaries[0]["server"].get("warmup") or {}).get("sizes") or [])
    sizes = ", ".join(s + ("*" if s in warmed else "") for s in spec.sizes)
    clients = (f"{args.concurrency} clients" if args.arrival_rate is None else
               f"open loop at {args.arrival_rate:g}/s (Poisson, seed {args.arrival_seed})")
    header = (f"load: {args.requests} requests per server, {clients}, sizes {sizes} (* warmed), "
              f"{len(spec.prompts)} prompts x {spec.seeds} seeds, mix seed {spec.mix_seed}")
    text = format_report(summaries, cross, ratios, header, throughput)
    passed = all(s["ok"] == s["requests"] == args.requests and not s["consistency"]["inconsistent_identities"]
                 for s in summaries)
    if cross is not None:
        passed = passed and not cross["mismatched"] and not cross["not_compared"]
    if ratios is not None and ratios["passed"] is False:
        passed = False
    if throughput is not None and throughput["passed"] is False:
        passed = False
    if args.check_alone:
        passed = passed and all(s["alone_check"] is not None and not s["alone_check"]["mismatched"]
                                and not s["alone_check"]["failed"] for s in summaries)
    result = {"mix": dataclasses.asdict(spec),
              "requests": args.requests, "concurrency": args.concurrency, "arrival_rate": args.arrival_rate,
              "arrival_seed": args.arrival_seed, "servers": summaries,
              "cross_check": cross, "latency_ratio": ratios, "throughput_ratio": throughput, "passed": passed,
              "outcomes": {r.label: [o.__dict__ for o in r.outcomes] for r in runs},
              "alone": {r.label: [o.__dict__ for o in r.alone] for r in runs if r.alone}}
    return text, result, passed


def _stop_on_sigterm(_signum, _frame):
    raise SystemExit(143)  # finally blocks stop spawned servers


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if MISSING:
            parser.error(MISSING)
        check_arguments(args, parser)
    except SystemExit as exc:
        return int(exc.code or 0)
    key_before = os.environ.get("BCG_API_KEY")
    if args.api_key:  # read by every client (run.client) and by the servers --spawn starts
        os.environ["BCG_API_KEY"] = args.api_key
    try:
        return run_and_report(args)
    finally:
        if key_before is None:
            os.environ.pop("BCG_API_KEY", None)
        else:
            os.environ["BCG_API_KEY"] = key_before


def run_and_report(args) -> int:
    spec = mix_spec(args)
    bodies = build_mix(spec, args.requests)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if in_main_thread else None
    try:
        if args.spawn:
            runs = run_spawned(args, bodies)
        else:
            runs = run_against_urls(args.url or list(args.compare), args, bodies)
    except MixMismatch as exc:
        print(f"{prog()}: error: {exc}", file=sys.stderr)
        return 2
    except SpawnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. a server that does not answer /stats
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    text, result, passed = report(runs, args, spec)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.out, json.dumps(result, indent=1, default=str))
        print(f"wrote {args.out}")
    print(f"result: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
