"""``bcg-serve --replicas N``: a local Ray instance, the application of :mod:`.ray_app`, Ray's proxy on ``--host``.

The server's options are checked here first (the same checks and exit code 2 as the single server; also replicas
that need more GPUs than this machine has, which Ray would wait for for ever), then Ray is started on this machine
only (``address="local"``: never a cluster found through ``RAY_ADDRESS``), the replicas build and warm their
pipelines, and once Ray's HTTP proxy answers ``/health`` through a replica the command prints the single server's
``listening on URL`` line. ``PYTHONPATH`` is passed on to Ray's workers, so a Ray installed outside the environment
(``PYTHONPATH=/tmp/site``) is theirs too.

**Stopping.** SIGINT or SIGTERM stops it at any stage (starting Ray, building the replicas, serving): the
application is deleted first, so the proxy stays up while the replicas finish the requests they hold (Ray's
graceful shutdown, up to :data:`~.ray_app.GRACEFUL_SHUTDOWN_S`), then Serve and Ray are shut down, and any process
this command started that is still alive (Ray's agents outlive its head) is ended: no process outlives the command.
A second signal skips the drain. The signal handler only records the stop (:class:`StopSignals`); the main thread
acts on it between Ray's calls, at its own waits. An exception raised by the handler inside Ray's calls (as this
command did until 2026-12-07) could stop Serve's start half-way: under load, a SIGINT 4 to 10 s after the start
ended in 101 s with exit code 1, in a segmentation fault, or in a ``SystemError`` out of Ray's ``get_objects``.
The application is deployed without waiting (``serve.run_many``) and its status polled here, so that the wait for
the replicas to build is one of those waits.

**Loopback.** With a loopback ``--host`` (the default), Ray's own servers listen on 127.0.0.1 too: its node address
is set to the loopback one (Ray's ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read where ``ray`` is imported, makes Ray
use 127.0.0.1 as this node's address; its GCS, raylet, agents and workers then bind to it), and the replicas' own
gRPC server, which Ray Serve binds to every interface, is bound to loopback in the replica (:mod:`.ray_app`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from bcg_diffusion.toolkit.options import Failure

from ..http.listen import bind_socket, is_loopback
from .options import ReplicaOptions, placement_problem
from .state import ServerOptionsError, check_server_args

logger = logging.getLogger("serve")

__all__ = ["OBJECT_STORE_BYTES", "Stopped", "end_processes", "local_ray_options", "missing_ray", "ray_environment",
           "run_replicas", "stop_ray"]

#: Ray's shared-memory object store of the local instance: answers are a few PNGs, never large.
OBJECT_STORE_BYTES = 256 * 1024**2
#: Seconds the replicas get to finish the requests they hold once the application is deleted (Ray's graceful
#: shutdown of a replica is 5 s; the rest is Ray's own bookkeeping), and ``serve.shutdown()`` then.
DRAIN_S = 15.0
SERVE_SHUTDOWN_S = 10.0
#: Seconds a leftover process gets after SIGTERM before SIGKILL.
END_GRACE_S = 5.0
#: Ray Serve's own log in the replicas' output: warnings only, no access log (the server logs its requests).
SERVE_LOGGING = {"log_level": "WARNING", "enable_access_log": False}
#: Seconds to wait for Ray's proxy to route ``/health`` to a replica once the application runs.
PROXY_READY_S = 60.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Seconds Serve's controller gives its proxy to answer a readiness check (Ray's default 5; after 3 failed checks it
#: kills the proxy, and ``serve.start`` fails with ``ActorDiedError``). On a machine whose cores are busy (2 cores
#: and two other busy processes, 2026-12-07) the proxy missed 5 s three times and the command never started.
PROXY_READY_CHECK_S = 30.0


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived (the signal's name): unwinds what the command was doing to its clean stop. A
    ``BaseException``, so that no ``except Exception`` on the way (Ray's, ours) takes it for an error."""


