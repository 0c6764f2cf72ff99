"""Where a step-batched request's host work runs (:class:`HostWork`): its preparation on a preparing thread as soon
as it is submitted, its finish (VAE decode, postprocessing, the answer) on a finishing thread, so that the thread
that runs the step boundaries never waits for either (``StepConfig.host_threads``; inline, both run on that thread).

Why: preparing a request (the tokenizers, the text encoder, a host-to-device copy from pageable memory, the
scheduler's ``set_timesteps`` on the device) and finishing it (``.cpu()`` in the postprocessing) each synchronize
with the device. Run between two steps on the pipeline's thread, each drained the device's queue and left the GPU
idle while the host work after it ran. On their own threads (and streams) they block only that thread; the
pipeline's thread keeps the next step queued.

Streams: on CUDA each worker queues its GPU work on a stream of its own, of a higher priority than the steps' by
default (``StepConfig.host_stream_priority``): the device runs a preparation's or a decode's kernels between the
kernels of the steps queued meanwhile, instead of behind them. Preparing a request synchronizes (a
host-to-device copy from pageable memory, ``.item()``); on the steps' stream each such wait also waited for the steps
queued before it, so a preparation took as long as several steps. On its own stream it waits for its own work only.
The hand-over is ordered on the device, never by waiting on the host: a preparation ends by recording an event on
its stream, and the pipeline's thread, as it takes the rows (:meth:`HostWork.take`), makes the steps' stream wait for
that event and marks every tensor of the rows as used by the steps' stream (``Tensor.record_stream``: the allocator
does not hand their memory to the preparing stream again before the steps that read it are done). A finish starts
with its stream waiting for an event recorded on the steps' stream after the last step of its rows, and marks their
latents as used by its stream.

Why the bits do not change: the same kernels run on the same inputs at the same shapes as inline (a stream changes
when a kernel runs, not what it computes), and each read is ordered after the write it needs by the events above.
BCG's captures use ``capture_error_mode="thread_local"`` on a side stream, so eager work on these threads does not
disturb a capture. One preparing thread (the tokenizers are not thread-safe: everything that encodes, the filler rows
included, goes through it) and one finishing thread, each with the creating thread's intra-op thread count (the CPU
kernels split their work the same way) and current CUDA device.
"""

from __future__ import annotations

import concurrent.futures
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from .rows import Row

__all__ = ["HostWork", "row_tensors"]


def row_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a prepared result: rows (:class:`~.rows.Row`), lists and tuples of them, a ``(rows, seconds)``
    pair; per row its conditioning dicts, latents, timesteps and the tensors its scheduler holds (directly, or in a
    list, tuple or dict attribute)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from row_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from row_tensors(item)
    elif isinstance(value, Row):
        for part in (value.cond, value.uncond, value.latents, value.timesteps, value.fixed_t):
            yield from row_tensors(part)
        for item in vars(value.scheduler).values() if value.scheduler is not None else ():
            if isinstance(item, (torch.Tensor, list, tuple, dict)):
                yield from row_tensors(item)


def _record_on(value: Any, stream) -> None:
    for tensor in row_tensors(value):
        if tensor.is_cuda:
            tensor.record_stream(stream)


@dataclass(frozen=True)
class _Handed:
    """A preparing job's result and the event recorded on the preparing stream after it (``None`` off CUDA)."""

    value: Any
    event: Any = None


def _like_creator(count: int, cuda_device: int | None) -> None:
    """A worker's start: the creating thread's intra-op thread count and current CUDA device (where CUDA is in use)."""
    torch.set_num_threads(count)
    if cuda_device is not None:
        torch.cuda.set_device(cuda_device)


class HostWork:
    """The preparing and the finishing worker of one step scheduler (``threaded``), or none: every job then runs on
    the caller's thread when the scheduler needs its result. ``switch_interval_s`` (threaded): the interpreter's
    switch interval while the workers exist (``StepConfig.switch_interval_s``), put back by :meth:`close`. ``cuda``
    (threaded): the pipeline runs on the current CUDA device; each worker gets a stream of its own, of priority
    ``stream_priority`` (``StepConfig.host_stream_priority``)."""

    def __init__(self, threaded: bool, switch_interval_s: float | None = None, cuda: bool = False,
                 stream_priority: int = 0):
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
        self._streams = ((torch.cuda.Stream(priority=stream_priority), torch.cuda.Stream(priority=stream_priority))
                         if threaded and cuda else (None, None))

    def prepare(self, job: Callable[..., Any], *args) -> concurrent.futures.Future | None:
        """``job(*args)`` queued on the preparing thread (on its stream): its future, whose result goes through
        :meth:`take` on the pipeline's thread; ``None`` inline (the caller runs it later)."""
        return None if self._preparer is None else self._preparer.submit(self._prepared, job, *args)

    def on_preparer(self, job: Callable[..., Any], *args) -> Any:
        """``job(*args)`` on the preparing thread, waited for and taken (inline: here); its result or its exception."""
        return job(*args) if self._preparer is None else self.take(self._preparer.submit(self._prepared, job, *args))

    def take(self, prepared: concurrent.futures.Future) -> Any:
        """On the pipeline's thread: the result of a finished preparation, its tensors handed to the current stream
        (which waits for the preparation's event; see the module's docstring); its exception if it failed."""
        handed = prepared.result()
        if handed.event is not None:
            stream = torch.cuda.current_stream()
            stream.wait_event(handed.event)
            _record_on(handed.value, stream)
        return handed.value

    def _prepared(self, job: Callable[..., Any], *args) -> _Handed:
        stream = self._streams[0]
        if stream is None:
            return _Handed(job(*args))
        with torch.cuda.stream(stream):
            value = job(*args)
            event = torch.cuda.Event()
            event.record(stream)
        return _Handed(value, event)

    def _finished(self, after, job: Callable[[list], None], tickets: list) -> None:
        stream = self._streams[1]
        if stream is None or after is None:
            job(tickets)
            return
        with torch.cuda.stream(stream):
            stream.wait_event(after)
            _record_on([row for ticket in tickets for row in ticket.rows], stream)
            job(tickets)

    def finish(self, job: Callable[[list], None], tickets: list) -> None:
        """``job(tickets)`` on the finishing thread, on its stream (inline, or once the workers are stopped: now);
        ``tickets`` are requests whose rows' last step was queued on the current stream. ``job`` answers them."""
        try:
            if self._finisher is not None:
                after = None
                if self._streams[1] is not None:
                    after = torch.cuda.Event()
                    after.record(torch.cuda.current_stream())
                self._finisher.submit(self._finished, after, job, tickets)
                return
        except RuntimeError:  # stopped by close(): the job fails its requests where it runs
            pass
        job(tickets)

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
