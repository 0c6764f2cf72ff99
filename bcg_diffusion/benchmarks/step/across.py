"""Across processes (``--processes K``): each figure's median and spread over K fresh processes, and a verdict.

Every process builds, compiles, captures and warms up anew, so a ratio near 1.00 moves between processes by
more than a one-process run shows. :func:`combine_processes` takes the K result files of one run and gives,
per case, for every ratio of :data:`.report.RATIOS` (time of the first mode over the second) and every
mode's median step time, the median over the processes, the spread (min-max) and the values; for the
first-image row the same per mode and compile-cache state (cold / warm). :func:`verdict` words a ratio
the way the docs do:

- **level with**: the median within +-1 % of 1.00 (:data:`LEVEL_TOLERANCE`) and the spread straddles 1.00;
- **ahead of**: the whole spread below 1.00 (the first mode faster in every process);
- **behind**: the whole spread above 1.00;
- **unsettled**: the spread straddles 1.00 but the median is more than 1 % off (more processes needed);
- ``-`` with one process (no spread). The docs use verdicts of K >= 3 processes only.
"""

from __future__ import annotations

import statistics
from typing import Any

from .report import RATIOS
from .row_base import fmt

LEVEL_TOLERANCE = 0.01
FIRST_IMAGE_FIELDS = {  # the first-image figures combined: name -> path in a mode's entry
    "setup_s": ("setup_s",), "first_call_s": ("first_call", "s"), "second_call_s": ("second_call", "s"),
    "first_image_s": ("first_image_s",), "one_off_s": ("one_off_s",),
    "first_image_over_eager": ("first_image_over_eager",),
    "first_step_over_median": ("first_call", "first_step_over_median"),
}
E2E_FIELDS = ("eager_s", "bcg_first_s", "bcg_second_s", "speedup_second_vs_eager")
MODE_FIELDS = ("median_ms", "setup_s")
NOT_OK = ("n/a", "error")  # first-image entries that did not run, grouped by status


def verdict(median: float, low: float, high: float, n: int, tolerance: float = LEVEL_TOLERANCE) -> str:
    """The docs' word for a ratio (time of the first mode over the second) measured in ``n`` processes."""
    if n < 2:
        return "-"
    if abs(median - 1.0) <= tolerance and low <= 1.0 <= high:
        return "level with"
    if high < 1.0:
        return "ahead of"
    if low > 1.0:
        return "behind"
    return "unsettled"


def spread(values: list[float]) -> dict[str, Any] | None:
    """``n``, ``median``, ``min``, ``max`` and the ``values`` (``None`` for no values)."""
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return None
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def ratio_spread(values: list[float]) -> dict[str, Any] | None:
    out = spread(values)
    if out is not None:
        out["verdict"] = verdict(out["median"], out["min"], out["max"], out["n"])
    return out


def _dig(entry: dict[str, Any], path: tuple[str, ...]):
    for key in path:
        if not isinstance(entry, dict):
            return None
        entry = entry.get(key)
    return entry


def _ratio_names(per_process: list[dict[str, Any]]) -> list[str]:
    present = {name for case in per_process for name in (case.get("ratios") or {})}
    return [f"{a}/{b}" for a, b in RATIOS if f"{a}/{b}" in present]


