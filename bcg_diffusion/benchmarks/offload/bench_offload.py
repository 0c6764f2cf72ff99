"""``bcg-bench-offload`` (``scripts/bench_offload.py``): weight streaming under a device memory cap, per
transformer call, against the same model resident and against diffusers' group offloading with streams, in one
process (:mod:`.modes`). Writes ``bench_offload_<date>_<time>.json`` and ``.md`` into ``--out-dir``.

    python scripts/bench_offload.py --case flux:full:1024x1024 --cap-gib 16 --out-dir bench_results
    python scripts/bench_offload.py --case wan14b:full:480x832:f33:b1 --cap-gib 24 --out-dir bench_results

Without CUDA it runs the tiny model eagerly, streamed and not (it tests the command, not the speed).
"""

from __future__ import annotations

from bcg_diffusion.toolkit.numbers import finite_float
import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

from ..environment import environment, output_base
from .modes import Bench, ModeResult, bandwidth, measure, set_cap
from .report import markdown, summary
from .subject import build_transformer, call_inputs, parse_case

GIB = 2**30


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bcg-bench-offload", description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="flux:full:1024x1024",
                   help="model[:size][:HxW][:fFRAMES][:bBATCH]; models: flux, wan (1.3B), wan14b (default: %(default)s)")
    p.add_argument("--cap-gib", type=finite_float, default=16.0,
                   help="device memory cap of the streaming modes, GiB (torch.cuda.set_per_process_memory_fraction)")
    p.add_argument("--slots", type=int, default=2, help="OffloadConfig(slots=K) (default: 2)")
    p.add_argument("--modes", default="resident_eager,resident_bcg,stream_eager,stream_bcg,group_offload",
                   help="comma-separated, in this order (default: all)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per mode (>= 2: BCG captures at its second)")
    p.add_argument("--iters", type=int, default=3, help="timed calls per mode")
    p.add_argument("--time-budget", type=finite_float, default=110.0, metavar="S",
                   help="start no mode after S seconds from the start (default: %(default)s)")
    p.add_argument("--dtype", choices=pipelines.DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--out-dir", type=Path, default=Path("bench_results"))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    try:
        case = parse_case(args.case, cuda)
    except ValueError as exc:
        parser.error(str(exc))
    if args.slots < 2 or args.warmup < 2 or args.iters < 1:
        parser.error("--slots and --warmup must be >= 2, --iters >= 1")
    started = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = pipelines.resolve_dtype(args.dtype, device)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    base, env = output_base(args.out_dir, "bench_offload"), environment(device, dtype, cuda)

    def save(result: dict[str, Any]) -> None:  # after every mode: a run cut short keeps what it measured
        result["environment"] = env
        base.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
        base.with_suffix(".md").write_text(markdown(result))

    result = run_case(case, device, dtype, args, modes, started, save)
    print(markdown(result))
    print(f"wrote {base.with_suffix('.json')} and {base.with_suffix('.md')}")
    return 0


def run_case(case, device: torch.device, dtype: torch.dtype, args, modes: list[str], started: float,
             save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Build, run the modes asked for in their order (``save`` after each), and sum up."""
    t0 = time.perf_counter()
    model = build_transformer(case, device, dtype)
    bench = Bench(model, call_inputs(case, device, dtype), device, args.slots, args.warmup, args.iters,
                  started + args.time_budget)
    built_s = time.perf_counter() - t0
    link = bandwidth(device) if bench.cuda else None
    cap = int(args.cap_gib * GIB) if bench.cuda else None
    state = {"fraction": None}

    def done() -> dict[str, Any]:
        result = summary(case, bench, built_s, link, cap, state["fraction"], args)
        save(result)
        return result

    for name, run in _plan(bench, modes):
        if name == "to_host":
            state["fraction"] = _to_host_under_cap(bench, cap)
        else:
            run()
            done()
    return done()


def _plan(bench: Bench, modes: list[str]) -> list[tuple[str, Callable[[], Any]]]:
    """The modes asked for, in their order, with the move to the host (under the cap) between."""
    cuda = bench.cuda
    steps: list[tuple[str, Callable[[], Any]]] = [] if cuda else [("eager", lambda: measure(bench, "eager (no CUDA)",
                                                                                            lambda: None))]
    steps += [(n, lambda n=n: _resident(bench, n)) for n in ("resident_eager", "resident_bcg") if n in modes and cuda]
    steps.append(("to_host", lambda: None))
    steps += [(n, lambda n=n: _streamed(bench, n)) for n in ("stream_eager", "stream_bcg") if n in modes]
    steps.append(("unstream", lambda: _unstream(bench.model)))
    if "group_offload" in modes and cuda:
        steps.append(("group_offload", lambda: measure(bench, "group_offload", lambda: bench.model.enable_group_offload(
            onload_device=bench.device, offload_device=torch.device("cpu"), offload_type="block_level",
            num_blocks_per_group=1, use_stream=True))))
    return steps


def _resident(bench: Bench, name: str) -> ModeResult:
    if name == "resident_eager":
        return measure(bench, name, lambda: None)
    return measure(bench, name, lambda: bcg_diffusion.accelerate_transformer(bench.model),
                   lambda: bcg_diffusion.remove_acceleration(bench.model))


def _to_host_under_cap(bench: Bench, cap: int | None) -> float | None:
    """The transformer to the CPU (where a model too large for the device would be), then the cap on."""
    if not bench.cuda:
        return None
    bench.model.to("cpu")
    return set_cap(bench.device, cap)


def _streamed(bench: Bench, name: str) -> ModeResult:
    """``stream_eager`` streams; ``stream_bcg`` accelerates the same streaming (made here if the first did not run)."""
    config = bcg_diffusion.OffloadConfig(slots=bench.slots, device=str(bench.device), measure_waits=bench.cuda)

    def set_up() -> None:
        if not bcg_diffusion.is_streaming(bench.model):
            bcg_diffusion.apply_weight_streaming(bench.model, config)
        if name == "stream_bcg":
            bcg_diffusion.accelerate_transformer(bench.model)

    return measure(bench, name, set_up)


def _unstream(model) -> None:
    """Acceleration and streaming off: the blocks' weights back on the CPU (views of the former host copies)."""
    bcg_diffusion.remove_acceleration(model)
    bcg_diffusion.remove_weight_streaming(model)


if __name__ == "__main__":
    sys.exit(main())
