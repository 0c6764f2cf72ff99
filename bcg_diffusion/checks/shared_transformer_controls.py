"""Which condition of the shared-transformer check moves the bits: each alone, against the process's first eager call.

Why: :mod:`.shared_transformer` (H100, 2026-12-07 15:34) found 60 of 60 generations different from its eager
references, each seed by the same amount every time: not a race between its threads, but something that holds for
the whole run and sets its accelerated calls apart from the eager calls made at its start. This runs, in one process,
the tiny Flux pipeline of ``bcg_pipelines`` with true CFG (latents out): a first eager call (the reference), then each
condition that check combines, one after the other, each compared with the reference bitwise:

- eager: a second call; a call in another thread; a call beside the GPU burner; a call beside a CPU burner;
- accelerated (``accelerate_pipeline``): three calls (the first key's warm-up, its capture, a replay); a call in
  another thread; a call of a second pipeline made with ``from_pipe``; the first pipeline again; a call beside the
  GPU burner, one beside a CPU burner, one after both;
- after ``remove_acceleration``: a call of each pipeline.

The second pipeline keeps the first one's dtype (:func:`.shared_transformer.second_pipeline`): the first run of these
controls (H100, 2026-12-07 16:31) made it with ``from_pipe``'s default, which cast the shared bfloat16 components to
float32, and every call from then on, eager ones included, differed from the bfloat16 reference by the same amount:
what the check's 60 of 60 differences were.

Writes ``controls.json`` and ``controls.md`` in ``--out``; the exit status is 1 when a result differs. Without CUDA
acceleration is a no-op and the GPU burner is left out: the plumbing only.

    python -m bcg_diffusion.checks.shared_transformer_controls --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

from .planting import current_commit
from .shared_transformer import FAMILY, burn_cpu, burn_gpu, generate, second_pipeline


def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a thread of its own; its result (its exception raised here)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="control-thread")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["out"]


@contextlib.contextmanager
def burning(burner: Callable, *extra: Any, settle_s: float = 0.2):
    """``burner(stop, *extra)`` running in a thread for the block (after ``settle_s`` seconds to get going)."""
    stop = threading.Event()
    thread = threading.Thread(target=burner, args=(stop, *extra), daemon=True)
    thread.start()
    time.sleep(settle_s)
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def beside(burner: Callable, fn: Callable[[], Any], *extra: Any) -> Callable[[], Any]:
    def call() -> Any:
        with burning(burner, *extra):
            return fn()
    return call


#: The name prefix of a step that changes the pipelines (run, not compared).
ACTION = "do: "


def controls(pipe: Any, other: list, seed: int, steps: int, device: torch.device) -> list[tuple[str, Callable]]:
    """The controls in order, as ``(name, call)``; a name that starts with :data:`ACTION` changes the pipelines and is
    run, not compared. ``other`` receives the second pipeline once it is made."""
    first = lambda: generate(pipe, seed, steps)  # noqa: E731
    second = lambda: generate(other[0], seed, steps)  # noqa: E731
    gpu_burner = [beside(burn_gpu, first, device)] if device.type == "cuda" else []

    def make_other() -> None:
        other.append(second_pipeline(pipe))

    plan = [("eager: a second call", first), ("eager: in another thread", lambda: in_thread(first))]
    plan += [("eager: beside the GPU burner", call) for call in gpu_burner]
    plan += [("eager: beside a CPU burner", beside(burn_cpu, first)),
             (f"{ACTION}accelerate_pipeline", lambda: bcg_diffusion.accelerate_pipeline(pipe))]
    plan += [(f"accelerated: call {i + 1} ({what})", first) for i, what in enumerate(("warm-up", "capture", "replay"))]
    plan += [("accelerated: in another thread", lambda: in_thread(first)), (f"{ACTION}from_pipe", make_other),
             ("accelerated: the second pipeline (from_pipe)", second), ("accelerated: the first pipeline again", first)]
    plan += [("accelerated: beside the GPU burner", call) for call in gpu_burner]
    plan += [("accelerated: beside a CPU burner", beside(burn_cpu, first)), ("accelerated: after the burners", first),
             (f"{ACTION}remove_acceleration", lambda: bcg_diffusion.remove_acceleration(pipe)),
             ("eager after remove_acceleration", first),
             ("eager after remove_acceleration: the second pipeline", second)]
    return plan


def compare(name: str, call: Callable[[], Any], reference: torch.Tensor) -> dict[str, Any]:
    """One control's result against the reference: equal, the largest difference, or the error it raised."""
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - reported
        return {"name": name, "equal": False, "max_diff": None, "error": f"{type(exc).__name__}: {exc}"}
    equal = bool(torch.equal(out, reference))
    diff = 0.0 if equal or out.shape != reference.shape else float((out.float() - reference.float()).abs().max())
    return {"name": name, "equal": equal, "max_diff": diff, "error": ""}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe = pipelines.build_pipeline(FAMILY, size="tiny", device=device, seed=0)
    pipe.set_progress_bar_config(disable=True)
    reference = generate(pipe, args.seed, args.steps)
    other: list = []
    results = []
    for name, call in controls(pipe, other, args.seed, args.steps, device):
        if name.startswith(ACTION):
            call()
            continue
        results.append(compare(name, call, reference))
    return {"header": {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "commit": current_commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "seed": args.seed, "steps": args.steps},
            "different": sum(not r["equal"] for r in results), "results": results}


def markdown(report: dict[str, Any]) -> str:
    h = report["header"]
    lines = [f"# Shared-transformer controls: {h['device']}, torch {h['torch']}", "",
             f"Commit `{h['commit']}`, {h['date']}; tiny Flux, seed {h['seed']}, {h['steps']} steps; each result against "
             "the process's first eager call.", "", "| control | bitwise equal | max abs diff | error |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {'yes' if r['equal'] else 'NO'} | {r['max_diff'] if r['max_diff'] is not None else '-'} | "
              f"{r['error'] or ''} |" for r in report["results"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bcg_diffusion.checks.shared_transformer_controls",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3, help="denoising steps of a call (default 3)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", type=Path, default=Path("outputs"), help="folder of the reports")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "controls.json").write_text(json.dumps(report, indent=1))
    (args.out / "controls.md").write_text(markdown(report))
    print(markdown(report))
    return 1 if report["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
