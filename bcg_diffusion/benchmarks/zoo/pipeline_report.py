"""The pipeline zoo probe's report: the summary against the targets, and a JSON and a Markdown file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["markdown", "summary", "write_reports"]

#: The statuses of a class whose accelerated calls all matched the twin and whose stats were read.
VERDICTS = ("replayed", "partial", "eager", "not accelerated")


def summary(records: list[dict[str, Any]], derived: int, not_built: dict[str, str]) -> dict[str, Any]:
    """Counts against issue 49's targets: built and ran (of the derived classes), wrong outputs, crashes, and
    the share of the classes that ran whose accelerated calls replayed graphs."""
    ran = [r for r in records if r.get("ran")]
    counts: dict[str, int] = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    replayed = [r for r in ran if (r.get("stats") or {}).get("hits", 0) > 0]
    return {
        "derived_classes": derived,
        "cases": len(records),
        "not_built": len(not_built),
        "built_and_ran": len(ran),
        "built_and_ran_share": round(len(ran) / derived, 4) if derived else None,
        "wrong_outputs": counts.get("mismatch", 0),
        "unrepeatable": counts.get("unrepeatable", 0),
        "crashes": counts.get("crash", 0),
        "replayed": len(replayed),
        "replayed_share_of_ran": round(len(replayed) / len(ran), 4) if ran else None,
        "fully_replayed": counts.get("replayed", 0),
        "status_counts": counts,
    }


def _cell(text: Any, limit: int = 150) -> str:
    text = str(text or "").replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _calls_cell(record: dict[str, Any]) -> str:
    marks = []
    for call in record.get("calls", []):
        marks.append("-" if call["bitwise"] is None else ("=" if call["bitwise"] else "x"))
    return "".join(marks)


def _stats_cell(record: dict[str, Any]) -> str:
    stats = record.get("stats")
    if not stats:
        return ""
    entries = stats.get("entries", ())
    captured = [e for e in entries if not e["fallback"]]
    modules = sorted({m for e in entries for m in e["eager_modules"]})
    text = (f"{stats['hits']} replayed, {stats['warmup_calls']} first, {stats['eager_calls']} eager; "
            f"keys {len(captured)}/{len(entries)}, segments {sum(e['segments'] for e in captured)}, "
            f"breaks {sum(e['breaks'] for e in captured)}")
    if stats.get("module_mode_keys"):
        text += f", module mode {stats['module_mode_keys']}"
    if modules:
        text += f", narrowed to eager: {', '.join(modules)}"
    return text


def markdown(records: list[dict[str, Any]], header: dict[str, Any], totals: dict[str, Any],
             not_built: dict[str, str]) -> str:
    """The report: header, totals against the targets, one row per class, the classes with no case."""
    share = totals["built_and_ran_share"]
    replayed = totals["replayed_share_of_ran"]
    lines = [
        f"# Pipeline zoo probe: {header.get('gpu') or header.get('device')} {header.get('dtype')}, torch "
        f"{header.get('torch')}, diffusers {header.get('diffusers')}",
        "",
        f"{header.get('date')}, commit {header.get('git_commit')}; {header.get('command', '')}",
        "",
        f"- derived classes (exported pipelines with a transformer): {totals['derived_classes']}; cases "
        f"{totals['cases']}; not built: {totals['not_built']}",
        f"- built and ran: {totals['built_and_ran']} ({'' if share is None else f'{100 * share:.1f} %'}; target "
        ">= 90 %)",
        f"- wrong outputs: {totals['wrong_outputs']} (target 0); unrepeatable (no verdict): {totals['unrepeatable']}; "
        f"crashes: {totals['crashes']} (target 0)",
        f"- replayed graphs: {totals['replayed']} of those that ran "
        f"({'' if replayed is None else f'{100 * replayed:.1f} %'}; target >= 95 %); every call after a key's first "
        f"replayed: {totals['fully_replayed']}",
        f"- statuses: {', '.join(f'{k} {v}' for k, v in sorted(totals['status_counts'].items()))}",
        "",
        "Calls, in order: seeds 1, 2, 3, two outputs per prompt, a step-end callback that edits the latents; `=` "
        "bitwise equal to the eager twin's output, `x` different, `-` not made (the note says why).",
        "",
        "| class | group | status | eager repeatable | calls | graphs | warnings of accelerate_pipeline | reason / "
        "error | notes | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        repeatable = "" if r.get("eager_repeatable") is None else ("yes" if r["eager_repeatable"] else "NO")
        reason = r.get("reason") or (f"{r['phase']}: {r['error']}" if r.get("error") else "")
        if r["status"] in ("eager", "partial") and r.get("key_changes"):
            reason += f" (e.g. {r['key_changes'][0]})"
        notes = "; ".join(f"{c['label']}: {c['note']}" for c in r.get("calls", []) if c.get("note"))
        if r.get("left_eager"):
            notes = "; ".join(filter(None, [f"not accelerated: {', '.join(r['left_eager'])}", notes]))
        lines.append(
            f"| {r['name']} | {r.get('group', '')} | {r['status']} | {repeatable} | {_calls_cell(r)} "
            f"| {_cell(_stats_cell(r), 200)} | {_cell('; '.join(r.get('accelerate_warnings', [])), 120)} "
            f"| {_cell(reason, 200)} | {_cell(notes, 120)} | {r.get('seconds', 0):.1f} |")
    if not_built:
        lines += ["", "## Classes with no case", ""]
        lines += [f"- **{name}**: {reason}" for name, reason in sorted(not_built.items())]
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, stem: str, records: list[dict[str, Any]], header: dict[str, Any],
                  not_built: dict[str, str]) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    totals = summary(records, header.get("derived_classes", len(records)), not_built)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    document = {"header": header, "totals": totals, "not_built": not_built, "results": records}
    json_path.write_text(json.dumps(document, indent=1, default=str))
    md_path.write_text(markdown(records, header, totals, not_built))
    return json_path, md_path
