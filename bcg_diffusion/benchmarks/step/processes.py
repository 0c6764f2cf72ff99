"""``--processes K``: the whole run (every case, all its modes and rows) repeated in K fresh Python processes.

The parent measures nothing. It starts ``bench_step.py`` again K times, one after another, with the same
options, each child writing its result files into ``<out>/<run>_processes/p<i>/`` and told its index
(``--process-index i/K``) and compile-cache folder; context-parallel cases start each child through
``python -m torch.distributed.run --standalone --nproc_per_node N``. Then the parent reads the children's
JSON files (:func:`.merge.read_result`), checks that they come from one set-up
(:func:`.merge.check_alike`) and writes the across-process report (:mod:`.across`).

Compile caches (``--compile-cache``): ``fresh`` (the default here) gives every child its own new empty
folder, so every process compiles cold; ``shared`` gives all children one new folder (the first compiles
cold, the later ones find it warm), removed at the end; a folder path is passed to every child as it is
(kept, possibly warm already).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .merge import check_alike, read_result

#: Options the parent sets per child (dropped from the parent's command line first), each with one value.
PER_CHILD_OPTIONS = ("--processes", "--out-dir", "--compile-cache", "--process-index")


def drop_options(argv: list[str], names: tuple[str, ...] = PER_CHILD_OPTIONS) -> list[str]:
    """``argv`` without the options ``names`` and their values (``--name value`` and ``--name=value``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(name + "=") for name in names):
            continue
        out.append(arg)
    return out


def child_argv(argv: list[str], index: int, count: int, out_dir: Path, compile_cache: str) -> list[str]:
    """The command-line options of child ``index`` (1-based) of ``count``."""
    return [*drop_options(argv), "--out-dir", str(out_dir), "--compile-cache", compile_cache,
            "--process-index", f"{index}/{count}"]


def child_command(script: Path, argv: list[str], cp_degree: int | None) -> list[str]:
    """The command that starts one child: the script itself, or torchrun of it for ``cp_degree`` ranks."""
    if cp_degree:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cp_degree),
                str(script), *argv]
    return [sys.executable, str(script), *argv]


def cache_folders(policy: str | None, count: int) -> tuple[list[str], list[Path]]:
    """The ``--compile-cache`` value of each child for the parent's ``policy``, and the folders the parent
    removes at the end."""
    if policy in (None, "fresh"):
        return ["fresh"] * count, []  # each child makes (and removes) its own
    if policy == "shared":
        root = Path(tempfile.mkdtemp(prefix="bench_compile_cache_shared_"))
        return [str(root)] * count, [root]
    return [str(Path(policy).expanduser().resolve())] * count, []


def parse_process_index(text: str) -> tuple[int, int]:
    """``i/K`` -> ``(i, K)`` with 1 <= i <= K (``ValueError`` otherwise)."""
    try:
        i, k = (int(t) for t in text.split("/"))
    except ValueError:
        raise ValueError(f"--process-index wants i/K (got {text!r})") from None
    if not 1 <= i <= k:
        raise ValueError(f"--process-index wants 1 <= i <= K (got {text!r})")
    return i, k


def newest_result(folder: Path) -> Path | None:
    files = sorted(Path(folder).glob("bench_step_*.json"))
    return files[-1] if files else None


def run_children(commands: list[list[str]], out_dirs: list[Path], log: Callable[[str], None],
                 run: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """Run the children one after another (``run``, default ``subprocess.run``; their output passes through);
    per child its ``index``, ``returncode``, ``wall_s``, result ``file`` and ``report`` (``None`` and an
    ``error`` where it wrote none)."""
    run = run or subprocess.run
    runs = []
    for index, (command, folder) in enumerate(zip(commands, out_dirs), 1):
        folder.mkdir(parents=True, exist_ok=True)
        log(f"=== process {index}/{len(commands)}: {' '.join(command)}")
        t0 = time.perf_counter()
        returncode = run(command).returncode
        entry: dict[str, Any] = {"index": index, "returncode": returncode, "wall_s": time.perf_counter() - t0,
                                 "file": newest_result(folder), "report": None, "error": None}
        if entry["file"] is None:
            entry["error"] = f"exit status {returncode} and no result file in {folder}"
        else:
            try:
                entry["report"] = read_result(entry["file"])
            except ValueError as exc:
                entry.update(file=None, error=str(exc))
        log(f"=== process {index}/{len(commands)}: exit status {returncode} after {entry['wall_s']:.0f} s"
            + (f" ({entry['error']})" if entry["error"] else ""))
        runs.append(entry)
    return runs


def check_runs(runs: list[dict[str, Any]]) -> None:
    """``ValueError`` unless the result files come from one set-up, measured alike."""
    done = [r for r in runs if r.get("report")]
    if len(done) > 1:
        check_alike([r["file"] for r in done], [r["report"] for r in done], allow_different_commits=False)


def remove_folders(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