def missing_ray() -> str | None:
    """Why ``--replicas`` cannot run here (Ray Serve not installed, what to install), or ``None``."""
    if importlib.util.find_spec("ray") is None:
        return ("--replicas runs on Ray Serve, which is not installed; install it with: "
                "pip install -e \".[serve,ray]\" (or pip install \"ray[serve]>=2.60,<2.61\")")
    return None


def ray_environment(host: str) -> None:
    """The environment Ray reads when it is imported, set where the user has not: this node's address on loopback
    when ``host`` is (see the module's docstring), every replica's output line shown (no deduplication: each
    replica's build, warm-up and request lines), no colour codes, and :data:`PROXY_READY_CHECK_S` for the readiness
    check of Serve's proxy."""
    if is_loopback(host):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_CHECK_S))


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


def wait_for_proxy(url: str, signals: "StopSignals", timeout_s: float = PROXY_READY_S) -> None:
    """Until ``GET url/health`` answers 200 through Ray's proxy (its routes reach a replica); ``Failure`` after
    ``timeout_s``; :class:`Stopped` when a stop signal came."""
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
        signals.sleep(0.25)
    raise Failure(1, f"error: Ray's proxy at {url} did not route /health to a replica within {timeout_s:.0f} s "
                  f"({last})")


def wait_until_running(name: str, signals: "StopSignals") -> None:
    """Until Serve reports the application ``name`` running (its replicas built and warmed; as long as that takes);
    ``Failure`` when its deployment failed; :class:`Stopped` when a stop signal came."""
    from ray import serve

    while True:
        app = serve.status().applications.get(name)
        state = str(getattr(app, "status", "NOT_STARTED"))
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED"):
            raise Failure(1, f"error: the replicas did not start: {getattr(app, 'message', '') or state}")
        signals.sleep(0.5)


