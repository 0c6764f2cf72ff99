"""The capture-failure loop on the GPU, a short run: 30 planted capture failures (host reads, raises,
interrupts inside real captures) in one process while two keys replay between them, every output bitwise
equal to the eager twin, no unhandled exception. In a child process, so that a native crash is this test's
failure (with its output), not a dead worker. The full run (1000 failures) is
``python -m bcg_diffusion.checks.capture_failures`` (docs/testing.md)."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_thirty_capture_failures_in_one_process_with_replays_between(tmp_path):
    command = [sys.executable, "-m", "bcg_diffusion.checks.capture_failures", "--failures", "30", "--out",
               str(tmp_path), "--time-budget", "120", "--sample-every", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    report_path = tmp_path / "capture_failures.json"
    assert report_path.exists(), f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert report["passed"] and done.returncode == 0, (report["checks"], report["mismatch_list"],
                                                       report["unhandled_list"], done.stderr[-2000:])
    assert report["failures"] == {"host_read": 10, "raise": 10, "interrupt": 10}
    assert report["failed_attempts"] >= 30 and len(report["memory"]) >= 6
