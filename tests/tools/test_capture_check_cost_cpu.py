"""The capture-time job with and without the snapshot check (``benchmarks/profile/capture_check_cost.py``) on the
CPU: a tiny PixArt in debug mode, both modes per round, the JSON it writes; the environment variable put back, and
the snapshot counter counting. The times themselves are the GPU run's (docs/benchmarks.md)."""

import json
import os

import torch

from bcg_diffusion.benchmarks.profile import capture_check_cost as job


def test_the_job_captures_both_ways_and_writes_its_json(tmp_path, monkeypatch):
    monkeypatch.delenv(job.ENV_CHECK, raising=False)
    assert job.main(["--size", "tiny", "--cases", "pixart:64x64", "--rounds", "2", "--ballast", "0,10",
                     "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "capture_check_cost.json").read_text())
    assert report["header"]["attention"] == "break" and report["header"]["ballast"] == [0, 10]
    levels = report["cases"][0]["levels"]
    assert [level["ballast_tensors"] for level in levels] == [0, 10]
    for level in levels:
        rows = level["rounds"]
        assert [r["mode"] for r in rows] == ["off", "on", "on", "off"], rows
        assert all(r["bitwise"] and r["captures"] == 1 and r["breaks"] > 0 and r["fallback"] is None for r in rows), rows
        assert all(r["snapshots"] == 0 for r in rows)  # debug mode captures no stream: nothing to check
        assert level["summary"]["on"]["captures"] == 2 and level["summary"]["off"]["all_bitwise"]
    assert job.ENV_CHECK not in os.environ


def test_the_mode_is_put_back_and_snapshots_are_counted(monkeypatch):
    monkeypatch.setenv(job.ENV_CHECK, "0")
    with job.check_mode("on"):
        assert os.environ[job.ENV_CHECK] == "1"
    assert os.environ[job.ENV_CHECK] == "0"
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: [])
    counter = job.SnapshotCounter()
    with counter.installed():
        torch.cuda.memory_snapshot()
        torch.cuda.memory_snapshot(mempool_id=(0, 1))
    assert counter.calls == 2 and counter.seconds >= 0.0
    torch.cuda.memory_snapshot()
    assert counter.calls == 2