class StopSignals:
    """SIGINT and SIGTERM while the block runs (the previous handlers come back after it). The first one only records
    the stop (``requested``, the signal's name in ``name``): the main thread raises :class:`Stopped` at its next
    :meth:`check` or :meth:`sleep`, never inside a call into Ray, so a stop during the start waits for Ray's call in
    progress (``ray.init``, ``serve.start``: seconds, at most Ray's own 60 s for its proxy). A second signal raises
    :class:`Stopped` at once, wherever the main thread is: the user insists (during the stop it skips the drain,
    whose waits run in helper threads)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.name: str | None = None
        self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def _handle(self, signum, _frame) -> None:
        if self.requested.is_set():
            raise Stopped(signal.Signals(signum).name)
        self.name = self.name or signal.Signals(signum).name
        self.requested.set()

    def install(self) -> None:
        """Put this handler in place (again: Ray's ``init`` installs its own for SIGTERM)."""
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def check(self) -> None:
        if self.requested.is_set():
            raise Stopped(self.name)

    def sleep(self, seconds: float) -> None:
        """``time.sleep``, cut short by a stop signal (then :class:`Stopped`)."""
        if self.requested.wait(seconds):
            raise Stopped(self.name)

    def __enter__(self) -> "StopSignals":
        self.install()
        return self

    def __exit__(self, *_exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def check_replicas(args: argparse.Namespace, parser: argparse.ArgumentParser, options: ReplicaOptions) -> None:
    """The server's options as the single server checks them, and replicas this machine can place (exit code 2)."""
    try:
        server_options = check_server_args(args)
    except ServerOptionsError as exc:
        parser.error(str(exc))
    args.api_key = server_options.api_key  # resolved here: the replicas may not see this environment
    import torch

    from .ray_app import on_cuda

    problem = placement_problem(options, on_cuda(args), torch.cuda.device_count())
    if problem:
        parser.error(problem)


def run_replicas(args: argparse.Namespace, parser: argparse.ArgumentParser, options: ReplicaOptions,
                 announce) -> int:
    """Serve ``args`` as ``options.replicas`` Ray Serve replicas until SIGINT/SIGTERM; ``announce(url)`` once
    the proxy routes to them. Exit code 0 once stopped; ``Failure`` when Ray or a replica cannot start."""
    ray_environment(args.host)  # before anything imports ray, which reads it once
    check_replicas(args, parser, options)
    port = free_port(args.host, args.port)
    counts = (f"{options.replicas}" if not options.autoscaling else
              f"{options.replicas} .. {options.max_replicas} (autoscaled)")
    print(f"starting Ray Serve on this machine: {counts} replica(s) of {args.model}, each building and warming its "
          "own pipeline ...", flush=True)
    with StopSignals() as signals:
        try:
            serve_until_stopped(args, options, port, announce, signals)
        except (Stopped, SystemExit) as stop:  # SystemExit: Ray's own SIGTERM handler, while ray.init runs
            print(f"{stop or 'SIGTERM'}: stopping the replicas and Ray ...", flush=True)
        finally:
            stop_ray()
    return 0


def serve_until_stopped(args: argparse.Namespace, options: ReplicaOptions, port: int, announce,
                        signals: StopSignals) -> None:
    """Start Ray, Serve and the replicas, wait for the proxy, announce, and wait for :class:`Stopped` (a signal is
    acted on between Ray's calls: :class:`StopSignals`)."""
    import ray
    from ray import serve

    from .ray_app import APP_NAME, image_server_app

    t0 = time.perf_counter()
    ray.init(**local_ray_options(options))
    signals.install()  # ray.init put its own SIGTERM handler in place of ours
    signals.check()
    try:
        serve.start(http_options={"host": args.host, "port": port}, logging_config=SERVE_LOGGING)
    except Exception as exc:  # noqa: BLE001 - e.g. its proxy did not start: Ray's message
        raise Failure(1, f"error: Ray Serve did not start: {type(exc).__name__}: {exc}") from exc
    signals.check()
    try:
        serve.run_many([serve.RunTarget(image_server_app(args, options), name=APP_NAME, route_prefix="/",
                                        logging_config=SERVE_LOGGING)],
                       wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    except Exception as exc:  # noqa: BLE001 - Ray's message
        raise Failure(1, f"error: the replicas did not start: {type(exc).__name__}: {exc}") from exc
    wait_until_running(APP_NAME, signals)
    url = _url(args.host, port)
    wait_for_proxy(url, signals)
    print(f"replicas ready in {time.perf_counter() - t0:.1f} s", flush=True)
    announce(url)
    while True:
        signals.sleep(3600)


def _bounded(name: str, work: Callable[[], Any], timeout_s: float) -> None:
    """``work()`` in a thread for at most ``timeout_s``; its failure is logged (the stop goes on)."""
    def run() -> None:
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - e.g. Serve never started: nothing to delete
            logger.debug("%s: %s: %s", name, type(exc).__name__, exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        print(f"{name} did not finish within {timeout_s:.0f} s; going on", flush=True)


def stop_ray() -> None:
    """Delete the application (the replicas finish what they hold while the proxy still answers them), shut Serve
    and Ray down, then end every process this command started that is still alive. A second SIGINT or SIGTERM skips
    the drain; the rest runs with both ignored."""
    started: list = []
    try:
        started = _descendants()
        import ray
        from ray import serve

        from .ray_app import APP_NAME

        if ray.is_initialized():
            _bounded("draining the replicas", lambda: serve.delete(APP_NAME), DRAIN_S)
            _bounded("serve.shutdown", serve.shutdown, SERVE_SHUTDOWN_S)
    except Stopped:
        print("second signal: stopping Ray without waiting for the replicas", flush=True)
    finally:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        end_processes(started + _descendants())


def _descendants() -> list:
    """This process's children and their children, as ``psutil.Process`` objects (a process that a dying parent
    leaves behind is no longer anyone's child: take the list before the parents go)."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def end_processes(processes: list) -> None:
    """SIGTERM to each process still alive, SIGKILL to those alive :data:`END_GRACE_S` later (psutil checks that
    a process id was not reused)."""
    import psutil

    alive = [p for p in {p.pid: p for p in processes}.values() if _running(p)]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(alive, timeout=END_GRACE_S)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=END_GRACE_S)


def _running(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
