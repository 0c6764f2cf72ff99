"""What the capture-failure loop (:mod:`.capture_failures`) counted, its checks, and its reports
(``capture_failures.json`` and ``capture_failures.md``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 2**20
KEEP = 20  # mismatches and unhandled exceptions listed in full (all are counted)


@dataclass
class LoopReport:
    """Counts of one run. ``failures``: planted failures done, by means; ``failed_attempts``: capture
    attempts the plant made fail (the library retries a failed capture once); ``compared``: outputs
    compared with the twin; ``memory``: ``(failures done, allocated, reserved)`` samples; ``reserved_after_release``:
    reserved bytes after the model was released and ``torch.cuda.empty_cache()`` ran (what the failures still hold)."""

    planned: int
    time_budget_s: float
    header: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: {"host_read": 0, "raise": 0, "interrupt": 0})
    failed_attempts: int = 0
    compared: int = 0
    mismatches: int = 0
    mismatch_list: list[dict[str, Any]] = field(default_factory=list)
    unhandled_exceptions: int = 0
    unhandled_list: list[dict[str, Any]] = field(default_factory=list)
    swallowed_interrupts: int = 0
    stopped_by_budget: bool = False
    stats_start: dict[str, int] = field(default_factory=dict)
    stats_end: dict[str, int] = field(default_factory=dict)
    memory: list[tuple[int, int, int]] = field(default_factory=list)
    reserved_after_release: int | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def mismatch(self, what: str, key: tuple[int, int], means: str) -> None:
        self.mismatches += 1
        if len(self.mismatch_list) < KEEP:
            self.mismatch_list.append({"call": what, "key": list(key), "means": means})

    def unhandled(self, what: str, key: tuple[int, int], means: str, exc: BaseException) -> None:
        self.unhandled_exceptions += 1
        if len(self.unhandled_list) < KEEP:
            message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            self.unhandled_list.append({"call": what, "key": list(key), "means": means,
                                        "error": f"{type(exc).__name__}: {message}"})

    def sample(self, done: int, allocated: int, reserved: int) -> None:
        self.memory.append((done, allocated, reserved))

    @property
    def done(self) -> int:
        return sum(self.failures.values())

    def delta(self, name: str) -> int | None:
        if name not in self.stats_end or name not in self.stats_start:
            return None
        return self.stats_end[name] - self.stats_start[name]

    def checks(self) -> dict[str, bool]:
        """Each check by name: every planted failure done, no output different from the twin, no exception
        but the planted interrupts reaching the caller, no interrupt swallowed, every planted capture failure
        counted by the library as a failed capture, both steady keys replayed after every failure."""
        failed = self.failures["host_read"] + self.failures["raise"]
        hits = self.delta("hits")
        return {
            "all planted failures done": self.done == self.planned and not self.stopped_by_budget,
            "outputs bitwise equal to the twin": self.mismatches == 0 and self.compared > 0,
            "no unhandled exception": self.unhandled_exceptions == 0,
            "no interrupt swallowed": self.swallowed_interrupts == 0,
            "every planted capture failure counted": self.delta("failed_captures") == failed,
            "steady keys replayed between failures": hits is not None and hits >= 2 * self.done,
        }

    @property
    def passed(self) -> bool:
        return all(self.checks().values())

    def memory_summary(self) -> dict[str, Any] | None:
        """First and last samples and the largest, in MiB (``None`` off CUDA)."""
        if not self.memory:
            return None
        first, last = self.memory[0], self.memory[-1]
        return {"first_allocated_mib": first[1] / MIB, "last_allocated_mib": last[1] / MIB,
                "first_reserved_mib": first[2] / MIB, "last_reserved_mib": last[2] / MIB,
                "max_allocated_mib": max(m[1] for m in self.memory) / MIB,
                "max_reserved_mib": max(m[2] for m in self.memory) / MIB}


def markdown(report: LoopReport) -> str:
    h = report.header
    per = report.seconds / report.done if report.done else 0.0
    lines = [
        f"# Capture-failure loop: {h.get('device')} {h.get('dtype')}, torch {h.get('torch')}",
        "",
        f"Commit `{h.get('commit')}`, {h.get('date')}. Command: `python -m bcg_diffusion.checks.capture_failures "
        f"--failures {report.planned}`. {report.seconds:.1f} s (budget {report.time_budget_s:.0f} s, "
        f"{per * 1000:.0f} ms per failure).",
        "",
        f"- planted capture failures: {report.done} of {report.planned} in one process ("
        + ", ".join(f"{m} {n}" for m, n in report.failures.items())
        + f"){'; stopped by the time budget' if report.stopped_by_budget else ''}",
        f"- capture attempts made to fail: {report.failed_attempts}; failed captures the library counted: "
        f"{report.delta('failed_captures')}; successful captures: {report.delta('captures')}",
        f"- replays (hits) during the loop: {report.delta('hits')}; eager calls: {report.delta('eager_calls')}",
        f"- outputs compared bitwise with the twin: {report.compared}, different: {report.mismatches}",
        f"- unhandled exceptions: {report.unhandled_exceptions}; planted interrupts swallowed: "
        f"{report.swallowed_interrupts}",
        f"- result: {'PASS' if report.passed else 'FAIL'}",
        "", "## Checks", "", "| check | passed |", "|---|---|",
        *[f"| {name} | {'yes' if ok else 'NO'} |" for name, ok in report.checks().items()],
    ]
    memory = report.memory_summary()
    if memory is not None:
        lines += ["", "## Device memory over the loop (MiB)", "",
                  f"Allocated {memory['first_allocated_mib']:.1f} -> {memory['last_allocated_mib']:.1f} (max "
                  f"{memory['max_allocated_mib']:.1f}); reserved {memory['first_reserved_mib']:.1f} -> "
                  f"{memory['last_reserved_mib']:.1f} (max {memory['max_reserved_mib']:.1f})"
                  + (f"; reserved after releasing the model and `empty_cache`: {report.reserved_after_release / MIB:.1f}"
                     if report.reserved_after_release is not None else "") + ".", "",
                  "| failures done | allocated | reserved |", "|---|---|---|",
                  *[f"| {d} | {a / MIB:.1f} | {r / MIB:.1f} |" for d, a, r in report.memory]]
    for title, rows in (("Different outputs", report.mismatch_list), ("Unhandled exceptions", report.unhandled_list)):
        if rows:
            lines += ["", f"## {title} (first {KEEP})", "", *[f"- {json.dumps(r)}" for r in rows]]
    if report.warnings:
        lines += ["", "## Distinct warnings of the library", "", *[f"- {w}" for w in report.warnings]]
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, report: LoopReport) -> tuple[Path, Path]:
    """``capture_failures.json`` (every count, check and sample) and ``capture_failures.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**dataclasses.asdict(report), "checks": report.checks(), "passed": report.passed,
               "memory_summary": report.memory_summary()}
    json_path, md_path = out_dir / "capture_failures.json", out_dir / "capture_failures.md"
    json_path.write_text(json.dumps(payload, indent=1))
    md_path.write_text(markdown(report))
    return json_path, md_path
