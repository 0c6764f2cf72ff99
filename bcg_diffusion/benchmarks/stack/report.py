"""The stack benchmark's result files: JSON (everything), Markdown (one table per case) and a PNG chart (time per
image of each mode, where matplotlib is installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FLUX_TARGETS", "markdown", "plot", "write_report"]

#: Issue 47's targets, per image against eager, for Flux.1-dev 1024 px, 28 steps (checked where that case ran).
FLUX_TARGETS = {"graphs+compile": 0.72, "graphs+compile+fp8": 0.50, "graphs+compile+fp8+cache": 0.30}
FLUX_TARGET_CASE = "flux:full:1024x1024:28"
CHART_NEEDS_MATPLOTLIB = 'no chart: matplotlib is not installed (pip install -e ".[bench]")'


def write_report(report: dict[str, Any], base: Path, *, chart: bool) -> list[Path]:
    """``base.json`` and ``base.md`` (and ``base.png`` with ``chart``, where matplotlib is installed)."""
    paths = [base.with_suffix(".json"), base.with_suffix(".md")]
    paths[0].write_text(json.dumps(report, indent=1, default=str))
    paths[1].write_text(markdown(report))
    if chart:
        try:
            plot(report, base.with_suffix(".png"))
            paths.append(base.with_suffix(".png"))
        except ImportError:
            report.setdefault("notes", []).append(CHART_NEEDS_MATPLOTLIB)
    return paths


def _f(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _row(name: str, m: dict[str, Any]) -> str:
    if m.get("status") != "ok":
        return f"| {name} | {m.get('status')}: {m.get('reason', '')} |" + " |" * 9
    dev = m.get("deviation") or {}
    psnr = "inf (identical)" if dev.get("identical") else _f(dev.get("psnr_db"), ".1f")
    twin = m.get("bitwise_vs_twin")
    same = "-" if twin is None else ("YES" if twin else "NO") + f" ({m['twin']})"
    cache = m.get("cached_calls")
    cached = "-" if not cache else f"{cache['cached']} of {cache['calls']}"
    return (f"| {name} | {_f(m['image_s'])} | {_f(m.get('image_vs_eager'), '.2f')} | {_f(m['step_ms'], '.1f')} | "
            f"{_f(m.get('step_vs_eager'), '.2f')} | {_f(m['first_image_s'], '.2f')} | {_f(m['peak_mib'], '.0f')} | "
            f"{_f(dev.get('latents_max_abs_diff'), '.3g')} | {psnr} | {same} | {cached} |")


def case_markdown(case: dict[str, Any]) -> list[str]:
    lines = [f"## {case['case']} ({case.get('title', case['case'])}, {case.get('steps', '?')} steps)", ""]
    if case.get("error"):
        return lines + [f"failed: {case['error']}", ""]
    lines += ["| mode | image s | x eager | step ms | x eager | first image s | peak MiB | latents max abs diff vs "
              "eager | PSNR dB vs eager | bitwise = same stack eagerly | calls cached |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(name, m) for name, m in case["modes"].items()]
    lines.append("")
    if case["case"] == FLUX_TARGET_CASE:
        for mode, target in FLUX_TARGETS.items():
            ratio = case["modes"].get(mode, {}).get("image_vs_eager")
            verdict = "not run" if ratio is None else ("met" if ratio <= target else "NOT met")
            lines.append(f"- target {mode} <= {target:.2f}x eager per image: {_f(ratio, '.2f')} ({verdict})")
        lines.append("")
    return lines + [f"- {note}" for note in case.get("notes", [])] + [""]


def markdown(report: dict[str, Any]) -> str:
    env, settings = report["environment"], report["settings"]
    lines = [f"# Stack benchmark, {env['date']}", "",
             f"{env['gpu'] or 'CPU (a check of the code path: no timing means anything)'}, torch {env['torch']}, "
             f"diffusers {env['diffusers']}, commit {env.get('git_commit')}, {env['dtype']}. **Random weights** at the "
             f"published sizes: the deviation columns say how far each layer moves the output from the {env['dtype']} "
             "eager output, not how good an image is.", "",
             f"Layers, added in this order: {settings['layer_text']}. Each stack runs eagerly (its *twin*) and with "
             "graphs (BCG) on top; a graphs mode is compared bitwise with its twin. Per mode: the first image (set-up "
             f"included: compilation, capture), then {settings['reps']} timed image(s) (median); step ms = the median "
             "step after each call's first (with a step cache: of computed and cached steps together); peak MiB = "
             "CUDA memory allocated at most during the mode; calls cached = transformer calls that reused cached "
             "residuals, of all, in one image (cache-dit's count).", ""]
    for case in report["cases"]:
        lines += case_markdown(case)
    lines += [f"- {note}" for note in report.get("notes", [])]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Horizontal bars: time per image of each mode, one panel per case (graphs modes hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in report["cases"] if any(m.get("status") == "ok" for m in c.get("modes", {}).values())]
    fig, axes = plt.subplots(len(cases) or 1, 1, figsize=(8, 1.2 + 0.45 * max(
        [len(c["modes"]) for c in cases] or [1]) * max(1, len(cases))), squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        rows = [(name, m) for name, m in case["modes"].items() if m.get("status") == "ok"]
        names, times = [n for n, _ in rows][::-1], [m["image_s"] for _, m in rows][::-1]
        bars = ax.barh(names, times, color=["tab:orange" if n.startswith("graphs") else "tab:blue"
                                                           for n in names])
        ax.bar_label(bars, fmt="%.2f s", fontsize=7, padding=2)
        ax.set_title(f"{case['case']} ({case['steps']} steps)", fontsize=9)
        ax.set_xlabel("seconds per image (median)", fontsize=8)
        ax.tick_params(labelsize=8)
    env = report["environment"]
    fig.suptitle(f"Stack, layer by layer: {env['gpu'] or 'CPU (code path only)'}, random weights", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
