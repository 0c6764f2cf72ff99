"""``bcg-serve --replicas N``: a local Ray instance, the application of :mod:`.ray_app`, Ray's proxy on ``--host``.

The server's options are checked here first (the same checks and exit code 2 as the single server), then Ray is
started on this machine only (``address="local"``: never a cluster found through ``RAY_ADDRESS``), the replicas
build and warm their pipelines, and once Ray's HTTP proxy answers ``/health`` through a replica the command
prints the single server's ``listening on URL`` line. It runs until SIGINT or SIGTERM, then stops the replicas
(Ray's graceful shutdown: requests already running finish within a few seconds) and Ray. ``PYTHONPATH`` is passed
on to Ray's workers, so a Ray installed outside the environment (``PYTHONPATH=/tmp/site``) is theirs too.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from bcg_diffusion.toolkit.options import Failure

from ..http.listen import bind_socket
from .options import ReplicaOptions
from .state import ServerOptionsError, check_server_args

logger = logging.getLogger("serve")

__all__ = ["OBJECT_STORE_BYTES", "local_ray_options", "missing_ray", "run_replicas"]

#: Ray's shared-memory object store of the local instance: answers are a few PNGs, never large.
OBJECT_STORE_BYTES = 256 * 1024**2
#: Seconds ``serve.shutdown()`` may take (graceful: running requests finish) before Ray itself is stopped.
SERVE_SHUTDOWN_S = 10.0
#: Ray Serve's own log in the replicas' output: warnings only, no access log (the server logs its requests).
SERVE_LOGGING = {"log_level": "WARNING", "enable_access_log": False}
#: Seconds to wait for Ray's proxy to route ``/health`` to a replica once the application runs.
PROXY_READY_S = 60.0


def missing_ray() -> str | None:
    """Why ``--replicas`` cannot run here (Ray Serve not installed, what to install), or ``None``."""
    if importlib.util.find_spec("ray") is None:
        return ("--replicas runs on Ray Serve, which is not installed; install it with: "
                "pip install -e \".[serve,ray]\" (or pip install \"ray[serve]>=2.60,<2.61\")")
    return None


def local_ray_options(options: ReplicaOptions) -> dict[str, Any]:
    """``ray.init`` keyword arguments of a local instance that can place every replica (logical CPUs: at least
    one per replica's ``num_cpus``; GPUs as Ray finds them), without a dashboard, with ``PYTHONPATH`` passed on."""
    cpus = max(os.cpu_count() or 1, int(options.most_replicas * options.cpus_per_replica + 0.999))
    init: dict[str, Any] = {"address": "local", "num_cpus": cpus, "include_dashboard": False,
                            "object_store_memory": OBJECT_STORE_BYTES, "logging_level": logging.WARNING}
    if os.environ.get("PYTHONPATH"):
        init["runtime_env"] = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}
    return init


def free_port(host: str, port: int) -> int:
    """``port``, or a free one for 0, checked by binding it now (Ray's proxy binds it later)."""
    try:
        sock = bind_socket(host, port, listen=False)
    except OSError as exc:
        raise Failure(2, f"error: cannot bind {host}:{port}: {exc}") from exc
    with sock:
        return sock.getsockname()[1]


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def wait_for_proxy(url: str, timeout_s: float = PROXY_READY_S) -> None:
    """Until ``GET url/health`` answers 200 through Ray's proxy (its routes reach a replica); ``Failure`` after
    ``timeout_s``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to 127.0.0.1
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with opener.open(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.25)
    raise Failure(1, f"error: Ray's proxy at {url} did not route /health to a replica within {timeout_s:.0f} s "
                  f"({last})")


def _wait_for_signal() -> str:
    stop = threading.Event()
    received: list[str] = []

    def handler(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return received[0]


def run_replicas(args: argparse.Namespace, parser: argparse.ArgumentParser, options: ReplicaOptions,
                 announce) -> int:
    """Serve ``args`` as ``options.replicas`` Ray Serve replicas until SIGINT/SIGTERM; ``announce(url)`` once
    the proxy routes to them. Exit code 0; ``Failure`` when Ray or a replica cannot start."""
    try:
        server_options = check_server_args(args)
    except ServerOptionsError as exc:
        parser.error(str(exc))
    args.api_key = server_options.api_key  # resolved here: the replicas may not see this environment
    port = free_port(args.host, args.port)
    import ray
    from ray import serve

    from .ray_app import APP_NAME, image_server_app

    counts = (f"{options.replicas}" if not options.autoscaling else
              f"{options.replicas} .. {options.max_replicas} (autoscaled)")
    print(f"starting Ray Serve on this machine: {counts} replica(s) of {args.model}, each building and warming its "
          "own pipeline ...", flush=True)
    t0 = time.perf_counter()
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # the replicas' lines in this output without colour codes
    ray.init(**local_ray_options(options))
    try:
        serve.start(http_options={"host": args.host, "port": port}, logging_config=SERVE_LOGGING)
        try:
            serve.run(image_server_app(args, options), name=APP_NAME, route_prefix="/", logging_config=SERVE_LOGGING)
        except Exception as exc:  # noqa: BLE001 - e.g. a replica's build or warm-up failed: Ray's message
            raise Failure(1, f"error: the replicas did not start: {type(exc).__name__}: {exc}") from exc
        url = _url(args.host, port)
        wait_for_proxy(url)
        print(f"replicas ready in {time.perf_counter() - t0:.1f} s", flush=True)
        announce(url)
        why = _wait_for_signal()
        print(f"{why}: stopping the replicas and Ray ...", flush=True)
    finally:
        stop_ray(serve, ray)
    return 0


def stop_ray(serve, ray, timeout_s: float = SERVE_SHUTDOWN_S) -> None:
    """``serve.shutdown()`` (replicas finish their running requests) for at most ``timeout_s``, then
    ``ray.shutdown()``, which ends the processes this command's Ray instance started."""
    done = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        print(f"Ray Serve did not stop within {timeout_s:.0f} s; stopping Ray", flush=True)
    ray.shutdown()

