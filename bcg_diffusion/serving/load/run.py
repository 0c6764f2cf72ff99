"""Sending a request mix to one server: C client threads, N requests at most, a time limit, a /stats poller.

Only servers on 127.0.0.1 are accepted (:func:`check_loopback`); every loop is bounded by the request
count and the time limit, and every request by its own timeout.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..http.png import payload_hash, pixel_hash
from .mix import identity

__all__ = ["ALLOWED_HOST", "DEFAULT_MAX_IN_FLIGHT", "Outcome", "ServerRun", "check_loopback", "get_stats",
           "poisson_arrivals", "replay_alone", "run_load", "run_open_loop"]

ALLOWED_HOST = "127.0.0.1"
GENERATIONS_PATH = "/v1/images/generations"
STATS_TIMEOUT_S = 10.0
#: Open loop: requests in flight at most (threads and connections); a later arrival waits for one, and its latency
#: counts from its scheduled arrival all the same.
DEFAULT_MAX_IN_FLIGHT = 256
#: The API key every request carries (``Authorization: Bearer``) when set: serve.py's variable.
API_KEY_VARIABLE = "BCG_API_KEY"


def check_loopback(url: str) -> str:
    """``url`` without a trailing slash if it is ``http://127.0.0.1:PORT``; ``ValueError`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname != ALLOWED_HOST or parts.port is None:
        raise ValueError(f"{url!r}: the load test only sends to a server on this machine, "
                         f"http://{ALLOWED_HOST}:PORT")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{url!r}: give the server's base URL, http://{ALLOWED_HOST}:PORT")
    return f"http://{ALLOWED_HOST}:{parts.port}"


def client(url: str, timeout_s: float, connections: int | None = None) -> httpx.Client:
    """An HTTP client for ``url`` that ignores proxy settings (traffic stays on this machine) and sends the API
    key of :data:`API_KEY_VARIABLE`, if set; ``connections``: its pool (httpx's default without)."""
    key = os.environ.get(API_KEY_VARIABLE)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections) if connections else None
    return httpx.Client(base_url=check_loopback(url), timeout=timeout_s, trust_env=False, headers=headers,
                        **({"limits": limits} if limits else {}))


def get_stats(url: str) -> dict[str, Any]:
    with client(url, STATS_TIMEOUT_S) as http:
        response = http.get("/stats")
        response.raise_for_status()
        return response.json()


@dataclass
class Outcome:
    """One request: its place in the mix, its identity, the status (0: no HTTP answer), the client-side
    latency, the server's queue and pipeline seconds, and per image the payload and pixel hashes; ``done_at``: when
    its answer (or its transport error) came, on the client's ``time.perf_counter`` clock."""

    index: int
    identity: str
    size: str
    status: int
    latency_s: float
    queue_s: float | None = None
    pipeline_s: float | None = None
    payload_hashes: tuple[str, ...] = ()
    pixel_hashes: tuple[str, ...] = ()
    error: str | None = None
    model: str | None = None
    batch_requests: int | None = None
    done_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


@dataclass
class ServerRun:
    """The outcomes of one server's run, with ``/stats`` before and after and the memory polled meanwhile;
    ``concurrency``: the closed loop's clients (``None``: open loop)."""

    label: str
    url: str
    outcomes: list[Outcome]
    wall_s: float
    stats_start: dict[str, Any]
    stats_end: dict[str, Any]
    polls: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    alone: list[Outcome] = field(default_factory=list)
    open_loop: dict[str, Any] | None = None
    concurrency: int | None = None


def _header_float(response: httpx.Response, name: str) -> float | None:
    try:
        return float(response.headers[name])
    except (KeyError, ValueError):
        return None


