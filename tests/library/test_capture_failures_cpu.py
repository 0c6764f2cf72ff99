"""The capture-failure loop's plumbing on the CPU (bcg_diffusion/checks/capture_failures.py), in debug mode,
where the host read raises the error CUDA raises wherever a real capture would record it: three planted
failures (one per means) in one process, steady keys replaying between them, every output compared with
the eager twin; the reports and their checks. The same loop with real captures: test_capture_failures_gpu.py."""

import json

import torch

from bcg_diffusion.checks import capture_failures
from bcg_diffusion.checks.capture_failures_report import LoopReport


def test_three_planted_failures_in_one_process(tmp_path, capsys):
    gelu = torch.nn.functional.gelu
    assert capture_failures.main(["--failures", "3", "--out", str(tmp_path), "--commit", "abc123"]) == 0
    report = json.loads((tmp_path / "capture_failures.json").read_text())
    assert report["passed"] and all(report["checks"].values()), report["checks"]
    assert report["failures"] == {"host_read": 1, "raise": 1, "interrupt": 1}
    # host read and raise: the attempt and the library's one retry; the interrupt reaches the caller at once
    assert report["failed_attempts"] == 5
    start, end = report["stats_start"], report["stats_end"]
    assert end["failed_captures"] - start["failed_captures"] == 2
    assert end["captures"] - start["captures"] == 1  # the interrupted key, captured when called again
    assert end["hits"] - start["hits"] == 2 * 3 + 1
    # steady keys warmed and captured; per failure a warm-up, the planted capture (an interrupt: the call again), two replays
    assert report["compared"] == 2 * 2 + 3 * (2 + 2) and report["mismatches"] == 0
    assert report["unhandled_exceptions"] == report["swallowed_interrupts"] == 0
    text = (tmp_path / "capture_failures.md").read_text()
    assert "Commit `abc123`" in text and "result: PASS" in capsys.readouterr().out
    assert any("PlantedCaptureError" in w for w in report["warnings"])  # the library's warning names the failure
    assert torch.nn.functional.gelu is gelu  # the plant is taken out


def test_the_checks_and_the_comparison_fail_where_they_must():
    nan = torch.tensor([float("nan"), 1.0])
    assert capture_failures.bitwise_equal((nan,), (nan.clone(),))
    assert not capture_failures.bitwise_equal((nan,), (torch.tensor([float("nan"), 1.0 + 1e-6]),))
    assert not capture_failures.bitwise_equal((nan,), (nan.double(),))
    report = LoopReport(planned=3, time_budget_s=1.0, failures={"host_read": 1, "raise": 1, "interrupt": 1},
                        compared=10, stats_start={"hits": 0, "failed_captures": 0},
                        stats_end={"hits": 6, "failed_captures": 2})
    assert report.passed
    report.mismatch("steady replay", (16, 24), "")
    report.unhandled("capture (planted)", (4, 4), "raise", RuntimeError("boom"))
    checks = report.checks()
    assert not report.passed and not checks["outputs bitwise equal to the twin"] and not checks["no unhandled exception"]
    assert report.unhandled_list == [{"call": "capture (planted)", "key": [4, 4], "means": "raise",
                                      "error": "RuntimeError: boom"}]
    assert len(set(capture_failures.fresh_keys(1000))) == 1000
    assert not set(capture_failures.fresh_keys(1000)) & set(capture_failures.STEADY_KEYS)
