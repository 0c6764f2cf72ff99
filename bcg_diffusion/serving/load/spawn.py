"""Starting ``scripts/serve.py`` subprocesses on 127.0.0.1 for a load run, and always stopping them.

Each server gets ``--host 127.0.0.1 --port 0`` and is ready when it prints ``listening on URL``. Its
stdout and stderr go to a log file. On Linux the child also gets SIGTERM if the load process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from ..http.listen import LISTENING_PREFIX
from .run import ALLOWED_HOST, check_loopback

__all__ = ["FAULT_SERVER_MODULE", "SERVER_MODULE", "SpawnError", "SpawnedServer", "spawned_servers", "start_server",
           "stop_server"]

#: The server a spawned process runs (``python -m``; the same code as ``scripts/serve.py`` and ``bcg-serve``).
SERVER_MODULE = "bcg_diffusion.serving.serve_command"
#: The same server with fault rules installed (:mod:`.fault_server`), for servers spawned with ``faults``.
FAULT_SERVER_MODULE = "bcg_diffusion.serving.load.fault_server"
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1
# Loaded here, not in the child: between fork and exec the child may only make the prctl call itself.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class SpawnError(RuntimeError):
    """A server did not come up (it exited, or did not listen in time); the message has its log's tail."""


@dataclass
class SpawnedServer:
    """One ``serve.py`` subprocess: its arguments, process, log file and (once listening) URL."""

    args: list[str]
    process: subprocess.Popen
    log_path: Path
    url: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _follow(server: SpawnedServer, log) -> None:
    """Copy the server's output to its log; note the URL of the listening line."""
    for line in server.process.stdout:
        log.write(line)
        log.flush()
        if server.url is None and line.startswith(LISTENING_PREFIX):
            server.url = line[len(LISTENING_PREFIX):].strip()
            server.ready.set()
    # the output closed: the process is ending; reap it first, so that a waiter reads its exit code
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=5)
    server.ready.set()


def start_server(arg_string: str, log_path: Path, faults: Sequence[str] = ()) -> SpawnedServer:
    """Start ``serve.py ARGS --host 127.0.0.1 --port 0`` (``ValueError`` if ARGS set the host or port); with
    ``faults`` (``KIND:PROMPT`` rules, :mod:`.fault_rules`), through :mod:`.fault_server`, which installs them."""
    args = shlex.split(arg_string)
    if any(a == flag or a.startswith(flag + "=") for a in args for flag in ("--host", "--port")):
        raise ValueError(f"--spawn {arg_string!r}: leave --host and --port out; spawned servers listen on "
                         f"{ALLOWED_HOST} on a free port")
    rules = [w for rule in faults for w in ("--fault", rule)]
    launcher = [FAULT_SERVER_MODULE, *rules, "--"] if faults else [SERVER_MODULE]
    command = [sys.executable, "-m", *launcher, *args, "--host", ALLOWED_HOST, "--port", "0"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w", buffering=1)  # noqa: SIM115 - closed by the follower thread's end
    log.write(f"$ {shlex.join(command)}\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               preexec_fn=_die_with_parent if _LIBC is not None else None)
    server = SpawnedServer(args, process, log_path)

    def follow():
        with log:
            _follow(server, log)

    threading.Thread(target=follow, name=f"serve-log-{process.pid}", daemon=True).start()
    return server


def wait_ready(servers: list[SpawnedServer], timeout_s: float) -> None:
    """Wait until every server listens; :class:`SpawnError` when one exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    for server in servers:
        server.ready.wait(max(0.0, deadline - time.monotonic()))
        if server.url is None:
            code = server.process.poll()
            why = f"exited with code {code}" if code is not None else f"did not listen within {timeout_s:.0f} s"
            raise SpawnError(f"serve.py {shlex.join(server.args)} {why}; log {server.log_path}:\n{server.log_tail()}")
        check_loopback(server.url)


def stop_server(server: SpawnedServer, grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
    process = server.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(grace_s)
    return process.returncode


@contextlib.contextmanager
def spawned_servers(arg_strings: list[str], log_dir: Path, timeout_s: float,
                    faults: Sequence[str] = ()) -> Iterator[list[SpawnedServer]]:
    """Start all servers at once (each with the fault rules ``faults``), wait until they listen, yield them; stop
    them all on exit, whatever happens."""
    servers: list[SpawnedServer] = []
    try:
        for i, arg_string in enumerate(arg_strings):
            servers.append(start_server(arg_string, log_dir / f"server{i}.log", faults))
        wait_ready(servers, timeout_s)
        yield servers
    finally:
        for server in servers:
            stop_server(server)