def send_one(http: httpx.Client, index: int, body: dict[str, Any]) -> Outcome:
    """Post one body; never raises for transport errors or bad answers (they become the outcome)."""
    start = time.perf_counter()
    base = {"index": index, "identity": identity(body), "size": body.get("size", ""), "model": body.get("model")}
    try:
        response = http.post(GENERATIONS_PATH, json=body)
    except httpx.HTTPError as exc:
        done = time.perf_counter()
        return Outcome(**base, status=0, latency_s=done - start, error=f"{type(exc).__name__}: {exc}", done_at=done)
    done = time.perf_counter()
    outcome = Outcome(**base, status=response.status_code, latency_s=done - start, done_at=done,
                      queue_s=_header_float(response, "x-queue-seconds"),
                      pipeline_s=_header_float(response, "x-pipeline-seconds"))
    batch = _header_float(response, "x-batch-requests")
    outcome.batch_requests = int(batch) if batch is not None else None
    try:
        answer = response.json()
        if response.status_code != 200:
            outcome.error = str(answer.get("error", {}).get("message", answer))
            return outcome
        payloads = [item["b64_json"] for item in answer["data"]]
        outcome.payload_hashes = tuple(payload_hash(p) for p in payloads)
        outcome.pixel_hashes = tuple(pixel_hash(p) for p in payloads)
        if len(payloads) != body.get("n", 1):
            outcome.error = f"asked for {body.get('n', 1)} images, got {len(payloads)}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        outcome.error = f"bad answer: {type(exc).__name__}: {exc}"
    return outcome


class _StatsPoller(threading.Thread):
    """Reads ``/stats`` every ``interval_s`` until stopped; keeps GPU memory and queue depth."""

    def __init__(self, url: str, interval_s: float):
        super().__init__(name="stats-poller", daemon=True)
        self.url, self.interval_s = url, interval_s
        self.polls: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with client(self.url, STATS_TIMEOUT_S) as http:
            while not self._halt.wait(self.interval_s):
                try:
                    stats = http.get("/stats").json()
                except (httpx.HTTPError, ValueError):
                    continue
                self.polls.append({"t": time.time(), "gpu_memory": stats.get("gpu_memory"),
                                   "queue_depth": stats.get("counters", {}).get("queue_depth")})

    def stop(self) -> None:
        self._halt.set()
        self.join(STATS_TIMEOUT_S + self.interval_s)


class _ClosedLoop:
    """Clients that each take the next body in order and send it, until every body is sent or the deadline has
    passed; their outcomes."""

    def __init__(self, url: str, bodies: list[dict[str, Any]], deadline: float, request_timeout_s: float):
        self.url, self.bodies, self.deadline, self.request_timeout_s = url, bodies, deadline, request_timeout_s
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.next_index = itertools.count()
        self.timed_out = threading.Event()

    def client_loop(self) -> None:
        with client(self.url, self.request_timeout_s) as http:
            while True:
                with self.lock:
                    index = next(self.next_index)
                if index >= len(self.bodies):
                    return
                if time.monotonic() >= self.deadline:
                    self.timed_out.set()
                    return
                outcome = send_one(http, index, self.bodies[index])
                with self.lock:
                    self.outcomes.append(outcome)


