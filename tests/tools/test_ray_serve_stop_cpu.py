"""CPU tests of stopping ``bcg-serve --replicas 1`` (issue 50): at every stage, with nothing left behind, and on
loopback only while it runs.

Each test starts its own local Ray instance with one replica of the tiny Flux pipeline (as ``load.py --spawn`` starts
servers: ``--host 127.0.0.1 --port 0``) and follows the processes it starts (``tests/_process_tree.py``), since Ray's
agents outlive their parent. The stages: while Ray starts (SIGINT right after the command says it starts Ray), while
the replica builds (SIGTERM at its first output line), and while it serves (SIGTERM with a request running, which
must get its answer). Every wait has a bound; whatever a failed test leaves is killed.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed: pip install -e \".[test,serve,ray]\"")

from _process_tree import ProcessTree, is_loopback  # noqa: E402

from bcg_diffusion.serving.spawn import start_server, stop_server, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 400  # a bound on a start-up, not a speed claim (Ray and a replica on a loaded 2-core machine)
STAGE_TIMEOUT_S = 300
STOP_TIMEOUT_S = 45  # the command's own bound: drain 15 s, Serve 10 s, the leftovers 5 + 5 s
GONE_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 120
SERVER_ARGS = "--model flux --device cpu --steps 2 --warmup 64x64 --max-steps 8 --inject slow:__slow__ --replicas 1"


@contextlib.contextmanager
def ray_server(tmp_path: Path):
    """The spawned ``--replicas 1`` server and the tree of its processes; whatever is left is killed at the end."""
    server = start_server(SERVER_ARGS, tmp_path / "ray.log")
    tree = ProcessTree(server.process.pid)
    try:
        yield server, tree
    finally:
        stop_server(server, grace_s=STOP_TIMEOUT_S)
        tree.stop()
        tree.kill_all()


def wait_for_line(server, needle: str, timeout_s: float = STAGE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in server.log_path.read_text(errors="replace"):
        assert server.process.poll() is None, server.log_tail()
        assert time.monotonic() < deadline, f"no {needle!r} within {timeout_s} s:\n{server.log_tail()}"
        time.sleep(0.1)


def assert_stops_cleanly(server, tree, signum: int) -> None:
    server.process.send_signal(signum)
    code = server.process.wait(STOP_TIMEOUT_S)
    assert code == 0, server.log_tail()
    leftovers = tree.wait_all_gone(GONE_TIMEOUT_S)
    assert not leftovers, f"processes outlived the command: {leftovers}\n{server.log_tail()}"
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "stopping the replicas and Ray" in log, log[-3000:]


def test_sigint_while_ray_starts_leaves_no_process(tmp_path):
    with ray_server(tmp_path) as (server, tree):
        wait_for_line(server, "starting Ray Serve on this machine")
        time.sleep(2)  # inside ray.init: its head processes are starting
        assert_stops_cleanly(server, tree, signal.SIGINT)


def test_sigterm_while_the_replica_builds_leaves_no_process(tmp_path):
    with ray_server(tmp_path) as (server, tree):
        wait_for_line(server, "building flux (tiny)")
        assert_stops_cleanly(server, tree, signal.SIGTERM)


def test_serving_on_loopback_only_and_a_stop_drains_the_running_request(tmp_path):
    """Point 5: every socket of every process listens on loopback; point 13: the proxy's own 400 for a malformed
    request (plain text, as docs/serving.md says); point 4: SIGTERM answers the request that runs, then stops."""
    with ray_server(tmp_path) as (server, tree):
        wait_ready([server], START_TIMEOUT_S)
        listening = tree.listening()
        assert listening and not [s for s in listening if not is_loopback(s[1])], listening
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
            assert raw.recv(64).startswith(b"HTTP/1.1 400"), "the proxy did not answer 400"
        held: dict = {}

        def slow_request():  # 2 s inside the pipeline
            held["response"] = httpx.post(f"{server.url}/v1/images/generations", timeout=REQUEST_TIMEOUT_S,
                                          json={"prompt": "__slow__", "size": "64x64"}, trust_env=False)

        thread = threading.Thread(target=slow_request)
        thread.start()
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as http:
            deadline = time.monotonic() + 30
            while not http.get("/stats").json()["counters"]["running"]:
                assert time.monotonic() < deadline, "the slow request never ran"
                time.sleep(0.05)
        assert_stops_cleanly(server, tree, signal.SIGTERM)
        thread.join(REQUEST_TIMEOUT_S)
        assert held["response"].status_code == 200, held["response"].text
