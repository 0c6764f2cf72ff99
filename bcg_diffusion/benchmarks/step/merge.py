"""Merging result files (e.g. the shards of one matrix) into one report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cases import DEFAULT_CASES

#: Fields every result file has, by section ("" is the top level; "cases[]" each case).
REQUIRED_FIELDS = {
    "": ("environment", "settings", "cases"),
    "environment": ("date", "gpu", "torch", "cuda", "diffusers", "dtype", "git_commit"),
    "settings": ("iters", "rounds", "warmup"),
    "cases[]": ("case", "modes"),
}
MERGE_MUST_AGREE = ("gpu", "torch", "cuda", "diffusers", "dtype", "git_commit")
SETTINGS_MUST_AGREE = ("iters", "rounds", "warmup", "bcg_config_of_step_modes")


def missing_field(report: Any) -> str | None:
    """The first required field ``report`` lacks, as a path (``settings.rounds``, ``cases[2].modes``)."""
    if not isinstance(report, dict):
        return "a JSON object at the top level"
    sections = {"": [report], "environment": [report.get("environment")], "settings": [report.get("settings")],
                "cases[]": report.get("cases") or []}
    for section, fields in REQUIRED_FIELDS.items():
        for index, part in enumerate(sections[section]):
            where = section.replace("[]", f"[{index}]")
            for name in fields:
                if not isinstance(part, dict) or name not in part:
                    return f"{where}.{name}" if where else name
    return None


def read_result(path: Path) -> dict[str, Any]:
    """A result file, checked for the fields a merge reads (``ValueError`` naming a missing one)."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if isinstance(report, dict) and report.get("kind") == "across_processes":
        raise ValueError(f"{path} is an across-process summary (--processes); merge the per-process result files "
                         "it lists instead")
    missing = missing_field(report)
    if missing:
        raise ValueError(f"{path} is not a bench_step result file: it has no field {missing}")
    return report


def check_alike(paths: list[Path], reports: list[dict], allow_different_commits: bool) -> None:
    """``ValueError`` unless all reports come from one set-up and were measured alike."""
    first, first_settings = reports[0]["environment"], reports[0]["settings"]
    for path, rep in zip(paths[1:], reports[1:]):
        for key in MERGE_MUST_AGREE:
            if key == "git_commit" and allow_different_commits:
                continue
            if rep["environment"].get(key) != first.get(key):
                raise ValueError(f"{path}: {key} is {rep['environment'].get(key)!r} but {paths[0]} has "
                                 f"{first.get(key)!r}; merge only results of one set-up")
        for key in SETTINGS_MUST_AGREE:
            if rep["settings"].get(key) != first_settings.get(key):
                raise ValueError(f"{path}: setting {key} is {rep['settings'].get(key)!r} but {paths[0]} has "
                                 f"{first_settings.get(key)!r}; merge only results measured alike")


def merged_cases(paths: list[Path], reports: list[dict]) -> list[dict]:
    """All cases, each in one file only; in the order of the default matrix, others in file order."""
    cases, seen = [], {}
    for path, rep in zip(paths, reports):
        for case in rep["cases"]:
            if case["case"] in seen:
                raise ValueError(f"case {case['case']} is in both {seen[case['case']]} and {path}")
            seen[case["case"]] = path
            cases.append(case)
    order = {text: i for i, text in enumerate(DEFAULT_CASES)}
    return sorted(cases, key=lambda c: order.get(c["case"], len(order)))  # stable: others keep file order


def merge_reports(paths: list[Path], allow_different_commits: bool = False) -> dict[str, Any]:
    """One report from several result files of the same set-up (``ValueError`` saying what differs or
    what is missing). With ``allow_different_commits`` the files may come from different commits of this
    project; each file's commit is kept in ``merged_from``."""
    reports = [read_result(path) for path in paths]
    check_alike(paths, reports, allow_different_commits)
    cases = merged_cases(paths, reports)
    ran = {c["case"] for c in cases}
    environment = dict(reports[0]["environment"])
    commits = sorted({str(rep["environment"].get("git_commit")) for rep in reports})
    if len(commits) > 1:
        environment["git_commit"] = " + ".join(commits)
    return {
        "environment": environment,
        "settings": dict(reports[0]["settings"], shard=None, argv=None),
        "modes": reports[0].get("modes", {}),
        "cases": cases,
        "skipped_cases": [s for rep in reports for s in rep.get("skipped_cases", [])],
        "not_run": [c for rep in reports for c in rep.get("not_run", []) if c not in ran],  # unless run elsewhere
        "total_s": sum(rep.get("total_s") or 0.0 for rep in reports),
        "merged_from": [
            {"file": Path(p).name, "date": rep["environment"].get("date"), "shard": rep["settings"].get("shard"),
             "git_commit": rep["environment"].get("git_commit"), "argv": rep["settings"].get("argv"),
             "total_s": rep.get("total_s"), "cases": [c["case"] for c in rep["cases"]]}
            for p, rep in zip(paths, reports)
        ],
    }
