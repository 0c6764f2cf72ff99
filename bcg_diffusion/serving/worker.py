"""The server's pipeline thread and its counters.

The pipeline is called from one thread only (:class:`PipelineWorker`), one call at a time, in the order the calls
were submitted (a request's, a batch's, the warm-up's: :mod:`.runner` runs them); the event loop only waits on the
futures it gets back, so it stays free to answer ``/health`` and ``/stats`` while a call runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from bcg_diffusion.toolkit.failed_calls import without_traceback

logger = logging.getLogger(__name__)

__all__ = ["PipelineWorker", "ServerCounters", "request_grad_mode"]


class PipelineWorker:
    """One daemon thread that runs submitted callables one at a time, in submission order.

    ``submit(fn)`` returns a :class:`concurrent.futures.Future` with ``fn()``'s result or exception (without its
    traceback, kept as a note: :mod:`bcg_diffusion.toolkit.failed_calls`);
    ``waiting`` counts submitted callables not started yet, ``running`` is 1 while one runs.
    """

    def __init__(self, name: str = "pipeline-worker"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._waiting += 1
        self._jobs.put((future, fn))
        return future

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> int:
        return self._running

    @property
    def depth(self) -> int:
        """Callables submitted and not finished (waiting + running)."""
        with self._lock:
            return self._waiting + self._running

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end after the callables already submitted; wait up to ``timeout`` seconds."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn = item
            with self._lock:
                self._waiting -= 1
                self._running = 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                        future.set_exception(without_traceback(exc))  # the failed call's frames go with this block
            finally:
                with self._lock:
                    self._running = 0


@dataclass
class ServerCounters:
    """What the server did since start. ``requests``: generation requests received; ``ok``: answered 200;
    ``errors``: the others by HTTP status; ``pipeline_calls``: generation calls the worker started
    (warm-up not counted), ``pipeline_failures`` those that raised; ``images``: images returned."""

    requests: int = 0
    ok: int = 0
    errors: dict[int, int] = field(default_factory=dict)
    pipeline_calls: int = 0
    pipeline_failures: int = 0
    images: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def record_status(self, status: int) -> None:
        with self._lock:
            if status == 200:
                self.ok += 1
            else:
                self.errors[status] = self.errors.get(status, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "ok": self.ok,
                    "errors": {str(k): v for k, v in sorted(self.errors.items())},
                    "pipeline_calls": self.pipeline_calls, "pipeline_failures": self.pipeline_failures,
                    "images": self.images}


@contextlib.contextmanager
def request_grad_mode():
    """The grad mode of every pipeline call of the server (warm-up too, so that its graphs match)."""
    with torch.inference_mode():
        yield
