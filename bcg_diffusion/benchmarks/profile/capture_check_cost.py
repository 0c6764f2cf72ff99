"""Capture time with and without the allocator-snapshot check of break arguments, side by side in one process.

Break arguments are told apart by their lifetime since branch ``volume`` (no allocator walk on the capture
path); ``BCG_DIFFUSION_CHECK_BREAK_ARGS=1`` still turns on the old membership check, which reads an allocator
snapshot (``torch.cuda.memory_snapshot``) after each capture whose break arguments stayed non-owning. The
variable is read at the end of every capture, so both ways run on the same accelerated transformer, the same
inputs and the same warm process: per round, ``clear_graphs``, one eager first call of the key, then the
capturing call, once with the check off and once on (the order alternates from round to round). The
check has something to read only where breaks have arguments: ``--attention break`` (the default here) makes
every attention call a break, as non-native attention backends and context parallelism do.

A snapshot walks every block of the caching allocator, so its cost grows with the process's blocks:
``--ballast N,M`` repeats the rounds with N (then M) small device tensors kept alive beside the model.

Per capture it records the runner's capture time (``get_stats``: ``capture_time_s`` and its phases), the
wall time of the capturing call, how many snapshots were taken and their seconds (``torch.cuda.memory_snapshot``
is wrapped for the run), and whether the output equals the eager call's, bitwise. Writes
``capture_check_cost.json`` under ``--out`` (rewritten after each case).

    python -m bcg_diffusion.benchmarks.profile.capture_check_cost --cases pixart:512x512 --rounds 5 --ballast 0,20000 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from ...toolkit.numbers import finite_float

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

from . import capture_profile as profile

ENV_CHECK = "BCG_DIFFUSION_CHECK_BREAK_ARGS"
MODES = ("off", "on")


class SnapshotCounter:
    """Counts the calls of ``torch.cuda.memory_snapshot`` and their seconds while installed."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator["SnapshotCounter"]:
        real = torch.cuda.memory_snapshot

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - start

        torch.cuda.memory_snapshot = counted
        try:
            yield self
        finally:
            torch.cuda.memory_snapshot = real


@contextlib.contextmanager
def check_mode(mode: str) -> Iterator[None]:
    """``BCG_DIFFUSION_CHECK_BREAK_ARGS`` set to 1 (``on``) or 0 (``off``), put back afterwards."""
    before = os.environ.get(ENV_CHECK)
    os.environ[ENV_CHECK] = "1" if mode == "on" else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_CHECK, None)
        else:
            os.environ[ENV_CHECK] = before


def one_capture(pipe: Any, model: torch.nn.Module, call: tuple, eager_out: torch.Tensor, mode: str) -> dict:
    """Drop the graphs, make the key's eager first call, then time its capturing call with the check ``mode``."""
    args, kwargs = call
    bcg_diffusion.clear_graphs(pipe)
    captures_before = _captures(pipe)
    counter = SnapshotCounter()
    with check_mode(mode), counter.installed(), torch.inference_mode():
        model(*args, **kwargs)
        out, wall = profile.timed(lambda: model(*args, **kwargs))
        equal = bool(torch.equal(out[0], eager_out))
    stats = bcg_diffusion.get_stats(pipe)
    entry = stats.entries[0] if stats.active and stats.entries else None
    return {
        "mode": mode, "capture_call_s": wall, "bitwise": equal, "snapshots": counter.calls,
        "snapshot_s": counter.seconds, "captures": _captures(pipe) - captures_before,
        "capture_time_s": entry.capture_time_s if entry is not None else None,
        "phases": dict(entry.capture_phases) if entry is not None else {},
        "breaks": entry.breaks if entry is not None else 0, "fallback": entry.fallback if entry is not None else None,
    }


def _captures(pipe: Any) -> int:
    stats = bcg_diffusion.get_stats(pipe)
    return stats.captures if stats.active else 0


def _median(rows: list[dict], field: str) -> float | None:
    values = [r[field] for r in rows if r.get(field) is not None]
    return statistics.median(values) if values else None


def summarise(rows: list[dict]) -> dict:
    """Per mode: medians of the capture time, the capturing call and the snapshot seconds; the on/off ratio."""
    out: dict = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        out[mode] = {"captures": len(mine), "capture_time_s": _median(mine, "capture_time_s"),
                     "capture_call_s": _median(mine, "capture_call_s"), "snapshot_s": _median(mine, "snapshot_s"),
                     "snapshots_per_capture": _median(mine, "snapshots"),
                     "all_bitwise": all(r["bitwise"] for r in mine)}
    on, off = out["on"]["capture_time_s"], out["off"]["capture_time_s"]
    out["on_over_off"] = on / off if on and off else None
    return out


def run_case(text: str, rounds: int, ballasts: list[int], attention: str, deadline: float, log: Any) -> dict:
    """One case: build it, read one transformer call's inputs, then the rounds at each ballast level."""
    case = profile.parse_case(text)
    pipe = pipelines.build_pipeline(case["family"], size=profile.SIZE, device=profile.DEVICE,
                                   dtype=torch.bfloat16 if profile.DEVICE == "cuda" else torch.float32, seed=0)
    pipe.set_progress_bar_config(disable=True)
    call = profile.transformer_inputs(pipe, profile.image_call(pipe, case, 2))
    model = pipe.transformer
    with torch.inference_mode():
        eager_out = model(*call[0], **call[1])[0].clone()
    config = bcg_diffusion.BCGConfig(debug=profile.DEVICE != "cuda", attention=attention)
    bcg_diffusion.accelerate_pipeline(pipe, config=config)
    result: dict = {"case": text, "attention": attention, "levels": []}
    for ballast in ballasts:
        kept = [torch.empty(64, device=profile.DEVICE) for _ in range(ballast)]
        rows = []
        for r in range(rounds):
            if time.perf_counter() > deadline:
                break
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                rows.append({"round": r, **one_capture(pipe, model, call, eager_out, mode)})
        level = {"ballast_tensors": ballast, "rounds": rows, "summary": summarise(rows)}
        result["levels"].append(level)
        log(f"  ballast {ballast}: {json.dumps(level['summary'])}")
        del kept
    bcg_diffusion.remove_acceleration(pipe)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="pixart:512x512", help="family:HxW[:fFRAMES], comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="captures per mode and ballast level")
    p.add_argument("--ballast", default="0,20000", help="small device tensors kept alive, per level (comma-separated)")
    p.add_argument("--attention", default="break", choices=("break", "capture_safe"),
                   help="BCGConfig.attention: 'break' (default) breaks at every attention call, so the breaks have "
                        "arguments to check; with 'capture_safe' full-size models capture attention inline (no breaks)")
    p.add_argument("--time-budget", type=finite_float, default=50.0, help="seconds; rounds stop starting after it")
    p.add_argument("--size", default="full", help="full (default) or tiny (a CPU dry run in debug mode)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    profile.SIZE = args.size
    profile.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    if profile.DEVICE == "cpu" and args.size != "tiny":
        print("capture_check_cost needs a CUDA GPU for --size full (--size tiny runs on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.time_budget
    ballasts = [int(b) for b in args.ballast.split(",") if b.strip()]
    header = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if profile.DEVICE == "cuda" else "cpu",
              "rounds": args.rounds, "ballast": ballasts, "size": args.size, "attention": args.attention}
    results: list = []
    for text in args.cases.split(","):
        print(f"case {text}", flush=True)
        results.append(run_case(text, args.rounds, ballasts, args.attention, deadline, lambda m: print(m, flush=True)))
        (args.out / "capture_check_cost.json").write_text(json.dumps({"header": header, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
