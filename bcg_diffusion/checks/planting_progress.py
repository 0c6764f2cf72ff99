"""The planting harness in one process (``--in-process``): progress written as it goes, so that a native
death (a signal no Python handler catches) leaves the plant it happened in on disk.

In the output folder, while the run goes:

- ``planting_plan.json``: the run's header and every planned plant (index, case, site kind, kind), written
  once at the start;
- ``planting_running.json``: the plant running now and how many plants finished before it in this process,
  replaced atomically before each plant starts and removed when the run ends normally;
- ``planting.jsonl``: one line per finished plant (``dataclasses.asdict`` of its result), flushed and synced;
- ``planting_fault.txt``: Python's ``faulthandler`` output: on a fatal signal, every thread's Python stack.

After a run that died, ``python -m bcg_diffusion.checks.planting --rebuild-report --out DIR`` writes
``planting.json`` and ``planting.md`` from those files: the plant that was running becomes a ``crash`` naming
the native death, the plants planned after it ``skipped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

PLAN = "planting_plan.json"
RUNNING = "planting_running.json"
RESULTS = "planting.jsonl"
FAULTS = "planting_fault.txt"


class ProgressLog:
    """What one in-process run writes as it goes (see the module docstring)."""

    def __init__(self, out_dir: Path, header: dict[str, Any], specs: list[Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.finished = 0
        plan = {"header": header, "plants": [dataclasses.asdict(spec) for spec in specs]}
        _replace(out_dir / PLAN, json.dumps(plan, indent=1))
        (out_dir / RUNNING).unlink(missing_ok=True)
        (out_dir / RESULTS).write_text("")
        self._was_enabled = faulthandler.is_enabled()  # pytest enables it on stderr, for one
        self._faults = open(out_dir / FAULTS, "w")  # noqa: SIM115 - open for the run: faulthandler writes to it
        faulthandler.enable(file=self._faults, all_threads=True)

    def start(self, spec: Any) -> None:
        """Note ``spec`` (a :class:`~.planting.PlantSpec`) as the plant running now, before it starts."""
        running = {"finished_before": self.finished, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "plant": dataclasses.asdict(spec)}
        _replace(self.out_dir / RUNNING, json.dumps(running, indent=1))

    def result(self, result: Any) -> None:
        """Append a finished plant's result."""
        with (self.out_dir / RESULTS).open("a") as f:
            f.write(json.dumps(dataclasses.asdict(result)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.finished += 1

    def finish(self) -> None:
        """The run ended normally: no plant is running, the fault handler is off."""
        (self.out_dir / RUNNING).unlink(missing_ok=True)
        faulthandler.disable()
        self._faults.close()
        if self._was_enabled:
            with contextlib.suppress(Exception):  # a stderr without a file descriptor: leave it off
                faulthandler.enable(file=sys.stderr, all_threads=True)


def _replace(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def rebuild(out_dir: Path, make_result: Callable[[dict, str, str], Any], from_dict: Callable[[dict], Any]
            ) -> tuple[dict[str, Any], list[Any]]:
    """The header and every plant's result of a dead in-process run in ``out_dir``: those it finished, a
    ``crash`` for the plant it was running, ``skipped`` for the rest of the plan (each made by
    ``make_result(plant, status, error)`` from the plant's entry of the plan). ``FileNotFoundError`` (saying so) when no run died there."""
    running_path = out_dir / RUNNING
    if not running_path.exists():
        raise FileNotFoundError(f"{running_path} does not exist: no in-process run died in {out_dir} "
                                "(a run that ended normally removes it and writes its reports itself)")
    running = json.loads(running_path.read_text())
    plan = json.loads((out_dir / PLAN).read_text())
    lines = (out_dir / RESULTS).read_text().splitlines() if (out_dir / RESULTS).exists() else []
    results = [from_dict(json.loads(line)) for line in lines if line.strip()]
    done = {r.index for r in results}
    plant = running["plant"]
    fault = _first_fault_line(out_dir / FAULTS)
    header = dict(plan["header"], died_in_plant=plant["index"])
    results.append(make_result(plant, "crash", (
        f"the process died natively in this plant, after {running['finished_before']} plants in the same process "
        f"(--in-process){'; ' + fault if fault else ''}; stacks in {FAULTS}")))
    done.add(plant["index"])
    after = f"not run: the process died in plant {plant['index']}"
    results += [make_result(p, "skipped", after) for p in plan["plants"] if p["index"] not in done]
    return header, sorted(results, key=lambda r: r.index)


def _first_fault_line(path: Path) -> str:
    """The first line faulthandler wrote (``Fatal Python error: Segmentation fault``), or ``""``."""
    if not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[0][:200] if lines else ""
