"""Two pipelines sharing one accelerated transformer, in two threads at once, under contention: every result
against eager, with what the runner did meanwhile.

Why: the GPU suite's ``test_one_transformer_shared_by_two_threads_is_serialised`` (two pipelines made with
``from_pipe``, one transformer, two threads, three generations each) passed in every run but one, where the GPU
and the CPU were loaded by other jobs and one of its six results differed from eager (docs/testing.md, "The GPU
suite"). This check repeats that setting for ``--rounds`` rounds, optionally with ``--cpu-burners`` threads that
spin in Python (they change how the threads interleave) and a ``--gpu-burner`` thread that runs eager matmuls on
its own stream, and records for every generation: its thread, round and seed, whether its latents equal the eager
reference of its seed bitwise, and the runner events (planned path, capture, eager run, failures) of both threads
while it ran (``bcg_diffusion.watch_every_runner``). A mismatch then comes with the events around it.

Found with it on the CPU, where acceleration is a no-op: the two pipelines shared their fast tokenizers, which race
(:mod:`bcg_diffusion.thread_pipelines`); the second pipeline is now made by ``pipeline_for_thread``, as the test's.

The tiny Flux pipeline of ``bcg_pipelines`` with true CFG (two transformer calls per step), latents out. Without
CUDA acceleration is a no-op, so a CPU run checks the plumbing only. Reports ``shared_transformer.json`` and
``.md`` in ``--out``; the exit status is 1 when a result differed.

    python -m bcg_diffusion.checks.shared_transformer --rounds 20 --cpu-burners 1 --gpu-burner --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.numbers import finite_float

from .planting import current_commit

FAMILY = "flux"
THREADS = 2


@dataclass
class Generation:
    """One pipeline call of one thread."""

    round: int
    thread: int
    index: int
    seed: int
    started: float
    ended: float = 0.0
    equal: bool | None = None
    max_diff: float = 0.0
    error: str = ""
    events: list[str] = field(default_factory=list)  # both threads', while it ran


class EventLog(bcg_diffusion.RunnerWatcher):
    """Every runner event of the process with its time and thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[float, str, str]] = []

    def _add(self, text: str) -> None:
        with self._lock:
            self.events.append((time.perf_counter(), threading.current_thread().name, text))

    def planned(self, path: str, key: Any) -> None:
        self._add(f"planned {path}")

    def planned_eager(self, reason: str, args: tuple, kwargs: dict) -> None:
        self._add(f"eager (planned): {reason}")

    def ran_eagerly(self, reason: str) -> None:
        self._add(f"ran eagerly: {reason}")

    def captured(self, entry: Any) -> Any:
        self._add(f"captured {type(entry).__name__}")
        return entry

    def call_failed(self, exc: BaseException) -> None:
        self._add(f"call failed: {type(exc).__name__}: {exc}")

    def replay_failed(self, exc: BaseException) -> None:
        self._add(f"replay failed: {type(exc).__name__}: {exc}")

    def between(self, start: float, end: float) -> list[str]:
        with self._lock:
            return [f"{t - start:+.4f} s {name}: {text}" for t, name, text in self.events if start <= t <= end]


def call_kwargs(pipe: Any, seed: int, steps: int) -> dict[str, Any]:
    tiny = pipelines.get_family(FAMILY).tiny
    return dict(prompt="a red fox in the snow", negative_prompt=" ", true_cfg_scale=2.0, num_inference_steps=steps,
                height=tiny.height, width=tiny.width, output_type="latent",
                generator=torch.Generator(pipe.device.type).manual_seed(seed))


def generate(pipe: Any, seed: int, steps: int) -> torch.Tensor:
    with torch.no_grad():
        return pipe(**call_kwargs(pipe, seed, steps))[0].clone()


def second_pipeline(pipe: Any) -> Any:
    """A second pipeline on ``pipe``'s models for the other thread: :func:`bcg_diffusion.pipeline_for_thread` (its own
    scheduler and tokenizers, ``pipe``'s dtype). This check's run of 2026-12-07 15:34 made it with ``from_pipe``'s
    default dtype (float32 calls against bfloat16 references: 60 of 60 different); its CPU test of that evening
    shared the tokenizers (1 of 4 different in CI, 9 of 520 under load with acceleration off: a tokenizer race)."""
    other = bcg_diffusion.pipeline_for_thread(pipe)
    other.set_progress_bar_config(disable=True)
    return other


def burn_cpu(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(20_000))


def burn_gpu(stop: threading.Event, device: torch.device) -> None:
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        x = torch.randn(2048, 2048, device=device)
        while not stop.is_set():
            for _ in range(8):
                x = torch.tanh(x @ x)
            stream.synchronize()  # its own stream only: a device-wide sync would end another thread's capture


