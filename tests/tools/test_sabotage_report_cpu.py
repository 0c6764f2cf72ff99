"""CPU tests of tests/sabotage_report.py (the GPU tests against broken replays): how it reads the
sessions' outcomes, what counts as a survivor and why, and the conftest option that records them."""

from __future__ import annotations

import json
import subprocess
import sys

from _scripts import ROOT, load_file

report = load_file(ROOT / "tests" / "sabotage_report.py", "_bcg_sabotage_report")


def _line(nodeid, when, outcome, survives=None, message=None):
    return json.dumps({"nodeid": nodeid, "when": when, "outcome": outcome, "duration": 0.5,
                       "survives": survives or {}, "message": message})


def test_outcomes_and_survivors():
    core = {"fallback": "drives the core", "skip_segment": "drives the core"}
    lines = [
        _line("a.py::replays", "setup", "passed"), _line("a.py::replays", "call", "passed"),
        _line("a.py::replays", "teardown", "passed"),
        _line("a.py::core", "setup", "passed", core), _line("a.py::core", "call", "passed", core),
        _line("a.py::caught", "call", "failed", message="AssertionError: 0 of 6 calls replayed"),
        _line("a.py::marked", "call", "failed", {"fallback": "thought to survive"}, "AssertionError"),
        _line("a.py::two_gpus", "setup", "skipped"),
    ]
    outcomes = report.outcomes_from_lines(lines)
    assert {n: t["outcome"] for n, t in outcomes.items()} == {
        "a.py::replays": "passed", "a.py::core": "passed", "a.py::caught": "failed", "a.py::marked": "failed",
        "a.py::two_gpus": "skipped"}
    assert outcomes["a.py::caught"]["message"] == "call: AssertionError: 0 of 6 calls replayed"
    fallback = report.summarize("fallback", outcomes)
    assert (fallback["passed"], fallback["failed"], fallback["skipped"]) == (2, 2, 1)
    assert fallback["survivors"] == [{"test": "a.py::core", "reason": "drives the core"},
                                     {"test": "a.py::replays", "reason": None}]
    assert fallback["unexpected_survivors"] == ["a.py::replays"]  # passed under sabotage without a reason
    assert fallback["marked_but_failed"] == ["a.py::marked"]
    stale = report.summarize("stale_inputs", outcomes)
    assert stale["unexpected_survivors"] == ["a.py::core", "a.py::replays"]  # the marker names other modes
    normal = report.summarize("normal", outcomes)
    assert set(normal["failures"]) == {"a.py::caught", "a.py::marked"}


def test_markdown_names_every_survivor_and_the_verdict():
    outcomes = report.outcomes_from_lines([_line("a.py::replays", "call", "passed")])
    summary = {**report.summarize("skip_segment", outcomes), "seconds": 12.0, "stopped": False}
    text = report.markdown({"command": "python tests/sabotage_report.py", "commit": "abc1234", "date": "d",
                            "device": "NVIDIA H200", "passed": False, "modes": [summary]})
    assert "| skip_segment | 1 | 1 | 0 | 0 | 1 | 1 | 12 |" in text
    assert "`a.py::replays`: **UNEXPECTED**" in text and "Result: **FAIL**" in text


def test_the_results_option_records_outcomes_with_the_survives_marker(tmp_path):
    """A real pytest session: every phase of every test is written, with the marker's modes and reasons."""
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--sabotage-results",
                           str(out), "tests/library/test_core_gpu.py", "-k", "replay_token or back_to_back"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    outcomes = report.outcomes_from_lines(out.read_text().splitlines())
    assert len(outcomes) == 2, outcomes
    for test in outcomes.values():
        assert set(test["survives"]) == {"fallback", "skip_segment", "stale_inputs"}, test
        assert "graph runner" in test["survives"]["fallback"]
        assert test["outcome"] in ("passed", "skipped")  # skipped without a CUDA device


def test_bad_modes_exit_2(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        report.main(["--modes", "normal,nope"])
    assert exit_info.value.code == 2 and "unknown nope" in capsys.readouterr().err
