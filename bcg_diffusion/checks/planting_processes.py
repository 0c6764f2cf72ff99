"""The planting harness's plan run in child processes (``--jobs`` at a time, ``--chunk`` plants each).

A process that dies (a native crash: a signal, not an exception) costs the plant it was running, which is
reported as a ``crash`` naming the signal; the rest of its chunk runs in a new process. Each child writes
one JSON line per finished plant (``--results-jsonl``), so nothing it finished is lost with it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

_STARTED = re.compile(r"^plant (\d+): ")


def child_command(args: Any, indices: list[int], jsonl: Path, out_dir: Path, budget_s: float) -> list[str]:
    """The command that runs ``indices`` of the same plan in a child."""
    command = [sys.executable, "-m", "bcg_diffusion.checks.planting", "--seed", str(args.seed),
               "--plants", str(args.plants), "--calls", str(args.calls), "--out", str(out_dir),
               "--only", ",".join(map(str, indices)), "--progress", "--results-jsonl", str(jsonl),
               "--time-budget", f"{max(budget_s, 0.0):.0f}", "--commit", args.commit or "unknown"]
    for name in ("classes", "device", "dtype"):
        if getattr(args, name):
            command += [f"--{name}", getattr(args, name)]
    return command


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _run_chunk(args: Any, indices: list[int], deadline: float, work: Path, make_result: Callable,
               from_dict: Callable) -> list[Any]:
    """Run ``indices`` in children until each has a result (a dead child's plant is a crash)."""
    results: list[Any] = []
    pending = list(indices)
    while pending:
        handle, name = tempfile.mkstemp(suffix=".jsonl", dir=work)
        os.close(handle)  # the child appends to it by name
        jsonl = Path(name)
        child = subprocess.run(child_command(args, pending, jsonl, work / f"out_{pending[0]}", deadline - time.time()),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        done = [from_dict(json.loads(line)) for line in jsonl.read_text().splitlines() if line.strip()]
        results += done
        finished = {r.index for r in done}
        started = [int(m.group(1)) for m in map(_STARTED.match, child.stderr.splitlines()) if m]
        died_in = next((i for i in reversed(started) if i not in finished), None)
        if child.returncode == 0 or died_in is None:
            # a clean exit (or a death before any plant started): what is missing was never started
            results += [make_result(i, "skipped", f"the child process ended ({_signal_name(child.returncode)}) "
                                    "before this plant") for i in pending if i not in finished]
            break
        results.append(make_result(died_in, "crash", f"the process died ({_signal_name(child.returncode)}) "
                                   f"in this plant; last lines: {' | '.join(child.stderr.splitlines()[-3:])[:400]}"))
        pending = [i for i in pending if i not in finished and i != died_in]
    return results


def run_in_processes(args: Any, indices: list[int], make_result: Callable[[int, str, str], Any],
                     from_dict: Callable[[dict], Any], on_result: Callable[[Any], None]) -> None:
    """Run ``indices`` of the plan in chunks of ``args.chunk``, ``args.jobs`` children at a time, each
    chunk's results passed to ``on_result`` in plan order once the chunk is done."""
    deadline = time.time() + args.time_budget
    chunks = [indices[i:i + args.chunk] for i in range(0, len(indices), args.chunk)]
    with tempfile.TemporaryDirectory(prefix="planting-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run_chunk, args, chunk, deadline, Path(tmp), make_result, from_dict)
                   for chunk in chunks]
        for future in futures:
            for result in sorted(future.result(), key=lambda r: r.index):
                on_result(result)


def result_from_dict(cls: type, data: dict) -> Any:
    """A result dataclass from its ``dataclasses.asdict`` form (unknown keys dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
