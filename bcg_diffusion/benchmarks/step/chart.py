"""The PNG chart of a report: speedup over eager per case and mode. Needs matplotlib (the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .modes import COMPILED, MODES

CHART_NEEDS_MATPLOTLIB = 'no chart: matplotlib is not installed (the chart needs pip install -e ".[bench]")'


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Save :func:`draw_chart` of ``report`` as a PNG at ``path``. ``ImportError`` without matplotlib."""
    import matplotlib.pyplot as plt

    fig = draw_chart(report)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def draw_chart(report: dict[str, Any]):
    """A figure of grouped bars (one group per case, one bar per mode) with the legend outside the axes, to
    the right, so it never covers a bar. ``ImportError`` without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in report["cases"] if c["modes"]]
    modes = [m for m in MODES if any("median_ms" in c["modes"].get(m, {}) for c in cases)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(cases) + 2) + 2.5, 4.8))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, c in enumerate(cases):
            r = c["modes"].get(mode, {})
            if r.get("speedup_vs_eager"):
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                ys.append(r["speedup_vs_eager"])
        bars = ax.bar(xs, ys, width, label=mode + (" (torch.compile)" if mode in COMPILED else ""),
                      hatch="//" if mode in COMPILED else None)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(cases)), [c["case"] for c in cases], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speedup over eager (eager ms / mode ms)")
    env = report["environment"]
    ax.set_title(f"One transformer call per denoising step: {env['gpu'] or 'CPU (code-path check only)'}, "
                 f"{env['date'][:10]}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig
