"""Result files of a run: the environment, the JSON, the Markdown tables and (where it can) the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.files import atomic_target, write_text_atomically

from ..environment import SUFFIXES
from ..timing import AUTO_ROUND_S, DEFAULT_ITERS, MIN_AUTO_ITERS
from .chart import CHART_NEEDS_MATPLOTLIB, plot_report
from .modes import MODE_REGISTRY
from .rows import ROW_REGISTRY

# Ratios of median step times reported per case where both modes ran: (numerator, denominator).
RATIOS = (
    ("bcg", "whole_graph"),
    ("bcg", "eager"),
    ("bcg_break", "whole_graph"),
    ("compile_bcg", "compile"),
    ("compile_bcg", "reduce_overhead"),
    ("compile_bcg_all", "reduce_overhead"),
    ("compile_bcg_all", "compile_all"),
    ("compile_bcg_all", "compile_bcg"),
    ("compile_all", "compile"),
    ("compile_full_bcg", "reduce_overhead"),
    ("compile_bcg", "partition_ceiling"),
    ("compile_bcg_break", "compile"),
    ("compile_bcg_dynamic", "compile_bcg"),
)


def case_ratios(modes: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``{"a/b": median_a / median_b}`` for the pairs of :data:`RATIOS` where both modes ran."""
    out = {}
    for a, b in RATIOS:
        ma, mb = (modes.get(m, {}).get("median_ms") for m in (a, b))
        if ma and mb:
            out[f"{a}/{b}"] = ma / mb
    return out


def write_report(report: dict[str, Any], base: Path, chart: bool, log=None, markdown=None) -> list[Path]:
    """Write ``base``.json and .md (``markdown(report)``, default :func:`markdown_report`) and, with ``chart``,
    .png, each whole or not at all (an earlier version stays where a write fails: a full disk leaves no empty file);
    return the paths written. Without matplotlib the chart is skipped with one line to ``log``; ``OSError`` where
    the disk refuses the numbers."""
    json_path, md_path, png_path = (base.with_suffix(s) for s in SUFFIXES)
    write_text_atomically(json_path, json.dumps(report, indent=2, default=str) + "\n")
    write_text_atomically(md_path, (markdown or markdown_report)(report))
    written = [json_path, md_path]
    if chart:
        try:
            with atomic_target(png_path) as partial:
                plot_report(report, partial)
            written.append(png_path)
        except ImportError:  # matplotlib is an optional extra: the numbers are in the JSON and Markdown
            if log:
                log(CHART_NEEDS_MATPLOTLIB)
        except Exception as exc:  # noqa: BLE001 - the numbers matter more than the chart
            if log:
                log(f"could not draw the chart: {type(exc).__name__}: {exc}")
    return written


def _f(x, fmt="{:.2f}", none="n/a") -> str:
    return none if x is None else fmt.format(x)


def _yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _short_note(note: str) -> str:
    if "leftover children" in note:
        return "regional + leftover children compiled"
    if note.startswith("slowest of"):
        return note
    if "compile_repeated_blocks" in note:
        return "regional: compile_repeated_blocks()"
    if "of each block" in note:
        return "regional: each block compiled"
    if "graph_partition=True" in note:
        return "whole module, CUDA graphs partitioned at attention"
    if "reduce-overhead" in note:
        return "whole module"
    if note.startswith("whole-module torch.compile"):
        return "whole module (default mode) under BCG"
    return note if note.startswith(("BCG ran", "BCG key", "no CUDA", "BCGConfig(", "compile + first capture")) else ""


def _header(report: dict[str, Any]) -> list[str]:
    env, settings = report["environment"], report["settings"]
    iters = settings.get("iters")
    iters_text = f"{iters} calls" if iters else f"calls for about {AUTO_ROUND_S} s ({MIN_AUTO_ITERS}-{DEFAULT_ITERS})"
    bcg_config = ", ".join(f"{k}={v!r}" for k, v in settings.get("bcg_config_of_step_modes", {}).items())
    lines = [
        f"# bench_step results, {env['date']}",
        "",
        f"GPU: {env['gpu'] or 'none (CPU run: code-path check only, timings mean nothing for BCG)'}; "
        f"torch {env['torch']}, CUDA {env['cuda']}, diffusers {env['diffusers']}, dtype {env['dtype']}, "
        f"commit {env.get('git_commit')}.",
        f"{iters_text} x {settings['rounds']} interleaved rounds per mode after {settings['warmup']} warm-up calls; "
        "latency is the median of one transformer call (the step's first call; `calls/step` says how many a step "
        f"makes). BCG modes: {bcg_config}.",
        "",
        "`/ whole_graph`: mode time divided by whole-step CUDA graph time (1.00 is the practical floor). "
        "`x eager`: eager time divided by mode time (speedup). `compile`: whether torch.compile was on. "
        "`setup s`: first-call time minus a steady call (capture and/or compilation). `extra peak`: peak GPU memory "
        "of the mode minus that of eager. `= eager`: output bitwise equal to eager's.",
    ]
    if report.get("merged_from"):
        lines += ["", "Merged from " + "; ".join(
            f"`{m['file']}` ({'shard ' + m['shard'] + ': ' if m.get('shard') else ''}{', '.join(m['cases'])}, "
            f"{_f(m.get('total_s'), '{:.0f}')} s, commit {m.get('git_commit')})" for m in report["merged_from"]) + "."]
    if report.get("ranks"):
        ranks = report["ranks"]
        lines += ["", f"Context parallel: {ranks['world_size']} ranks ({ranks['backend']}); every rank timed its own calls, "
                  "the tables give the slowest rank's median (the JSON has each rank's)."]
    if report.get("compile_cache"):
        cc = report["compile_cache"]
        lines += ["", f"Compile cache: {cc['where']} (Inductor folder {cc['inductor_folder']}, {cc['state_at_start']} "
                  "at the start of this process)."]
    if report.get("not_run"):
        lines += ["", "Not run (time budget spent): " + ", ".join(report["not_run"]) + "."]
    if report.get("skipped_cases"):
        lines += ["", "Skipped: " + "; ".join(f"{s['case']} ({s['error']})" for s in report["skipped_cases"]) + "."]
    return lines


