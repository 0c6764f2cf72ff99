"""Pipeline work for the server: one worker thread, the job that generates images, the counters.

The pipeline is called from one thread only (:class:`PipelineWorker`), one call at a time, in the order
the calls were submitted (a request's, or a batch's: :mod:`.batching`); the event loop only waits on the futures
it gets back, so it stays free to answer ``/health`` and ``/stats`` while a call runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.stack import compiled_graphs
from bcg_pipelines.calls import BATCH_KWARGS

from .png import to_pil_images
from .requests import GenerationJob

logger = logging.getLogger(__name__)

__all__ = ["INJECT_KINDS", "GenerationResult", "ImageGenerator", "InjectedFailure", "PipelineWorker",
           "ServerCounters", "is_out_of_memory", "parse_injection", "request_grad_mode", "stats_dict"]

#: ``--inject KIND:PROMPT`` (testing only): what a request with exactly that prompt does inside the pipeline,
#: at the end of its first denoising step. ``error``: RuntimeError (a 500); ``oom``: torch.OutOfMemoryError
#: (a 503); ``slow``: sleeps SLOW_INJECT_S once, then finishes normally.
INJECT_KINDS = ("error", "oom", "slow")
SLOW_INJECT_S = 2.0


class InjectedFailure(RuntimeError):
    """The failure ``--inject error:PROMPT`` raises inside the pipeline (testing only)."""


def parse_injection(text: str) -> tuple[str, str]:
    """``"KIND:PROMPT"`` -> ``(kind, prompt)``; ``ValueError`` saying what is allowed."""
    kind, sep, prompt = text.partition(":")
    if not sep or kind not in INJECT_KINDS or not prompt:
        raise ValueError(f"--inject {text!r}: expected KIND:PROMPT with KIND one of {', '.join(INJECT_KINDS)}")
    return kind, prompt


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError)


class PipelineWorker:
    """One daemon thread that runs submitted callables one at a time, in submission order.

    ``submit(fn)`` returns a :class:`concurrent.futures.Future` with ``fn()``'s result or exception;
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
                        future.set_exception(exc)
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


@dataclass
class GenerationResult:
    """The images of one request (PIL, RGB), how long its pipeline call took, and that call's batch: requests
    and rows (filler rows included; 1 and ``n`` for an unbatched call)."""

    images: list
    pipeline_s: float
    batch_requests: int = 1
    batch_rows: int | None = None


def stats_dict(pipe) -> dict[str, Any] | None:
    """``bcg_diffusion.get_stats(pipe)`` as JSON-ready data (``None`` when BCG is not active)."""
    stats = bcg_diffusion.get_stats(pipe)
    return dataclasses.asdict(stats) if stats.active else None


