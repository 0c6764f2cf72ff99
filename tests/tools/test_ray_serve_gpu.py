"""GPU test of ``bcg-serve --replicas 1`` on CUDA (issue 50): the replica takes the GPU Ray gives it (the default of
one GPU per replica passes the placement check), Ray's ports stay on loopback with a GPU replica too (its gRPC server
bound to 127.0.0.1 in the replica), a BCG replica's image equals the single BCG server's bitwise, and SIGTERM while a
request runs answers it and leaves no process. Tiny Flux, 2 steps, warmed at 64x64; one local Ray instance and one
single server, both stopped at the end; about a minute on an H100/H200 (Ray's start-up is most of it).
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("ray.serve", reason="the ray extra is not installed: pip install -e \".[test,serve,ray]\"")

from _faults import in_started_processes  # noqa: E402
from _process_tree import ProcessTree, is_loopback  # noqa: E402
from _serve_http import pixels, post  # noqa: E402

from bcg_diffusion.serving.load.spawn import start_server, stop_server, wait_ready  # noqa: E402

START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 45
REQUEST_TIMEOUT_S = 120
ARGS = "--model flux --device cuda --steps 2 --warmup 64x64 --max-steps 8 --bcg"
#: A request of prompt __slow__ sleeps 2 s inside the pipeline (the replica gets the rule through tests/fault_site).
FAULTS = ["slow:__slow__"]
REQUEST = {"prompt": "a red fox in the snow", "size": "64x64", "seed": 5}


def test_a_gpu_replica_serves_on_loopback_equals_the_single_server_and_stops_cleanly(tmp_path):
    single = start_server(ARGS, tmp_path / "single.log")
    with in_started_processes(FAULTS):
        ray_server = start_server(f"{ARGS} --replicas 1", tmp_path / "ray.log")
    tree = ProcessTree(ray_server.process.pid)
    try:
        wait_ready([single, ray_server], START_TIMEOUT_S)
        listening = tree.listening()
        assert listening and not [s for s in listening if not is_loopback(s[1])], listening
        assert pixels(post(ray_server.url, REQUEST)) == pixels(post(single.url, REQUEST))
        stats = httpx.get(f"{ray_server.url}/stats", timeout=REQUEST_TIMEOUT_S, trust_env=False).json()
        assert stats["server"]["device"].startswith("cuda") and stats["server"]["bcg"] is True, stats["server"]
        held: dict = {}
        thread = threading.Thread(target=lambda: held.update(r=post(ray_server.url, {**REQUEST, "prompt": "__slow__"})))
        thread.start()
        time.sleep(1.0)  # the slow call sleeps 2 s inside the pipeline
        ray_server.process.send_signal(signal.SIGTERM)
        assert ray_server.process.wait(STOP_TIMEOUT_S) == 0, ray_server.log_tail()
        thread.join(REQUEST_TIMEOUT_S)
        assert held["r"].status_code == 200, held["r"].text
        leftovers = tree.wait_all_gone(20)
        assert not leftovers, f"processes outlived the command: {leftovers}"
        assert "Traceback" not in ray_server.log_path.read_text(errors="replace")
    finally:
        stop_server(ray_server, grace_s=STOP_TIMEOUT_S)
        stop_server(single)
        tree.stop()
        tree.kill_all()