def _modes(per_process: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(dict.fromkeys(m for case in per_process for m in case.get("modes", {})))
    out = {}
    for name in names:
        results = [case.get("modes", {}).get(name, {}) for case in per_process]
        out[name] = {field: spread([r.get(field) for r in results]) for field in MODE_FIELDS}
        out[name]["statuses"] = [r.get("status", "missing") for r in results]
        out[name]["torch_compile"] = next((r["torch_compile"] for r in results if "torch_compile" in r), None)
        reasons = sorted({r.get("reason") for r in results if r.get("reason")})
        if reasons:
            out[name]["reasons"] = reasons
    return out


def _first_image(per_process: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows = [case.get("first_image") for case in per_process]
    if not any(rows):
        return None
    names = list(dict.fromkeys(m for row in rows if row for m in row.get("modes", {})))
    out: dict[str, Any] = {}
    for name in names:
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            entry = (row or {}).get("modes", {}).get(name)
            if not entry:
                continue
            ok = entry.get("status") == "ok"
            state = (entry.get("compile_cache") or {}).get("state", "-") if ok else entry.get("status", "error")
            groups.setdefault(state, []).append(entry)
        out[name] = {state: {"n": len(entries), **{
            field: spread([_dig(e, path) for e in entries]) for field, path in FIRST_IMAGE_FIELDS.items()}}
            for state, entries in groups.items()}
        for state, entries in groups.items():
            if state in NOT_OK:
                out[name][state]["reasons"] = sorted({str(e.get("reason") or state) for e in entries})
    steps = next((row.get("steps") for row in rows if row), None)
    return {"steps": steps, "asked": next((row.get("asked") for row in rows if row), None), "modes": out}


def combine_case(label: str, per_process: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's results of every process (in process order) as medians, spreads and verdicts."""
    out: dict[str, Any] = {"case": label, "processes": len(per_process),
                           "errors": [c.get("error") for c in per_process if c.get("error")]}
    out["modes"] = _modes(per_process)
    out["ratios"] = {name: ratio_spread([(c.get("ratios") or {}).get(name) for c in per_process])
                     for name in _ratio_names(per_process)}
    first = _first_image(per_process)
    if first:
        out["first_image"] = first
    e2e = [c.get("e2e") for c in per_process if c.get("e2e")]
    if e2e:
        out["e2e"] = {field: spread([e.get(field) for e in e2e]) for field in E2E_FIELDS}
    return out


def combine_processes(runs: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The report of a ``--processes`` run. ``runs``: one dict per child process, in order, with ``index``,
    ``returncode``, ``wall_s``, ``file`` and ``report`` (its result file and contents, ``None`` where it wrote
    none) and ``error``; ``settings``: the parent's."""
    reports = [run["report"] for run in runs if run.get("report")]
    labels = list(dict.fromkeys(c["case"] for rep in reports for c in rep["cases"]))
    cases = [combine_case(label, [c for rep in reports for c in rep["cases"] if c["case"] == label])
             for label in labels]
    first = reports[0] if reports else {"environment": {}, "modes": {}}
    processes = []
    for run in runs:
        rep = run.get("report") or {}
        processes.append({"index": run["index"], "returncode": run.get("returncode"), "wall_s": run.get("wall_s"),
                          "file": None if run.get("file") is None else str(run["file"]), "error": run.get("error"),
                          "compile_cache": rep.get("compile_cache"), "total_s": rep.get("total_s")})
    return {
        "kind": "across_processes",
        "environment": first["environment"],
        "settings": settings,
        "modes": first.get("modes", {}),
        "processes": processes,
        "cases": cases,
        "skipped_cases": first.get("skipped_cases", []),
        "not_run": sorted({c for rep in reports for c in rep.get("not_run", [])}),
    }


def _range(s: dict[str, Any] | None, spec: str = "{:.3f}") -> str:
    if not s:
        return "-"
    return f"{fmt(s['min'], spec)}-{fmt(s['max'], spec)}"


def _median(s: dict[str, Any] | None, spec: str = "{:.3f}") -> str:
    return "-" if not s else fmt(s["median"], spec)


def _ratio_lines(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Ratios across processes (time of the first mode over the second; below 1.00: the first is faster)",
             "", "| case | ratio | median | min-max | processes | verdict |", "|---|---|---|---|---|---|"]
    rows = [(c["case"], name, s) for c in cases for name, s in c["ratios"].items() if s]
    if not rows:
        return []
    for label, name, s in rows:
        a, b = name.split("/")
        word = s["verdict"] if s["verdict"] == "-" else f"{a} {s['verdict']} {b}"
        lines.append(f"| {label} | {name} | {_median(s)} | {_range(s)} | {s['n']} | {word} |")
    return lines


def _mode_lines(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Per-step latency across processes (each process's median ms)", "",
             "| case | mode | compile | median ms | min-max ms | setup s (median) | processes ok | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for name, m in case["modes"].items():
            ok = sum(s == "ok" for s in m["statuses"])
            compiled = {True: "yes", False: "no"}.get(m.get("torch_compile"), "-")
            lines.append(f"| {case['case']} | {name} | {compiled} | {_median(m['median_ms'], '{:.2f}')} | "
                         f"{_range(m['median_ms'], '{:.2f}')} | {_median(m['setup_s'], '{:.2f}')} | "
                         f"{ok}/{len(m['statuses'])} | {'; '.join(m.get('reasons', []))[:300]} |".replace("\n", " "))
    return lines


def _first_image_lines(cases: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cases if c.get("first_image")]
    if not rows:
        return []
    lines = ["", "## First image across processes (median, min-max)", "",
             "`compile cache`: cold (a new folder) or warm (filled by an earlier process); `-`: no compile. "
             "Cells: median (min to max). `one-off s` = set-up + first call - second call; `x eager image` = first "
             "image / eager's second call.",
             "", "| case | mode | compile cache | processes | set-up s | first call s | second call s | first image s | "
             "one-off s | x eager image | first step / later |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(s):
        return "-" if not s else f"{fmt(s['median'])} ({fmt(s['min'])} to {fmt(s['max'])})"

    for case in rows:
        for name, groups in case["first_image"]["modes"].items():
            for state, g in groups.items():
                if state in NOT_OK:
                    lines.append(f"| {case['case']} | {name} | {state} | {g['n']} | | | | | | | "
                                 f"{'; '.join(map(str, g.get('reasons', [])))[:300]} |".replace("\n", " "))
                    continue
                lines.append(f"| {case['case']} | {name} | {state} | {g['n']} | {cell(g['setup_s'])} | "
                             f"{cell(g['first_call_s'])} | {cell(g['second_call_s'])} | {cell(g['first_image_s'])} | "
                             f"{cell(g['one_off_s'])} | {cell(g['first_image_over_eager'])} | "
                             f"{cell(g['first_step_over_median'])} |")
    return lines


def _process_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Processes", "", "| process | exit status | wall s | compile cache | result file |",
             "|---|---|---|---|---|"]
    for p in report["processes"]:
        cc = p.get("compile_cache") or {}
        cache = f"{cc.get('where', '-')}, {cc.get('state_at_start', '-')} at start" if cc else "-"
        lines.append(f"| {p['index']} | {p.get('returncode')} | {fmt(p.get('wall_s'), '{:.0f}')} | {cache} | "
                     f"{p.get('file') or 'none: ' + str(p.get('error'))} |")
    return lines


def across_markdown(report: dict[str, Any]) -> str:
    env, settings = report["environment"], report["settings"]
    lines = [
        f"# bench_step across {settings.get('processes')} processes, {env.get('date')}", "",
        f"GPU: {env.get('gpu') or 'none (CPU run: code-path check only)'}; torch {env.get('torch')}, diffusers "
        f"{env.get('diffusers')}, dtype {env.get('dtype')}, commit {env.get('git_commit')}. The whole run repeated in "
        f"{settings.get('processes')} fresh processes, one after another (compile cache: "
        f"{settings.get('compile_cache')}); command: `{' '.join(settings.get('argv') or [])}`.", "",
        f"Verdicts: *level with* = median within +-{LEVEL_TOLERANCE:.0%} of 1.00 and the spread (min-max over "
        "processes) straddles 1.00; *ahead of* / *behind* = the whole spread below / above 1.00; *unsettled* = the "
        "spread straddles 1.00 but the median is more than 1 % off (run more processes). The docs use K >= 3.",
    ]
    if report.get("not_run"):
        lines += ["", "Not run in some process (time budget spent): " + ", ".join(report["not_run"]) + "."]
    cases = report["cases"]
    for case in cases:
        if case.get("errors"):
            lines += ["", f"{case['case']}: failed in {len(case['errors'])} process(es): {case['errors'][0]}"]
    lines += _ratio_lines(cases) + _mode_lines(cases) + _first_image_lines(cases) + _process_lines(report)
    return "\n".join(lines) + "\n"
