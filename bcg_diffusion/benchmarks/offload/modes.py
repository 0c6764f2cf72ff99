"""The modes of the offload benchmark, in the order they run on one model in one process:

- ``resident_eager``, ``resident_bcg``: the whole transformer on the device, no cap (the speed to reach);
- then the transformer goes to the CPU and the cap is set (``torch.cuda.set_per_process_memory_fraction``);
- ``stream_eager``, ``stream_bcg``: weight streaming through K slots (``bcg_diffusion.apply_weight_streaming``),
  without and with graphs;
- ``group_offload``: diffusers' group offloading at block level with streams
  (``enable_group_offload(onload_device, offload_device, offload_type="block_level", num_blocks_per_group=1,
  use_stream=True)``), eager (it moves weights to new addresses on every onload, which no graph replays).

Each mode: untimed calls (the first call of BCG warms up, the second captures), then timed calls, each between
device synchronisations; its output compared bitwise with ``resident_eager``'s (or, without CUDA, with the
unstreamed model's); its peak device memory; BCG's and streaming's statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import bcg_diffusion

from ..timing import Clock, summarize


@dataclass
class ModeResult:
    name: str
    times_ms: dict[str, float] = field(default_factory=dict)
    bitwise: bool | None = None
    peak_bytes: int | None = None
    setup_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    error: str | None = None


@dataclass
class Bench:
    """One case's model, inputs and settings, and what the modes found."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    device: torch.device
    slots: int
    warmup: int
    iters: int
    deadline: float
    reference: torch.Tensor | None = None
    results: list[ModeResult] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def call(self) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(**self.inputs)[0]


def measure(bench: Bench, name: str, set_up: Callable[[], None], tear_down: Callable[[], None] | None = None) -> ModeResult:
    """Set up a mode, run it (untimed, then timed calls), record, tear down; an error is recorded, not raised."""
    result = ModeResult(name)
    bench.results.append(result)
    if time.perf_counter() > bench.deadline:
        result.skipped = "time budget spent (--time-budget)"
        return result
    clock = Clock(bench.cuda)
    try:
        if bench.cuda:
            torch.cuda.reset_peak_memory_stats(bench.device)
        result.setup_s, _ = clock.wall(set_up)
        out = None
        for _ in range(bench.warmup):
            out = bench.call()
        before = bcg_diffusion.get_stats(bench.model)
        times = [clock.wall(bench.call)[0] for _ in range(bench.iters)]
        out = bench.call() if out is None else out
        result.times_ms = summarize(times)
        result.stats = _stats(before, bcg_diffusion.get_stats(bench.model))
        if bench.cuda:
            result.peak_bytes = torch.cuda.max_memory_allocated(bench.device)
        if bench.reference is None:
            bench.reference = out.detach().cpu()
        result.bitwise = torch.equal(out.detach().cpu(), bench.reference)
    except Exception as exc:  # noqa: BLE001 - one failed mode does not end the run
        result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        if tear_down is not None:
            tear_down()
    return result


def _stats(before: Any, after: Any) -> dict[str, Any]:
    """What the timed calls did: graph replays and captures (BCG), loads and bytes per call (streaming)."""
    found: dict[str, Any] = {}
    if after.active:
        found.update(hits=after.hits - before.hits, captures_during_timed=after.captures - before.captures,
                     segments=[e.segments for e in after.entries], breaks=[e.breaks for e in after.entries])
    if after.offload is not None:
        o, o0 = after.offload, before.offload
        calls = max(1, o.calls - o0.calls)
        found.update(blocks=o.blocks, slots=o.slots, slot_bytes=o.slot_bytes, resident_bytes=o.resident_bytes,
                     host_bytes=o.host_bytes, pinned=o.pinned, bytes_per_call=o.bytes_last_call,
                     sync_loads_during_timed=o.sync_loads - o0.sync_loads,
                     wait_ms_per_call=None if o.wait_s is None else 1e3 * (o.wait_s - o0.wait_s) / calls)
    return found


def bandwidth(device: torch.device, nbytes: int = 2**30, reps: int = 5) -> dict[str, float]:
    """Host-to-device copy bandwidth from page-locked memory (GB/s, 1e9 bytes), median of ``reps`` copies."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times = sorted(times[1:])
    del src, dst
    return {"bytes": nbytes, "gb_per_s": nbytes / times[len(times) // 2] / 1e9}


def set_cap(device: torch.device, cap_bytes: int | None) -> float | None:
    """The per-process memory fraction that stands for a smaller GPU; ``None`` without a cap."""
    if cap_bytes is None:
        return None
    torch.cuda.empty_cache()
    fraction = min(1.0, cap_bytes / torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction
