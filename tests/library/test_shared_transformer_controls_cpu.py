"""The shared-transformer controls (bcg_diffusion.checks.shared_transformer_controls) on the CPU: the plumbing only
(without CUDA acceleration is a no-op and there is no GPU burner): every control runs in order against the first
eager call, the steps that change the pipelines are not compared, and a difference fails the check with its name."""

from __future__ import annotations

import json

import pytest

from bcg_diffusion.checks import shared_transformer_controls as controls

ARGS = ["--device", "cpu", "--steps", "1"]


@pytest.fixture(autouse=True)
def idle_cpu_burner(monkeypatch):
    """A CPU burner that waits instead of spinning: on this CPU a spinning thread makes every op of the pipeline wait
    for the interpreter lock (seconds per call); the plumbing is the same."""
    monkeypatch.setattr(controls, "burn_cpu", lambda stop: stop.wait())


def test_every_control_is_compared_with_the_first_eager_call(tmp_path):
    assert controls.main([*ARGS, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "controls.json").read_text())
    names = [r["name"] for r in report["results"]]
    assert names[:3] == ["eager: a second call", "eager: in another thread", "eager: beside a CPU burner"]
    assert "accelerated: call 2 (capture)" in names and names[-1] == "eager after remove_acceleration: the second pipeline"
    assert not any(n.startswith(controls.ACTION) for n in names) and len(names) == 13
    assert report["different"] == 0 and all(r["equal"] and not r["error"] for r in report["results"])
    assert "| accelerated: the second pipeline (from_pipe) | yes |" in (tmp_path / "controls.md").read_text()


def test_a_control_that_differs_fails_the_check(tmp_path, monkeypatch):
    real = controls.generate

    def off_in_a_thread(pipe, seed, steps):
        latents = real(pipe, seed, steps)
        return latents + 1 if controls.threading.current_thread().name == "control-thread" else latents

    monkeypatch.setattr(controls, "generate", off_in_a_thread)
    assert controls.main([*ARGS, "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "controls.json").read_text())
    assert [r["name"] for r in report["results"] if not r["equal"]] == [
        "eager: in another thread", "accelerated: in another thread"]
    assert report["different"] == 2
