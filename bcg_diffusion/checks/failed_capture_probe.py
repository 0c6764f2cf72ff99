"""What does a long process with many failed captures need to die natively? (issue 44)

Each variant runs in its own child process (a native death is an exit code, not a lost run): ``--n`` failing
captures in a row (a raise, a host read, an interrupt, in turn), with a live breakable graph replayed and checked
between them, and eager memory allocated and freed. Raw-torch variants end a failed capture as the library does
(``raw_*``; ``_noclean`` leaves the allocator's routing as torch left it, ``_keep`` keeps the failed graphs alive),
library variants go through ``BreakableCUDAGraphCapture`` with a fresh pool per failure, one shared pool, or one
pool kept for failures (``lib_*``). Each writes a JSON line: done, mismatches, reserved memory before and after
``empty_cache``, pools with segments, failed segments parked, and what torch left on after a failed ``capture_end``.
Run on the H100 of 2026-12-07: ``bench_results/failed_capture_probe_2026-12-07_072930.jsonl`` (docs/testing.md).

    python -m bcg_diffusion.checks.failed_capture_probe --n 1000 --budget 6 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bcg_diffusion.toolkit.numbers import finite_float

VARIANTS = [
    # raw torch, a failure inside the capture; the pool a fresh one each time (as the library does) or shared
    "raw_raise_fresh",
    "raw_raise_shared",
    # raw torch, a host read invalidates the capture; cleanup as the library does it
    "raw_item_fresh",
    "raw_item_shared",
    # raw torch, invalidated capture, the failed graph kept alive (never destroyed) vs destroyed
    "raw_item_fresh_keep",
    # raw torch, invalidated capture, no cleanup of the allocator's routing, the graph destroyed
    "raw_item_fresh_noclean",
    # the library's BreakableCUDAGraphCapture, failing three ways in turn
    "lib_fresh",
    "lib_shared",
    "lib_fresh_snapshot",  # + a pool-scoped memory_snapshot after every failure (what nonowning did)
    "lib_fresh_keep",  # the failed graphs kept alive
    "lib_one_failpool",  # every failure captures into ONE long-lived pool kept for failed captures
    # as lib_fresh (a fresh pool per failure, given), and where the failed segment was parked (capture_begin had
    # taken a reference on the pool, capture_end failed and the parked graph never gives it back: pytorch #190348)
    # that reference is given back with torch._C._cuda_releasePool, so empty_cache can free the pool
    "lib_fresh_release",
]


def child(variant: str, n: int, budget: float) -> dict:
    import torch

    from bcg_diffusion.core import BreakableCUDAGraph, BreakableCUDAGraphCapture

    dev = torch.device("cuda")
    torch.manual_seed(0)
    w = torch.randn(256, 256, device=dev)
    x = torch.randn(64, 256, device=dev)
    # a live breakable graph that keeps replaying between failures
    live = BreakableCUDAGraph()
    stream = torch.cuda.Stream()
    with BreakableCUDAGraphCapture(live, stream=stream):
        y_live = torch.relu(x @ w) @ w
    expected = torch.relu(x @ w) @ w
    shared_pool = torch.cuda.graph_pool_handle()
    fail_pool = torch.cuda.graph_pool_handle()
    kept = []
    mismatches = 0
    start = time.perf_counter()
    done = 0
    kinds = ("raise", "item", "interrupt")
    for i in range(n):
        if time.perf_counter() - start > budget:
            break
        kind = kinds[i % 3]
        if variant.startswith("raw"):
            _raw_failure(torch, variant, kind if "item" not in variant else "item", x, w, shared_pool, kept, stream)
        else:
            pool = {"lib_shared": shared_pool, "lib_one_failpool": fail_pool}.get(variant)
            if variant == "lib_fresh_release":
                pool = torch.cuda.graph_pool_handle()
            parked_before = _parked()
            g = BreakableCUDAGraph()
            try:
                with BreakableCUDAGraphCapture(g, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    h = torch.relu(x @ w)
                    h = h * 2 + 1
                    if kind == "raise":
                        raise ValueError("planted")
                    if kind == "item":
                        float(h.sum().item())
                    if kind == "interrupt":
                        raise KeyboardInterrupt
                    h @ w
            except (ValueError, RuntimeError, KeyboardInterrupt):
                pass
            if variant == "lib_fresh_release":
                _release_parked_pool(torch, pool, dev, _parked() - parked_before)
            if variant.endswith("keep"):
                kept.append(g)
            if variant.endswith("snapshot"):
                torch.cuda.memory_snapshot(mempool_id=tuple(shared_pool))
        live.replay()
        if not torch.equal(y_live, expected):
            mismatches += 1
        # allocate and free some eager memory so blocks move
        t = torch.empty(1 << (18 + i % 5), device=dev)
        del t
        done += 1
    torch.cuda.synchronize()
    pools = sorted({tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()})
    return {
        "variant": variant, "done": done, "mismatches": mismatches,
        "reserved_MiB": torch.cuda.memory_reserved() / 2**20, "allocated_MiB": torch.cuda.memory_allocated() / 2**20,
        "pools_with_segments": len(pools), "seconds": time.perf_counter() - start, "facts": FACTS,
        "parked": _parked(), "reserved_after_empty_cache_MiB": _after_empty_cache(torch),
    }


def _abandon_capture(stream) -> None:
    """End a capture left open on ``stream`` and destroy the partial graph; clear the error it left."""
    from bcg_diffusion.core import CaptureStatus, cuda_runtime, stream_capture_status

    rt = cuda_runtime()
    if stream_capture_status(stream) is not CaptureStatus.NONE:
        result = rt.cudaStreamEndCapture(stream.cuda_stream)
        graph = result[1] if isinstance(result, tuple) and len(result) > 1 else None
        if graph is not None and int(graph) != 0:
            rt.cudaGraphDestroy(graph)
    rt.cudaGetLastError()


def _parked():
    from bcg_diffusion.core import failed_segment_count

    return failed_segment_count()


def _release_parked_pool(torch, pool, dev, newly_parked: int) -> None:
    """Give back the reference a parked segment's ``capture_begin`` took on ``pool``: only where exactly one segment
    was parked by this failure (its capture began, its end failed); counted in ``FACTS``."""
    if newly_parked != 1:
        FACTS["release_skipped"] = FACTS.get("release_skipped", 0) + (newly_parked != 0)
        return
    torch._C._cuda_releasePool(dev.index, pool)
    FACTS["pools_released"] = FACTS.get("pools_released", 0) + 1


def _after_empty_cache(torch):
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2**20


FACTS: dict = {}


def _raw_failure(torch, variant, kind, x, w, shared_pool, kept, stream):
    from bcg_diffusion.core import reset_generator_capture_state

    pool = shared_pool if variant.endswith("shared") else torch.cuda.graph_pool_handle()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        g.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            h = torch.relu(x @ w)
            if kind == "item":
                float(h.sum().item())
            raise ValueError("planted")
        except Exception:
            try:
                g.capture_end()
            except Exception:
                if not variant.endswith("noclean"):
                    try:
                        torch._C._cuda_endAllocateToPool(stream.device.index, pool)
                        FACTS["torch_left_routing_on"] = FACTS.get("torch_left_routing_on", 0) + 1
                    except Exception:
                        FACTS["torch_ended_routing"] = FACTS.get("torch_ended_routing", 0) + 1
                _abandon_capture(stream)
                reset_generator_capture_state(stream.device)
    if variant.endswith("keep"):
        kept.append(g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--budget", type=finite_float, default=40.0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", default=None)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.n, a.budget)), flush=True)
        return
    import torch

    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "pool_apis": sorted(n for n in dir(torch._C) if "ool" in n and n.startswith("_cuda"))}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "crash_probe.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(info) + "\n")
    print(json.dumps(info), flush=True)
    for v in a.variants.split(","):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", v, "--n", str(a.n), "--budget", str(a.budget)],
                              capture_output=True, text=True, timeout=a.budget + 60)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        row = {"variant": v, "rc": proc.returncode, "wall": round(time.perf_counter() - t0, 1)}
        try:
            row.update(json.loads(last))
        except Exception:
            row["stderr_tail"] = proc.stderr[-800:]
        print(json.dumps(row), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
