"""The planting harness's plumbing on the CPU (debug mode: the runner's real path with segments run
eagerly, host reads raising what CUDA raises where a capture would record them): plans from a seed,
sites from a survey, plants put in and taken out exactly, the verdicts, the reports. That replays
stay bitwise with captured graphs is the GPU test's claim (test_planting_gpu.py)."""

import json

import pytest
import torch

import bcg_diffusion as bcg
from bcg_diffusion.checks import planting
from bcg_diffusion.checks.planting_kinds import KINDS, PlantState
from bcg_diffusion.checks.planting_report import summary
from bcg_diffusion.checks.planting_sites import SITE_KINDS, Plant, Site, install, map_first_float

CPU = torch.device("cpu")
FLUX = "FluxTransformer2DModel"


@pytest.fixture(scope="module")
def flux():
    return planting.build_bundle(planting.planted_cases(FLUX)[0], CPU, torch.float32, planting.CALLS)


def test_plans_are_reproducible_from_the_seed_and_cover_every_pair():
    cases = planting.planted_cases()
    assert len({c.class_name for c in cases}) == len(cases) >= 65  # one case per class
    assert not {c.name for c in cases} & planting.NOT_CAPTURED
    first, again, other = planting.plan(3, 200, cases), planting.plan(3, 200, cases), planting.plan(4, 200, cases)
    assert first == again and first != other
    pairs = {(s.site_kind, s.kind) for s in planting.plan(0, len(SITE_KINDS) * len(KINDS), cases)}
    assert len(pairs) == len(SITE_KINDS) * len(KINDS)


def test_the_survey_finds_every_site_kind_and_choices_follow_the_seed(flux):
    for kind in SITE_KINDS:
        assert flux.survey.of(kind), kind
    assert "torch.nn.functional.gelu" in [s.target for s in flux.survey.of("torch_function")]
    spec = planting.PlantSpec(7, flux.case.name, "free_function", "item")
    assert planting.choose_site(spec, flux.survey, 0) == planting.choose_site(spec, flux.survey, 0)


@pytest.mark.parametrize("site_kind", SITE_KINDS)
def test_plants_are_undone_exactly(flux, site_kind):
    import sys

    site = flux.survey.of(site_kind)[0]
    owner, name = (sys.modules[site.target.rpartition(".")[0]], site.target.rpartition(".")[2]) \
        if site_kind in ("free_function", "torch_function") else (None, None)
    before = [dict(vars(m)) for m in flux.model.modules()]
    function = getattr(owner, name) if owner is not None else None
    classes = {t: dict(vars(t)) for t in {type(m) for m in flux.model.modules()}}
    undo = install(site, Plant(KINDS["counter"], PlantState(), flux.paths), (flux.model, flux.twin))
    undo()
    assert [dict(vars(m)) for m in flux.model.modules()] == before
    assert {t: dict(vars(t)) for t in classes} == classes
    if owner is not None:
        assert getattr(owner, name) is function


def test_map_first_float_changes_only_the_first_floating_tensor():
    ids, x, y = torch.arange(3), torch.ones(2), torch.ones(2)
    out, done = map_first_float((ids, {"a": x, "b": y}), lambda t: t * 2)
    assert done and out[0] is ids and torch.equal(out[1]["a"], x * 2) and out[1]["b"] is y
    assert map_first_float((ids, None), lambda t: t * 2) == ((ids, None), False)


@pytest.mark.parametrize("site_kind, kind", [
    ("free_function", "item"),  # a host read in a helper of the model file: narrowed to the module calling it
    ("torch_function", "bool_mask"),  # a torch function replaced process-wide: narrowed, several modules
    ("module_instance", "counter"),  # a replaced forward: module mode
    ("hook", "synchronize"),  # a diffusers hook: runs eagerly around a captured body
])
def test_plants_in_debug_mode_are_equal_replay_and_are_named(flux, site_kind, kind):
    spec = planting.PlantSpec(11, flux.case.name, site_kind, kind)
    result = planting.run_plant(spec, flux, 0, CPU)
    assert result.status == "ok" and result.passed, result
    assert result.replayed_calls >= 2 and result.counters["hits"] >= 2, result
    if site_kind in ("free_function", "torch_function"):
        # the emulated capture error ran the library's failure handling: narrowed, one warning naming the place
        assert result.fired_in_capture > 0 and result.eager_modules and result.named, result
        assert any("operation not permitted when stream is capturing" in m for m in result.messages)
    if site_kind == "module_instance":
        assert result.module_mode and result.named and result.counters["child_hits"] > 0, result
    assert not bcg.is_accelerated(flux.model)