def run_round(pipes: list[Any], number: int, seeds: list[int], generations: int, steps: int,
              references: dict[int, torch.Tensor], log: EventLog) -> list[Generation]:
    """Both threads, ``generations`` calls each (thread ``t``'s ``i``-th call takes ``seeds[(t + i) % len]``)."""
    done: list[Generation] = []
    lock = threading.Lock()

    def work(thread: int) -> None:
        for i in range(generations):
            seed = seeds[(thread + i) % len(seeds)]
            g = Generation(number, thread, i, seed, time.perf_counter())
            try:
                latents = generate(pipes[thread], seed, steps)
                reference = references[seed]
                g.equal = bool(torch.equal(latents, reference))
                if not g.equal and latents.shape == reference.shape:
                    g.max_diff = float((latents.float() - reference.float()).abs().max())
            except Exception as exc:  # noqa: BLE001 - counted and reported
                g.error = f"{type(exc).__name__}: {exc}"
            g.ended = time.perf_counter()
            with lock:
                done.append(g)

    threads = [threading.Thread(target=work, args=(t,), name=f"pipeline-{t}") for t in range(len(pipes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g in done:
        if g.equal is not True:
            g.events = log.between(g.started, g.ended)
    return sorted(done, key=lambda g: (g.thread, g.index))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe = pipelines.build_pipeline(FAMILY, size="tiny", device=device, seed=0)
    pipe.set_progress_bar_config(disable=True)
    seeds = list(range(args.seeds))
    references = {seed: generate(pipe, seed, args.steps) for seed in seeds}
    bcg_diffusion.accelerate_pipeline(pipe)
    other = second_pipeline(pipe)
    log = EventLog()
    handle = bcg_diffusion.watch_every_runner(log)
    stop = threading.Event()
    burners = [threading.Thread(target=burn_cpu, args=(stop,), daemon=True) for _ in range(args.cpu_burners)]
    if args.gpu_burner and device.type == "cuda":
        burners.append(threading.Thread(target=burn_gpu, args=(stop, device), daemon=True))
    for b in burners:
        b.start()
    results: list[Generation] = []
    started = time.perf_counter()
    try:
        for number in range(args.rounds):
            if time.perf_counter() - started > args.time_budget:
                break
            results += run_round([pipe, other], number, seeds, args.generations, args.steps, references, log)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=10)
        handle.remove()
    stats = bcg_diffusion.get_stats(pipe)
    counters = {n: getattr(stats, n) for n in ("hits", "misses", "captures", "failed_captures", "eager_calls")} \
        if stats is not None else None
    bcg_diffusion.remove_acceleration(pipe)
    return {
        "header": {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "commit": current_commit(), "date": time.strftime("%Y-%m-%d %H:%M"),
                   "args": {k: v for k, v in vars(args).items() if k != "out"}},
        "seconds": round(time.perf_counter() - started, 1),
        "generations": len(results),
        "different": sum(g.equal is False for g in results),
        "errors": sum(bool(g.error) for g in results),
        "counters": counters,
        "results": [asdict(g) for g in results],
    }


def markdown(report: dict[str, Any]) -> str:
    h = report["header"]
    lines = [f"# One transformer, two pipelines, two threads: {h['device']}, torch {h['torch']}", "",
             f"Commit `{h['commit']}`, {h['date']}, {report['seconds']} s; options {h['args']}.", "",
             f"- generations: {report['generations']}; different from eager: {report['different']}; "
             f"errors: {report['errors']}", f"- runner counters: {report['counters']}", ""]
    for g in report["results"]:
        if g["equal"] is not True:
            lines += [f"## round {g['round']}, thread {g['thread']}, call {g['index']}, seed {g['seed']}: "
                      f"{g['error'] or 'max diff %g' % g['max_diff']}", ""]
            lines += [f"    {e}" for e in g["events"]] + [""]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bcg_diffusion.checks.shared_transformer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of both threads (default 20)")
    parser.add_argument("--generations", type=int, default=3, help="pipeline calls per thread and round (default 3)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds the calls cycle through (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="denoising steps of a call (default 3)")
    parser.add_argument("--cpu-burners", type=int, default=0,
                        help="threads spinning in Python meanwhile (default 0); each holds the interpreter lock for "
                        "its switch interval, so every op of the pipelines waits: one is plenty (on 2 CPU cores, "
                        "debug mode: 20 generations took 216 s with two)")
    parser.add_argument("--gpu-burner", action="store_true", help="a thread running matmuls on its own stream")
    parser.add_argument("--time-budget", type=finite_float, default=120.0,
                        help="seconds; no round starts after it (default 120)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--out", type=Path, default=Path("outputs"), help="folder of the reports")
    args = parser.parse_args(argv)
    for name in ("rounds", "generations", "seeds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.cpu_burners < 0:
        parser.error(f"--cpu-burners must be 0 or more (got {args.cpu_burners})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shared_transformer.json").write_text(json.dumps(report, indent=1))
    (args.out / "shared_transformer.md").write_text(markdown(report))
    print(f"{report['generations']} generations, {report['different']} different from eager, {report['errors']} "
          f"errors; wrote {args.out / 'shared_transformer.json'} and .md")
    return 1 if report["different"] or report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
