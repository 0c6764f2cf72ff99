"""The pipeline calls of the server, run: :class:`CallRunner` takes a :class:`~.calls.PipelineCall` (a request's,
a batch's, or the warm-up's) and runs it on the pipeline, on the worker thread (:class:`~.worker.PipelineWorker`).

Before a call the runner selects the call's adapter (with an :class:`~.adapters.bank.AdapterBank`) and resets a step
cache's state (``before_call``: a call that failed half-way leaves it), so an image depends on its request alone;
every call runs in the server's grad mode (:func:`~.worker.request_grad_mode`). After a failure the pipeline is left
as it is (every diffusers call resets its scheduler and per-call state); after an out-of-memory error the CUDA cache
is emptied as well. The BCG stats are snapshotted after every call (``bcg_stats``), so the event loop never reads
them while a call changes them.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.toolkit.stack import compiled_graphs

from .calls import GenerationResult, PipelineCall
from .faults import Fault, InjectedFailure, fault_for
from .worker import ServerCounters, request_grad_mode

logger = logging.getLogger(__name__)

__all__ = ["PER_SHAPE_KEYS", "QUIET_FAILURES", "CallRunner", "stats_dict", "to_pil_images"]

#: Keys of a call that the library's warm-up sets per shape (or leaves to its own default).
PER_SHAPE_KEYS = ("height", "width", "num_inference_steps")

#: Failures of a call logged without their traceback (the message says it all): injected by tests, or out of memory.
QUIET_FAILURES = (InjectedFailure, torch.OutOfMemoryError)


def to_pil_images(generated) -> list[Image.Image]:
    """A pipeline's images (PIL images, or a float array/tensor in [0, 1] of shape (B, H, W, C)) as RGB PIL
    images, converted to uint8 as diffusers does (``round(x * 255)``)."""
    if isinstance(generated, Image.Image):
        generated = [generated]
    if isinstance(generated, (list, tuple)) and all(isinstance(im, Image.Image) for im in generated):
        return [im.convert("RGB") if im.mode != "RGB" else im for im in generated]
    array = np.asarray(generated.cpu().float() if hasattr(generated, "cpu") else generated)
    if array.ndim != 4:
        raise ValueError(f"expected images of shape (batch, height, width, channels), got {array.shape}")
    array = (np.clip(array, 0.0, 1.0) * 255).round().astype("uint8")
    return [Image.fromarray(a[..., :3] if a.shape[-1] >= 3 else a[..., 0]).convert("RGB") for a in array]


def stats_dict(pipe) -> dict[str, Any] | None:
    """``bcg_diffusion.get_stats(pipe)`` as JSON-ready data (``None`` when BCG is not active)."""
    stats = bcg_diffusion.get_stats(pipe)
    return dataclasses.asdict(stats) if stats.active else None


class CallRunner:
    """Runs :class:`~.calls.PipelineCall` on ``pipe``: call it only from the worker thread (see the module's
    docstring). ``adapters``: the :class:`~.adapters.bank.AdapterBank` (``None`` without adapters); ``before_call``: run
    before every call (a step cache's reset; ``None``: nothing)."""

    def __init__(self, pipe, device: torch.device, counters: ServerCounters, *, adapters=None,
                 before_call: Callable[[], None] | None = None):
        self.pipe = pipe
        self.device = device
        self.counters = counters
        self.adapters = adapters
        self.before_call = before_call
        self._params = pipelines.call_parameters(pipe)
        self.bcg_stats: dict[str, Any] | None = None
        self.adapter_stats: dict[str, Any] | None = None
        self.compiled_graphs = 0  # torch.compile's graphs in this process, as of the last call
        self.refresh_stats()

    def refresh_stats(self) -> None:
        self.bcg_stats = stats_dict(self.pipe)
        self.compiled_graphs = compiled_graphs()
        if self.adapters is not None:
            self.adapter_stats = self.adapters.stats(self.bcg_stats)

    def select(self, adapter: str | None, scale: float | None, requests: int) -> None:
        """Make the next calls serve ``adapter`` at ``scale`` (``None``: the base model), for ``requests`` requests."""
        if self.adapters is not None:
            self.adapters.select(adapter, scale, requests=requests)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator("cuda" if self.device.type == "cuda" else "cpu").manual_seed(seed)

    def run(self, call: PipelineCall) -> list[GenerationResult]:
        """Run ``call``: each of its jobs' results. A failure is counted and logged, and raised again (an out-of-memory
        error as a fresh ``torch.OutOfMemoryError``, after the CUDA cache is emptied)."""
        self.counters.add("pipeline_calls")
        start = time.perf_counter()
        try:
            self.select(call.adapter, call.adapter_scale, len(call.batch.jobs))
            if self.before_call is not None:
                self.before_call()
            generators = [self.generator(s) for s in call.seeds]
            with request_grad_mode():
                output = self.pipe(**call.kwargs, **self._fault_kwargs(fault_for(call.prompts)),
                                   generator=generators[0] if call.one_generator else generators)
            images = to_pil_images(pipelines.generated(output))
            return call.batch.results(images, time.perf_counter() - start)
        except BaseException as exc:
            self.counters.add("pipeline_failures")
            logger.error("pipeline call failed (%s): %s: %s", call.what, type(exc).__name__, exc,
                         exc_info=not isinstance(exc, QUIET_FAILURES))
            if not isinstance(exc, torch.OutOfMemoryError):
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

    def warm(self, call: PipelineCall, sizes: list[Size], steps: int | None = None):
        """Warm ``sizes`` with ``call``'s settings through ``bcg_diffusion.warmup``: one call of
        ``steps`` steps per size (``None``: the library's default), its own generator, the call's adapter selected;
        the library's report."""
        settings = {k: v for k, v in call.kwargs.items() if k not in PER_SHAPE_KEYS}
        extra = {} if steps is None else {"num_inference_steps": steps}
        try:
            self.select(call.adapter, call.adapter_scale, len(call.batch.jobs))
            with request_grad_mode():
                return bcg_diffusion.warmup(self.pipe, [dict(height=s.height, width=s.width) for s in sizes], **extra,
                                            **settings)
        finally:
            self.refresh_stats()

    def _fault_kwargs(self, fault: Fault | None) -> dict[str, Any]:
        """The step callback that runs ``fault`` once, at the end of the call's first step (none without a fault; a
        pipeline without a step callback runs it before the call)."""
        if fault is None:
            return {}
        fired = []

        def once() -> None:
            if not fired:
                fired.append(True)
                fault()

        if "callback_on_step_end" in self._params:
            def on_step_end(_pipe, _step, _timestep, callback_kwargs):
                once()
                return callback_kwargs
            return {"callback_on_step_end": on_step_end}
        if "callback" in self._params:  # legacy step callback (PixArt-Sigma)
            extra = {"callback_steps": 1} if "callback_steps" in self._params else {}
            return {"callback": lambda _step, _timestep, _latents: once(), **extra}
        once()
        return {}
