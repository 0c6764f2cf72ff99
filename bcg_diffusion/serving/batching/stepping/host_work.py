"""Where a step-batched request's host work runs (:class:`HostWork`): its preparation on a preparing thread as soon
as it is submitted, its finish (VAE decode, postprocessing, the answer) on a finishing thread, so that the thread
that runs the step boundaries never waits for either (``StepConfig.host_threads``; inline, both run on that thread).

Why: preparing a request (the tokenizers, the text encoder, a host-to-device copy from pageable memory, the
scheduler's ``set_timesteps`` on the device) and finishing it (``.cpu()`` in the postprocessing) each synchronize
with the device. Run between two steps on the pipeline's thread, each drained the device's queue and left the GPU
idle while the host work after it ran. On their own threads they block only that thread; the pipeline's thread keeps
the next step queued.

Why the bits do not change: every GPU op of both workers runs on the same stream as the steps (the device's default
stream: the workers never select another one), with the same kernels and the same shapes as inline. A request's rows
are read by the pipeline's thread only once its preparation is done on the host, so its kernels were queued before
the steps that read them; a finished row's latents are decoded by kernels queued after the step that wrote them.
Stream order does the rest. BCG's captures use ``capture_error_mode="thread_local"`` on a side stream, so eager work
on these threads does not disturb a capture. One preparing thread (the tokenizers are not thread-safe: everything
that encodes, the filler rows included, goes through it) and one finishing thread, each with the creating thread's
intra-op thread count (the CPU kernels split their work the same way) and current CUDA device.
"""

from __future__ import annotations

import concurrent.futures
import sys
from typing import Any, Callable

import torch

__all__ = ["HostWork"]


def _like_creator(count: int, cuda_device: int | None) -> None:
    """A worker's start: the creating thread's intra-op thread count and current CUDA device (where CUDA is in use)."""
    torch.set_num_threads(count)
    if cuda_device is not None:
        torch.cuda.set_device(cuda_device)


class HostWork:
    """The preparing and the finishing worker of one step scheduler (``threaded``), or none: every job then runs on
    the caller's thread when the scheduler needs its result. ``switch_interval_s`` (threaded): the interpreter's
    switch interval while the workers exist (``StepConfig.switch_interval_s``), put back by :meth:`close`."""

    def __init__(self, threaded: bool, switch_interval_s: float | None = None):
        self.threaded = threaded
        pools = [None, None]
        self._switch = None  # (the interval set here, the one it replaced)
        if threaded and switch_interval_s is not None:
            self._switch = (switch_interval_s, sys.getswitchinterval())
            sys.setswitchinterval(switch_interval_s)
        if threaded:
            like = (torch.get_num_threads(), torch.cuda.current_device() if torch.cuda.is_initialized() else None)
            pools = [concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"bcg-step-{name}",
                                                           initializer=_like_creator, initargs=like)
                     for name in ("prepare", "finish")]
        self._preparer, self._finisher = pools

    def prepare(self, job: Callable[..., Any], *args) -> concurrent.futures.Future | None:
        """``job(*args)`` queued on the preparing thread: its future; ``None`` inline (the caller runs it later)."""
        return None if self._preparer is None else self._preparer.submit(job, *args)

    def on_preparer(self, job: Callable[..., Any], *args) -> Any:
        """``job(*args)`` on the preparing thread, waited for (inline: here); its result or its exception."""
        return job(*args) if self._preparer is None else self._preparer.submit(job, *args).result()

    def finish(self, job: Callable[..., Any], *args) -> None:
        """``job(*args)`` on the finishing thread (inline, or once the workers are stopped: now). ``job`` answers its
        requests itself."""
        try:
            if self._finisher is not None:
                self._finisher.submit(job, *args)
                return
        except RuntimeError:  # stopped by close(): the job fails its requests where it runs
            pass
        job(*args)

    def drain(self) -> None:
        """Wait until the finishing jobs queued so far are done."""
        if self._finisher is not None:
            try:
                self._finisher.submit(lambda: None).result()
            except RuntimeError:  # closed: nothing more runs there
                pass

    def close(self) -> None:
        """Stop both workers: queued preparations are cancelled (their requests are failed by the scheduler), queued
        finishing jobs still run (they fail their requests once the scheduler is closed); nothing waits here."""
        if self._preparer is not None:
            self._preparer.shutdown(wait=False, cancel_futures=True)
            self._finisher.shutdown(wait=False)
        if self._switch is not None:
            ours, before = self._switch
            self._switch = None
            if abs(sys.getswitchinterval() - ours) < 1e-9:  # not changed by someone else meanwhile
                sys.setswitchinterval(before)
