"""The planting harness's reports: ``planting.json`` (every plant) and ``planting.md`` (totals, tables by
kind and by site kind, the plants a replay's assumption covers, every failure and invalid plant)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .planting_kinds import KINDS
from .planting_sites import SITE_KINDS

#: Statuses of plants that ran. ``unrepeatable``: the accelerated output differed from the twin's, and a
#: second eager run of the twin differed from its first (a nondeterministic kernel, such as an atomic
#: ``scatter_add_``): bitwise equality cannot be judged, so it counts neither as equal nor as different.
RAN = ("ok", "different", "crash", "unrepeatable")


def summary(results: list[Any]) -> dict[str, Any]:
    """Totals over the plants that ran (``invalid`` and ``skipped`` ones apart); ``checked`` are those
    not covered by an assumption."""
    ran = [r for r in results if r.status in RAN]
    checked = [r for r in ran if not r.assumption]
    return {
        "planned": len(results),
        "ran": len(ran),
        "invalid": sum(r.status == "invalid" for r in results),
        "skipped": sum(r.status == "skipped" for r in results),
        "classes": len({r.case for r in ran}),
        "site_kinds": sorted({r.site_kind for r in ran}),
        "kinds": sorted({r.kind for r in ran}),
        "crashes": sum(r.status == "crash" for r in ran),
        "different": sum(r.status == "different" for r in checked),
        "unrepeatable": sum(r.status == "unrepeatable" for r in checked),
        "replayed": sum(r.replayed_calls > 0 for r in ran),
        "host_random": sum(getattr(r, "host_random", False) for r in ran),
        "named_missing": sum(r.named is False for r in ran),
        "suspicious": sum(bool(r.suspicious) for r in ran),
        "assumption": len(ran) - len(checked),
        "assumption_different": sum(r.status == "different" for r in ran if r.assumption),
        "passed": sum(r.passed for r in ran),
    }


def _row(label: str, group: list[Any]) -> str:
    ran = [r for r in group if r.status in RAN]
    checked = [r for r in ran if not r.assumption]
    named = [r for r in ran if r.named is not None]
    return (f"| {label} | {len(ran)} | {sum(r.status == 'ok' for r in checked)} | "
            f"{sum(r.status == 'different' for r in checked)} | {sum(r.status == 'crash' for r in ran)} | "
            f"{sum(r.replayed_calls > 0 for r in ran)} | {sum(bool(r.named) for r in named)}/{len(named)} | "
            f"{len(ran) - len(checked)} |")


_HEAD = ("| {} | plants | equal | different | crash | replayed | named | assumption |\n"
         "|---|---|---|---|---|---|---|---|")


def _cell(text: str, limit: int = 200) -> str:
    text = str(text).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def markdown(results: list[Any], header: dict[str, Any]) -> str:
    s = summary(results)
    pct = 100.0 * s["replayed"] / s["ran"] if s["ran"] else 0.0
    lines = [
        f"# Planting harness: {header['device']} {header['dtype']}, torch {header['torch']}, diffusers {header['diffusers']}",
        "",
        f"Commit `{header['commit']}`, {header['date']}, seed {header['seed']}, {header['calls']} calls per plant, "
        f"{header.get('seconds', '?')} s (budget {header['time_budget_s']:.0f} s). Command: "
        f"`python -m bcg_diffusion.checks.planting --seed {header['seed']} --plants {header['plants']}`.",
        "",
        f"- plants run: {s['ran']} of {s['planned']} planned ({s['skipped']} skipped by the time budget, "
        f"{s['invalid']} invalid: the plant broke the model itself or never ran), over {s['classes']} classes, "
        f"{len(s['site_kinds'])} site kinds and {len(s['kinds'])} kinds",
        f"- unhandled exceptions: {s['crashes']}",
        f"- outputs different from the eager twin: {s['different']} (of {s['ran'] - s['assumption']} checked)",
        f"- no verdict, the eager twin itself not repeatable (it gave other bits on a second run: a nondeterministic "
        f"kernel in the model): {s['unrepeatable']}",
        f"- some graph replayed in the calls: {s['replayed']} of {s['ran']} ({pct:.1f} %)",
        f"- a key run eagerly because its capture drew host random numbers (a replay would repeat them; no replay "
        f"owed): {s['host_random']}",
        f"- a place the library acted on not named in its warning or log: {s['named_missing']}",
        f"- a log line saying the library itself went wrong (a nested capture, a failed narrowing, a stopped "
        f"replay): {s['suspicious']}",
        f"- under the documented assumption (hidden state in a free or torch function): {s['assumption']}, "
        f"of which {s['assumption_different']} differed from the twin",
        f"- plants that passed every check: {s['passed']} of {s['ran']}",
        "",
        "`equal`/`different` count the checked plants (not under the assumption); `replayed`: plants in whose calls "
        "a graph replayed; `named`: where the library had to act on the plant, its warning or log line named the "
        "place (named/required).",
        "",
        "## By kind",
        "",
        _HEAD.format("kind (family)"),
    ]
    if header.get("process"):
        died = header.get("died_in_plant")
        note = (f"the process died natively in plant {died} (its crash below; the plants after it skipped)"
                if died is not None else "no native death")
        lines[4:4] = [f"- every plant in {header['process']}: {note}"]
    for name, kind in KINDS.items():
        lines.append(_row(f"{name} ({kind.family})", [r for r in results if r.kind == name]))
    lines += ["", "## By site kind", "", _HEAD.format("site kind")]
    for site_kind in SITE_KINDS:
        lines.append(_row(site_kind, [r for r in results if r.site_kind == site_kind]))
    assumed = [r for r in results if r.assumption and r.status in RAN]
    if assumed:
        lines += ["", "## Under the documented assumption", "",
                  "Hidden state (Python `random`, a call counter) in code the library takes for the class's own. "
                  "A replay runs what the capture recorded; `different` shows where the assumption mattered.", "",
                  "| # | case | site | kind | result | calls equal |", "|---|---|---|---|---|---|"]
        for r in assumed:
            lines.append(f"| {r.index} | {r.case} | {_cell(r.site, 90)} | {r.kind} | {r.status} | "
                         f"{''.join('=' if e else 'x' for e in r.equal)} |")
    failed = [r for r in results if r.status in RAN and not r.passed]
    lines += ["", "## Plants that failed a check", ""]
    if failed:
        lines += ["| # | case | site | kind | status | replayed | named | error / messages |", "|---|---|---|---|---|---|---|---|"]
        for r in failed:
            detail = r.error or "; ".join(r.suspicious[:2] or r.messages[-3:])
            lines.append(f"| {r.index} | {r.case} | {_cell(r.site, 90)} | {r.kind} | {r.status} | {r.replayed_calls} | "
                         f"{r.named} | {_cell(detail, 300)} |")
    else:
        lines.append("None.")
    invalid = [r for r in results if r.status == "invalid"]
    if invalid:
        lines += ["", "## Invalid plants", "", "| # | case | site | kind | why |", "|---|---|---|---|---|"]
        for r in invalid:
            lines.append(f"| {r.index} | {r.case} | {_cell(r.site, 90)} | {r.kind} | {_cell(r.error, 300)} |")
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, results: list[Any], header: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``planting.json`` and ``planting.md`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "planting.json", out_dir / "planting.md"
    payload = {"header": header, "summary": summary(results), "plants": [dataclasses.asdict(r) for r in results]}
    json_path.write_text(json.dumps(payload, indent=1))
    md_path.write_text(markdown(results, header))
    return json_path, md_path
