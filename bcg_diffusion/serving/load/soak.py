"""A bounded soak of one ``bcg-serve`` server on 127.0.0.1: thousands of requests of every kind a server meets,
with the server's memory watched and every answer checked.

The request mix (seeded) holds valid image requests (mixed sizes, ``n``, LoRA adapters by the ``model`` field;
a fixed set of distinct requests, so equal ones recur), bad requests (malformed JSON, bad sizes, an unknown
model, ...), injected faults (fault rules, :mod:`.fault_rules`: a failure and an out-of-memory error inside the
pipeline, which answer 500 and 503, and a slow call), clients that disconnect while their request is being served,
and clients that send their body slowly. ``--spawn ARGS`` starts the server itself with what the mix needs (the
fault rules, through :mod:`.fault_server`; random LoRA adapters, batching, the sizes warmed); ``--url`` takes a
running one started with the same (``--pid`` lets the host memory be read).

The run is split into phases; after each the soak waits until the server is idle and reads its GPU memory
(``/stats``) and its process's resident memory (``/proc/PID/status``): the first phase is the warm-up, the
later readings are compared with its. At the end every distinct image request is sent once more, alone, and
its images must equal (decoded pixels) every image the load got for it. The checks and the report:
:mod:`.soak_report`. Every loop is bounded by the request count and ``--time-limit`` (at most 600 s), every
request by its timeout; only ``http://127.0.0.1:PORT`` is accepted.

    python -m bcg_diffusion.serving.load.soak --spawn "--model flux --device cpu --steps 1" --requests 40 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import random
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.sizes import sizes_argument

from ..http.png import pixel_hash
from .mix import DEFAULT_PROMPTS, identity
from .run import API_KEY_VARIABLE, check_loopback, client, get_stats
from .soak_report import report, write_reports

__all__ = ["FAULT_PROMPTS", "KINDS", "SoakMix", "SoakOutcome", "SoakRequest", "build_requests", "fault_rules", "main",
           "run_soak"]

#: The prompts of the soak's faults: a fault rule ``KIND:PROMPT`` (:mod:`.fault_rules`) for each, installed in the
#: server it starts (:mod:`.fault_server`).
FAULT_PROMPTS = {"error": "__soak_error__", "oom": "__soak_oom__", "slow": "__soak_slow__"}
#: Request kinds and their shares of the mix (every kind at least once).
SHARES = {"image": 0.815, "bad": 0.07, "disconnect": 0.04, "slow_body": 0.03, "fault_error": 0.02,
          "fault_oom": 0.02, "fault_slow": 0.005}  # a slow fault holds the pipeline 2 s
KINDS = tuple(SHARES)
IMAGE_KINDS = ("image", "slow_body", "fault_slow")  # answered with images (disconnect: never read)
MAX_TIME_LIMIT_S = 600.0
#: What a failing injected fault may be answered with (see :func:`build_requests`).
FAULT_STATUSES = (500, 503)
#: The share of the time limit kept for sending each distinct image alone after the load (at most 60 s).
ALONE_SHARE = 0.15


@dataclass(frozen=True)
class SoakRequest:
    """One request of the mix: its kind, its JSON body (or ``raw`` bytes for a malformed one), the HTTP
    statuses it may be answered with (none for a client that disconnects), and what a bad one gets wrong."""

    index: int
    kind: str
    body: dict[str, Any] | None
    expect: tuple[int, ...]
    raw: bytes | None = None
    what: str = ""

    def payload(self) -> bytes:
        return self.raw if self.raw is not None else json.dumps(self.body).encode()

    @property
    def identity(self) -> str | None:
        return identity(self.body) if self.kind in IMAGE_KINDS and self.body is not None else None


@dataclass
class SoakOutcome:
    """What one request got: the status (0: no answer), latency, the images' pixel hashes, an error."""

    index: int
    kind: str
    status: int
    latency_s: float
    expect: tuple[int, ...]
    identity: str | None = None
    pixel_hashes: tuple[str, ...] = ()
    error: str | None = None

    @property
    def as_expected(self) -> bool:
        if not self.expect:  # a client that disconnected: nothing to read
            return self.error is None
        return self.status in self.expect and not (self.status == 200 and self.error)


@dataclass(frozen=True)
class SoakMix:
    """What the image requests draw from: ``distinct`` requests cycling through sizes, ``n`` values and models
    (``""``: the base model, no ``model`` field), one seed each; the faults use ``fault_steps`` so that they
    never share a pipeline call with an image request."""

    sizes: tuple[str, ...]
    ns: tuple[int, ...] = (1, 2)
    models: tuple[str, ...] = ("",)
    prompts: tuple[str, ...] = DEFAULT_PROMPTS[:3]
    distinct: int = 24
    fault_steps: int = 3
    seed: int = 0


def distinct_images(mix: SoakMix) -> list[dict[str, Any]]:
    """The distinct image request bodies: request ``i`` has seed ``i`` and cycles through every size, ``n``,
    model and prompt, so each appears at least once when ``distinct`` is at least the longest of them."""
    bodies = []
    for i in range(mix.distinct):
        body = {"prompt": mix.prompts[i % len(mix.prompts)], "size": mix.sizes[i % len(mix.sizes)], "seed": i,
                "n": mix.ns[i % len(mix.ns)], "response_format": "b64_json"}
        model = mix.models[i % len(mix.models)]
        if model:
            body["model"] = model
        bodies.append(body)
    return bodies


def bad_requests(size: str) -> list[tuple[bytes, tuple[int, ...], str]]:
    """Malformed or refused bodies: ``(raw bytes, the status expected, what is wrong)``."""
    def dump(body: dict) -> bytes:
        return json.dumps(body).encode()

    return [
        (b'{"prompt": "a fox", "size": "' + size.encode(), (400,), "truncated JSON"),
        (b"[1, 2, 3]", (400,), "not a JSON object"),
        (b"", (400,), "empty body"),
        (dump({"prompt": "a fox", "size": "63x65"}), (400,), "size not a multiple of the granularity"),
        (dump({"prompt": "a fox", "size": "0x0"}), (400,), "zero size"),
        (dump({"prompt": "a fox", "size": "8192x8192"}), (400,), "size above --max-pixels"),
        (dump({"prompt": "a fox", "size": "big"}), (400,), "size not WxH"),
        (dump({"prompt": "a fox", "size": size, "model": "no-such-model"}), (404,), "unknown model"),
        (dump({"prompt": "a fox", "size": size, "n": 1000}), (400,), "n out of range"),
        (dump({"prompt": "", "size": size}), (400,), "empty prompt"),
        (dump({"prompt": "a fox", "size": size, "num_inference_step": 2}), (400,), "unknown field"),
    ]


def _kinds(count: int, rng: random.Random) -> list[str]:
    """``count`` kinds in the shares of :data:`SHARES`, each at least once (if ``count`` allows), shuffled."""
    counts = {kind: max(1, round(share * count)) for kind, share in SHARES.items() if kind != "image"}
    counts["image"] = max(count - sum(counts.values()), 0)
    kinds = [kind for kind, n in counts.items() for _ in range(n)][:count]
    rng.shuffle(kinds)
    return kinds


def build_requests(mix: SoakMix, count: int) -> list[SoakRequest]:
    """``count`` requests, the same for the same mix (``mix.seed``)."""
    rng = random.Random(mix.seed)
    images, bad = distinct_images(mix), bad_requests(mix.sizes[0])
    out = []
    for index, kind in enumerate(_kinds(count, rng)):
        body = dict(rng.choice(images))
        if kind == "bad":
            raw, expect, what = rng.choice(bad)
            out.append(SoakRequest(index, kind, None, expect, raw=raw, what=what))
            continue
        if kind.startswith("fault_"):
            fault = kind.split("_", 1)[1]
            body = {**body, "prompt": FAULT_PROMPTS[fault]}
            body.pop("model", None)
            if fault != "slow":  # a failing call fails every request it carries: keep the faults to themselves
                body["num_inference_steps"] = mix.fault_steps
        # The failing faults share pipeline calls with each other (the same steps, never an image's): a batched call
        # that fails answers every request it carries with its first fault, an error (500) or an out-of-memory (503).
        expect = {"disconnect": (), "fault_error": FAULT_STATUSES, "fault_oom": FAULT_STATUSES}.get(kind, (200,))
        out.append(SoakRequest(index, kind, body, expect))
    return out


# -- sending ------------------------------------------------------------------------------------------------
def _auth_header() -> str:
    key = os.environ.get(API_KEY_VARIABLE)
    return f"Authorization: Bearer {key}\r\n" if key else ""


def _hashes(answer: dict[str, Any]) -> tuple[str, ...]:
    return tuple(pixel_hash(item["b64_json"]) for item in answer["data"])