def test_the_verdicts_tell_an_assumption_from_a_failure(flux):
    # a call counter in a torch function replaced process-wide: code the library takes for torch's own.
    # In debug mode the capture run counts one call more than the eager twin: the outputs differ, and
    # the plant is reported under the documented assumption, not as a failure.
    spec = planting.PlantSpec(5, flux.case.name, "torch_function", "counter")
    result = planting.run_plant(spec, flux, 0, CPU, site=Site("torch_function", "torch.nn.functional.gelu"))
    assert result.assumption and result.status == "different" and result.passed, result
    failed = planting.PlantResult(1, FLUX, "hook", "item", "host read", site="hook:x", status="different",
                                  equal=[True, False], replayed_calls=2)
    crashed = planting.PlantResult(2, FLUX, "hook", "item", "host read", site="hook:x", status="crash")
    unnamed = planting.PlantResult(3, FLUX, "hook", "item", "host read", site="hook:x", status="ok", replayed_calls=1,
                                   named=False)
    eager = planting.PlantResult(4, FLUX, "hook", "item", "host read", site="hook:x", status="ok", replayed_calls=0)
    assert not any(r.passed for r in (failed, crashed, unnamed, eager))
    totals = summary([result, failed, crashed, unnamed, eager])
    assert (totals["different"], totals["crashes"], totals["named_missing"], totals["assumption"]) == (1, 1, 1, 1)
    assert totals["replayed"] == 3


def test_a_key_run_eagerly_for_host_random_numbers_passes_without_a_replay(flux, monkeypatch):
    # plant 631 of the 1000-plant run: a dropout on the host inside the captured step. Debug mode does not
    # watch the CPU generator (on a machine without CUDA it is also the device's); switched on here, the
    # dropout in gelu is host randomness as on a GPU machine: the key runs eagerly, equal to the twin.
    from bcg_diffusion.integration import host_random

    monkeypatch.setattr(host_random, "watched", lambda config: True)
    spec = planting.PlantSpec(631, flux.case.name, "torch_function", "dropout")
    result = planting.run_plant(spec, flux, 0, CPU, site=Site("torch_function", "torch.nn.functional.gelu"))
    assert result.status == "ok" and result.host_random and result.replayed_calls == 0 and result.passed, result
    assert result.counters["failed_captures"] == 1 and summary([result])["host_random"] == 1, result


def test_a_twin_that_does_not_repeat_itself_gets_no_verdict(flux, monkeypatch):
    # a model with a nondeterministic kernel (an atomic scatter_add_ on CUDA): its eager twin's first run
    # differs from its second, so the accelerated output's difference from it is no verdict on the library
    real_calls, twin_runs = planting._calls, []

    def calls(model, bundle, on_call=None):
        outs = real_calls(model, bundle, on_call)
        if model is bundle.twin:
            twin_runs.append(1)
            if len(twin_runs) == 1:
                outs = [[t + 1e-3 if t.is_floating_point() else t for t in out] for out in outs]
        return outs

    monkeypatch.setattr(planting, "_calls", calls)
    spec = planting.PlantSpec(11, flux.case.name, "free_function", "item")
    result = planting.run_plant(spec, flux, 0, CPU)
    assert result.status == "unrepeatable" and not result.passed and len(twin_runs) == 2, result
    totals = summary([result])
    assert (totals["ran"], totals["different"], totals["unrepeatable"]) == (1, 0, 1)