def _mode_line(case: str, mode: str, r: dict[str, Any]) -> str:
    compiled = "yes" if r["torch_compile"] else "no"
    if "median_ms" not in r:
        return f"| {case} | {mode} | {compiled} | n/a | | | | | | | {r['status']}: {r.get('reason', '')} |".replace("\n", " ")
    extra = r.get("extra_peak_vs_eager_bytes")
    notes = "; ".join(_short_note(n) for n in r.get("notes", []) if _short_note(n))
    return (f"| {case} | {mode} | {compiled} | {r['median_ms']:.2f} | {r['p10_ms']:.2f}-{r['p90_ms']:.2f} | "
            f"{_f(r.get('ratio_to_whole_graph'))} | {_f(r.get('speedup_vs_eager'))} | {_f(r.get('setup_s'))} | "
            f"{_f(None if extra is None else extra / 2**20, '{:.0f}')} | {_yes_no(r.get('bitwise_equal_to_eager'))} | "
            f"{notes} |")


def _latency_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Per-step latency", "",
             "| case | mode | compile | median ms | p10-p90 ms | / whole_graph | x eager | setup s | extra peak MiB | "
             "= eager | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        if case.get("error") and not case["modes"]:
            lines.append(f"| {case['case']} | - | - | - | - | - | - | - | - | - | case failed: {case['error']} |")
        lines += [_mode_line(case["case"], mode, r) for mode, r in case["modes"].items()]
    return lines


def _cases_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Cases", "", "| case | transformer batch | calls/step | eager kernels/step | eager GPU busy ms | "
             "eager ms / GPU busy | eager repeatable | hidden_states | note |", "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        eager = case["modes"].get("eager", {})
        prof = eager.get("profile") or {}
        inputs = case.get("step_inputs") or {}
        hs = inputs.get("hidden_states", inputs.get("arg0"))
        bound = (eager["median_ms"] / prof["gpu_busy_ms"]) if prof.get("gpu_busy_ms") and eager.get("median_ms") else None
        lines.append(f"| {case['case']} | {case.get('transformer_batch', '-')} | {case.get('calls_per_step', '-')} | "
                     f"{prof.get('kernels', 'n/a')} | {_f(prof.get('gpu_busy_ms'))} | {_f(bound)} | "
                     f"{_yes_no(eager.get('repeatable'))} | {hs} | {_case_note(case)} |")
    return lines


def _parallel_note(case: dict[str, Any]) -> str:
    cp = case.get("context_parallel")
    if not cp:
        return ""
    fractions = case["modes"].get("eager", {}).get("per_rank_gpu_busy_fraction") or []
    busy = ", ".join("n/a" if f is None else f"{f:.2f}" for f in fractions)
    return (f"context parallel: {cp['kind']} x{cp['degree']}, times of the slowest rank"
            + (f"; eager GPU-busy fraction per rank {busy}" if busy else ""))


def _case_note(case: dict[str, Any]) -> str:
    parts = [case.get("note") or "", _parallel_note(case), "resolution binning on" if case.get("resolution_binning") else "",
             case.get("variant_note") or "", case.get("error") or ""]
    return "; ".join(p for p in parts if p).replace("\n", " ")


def _ratio_table(cases: list[dict[str, Any]]) -> list[str]:
    """Ratios of median step times per case (lower is better for the numerator), where both modes ran."""
    per_case = [(case["case"], case_ratios(case["modes"])) for case in cases if case.get("modes")]
    names = [f"{a}/{b}" for a, b in RATIOS if any(f"{a}/{b}" in r for _, r in per_case)]
    if not names:
        return []
    lines = ["", "## Ratios (median step time of the first mode over the second, where both ran)", "",
             "| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, ratios in per_case:
        lines.append(f"| {label} | " + " | ".join(_f(ratios.get(n), none="-") for n in names) + " |")
    return lines


def markdown_report(report: dict[str, Any]) -> str:
    """The report as Markdown: header, per-step latency, cases, each whole-pipeline row, mode legend."""
    lines = _header(report) + _latency_table(report["cases"]) + _ratio_table(report["cases"]) + _cases_table(report["cases"])
    for row in ROW_REGISTRY.values():
        lines += row.markdown(report["cases"])
    lines += ["", "Mode details:", ""]
    lines += [f"- `{m.name}`: {m.description}" + (" (torch.compile on)" if m.torch_compile else "")
              for m in MODE_REGISTRY.values()]
    return "\n".join(lines) + "\n"