def _outcome(request: SoakRequest, status: int, start: float, answer: Any = None, error: str | None = None) -> SoakOutcome:
    """The outcome of ``request``; a 200 answer's images are hashed (a malformed one is an error)."""
    outcome = SoakOutcome(request.index, request.kind, status, time.perf_counter() - start, request.expect,
                          request.identity, error=error)
    if status == 200 and error is None:
        try:
            outcome.pixel_hashes = _hashes(answer)
            if request.body is not None and len(outcome.pixel_hashes) != request.body.get("n", 1):
                outcome.error = f"asked for {request.body.get('n', 1)} images, got {len(outcome.pixel_hashes)}"
        except (KeyError, TypeError, ValueError) as exc:
            outcome.error = f"bad answer: {type(exc).__name__}: {exc}"
    elif status and status not in request.expect and isinstance(answer, dict):
        outcome.error = str((answer.get("error") or {}).get("message", answer))[:300]
    return outcome


def send_http(http, request: SoakRequest) -> SoakOutcome:
    """An image, bad or fault request through ``http`` (an httpx client); never raises for transport errors."""
    import httpx

    start = time.perf_counter()
    try:
        response = http.post("/v1/images/generations", content=request.payload(),
                             headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        return _outcome(request, 0, start, error=f"{type(exc).__name__}: {exc}")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    return _outcome(request, response.status_code, start, answer)


def _request_head(url: str, length: int) -> bytes:
    host = urlsplit(url).netloc
    return (f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{_auth_header()}Connection: close\r\n\r\n").encode()


def _connect(url: str, timeout_s: float) -> socket.socket:
    parts = urlsplit(check_loopback(url))
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)


def send_disconnect(url: str, request: SoakRequest, after_s: float) -> SoakOutcome:
    """Send the whole request, then close the connection after ``after_s`` without reading the answer."""
    start = time.perf_counter()
    body = request.payload()
    try:
        with _connect(url, 10.0) as sock:
            sock.sendall(_request_head(url, len(body)) + body)
            time.sleep(after_s)
    except OSError as exc:
        return _outcome(request, 0, start, error=f"could not send: {exc}")
    return _outcome(request, 0, start)


def _read_answer(sock: socket.socket) -> tuple[int, Any]:
    """Status and JSON of an HTTP/1.1 answer read to the end of the connection (``Connection: close``)."""
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return status, json.loads(body) if body else None


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2:]
    return out