def test_the_command_writes_its_reports(tmp_path, capsys):
    """In one process (``--in-process``): the reports, and the progress written as it went."""
    assert planting.main(["--seed", "2", "--plants", "2", "--calls", "2", "--classes", FLUX, "--out", str(tmp_path),
                          "--commit", "abc123", "--in-process"]) == 0
    report = json.loads((tmp_path / "planting.json").read_text())
    assert report["header"]["commit"] == "abc123" and len(report["plants"]) == 2
    assert report["summary"]["ran"] == 2 and report["summary"]["crashes"] == 0
    text = (tmp_path / "planting.md").read_text()
    assert "Commit `abc123`" in text and "## By kind" in text and "## By site kind" in text
    assert "plants run: 2 of 2" in capsys.readouterr().out
    assert report["header"]["process"] == "one process (--in-process)"
    assert "every plant in one process (--in-process): no native death" in text
    lines = (tmp_path / "planting.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1]
    assert not (tmp_path / "planting_running.json").exists()
    assert planting.main(["--out", str(tmp_path), "--rebuild-report"]) == 2  # no run died there
    assert planting.main(["--out", str(tmp_path), "--in-process", "--jobs", "2"]) == 2


def test_a_child_that_dies_costs_only_the_plant_it_was_running(tmp_path, monkeypatch):
    """--jobs: a child killed by a signal in plant 3 gives plant 3 a crash naming the signal; plants 2
    (finished before) and 4 (run by a new child) keep their results."""
    import argparse
    import sys as _sys

    from bcg_diffusion.checks import planting, planting_processes

    script = tmp_path / "child.py"
    script.write_text(
        "import json, os, signal, sys\n"
        "indices = [int(i) for i in sys.argv[1].split(',')]\n"
        "jsonl = sys.argv[2]\n"
        "for i in indices:\n"
        "    print(f'plant {i}: case site kind', file=sys.stderr, flush=True)\n"
        "    if i == 3:\n"
        "        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    with open(jsonl, 'a') as f:\n"
        "        f.write(json.dumps({'index': i, 'case': 'c', 'site_kind': 's', 'kind': 'k', 'family': 'f', 'status': 'ok'}) + '\\n')\n")

    def command(args, indices, jsonl, out_dir, budget_s):
        return [_sys.executable, str(script), ",".join(map(str, indices)), str(jsonl)]

    monkeypatch.setattr(planting_processes, "child_command", command)
    got = []
    args = argparse.Namespace(time_budget=60, chunk=10, jobs=1)
    planting_processes.run_in_processes(
        args, [2, 3, 4],
        lambda i, status, error: planting.PlantResult(i, "c", "s", "k", "f", status=status, error=error),
        lambda d: planting_processes.result_from_dict(planting.PlantResult, d), got.append)
    assert [(r.index, r.status) for r in got] == [(2, "ok"), (3, "crash"), (4, "ok")]
    assert "SIGSEGV" in got[1].error


def test_a_planted_processor_keeps_the_keyword_arguments_its_processor_names():
    """diffusers' Attention passes a processor only the keyword arguments its ``__call__`` names: the planted
    wrapper (instance and class sites) must name those of the processor it wraps, or the twin raises (SanaVideo's
    processor without its rotary_emb, three invalid plants of the 2026-12-02 GPU run)."""
    import inspect

    from bcg_diffusion.checks import planting_sites

    seen = []

    class Processor:
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, rotary_emb=None):
            seen.append(rotary_emb)
            return hidden_states

    plant = Plant(KINDS["counter"], PlantState(), {})
    wrapped = planting_sites.planted_processor(Processor(), plant)
    assert "rotary_emb" in inspect.signature(wrapped.__call__).parameters
    x = torch.ones(2)
    wrapped(None, x, rotary_emb=x)
    assert seen == [x] and plant.state.fired == 1
    undo = planting_sites._class_attr(Processor, "__call__", plant)
    try:
        assert "rotary_emb" in inspect.signature(Processor().__call__).parameters
    finally:
        undo()
    assert "planted" not in Processor.__call__.__name__


_DIES_IN_PLANT_3 = r"""
import os, signal, sys
from bcg_diffusion.checks import planting

def run_plant(spec, bundle, seed, device, site=None):
    if spec.index == 3:
        os.kill(os.getpid(), signal.SIGSEGV)  # a native death, as torch's was
    return planting.PlantResult(spec.index, spec.case, spec.site_kind, spec.kind, "f", status="ok", replayed_calls=2)

planting.build_bundle = lambda case, device, dtype, calls: object()
planting.run_plant = run_plant
sys.exit(planting.main(sys.argv[1:]))
"""


def test_an_in_process_run_that_dies_natively_leaves_the_plant_it_died_in(tmp_path):
    """A SIGSEGV in plant 3 ends the run (no Python handler can catch it); the progress files name plant 3,
    faulthandler wrote the stacks, and --rebuild-report makes plant 3 a crash and plants 4-5 skipped."""
    import subprocess
    import sys

    script = tmp_path / "dies.py"
    script.write_text(_DIES_IN_PLANT_3)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), "--seed", "0", "--plants", "6", "--classes", FLUX,
                           "--out", str(out), "--commit", "abc123", "--in-process"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode < 0, (done.returncode, done.stderr[-2000:])  # killed by the signal
    running = json.loads((out / "planting_running.json").read_text())
    assert running["plant"]["index"] == 3 and running["finished_before"] == 3
    assert "Segmentation fault" in (out / "planting_fault.txt").read_text()
    assert planting.main(["--out", str(out), "--rebuild-report"]) == 0
    report = json.loads((out / "planting.json").read_text())
    statuses = [(p["index"], p["status"]) for p in report["plants"]]
    assert statuses == [(0, "ok"), (1, "ok"), (2, "ok"), (3, "crash"), (4, "skipped"), (5, "skipped")]
    assert "died natively" in report["plants"][3]["error"] and "Segmentation fault" in report["plants"][3]["error"]
    assert report["header"]["died_in_plant"] == 3 and report["summary"]["crashes"] == 1
    assert "the process died natively in plant 3" in (out / "planting.md").read_text()


def test_the_commit_is_read_from_bench_git_commit_where_set(monkeypatch):
    from bcg_diffusion.checks.planting import current_commit

    monkeypatch.setenv("BENCH_GIT_COMMIT", "0ec6bf5")
    assert current_commit() == "0ec6bf5"  # a copy whose git metadata is stale says its commit so
    monkeypatch.delenv("BENCH_GIT_COMMIT")
    assert current_commit() != "0ec6bf5"  # git's, or "unknown" without git