class ImageGenerator:
    """Runs :class:`GenerationJob` on the pipeline: call this only from the worker thread.

    Each call gets its own ``torch.Generator(device).manual_seed(job.seed)``, so an image depends only on
    its request (with a step cache, ``before_call`` resets its state first: a call that failed half-way leaves
    it). After a failure the pipeline is left as it is (every diffusers call resets its scheduler and per-call
    state); after an out-of-memory error the CUDA cache is emptied as well. The BCG stats are
    snapshotted after every call (``bcg_stats``), so the event loop never reads them while a call changes them.
    """

    def __init__(self, pipe, device: torch.device, counters: ServerCounters,
                 injections: dict[str, str] | None = None):
        self.pipe = pipe
        self.device = device
        self.generator_device = "cuda" if device.type == "cuda" else "cpu"
        self.counters = counters
        self.injections = dict(injections or {})
        self._params = pipelines.call_parameters(pipe)
        self.adapters = None  # an adapters.AdapterBank when the server serves LoRA adapters (attach_adapters)
        self.bcg_stats: dict[str, Any] | None = stats_dict(pipe)
        self.adapter_stats: dict[str, Any] | None = None
        self.compiled_graphs = compiled_graphs()  # torch.compile's graphs in this process, as of the last call
        self.before_call: Callable[[], None] | None = None  # run before every pipeline call (a step cache's reset)

    def refresh_stats(self) -> None:
        self.bcg_stats = stats_dict(self.pipe)
        self.compiled_graphs = compiled_graphs()
        if self.adapters is not None:
            self.adapter_stats = self.adapters.stats(self.bcg_stats)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(self.generator_device).manual_seed(seed)

    def generate(self, job: GenerationJob) -> GenerationResult:
        """One request alone: ``pipe(**job.call)`` with one generator seeded ``job.seed`` for its ``n`` images."""
        def call():
            return self.pipe(**job.call, **self._injection_kwargs([job.prompt]), generator=self.generator(job.seed))

        images, seconds = self._guarded(call, f"{job.size}, n={job.n}, {job.steps} steps, seed {job.seed}", [job])
        return GenerationResult(images, seconds, 1, job.n)

    def generate_batch(self, jobs: list[GenerationJob], rows: int) -> list[GenerationResult]:
        """Requests of one batch key as ONE call of exactly ``rows`` rows (:mod:`.batching`): one prompt and one
        generator per image (image ``i`` of a request seeded ``s`` from seed ``s + i``), filler rows up to ``rows``
        (the first prompt, seed :data:`.batching.FILLER_SEED`), whose images are dropped. One result per job."""
        from .batching import FILLER_SEED, row_seeds

        prompts, seeds = [], []
        for job in jobs:
            prompts += [job.prompt] * job.n
            seeds += row_seeds(job.seed, job.n)
        real = len(prompts)
        if not 0 < real <= rows:
            raise ValueError(f"a batch of {real} images does not fit {rows} rows")
        prompts += [prompts[0]] * (rows - real)
        seeds += [FILLER_SEED] * (rows - real)
        call_kwargs = {**jobs[0].call, "prompt": prompts}
        for key in BATCH_KWARGS:
            if key in call_kwargs:
                call_kwargs[key] = 1

        def call():
            return self.pipe(**call_kwargs, **self._injection_kwargs([j.prompt for j in jobs]),
                             generator=[self.generator(s) for s in seeds])

        what = f"batch of {len(jobs)} request(s), {real} image(s) in {rows} rows, {jobs[0].size}, {jobs[0].steps} steps"
        images, seconds = self._guarded(call, what, jobs)
        results, start = [], 0
        for job in jobs:
            results.append(GenerationResult(images[start:start + job.n], seconds, len(jobs), rows))
            start += job.n
        return results

    def _guarded(self, call: Callable[[], Any], what: str, jobs: list[GenerationJob]) -> tuple[list, float]:
        """Run one pipeline call for ``jobs`` (one batch key: one adapter and scale) in the server's grad mode:
        its images and seconds. With adapters, the jobs' adapter is selected first. A failure is counted and
        logged; after an out-of-memory error the CUDA cache is emptied before it is raised again."""
        self.counters.add("pipeline_calls")
        start = time.perf_counter()
        try:
            if self.adapters is not None:
                if len({(j.adapter, j.adapter_scale) for j in jobs}) != 1:
                    raise ValueError("requests for different adapters or scales cannot share a pipeline call")
                self.adapters.select(jobs[0].adapter, jobs[0].adapter_scale, requests=len(jobs))
            if self.before_call is not None:
                self.before_call()
            with request_grad_mode():
                output = call()
            return to_pil_images(pipelines.generated(output)), time.perf_counter() - start
        except BaseException as exc:
            self.counters.add("pipeline_failures")
            logger.error("pipeline call failed (%s): %s: %s", what, type(exc).__name__, exc,
                         exc_info=not isinstance(exc, (InjectedFailure, torch.OutOfMemoryError)))
            if not is_out_of_memory(exc):
                raise
            message = str(exc)
        finally:
            self.refresh_stats()
        # Out of memory: the exception's traceback (whose frames hold the call's tensors) is gone here, so
        # the memory can be given back before the error is raised again, without that traceback.
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise torch.OutOfMemoryError(message)

    # -- testing: --inject ---------------------------------------------------------------------------
    def _injection_kwargs(self, prompts: list[str]) -> dict[str, Any]:
        """The step callback of the first of ``prompts`` with an ``--inject`` rule (a batch fails as a whole)."""
        prompt = next((p for p in prompts if p in self.injections), None)
        if prompt is None:
            return {}
        kind = self.injections[prompt]
        state = {"done": False}

        def fire():
            if state["done"]:
                return
            state["done"] = True
            if kind == "error":
                raise InjectedFailure(f"injected failure (--inject error:{prompt}) after denoising step 1")
            if kind == "oom":
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected by --inject oom:{prompt})")
            logger.info("--inject slow:%s: sleeping %.0f s inside the pipeline", prompt, SLOW_INJECT_S)
            time.sleep(SLOW_INJECT_S)

        if "callback_on_step_end" in self._params:
            def on_step_end(_pipe, _step, _timestep, callback_kwargs):
                fire()
                return callback_kwargs
            return {"callback_on_step_end": on_step_end}
        if "callback" in self._params:  # legacy step callback (PixArt-Sigma)
            extra = {"callback_steps": 1} if "callback_steps" in self._params else {}
            return {"callback": lambda _step, _timestep, _latents: fire(), **extra}
        fire()  # no step callback: fail (or sleep) before the call
        return {}


@contextlib.contextmanager
def request_grad_mode():
    """The grad mode of every pipeline call of the server (warm-up too, so that its graphs match)."""
    with torch.inference_mode():
        yield