def run_load(url: str, bodies: list[dict[str, Any]], *, label: str, concurrency: int, time_limit_s: float,
             request_timeout_s: float, poll_s: float = 1.0) -> ServerRun:
    """Send ``bodies`` from ``concurrency`` threads (each takes the next body in order) until all are sent or
    ``time_limit_s`` has passed (requests already sent finish, within their own timeout)."""
    url = check_loopback(url)
    if concurrency < 1 or time_limit_s <= 0 or request_timeout_s <= 0:
        raise ValueError("concurrency must be >= 1 and the time limits > 0")
    stats_start = get_stats(url)
    loop = _ClosedLoop(url, bodies, time.monotonic() + time_limit_s, request_timeout_s)
    poller = _StatsPoller(url, poll_s)
    poller.start()
    start = time.perf_counter()
    threads = [threading.Thread(target=loop.client_loop, name=f"load-client-{i}", daemon=True)
               for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(time_limit_s + request_timeout_s + 5)
    wall = time.perf_counter() - start
    poller.stop()
    with loop.lock:
        done = sorted(loop.outcomes, key=lambda o: o.index)
    return ServerRun(label, url, done, wall, stats_start, get_stats(url), poller.polls,
                     loop.timed_out.is_set() or any(t.is_alive() for t in threads), concurrency=concurrency)


def replay_alone(url: str, run: ServerRun, *, request_timeout_s: float, time_limit_s: float) -> list[Outcome]:
    """Send each distinct request of ``run`` (its first occurrence, by mix index) once more, alone: one client, one
    request at a time, after the load. With batching, each then runs in a batch of its own, so comparing these
    images with the load's shows whether an image depended on what it was batched with."""
    firsts: dict[str, Outcome] = {}
    for outcome in run.outcomes:
        firsts.setdefault(outcome.identity, outcome)
    deadline = time.monotonic() + time_limit_s
    replies = []
    with client(url, request_timeout_s) as http:
        for first in sorted(firsts.values(), key=lambda o: o.index):
            if time.monotonic() >= deadline:
                break
            replies.append(send_one(http, first.index, json.loads(first.identity)))
    run.alone = replies
    return replies


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """When ``count`` requests arrive (seconds from the start) at ``rate`` per second: a Poisson process, its gaps
    drawn from the exponential distribution with ``random.Random(seed)`` (the same seed, the same arrivals)."""
    if rate <= 0 or count < 0:
        raise ValueError(f"the arrival rate must be > 0 and the count >= 0 (got {rate}, {count})")
    rng, now, times = random.Random(seed), 0.0, []
    for _ in range(count):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def _send_scheduled(http: httpx.Client, index: int, body: dict[str, Any], scheduled: float) -> Outcome:
    """``send_one`` started late when no connection was free: its latency counts from its scheduled arrival."""
    late = max(0.0, time.perf_counter() - scheduled)
    outcome = send_one(http, index, body)
    outcome.latency_s += late
    return outcome


def run_open_loop(url: str, bodies: list[dict[str, Any]], *, label: str, rate: float, seed: int, time_limit_s: float,
                  request_timeout_s: float, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                  poll_s: float = 1.0) -> ServerRun:
    """Send ``bodies`` at Poisson arrivals of ``rate`` per second (:func:`poisson_arrivals` with ``seed``), whatever
    the answers (open loop), until all are sent or ``time_limit_s`` has passed; at most ``max_in_flight`` at once.
    Latency counts from each request's scheduled arrival."""
    url = check_loopback(url)
    if max_in_flight < 1 or time_limit_s <= 0 or request_timeout_s <= 0:
        raise ValueError("max_in_flight must be >= 1 and the time limits > 0")
    arrivals = poisson_arrivals(rate, len(bodies), seed)
    stats_start, poller = get_stats(url), _StatsPoller(url, poll_s)
    poller.start()
    futures, start, sent = [], time.perf_counter(), 0
    with client(url, request_timeout_s, connections=max_in_flight) as http, \
            concurrent.futures.ThreadPoolExecutor(max_in_flight, thread_name_prefix="load-open") as pool:
        for index, (body, offset) in enumerate(zip(bodies, arrivals)):
            if offset >= time_limit_s:
                break
            time.sleep(max(0.0, start + offset - time.perf_counter()))
            futures.append(pool.submit(_send_scheduled, http, index, body, start + offset))
            sent += 1
        outcomes = [f.result() for f in futures]
    wall = time.perf_counter() - start
    poller.stop()
    info = {"rate": rate, "seed": seed, "sent": sent, "max_in_flight": max_in_flight,
            "offered_s": arrivals[sent - 1] if sent else 0.0}
    return ServerRun(label, url, sorted(outcomes, key=lambda o: o.index), wall, stats_start, get_stats(url),
                     poller.polls, sent < len(bodies), open_loop=info)
