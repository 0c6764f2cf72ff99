"""``--cpu-times PATH``: one JSON line per test with its wall time and its CPU time (user and system) in the
test's process and in the processes it started and waited for (servers, scripts, torchrun launches), so
that what a test costs can be compared before and after a change on a machine shared with other jobs
(docs/testing.md). Under xdist every worker appends to PATH; ``summarize(PATH)`` adds them up per file."""

from __future__ import annotations

import collections
import json
import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuTimes:
    """The plugin: appends ``{"id", "wall", "cpu", "children_cpu", "pid"}`` per test to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, (own, children) = time.perf_counter(), _cpu()
        yield
        own_after, children_after = _cpu()
        line = {"id": item.nodeid, "wall": round(time.perf_counter() - wall, 3), "cpu": round(own_after - own, 3),
                "children_cpu": round(children_after - children, 3), "pid": os.getpid()}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def summarize(path: str) -> dict[str, dict[str, float]]:
    """Per test file: the sums of ``wall``, ``cpu`` and ``children_cpu`` and the test count.
    (A process a test started but did not wait for is counted where it is reaped.)"""
    files: dict = collections.defaultdict(lambda: {"wall": 0.0, "cpu": 0.0, "children_cpu": 0.0, "tests": 0})
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            total = files[row["id"].split("::")[0]]
            for key in ("wall", "cpu", "children_cpu"):
                total[key] += row[key]
            total["tests"] += 1
    return dict(files)


if __name__ == "__main__":
    import sys

    rows = sorted(summarize(sys.argv[1]).items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["children_cpu"]))
    for name, t in rows:
        print(f"{t['cpu'] + t['children_cpu']:8.1f} s CPU ({t['children_cpu']:6.1f} in started processes) "
              f"{t['wall']:7.1f} s wall {t['tests']:4d} tests  {name}")