def send_slow_body(url: str, request: SoakRequest, seconds: float, timeout_s: float, pieces: int = 8) -> SoakOutcome:
    """Send the headers, then the body in ``pieces`` spread over ``seconds``; read the answer."""
    start = time.perf_counter()
    body = request.payload()
    step = -(-len(body) // pieces)
    try:
        with _connect(url, timeout_s) as sock:
            sock.sendall(_request_head(url, len(body)))
            for i in range(0, len(body), step):
                time.sleep(seconds / pieces)
                sock.sendall(body[i:i + step])
            status, answer = _read_answer(sock)
    except (OSError, ValueError, IndexError) as exc:
        return _outcome(request, 0, start, error=f"{type(exc).__name__}: {exc}")
    return _outcome(request, status, start, answer)


# -- the server's memory ------------------------------------------------------------------------------------------
def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of process ``pid`` from ``/proc/PID/status`` (``None`` where it cannot be read)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def wait_idle(url: str, timeout_s: float) -> dict[str, Any]:
    """``/stats`` once nothing is queued, batching or running (or after ``timeout_s``; ``idle`` says which).
    A server that does not answer gives ``{"idle": False, "error": ...}`` (a dead server is reported, not raised)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stats = get_stats(url)
        except Exception as exc:  # noqa: BLE001 - the report says the server stopped answering
            return {"idle": False, "error": f"/stats: {type(exc).__name__}: {exc}"}
        c = stats.get("counters", {})
        idle = not (c.get("queue_depth") or c.get("running") or c.get("batch_pending"))
        if idle or time.monotonic() >= deadline:
            return {**stats, "idle": idle}
        time.sleep(0.2)


def checkpoint(url: str, pid: int | None, sent: int, timeout_s: float) -> dict[str, Any]:
    """The server's memory once it is idle, after ``sent`` requests."""
    stats = wait_idle(url, timeout_s)
    memory = stats.get("gpu_memory") or {}
    return {"sent": sent, "t": time.time(), "idle": stats["idle"], "gpu_allocated": memory.get("allocated_bytes"),
            "gpu_reserved": memory.get("reserved_bytes"), "rss": rss_bytes(pid), "counters": stats.get("counters"),
            "error": stats.get("error")}


class _Sampler(threading.Thread):
    """Reads ``/stats`` GPU memory and the server's resident memory every ``interval_s`` until stopped."""

    def __init__(self, url: str, pid: int | None, interval_s: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.url, self.pid, self.interval_s = url, pid, interval_s
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with client(self.url, 10.0) as http:
            while not self._halt.wait(self.interval_s):
                try:
                    memory = http.get("/stats").json().get("gpu_memory") or {}
                except Exception:  # noqa: BLE001 - a missed sample is only a gap
                    continue
                self.samples.append({"t": time.time(), "gpu_allocated": memory.get("allocated_bytes"),
                                     "rss": rss_bytes(self.pid)})

    def stop(self) -> None:
        self._halt.set()
        self.join(15.0)


# -- the run ----------------------------------------------------------------------------------------------------
@dataclass
class SoakOptions:
    """How the requests are sent: clients, bounds, and the timing of the special clients."""

    concurrency: int = 8
    time_limit_s: float = 600.0
    request_timeout_s: float = 120.0
    phases: int = 5
    disconnect_after_s: float = 0.05
    slow_body_s: float = 1.0
    poll_s: float = 1.0


@dataclass
class SoakRun:
    """Everything one soak saw (the report is made from it)."""

    outcomes: list[SoakOutcome] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stats_start: dict[str, Any] = field(default_factory=dict)
    stats_end: dict[str, Any] = field(default_factory=dict)
    alone: list[SoakOutcome] = field(default_factory=list)
    not_sent: int = 0
    wall_s: float = 0.0


def _sender(url: str, options: SoakOptions) -> Callable[[Any, SoakRequest], SoakOutcome]:
    def send(http, request: SoakRequest) -> SoakOutcome:
        if request.kind == "disconnect":
            return send_disconnect(url, request, options.disconnect_after_s)
        if request.kind == "slow_body":
            return send_slow_body(url, request, options.slow_body_s, options.request_timeout_s)
        return send_http(http, request)
    return send


def run_phase(url: str, requests: list[SoakRequest], options: SoakOptions, deadline: float) -> tuple[list[SoakOutcome], int]:
    """Send ``requests`` from ``options.concurrency`` clients, each taking the next; none started after
    ``deadline`` (those are counted as not sent)."""
    send, outcomes, lock, cursor = _sender(url, options), [], threading.Lock(), itertools.count()
    skipped = [0]

    def client_loop() -> None:
        with client(url, options.request_timeout_s) as http:
            while (index := next(cursor)) < len(requests):
                if time.monotonic() >= deadline:
                    with lock:
                        skipped[0] += 1
                    continue
                outcome = send(http, requests[index])
                with lock:
                    outcomes.append(outcome)

    threads = [threading.Thread(target=client_loop, name=f"soak-client-{i}", daemon=True)
               for i in range(options.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.0) + options.request_timeout_s + 15)
    return sorted(outcomes, key=lambda o: o.index), skipped[0]


def send_alone(url: str, outcomes: list[SoakOutcome], requests: list[SoakRequest], timeout_s: float,
               deadline: float) -> list[SoakOutcome]:
    """Each distinct image request answered during the load, sent once more alone (one client, in turn)."""
    firsts: dict[str, SoakRequest] = {}
    answered = {o.index for o in outcomes if o.status == 200}
    for request in requests:
        if request.kind == "image" and request.index in answered:
            firsts.setdefault(request.identity, request)
    replies = []
    with client(url, timeout_s) as http:
        for request in firsts.values():
            if time.monotonic() >= deadline:
                break
            replies.append(send_http(http, request))
    return replies


def run_soak(url: str, pid: int | None, requests: list[SoakRequest], options: SoakOptions) -> SoakRun:
    """Send ``requests`` in ``options.phases`` phases, a memory checkpoint after each (and one before), then
    each distinct image request alone; the server's ``/stats`` at the start and the end."""
    url = check_loopback(url)
    run, start = SoakRun(stats_start=get_stats(url)), time.perf_counter()
    limit = min(options.time_limit_s, MAX_TIME_LIMIT_S)
    deadline = time.monotonic() + limit  # the alone checks end by it; the load by alone_reserve before it
    load_deadline = deadline - min(ALONE_SHARE * limit, 60.0)
    run.checkpoints.append(checkpoint(url, pid, 0, options.request_timeout_s))
    sampler = _Sampler(url, pid, options.poll_s)
    sampler.start()
    try:
        size = -(-len(requests) // options.phases)
        for first in range(0, len(requests), size):
            outcomes, skipped = run_phase(url, requests[first:first + size], options, load_deadline)
            run.outcomes += outcomes
            run.not_sent += skipped
            run.checkpoints.append(checkpoint(url, pid, first + len(outcomes), options.request_timeout_s))
    finally:
        sampler.stop()
        run.samples = sampler.samples
    run.alone = send_alone(url, run.outcomes, requests, options.request_timeout_s, deadline)
    run.stats_end = wait_idle(url, options.request_timeout_s)
    run.wall_s = time.perf_counter() - start
    return run


# -- the command ----------------------------------------------------------------------------------------------------
def make_adapters(words: list[str], count: int, folder: Path) -> tuple[dict[str, Path], str]:
    """``count`` random LoRA adapters for the family and size of the server's ``--model`` and ``--size``; the
    adapters by name and a note (why there are none, where the family takes no LoRA)."""
    from bcg_pipelines import list_families, lora_files

    known = argparse.ArgumentParser(add_help=False)
    known.add_argument("--model", default="flux")
    known.add_argument("--size", default="tiny")
    given, _ = known.parse_known_args(words)
    if count < 1 or given.model not in list_families():
        return {}, "" if count < 1 else f"no adapters: --model {given.model} is not a family of bcg_pipelines"
    try:
        paths = {f"soak{i}": lora_files.write_family_lora(given.model, given.size, folder / f"soak{i}", (4, 8)[i % 2],
                                                          seed=i) for i in range(1, count + 1)}
    except ValueError as exc:
        return {}, f"no adapters: {exc}"
    return {name: path.parent for name, path in paths.items()}, ""


def fault_rules() -> list[str]:
    """The fault rules the soak's mix needs in its server: ``KIND:PROMPT`` for each of :data:`FAULT_PROMPTS`."""
    return [f"{kind}:{prompt}" for kind, prompt in FAULT_PROMPTS.items()]


def server_arguments(words: list[str], args: argparse.Namespace, adapters: dict[str, Path]) -> list[str]:
    """``words`` (the server's options) with what the soak needs added: the adapters, and, unless given, batching
    (``--max-batch 4``), the sizes warmed and a queue that the clients never fill."""
    words = list(words)

    def given(flag: str) -> bool:
        return any(w == flag or w.startswith(flag + "=") for w in words)

    for name, path in adapters.items():
        words += ["--lora", f"{name}={path}"]
    defaults = {"--max-batch": "4", "--warmup": args.sizes, "--max-queue": str(max(64, 4 * args.concurrency))}
    for flag, value in defaults.items():
        if not given(flag):
            words += [flag, value]
    return words


@contextlib.contextmanager
def soak_server(args: argparse.Namespace, words: list[str]) -> Iterator[tuple[str, int | None, list[str], str]]:
    """The server to soak: ``(url, pid, its options, a note)``; a spawned one is stopped on exit."""
    from .spawn import start_server, stop_server, wait_ready

    if args.url:
        yield check_loopback(args.url), args.pid, [], ""
        return
    adapters, note = make_adapters(words, args.adapters, args.out / "adapters")
    full = server_arguments(words, args, adapters)
    server = start_server(shlex.join(full), args.out / "server.log", faults=fault_rules())
    try:
        wait_ready([server], args.spawn_timeout)
        yield server.url, server.process.pid, full, note
    finally:
        if server.process.poll() is not None:  # it died: say so (a signal is a negative code)
            print(f"soak: the server exited with code {server.process.returncode} during the soak; its log "
                  f"{server.log_path}:\n{server.log_tail()}", flush=True)
        stop_server(server)


def mix_for(args: argparse.Namespace, url: str) -> SoakMix:
    """The mix against the server at ``url``: its adapters (``/v1/models``) and default steps (``/stats``)."""
    with client(url, 30.0) as http:
        ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
    steps = (get_stats(url).get("server") or {}).get("default_steps") or 2
    return SoakMix(sizes=tuple(args.sizes.split(",")), ns=tuple(int(n) for n in args.ns.split(",")),
                   models=("", *ids[1:]), distinct=args.distinct, fault_steps=steps + 1, seed=args.mix_seed)


def soak_command(args: argparse.Namespace, words: list[str]) -> int:
    """Start (or find) the server, run the soak, write ``soak.json`` and ``soak.md``; the exit status."""
    args.out.mkdir(parents=True, exist_ok=True)
    options = SoakOptions(concurrency=args.concurrency, time_limit_s=args.time_limit,
                          request_timeout_s=args.request_timeout, phases=args.phases)
    with soak_server(args, words) as (url, pid, server_args, note):
        mix = mix_for(args, url)
        requests = build_requests(mix, args.requests)
        print(f"soak: {len(requests)} requests to {url} from {args.concurrency} clients in {args.phases} phases",
              flush=True)
        run = run_soak(url, pid, requests, options)
    header = {"url": url, "pid": pid, "server_args": server_args, "note": note, "requests": args.requests,
              "concurrency": args.concurrency, "time_limit_s": args.time_limit, "mix": dataclasses.asdict(mix)}
    summary = report(run, requests, header, kinds=KINDS, gpu_tolerance=args.gpu_tolerance,
                     host_tolerance=args.host_tolerance)
    json_path, md_path = write_reports(args.out, summary)
    print(md_path.read_text().split("\n## ")[0])
    print(f"wrote {json_path} and {md_path}")
    return 0 if summary["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bcg_diffusion.serving.load.soak", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("server (one of)")
    g.add_argument("--spawn", metavar="ARGS", help="start 'bcg-serve ARGS' on 127.0.0.1 with the soak's fault rules "
                   "installed, LoRA adapters, --max-batch and --warmup added (unless ARGS give them), and stop it after")
    g.add_argument("--url", help="a running server, http://127.0.0.1:PORT, started with the soak's fault rules: python "
                   f"-m bcg_diffusion.serving.load.fault_server {' '.join(f'--fault {r}' for r in fault_rules())} -- ARGS")
    g.add_argument("--pid", type=int, default=None, help="with --url: the server's process id (its resident memory)")
    g = p.add_argument_group("load")
    g.add_argument("--requests", type=int, default=2000, help="requests in all (default: 2000)")
    g.add_argument("--concurrency", type=int, default=8, help="concurrent clients (default: 8)")
    g.add_argument("--time-limit", type=finite_float, default=MAX_TIME_LIMIT_S,
                   help=f"seconds after which no request is started (default and most: {MAX_TIME_LIMIT_S:.0f})")
    g.add_argument("--request-timeout", type=finite_float, default=120.0, help="seconds per request (default: 120)")
    g.add_argument("--phases", type=int, default=5, help="phases, each followed by a memory checkpoint; the first is "
                   "the warm-up (default: 5)")
    g = p.add_argument_group("request mix")
    g.add_argument("--sizes", type=sizes_argument, default="64x64,64x80",
                   help="sizes WxH of the image requests (default: 64x64,64x80)")
    g.add_argument("--ns", default="1,2", help="values of n (default: 1,2)")
    g.add_argument("--adapters", type=int, default=2, help="with --spawn: random LoRA adapters made and served "
                   "(default: 2); with --url the server's own, from /v1/models")
    g.add_argument("--distinct", type=int, default=24, help="distinct image requests the mix draws from (default: 24)")
    g.add_argument("--mix-seed", type=int, default=0, help="seed of the mix (default: 0)")
    g = p.add_argument_group("checks and output")
    g.add_argument("--gpu-tolerance", type=finite_float, default=0.01, help="GPU memory after warm-up flat within (default: 0.01)")
    g.add_argument("--host-tolerance", type=finite_float, default=0.05, help="resident memory after warm-up within (default: 0.05)")
    g.add_argument("--out", type=Path, required=True, help="folder of soak.json and soak.md (and the server's log)")
    g.add_argument("--spawn-timeout", type=finite_float, default=600.0, help="seconds for a spawned server to listen")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the soak and write its reports; 0 when every check passed, 1 otherwise, 2 for bad arguments."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if bool(args.spawn) == bool(args.url):
            parser.error("give one of --spawn ARGS or --url URL")
        if args.url:
            check_loopback(args.url)
        if not 1 <= args.time_limit <= MAX_TIME_LIMIT_S or args.requests < 1 or args.concurrency < 1 or args.phases < 2:
            parser.error(f"--time-limit must be 1 .. {MAX_TIME_LIMIT_S:.0f} s, --requests and --concurrency >= 1, "
                         "--phases >= 2 (the first is the warm-up)")
    except SystemExit as exc:
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"soak: error: {exc}")
        return 2
    return soak_command(args, shlex.split(args.spawn or ""))


if __name__ == "__main__":
    raise SystemExit(main())
