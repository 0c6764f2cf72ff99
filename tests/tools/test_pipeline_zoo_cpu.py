"""CPU tests of the pipeline zoo's list and of its probe (``scripts/pipeline_zoo_probe.py``).

The list of classes is derived from the installed diffusers; every class on it has a case or a documented reason in
``NOT_BUILT``. The probe's plumbing runs here in debug mode (``BCGConfig(debug=True)``: the graph runner keys and
"replays" every call with its segments run eagerly), against the eager twin, bitwise. The cases themselves run in
test_pipeline_zoo_run_a_cpu.py and test_pipeline_zoo_run_b_cpu.py.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
from PIL import Image

from bcg_diffusion.benchmarks.zoo import pipeline_calls, pipeline_probe, pipeline_report
from bcg_pipelines import pipeline_zoo

from _pipeline_zoo import CASES


# -- the list -----------------------------------------------------------------------------------------------------
def test_every_exported_transformer_pipeline_has_a_case_or_a_documented_reason():
    derived = set(pipeline_zoo.transformer_pipelines())
    cases = {case.pipeline for case in CASES}
    not_built, not_yet = set(pipeline_zoo.NOT_BUILT), set(pipeline_zoo.NOT_YET_BUILT)
    missing = sorted(derived - cases - not_built - not_yet)
    assert not missing, f"diffusers exports transformer pipelines the zoo neither builds nor lists: {missing}"
    assert cases <= derived, f"cases of classes that are not on the derived list: {sorted(cases - derived)}"
    assert not_built | not_yet <= derived, sorted((not_built | not_yet) - derived)
    assert not cases & (not_built | not_yet), "a class is both built and listed as not built"
    assert not not_built & not_yet
    reasons = [*pipeline_zoo.NOT_BUILT.values(), *pipeline_zoo.NOT_YET_BUILT.values()]
    assert all(len(reason) > 40 for reason in reasons), "every entry says why"
    assert len(cases) >= 0.9 * len(derived), f"{len(cases)} of {len(derived)} classes have a case"


def test_the_list_is_derived_from_components_and_reads_placeholders_from_source():
    derived = pipeline_zoo.transformer_pipelines()
    assert "FluxPipeline" in derived and "StableDiffusionPipeline" not in derived  # a UNet pipeline is not
    assert {"transformer", "transformer_2"} <= set(derived["WanPipeline"].components)
    assert derived["FluxFillPipeline"].folder == "flux" and derived["FluxFillPipeline"].importable
    consisid = derived["ConsisIDPipeline"]  # a placeholder here: opencv is missing, its source is read
    assert not consisid.importable and consisid.missing_backends == ("opencv",)
    assert "transformer" in consisid.components and consisid.folder == "consisid"


def test_cases_are_unique_and_have_groups():
    names = [case.pipeline for case in CASES]
    assert len(names) == len(set(names))
    assert all(pipeline_zoo.group_of(case) for case in CASES)
    assert len({pipeline_zoo.group_of(case) for case in CASES}) >= 30


def test_two_builds_with_one_seed_are_equal_and_another_seed_differs():
    case = pipeline_zoo.get_case("FluxFillPipeline")
    before = torch.get_rng_state()
    first, second = (pipeline_zoo.build(case, seed=3).transformer.state_dict() for _ in range(2))
    assert torch.equal(torch.get_rng_state(), before), "building changed the caller's RNG state"
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = pipeline_zoo.build(case, seed=4).transformer.state_dict()
    assert not all(torch.equal(first[k], other[k]) for k in first)
    assert all(p.any() for p in pipeline_zoo.build(case).transformer.parameters()), "an all-zero parameter is left"


def test_a_class_that_needs_ftfy_says_so_where_it_is_missing(monkeypatch):
    import importlib.util

    from bcg_pipelines.pipeline_zoo import case as case_module

    case = pipeline_zoo.get_case("WanImageToVideoPipeline")
    assert not case_module.needs_ftfy(case.pipeline_class), "ftfy is in the test extra"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ftfy" else find_spec(name, *a))
    assert case_module.needs_ftfy(case.pipeline_class)
    for guarded in ("FluxPipeline", "WanPipeline", "SanaPipeline"):  # no ftfy, or checked, or only to clean captions
        assert not case_module.needs_ftfy(pipeline_zoo.get_case(guarded).pipeline_class), guarded
    with pytest.raises(ImportError, match="pip install ftfy"):
        pipeline_zoo.build(case)
    result = pipeline_calls.probe_class(case, pipeline_calls.Settings(torch.device("cpu"), torch.float32))
    assert result.status == "missing package" and "ftfy" in result.error and not result.ran


def test_unknown_case_names_the_cases():
    with pytest.raises(KeyError, match="FluxPipeline"):
        pipeline_zoo.get_case("NoSuchPipeline")


# -- the probe's parts ----------------------------------------------------------------------------------------------
def test_output_tensors_and_bitwise_comparison():
    image = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    out = {"images": [image, torch.ones(2)], "extra": np.zeros(3, dtype=np.float32), "name": "ignored"}
    tensors = pipeline_calls.output_tensors(out)
    assert [p for p, _ in tensors] == ["out.images[0]", "out.images[1]", "out.extra"]
    assert pipeline_calls.compare_outputs(tensors, tensors) == (True, 0.0)
    changed = [(p, t.clone()) for p, t in tensors]
    changed[1][1][0] = 1 + 1e-6
    equal, diff = pipeline_calls.compare_outputs(tensors, changed)
    assert not equal and 0 < diff < 1e-5
    assert pipeline_calls.compare_outputs(tensors, tensors[:2]) == (False, None)
    minus_zero = [("x", torch.tensor([-0.0]))]
    assert not pipeline_calls.compare_outputs([("x", torch.tensor([0.0]))], minus_zero)[0], "bits, not values"


def test_callbacks_fit_each_kind_of_pipeline():
    flux = pipeline_zoo.build(pipeline_zoo.get_case("FluxPipeline"))
    kwargs, note = pipeline_calls.callback_kwargs(flux)
    assert kwargs["callback_on_step_end_tensor_inputs"] == ["latents"] and not note
    pixart = pipeline_zoo.build(pipeline_zoo.get_case("PixArtSigmaPipeline"))
    kwargs, note = pipeline_calls.callback_kwargs(pixart)
    assert set(kwargs) == {"callback", "callback_steps"} and "legacy" in note
    latents = torch.ones(2)
    kwargs["callback"](0, 999, latents)
    assert torch.equal(latents, torch.full((2,), pipeline_calls.LATENT_EDIT))
    dit_case = pipeline_zoo.get_case("DiTPipeline")
    dit = pipeline_zoo.build(dit_case)
    two, how = pipeline_calls.two_outputs_kwargs(dit_case, dit, {"class_labels": [1]})
    assert two == {"class_labels": [1, 0]} and how == "two prompts"


@pytest.mark.parametrize("name", ["FluxPipeline", "PixArtSigmaPipeline"])
def test_probe_in_debug_mode_replays_every_call_bitwise(name):
    """Debug mode on the CPU: every call after a key's first is served by the runner, equal to the eager twin."""
    settings = pipeline_calls.Settings(torch.device("cpu"), torch.float32, debug=True)
    result = pipeline_calls.probe_class(pipeline_zoo.get_case(name), settings)
    assert result.status == "replayed", (result.status, result.error, result.reason)
    assert result.eager_repeatable and result.ran
    assert [c.label for c in result.calls] == ["seed 1", "seed 2", "seed 3", "2 outputs", "callback"]
    assert all(c.bitwise for c in result.calls), [(c.label, c.max_diff) for c in result.calls]
    assert result.stats["hits"] > 0 and result.stats["eager_calls"] == 0
    assert result.calls[3].counters["warmup_calls"] == 1, "two outputs per prompt is a new key"
    assert not result.accelerate_warnings


def test_a_call_the_eager_twin_cannot_make_is_not_made():
    """Lucy Edit cannot make two videos per prompt (diffusers raises, eagerly too): that call is not made, and the
    class is judged on the others."""
    settings = pipeline_calls.Settings(torch.device("cpu"), torch.float32, debug=True)
    result = pipeline_calls.probe_class(pipeline_zoo.get_case("LucyEditPipeline"), settings)
    assert result.status == "replayed", (result.status, result.error)
    two = result.calls[3]
    assert two.label == "2 outputs" and two.bitwise is None and "eager twin raises" in two.note


def test_every_transformer_of_a_pipeline_is_taken():
    """Ideogram 4's second transformer is ``unconditional_transformer``: the probe found it left eager while
    accelerate_pipeline took only components named ``transformer...``; it takes ``*_transformer`` too now, and the
    probe would name any transformer left out."""
    settings = pipeline_calls.Settings(torch.device("cpu"), torch.float32, debug=True)
    result = pipeline_calls.probe_class(pipeline_zoo.get_case("Ideogram4Pipeline"), settings)
    assert result.status == "replayed", (result.status, result.error)
    assert result.left_eager == []


def test_calls_seed_the_global_rngs_for_pipelines_that_draw_without_their_generator():
    """SD3 ControlNet samples the control image's latents with torch's global RNG: seeded per call, it repeats."""
    case = pipeline_zoo.get_case("StableDiffusion3ControlNetPipeline")
    pipe = pipeline_zoo.build(case)
    call = pipeline_zoo.call_kwargs(case, pipe)
    first, second = (pipeline_calls.run_call(pipe, call, seed=1) for _ in range(2))
    assert pipeline_calls.compare_outputs(first, second)[0]


def test_probe_without_cuda_reports_not_accelerated_with_the_reason(tmp_path, hide_cuda):
    code = pipeline_probe.main(["--classes", "SanaSprintPipeline", "--chunk", "0", "--device", "cpu",
                                "--out", str(tmp_path)])
    assert code == 0
    (json_path,) = tmp_path.glob("pipeline_zoo_probe_*.json")
    report = json.loads(json_path.read_text())
    (record,) = report["results"]
    assert record["status"] == "not accelerated" and "CUDA" in record["reason"]
    assert all(call["bitwise"] for call in record["calls"])
    assert report["totals"]["built_and_ran"] == 1 and report["totals"]["crashes"] == 0
    markdown = json_path.with_suffix(".md").read_text()
    assert "| SanaSprintPipeline | sana | not accelerated | yes | ===== |" in markdown


def test_a_crash_is_a_result_with_its_phase(monkeypatch):
    case = pipeline_zoo.get_case("FluxPipeline")
    broken = pipeline_zoo.PipelineCase(case.pipeline, case.components, lambda m: {"prompt": 1})
    result = pipeline_calls.probe_class(broken, pipeline_calls.Settings(torch.device("cpu"), torch.float32))
    assert result.status == "crash" and result.phase == "eager" and not result.ran
    assert "Error" in result.error


def test_a_dead_child_costs_one_class(tmp_path):
    """The parent reads what a child wrote: its finished classes, and the one it was running when it died."""
    results = tmp_path / "results.jsonl"
    record = pipeline_calls.as_dict(pipeline_calls.ClassResult("FluxPipeline", "flux", status="replayed"))
    results.write_text("\n".join(json.dumps(x) for x in [{"started": "FluxPipeline"}, {"record": record},
                                                         {"started": "FluxFillPipeline"}]) + "\n")
    records, died = pipeline_probe._read_child(results, -11)
    assert [r["name"] for r in records] == ["FluxPipeline"] and died == "FluxFillPipeline"
    assert pipeline_probe._read_child(results, 0)[1] is None


def test_select_cases_names_classes_without_a_case():
    assert [c.pipeline for c in pipeline_probe.select_cases("FluxPipeline,sana_video")] == [
        "FluxPipeline", "SanaVideoPipeline", "SanaImageToVideoPipeline"]
    with pytest.raises(SystemExit, match="NOT_BUILT"):
        pipeline_probe.select_cases("OmniGenPipeline")


def test_report_totals_against_the_targets():
    def record(name, status, hits, ran=True):
        return {"name": name, "status": status, "ran": ran, "stats": {"hits": hits}, "calls": [], "phase": "",
                "error": ""}

    records = [record("A", "replayed", 4), record("B", "eager", 0), record("C", "mismatch", 2),
               record("D", "crash", 0, ran=False)]
    totals = pipeline_report.summary(records, derived=5, not_built={"E": "why"})
    assert totals["built_and_ran"] == 3 and totals["built_and_ran_share"] == 0.6
    assert totals["wrong_outputs"] == 1 and totals["crashes"] == 1
    assert totals["replayed"] == 2 and totals["replayed_share_of_ran"] == round(2 / 3, 4)


@pytest.mark.parametrize("name", ["LucyEditPipeline", "VQDiffusionPipeline"])
def test_cases_that_crashed_in_bfloat16_run_in_it(name):
    # the H100 probe of 2026-12-07: Lucy fed its float32 video to a bf16 VAE, VQ-Diffusion's numpy output has no bf16
    case = pipeline_zoo.get_case(name)
    pipe = pipeline_zoo.build(case, "cpu", torch.bfloat16)
    out = pipe(**pipeline_zoo.call_kwargs(case, pipe), generator=torch.Generator().manual_seed(0))
    assert pipeline_calls.output_tensors(out)
    if name == "LucyEditPipeline":
        assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32
    else:
        assert case.dtype == torch.float32 and pipe.transformer.dtype == torch.float32


def test_a_difference_the_eager_twin_makes_itself_is_no_verdict(monkeypatch):
    # NucleusMoE on the H100: one call of five differed, while the twin repeated only the first call; a differing call
    # is now made again on the twin, and only a difference the twin does not make itself is a wrong output
    outputs = iter([[("out", torch.zeros(2))], [("out", torch.ones(2))]])  # the accelerated call, the twin again
    monkeypatch.setattr(pipeline_calls, "run_call", lambda pipe, call, seed: next(outputs))
    monkeypatch.setattr(pipeline_calls, "counters", lambda pipe: dict.fromkeys(pipeline_calls._COUNTERS, 0))
    references = {"2 outputs": [("out", torch.full((2,), 0.5))]}
    call = pipeline_calls._compared_call(object(), object(), references, ("2 outputs", {"prompt": "a"}, 4, ""))
    assert call.bitwise is False and call.eager_repeats is False and "does not repeat this call" in call.note

    result = pipeline_calls.ClassResult("NucleusMoEImagePipeline", eager_repeatable=True,
                                        calls=[pipeline_calls.CallResult("seed 1", True), call])
    status, reason = pipeline_calls.classify(result)
    assert status == "unrepeatable" and "2 outputs" in reason and "--deterministic" in reason
    call.eager_repeats = True  # the twin repeats what the replay got wrong: a wrong output
    assert pipeline_calls.classify(result)[0] == "mismatch"


@pytest.mark.parametrize("name, why", [("Flux2KleinKVPipeline", "returns a Flux2KVCache object"),
                                       ("QwenImage21Pipeline", "changes its own input kv_cache.layer_caches[0].k")])
def test_kv_cache_pipelines_in_debug_mode_replay_the_cached_steps_and_warn_once(name, why):
    """A new KV-cache object per pipeline call: the step that fills it runs eagerly (one warning says why), the steps
    that read it are served by the runner across objects (H100, 2026-12-07: Klein KV crashed at its third call,
    Qwen-Image 2.1 made a new key every call)."""
    settings = pipeline_calls.Settings(torch.device("cpu"), torch.float32, debug=True)
    result = pipeline_calls.probe_class(pipeline_zoo.get_case(name), settings)
    assert result.status == "partial" and why in result.reason, (result.status, result.error, result.reason)
    assert all(c.bitwise for c in result.calls), [(c.label, c.max_diff) for c in result.calls]
    later = [c for c in result.calls if c.label in ("seed 2", "seed 3", "callback")]  # two outputs: new keys
    assert all(c.counters["hits"] > 0 for c in later), [(c.label, c.counters) for c in result.calls]
    assert [c.label for c in result.calls if why in c.note] == ["seed 1"]


def test_lane_i_takes_every_nth_case_and_the_lanes_run_at_once(monkeypatch):
    import threading

    started = threading.Barrier(3, timeout=10)  # three lanes: each waits until all three have started
    shares = []

    def children(share, args):
        shares.append(list(share))
        started.wait()
        for case in share:
            yield {"name": case}

    monkeypatch.setattr(pipeline_probe, "iter_in_children", children)
    records = list(pipeline_probe.iter_in_lanes(list("abcdefg"), argparse.Namespace(jobs=3)))
    assert sorted(shares) == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert sorted(r["name"] for r in records) == list("abcdefg")


def test_lanes_run_children_at_once_and_report_in_the_cases_order(tmp_path):
    names = ["FluxPipeline", "PixArtSigmaPipeline"]  # two children at once (the lanes' split: the test above)
    code = pipeline_probe.main(["--classes", ",".join(names), "--chunk", "1", "--jobs", "2", "--device", "cpu",
                                "--out", str(tmp_path)])
    assert code == 0
    (json_path,) = tmp_path.glob("pipeline_zoo_probe_*.json")
    report = json.loads(json_path.read_text())
    order = [c.pipeline for c in pipeline_probe.select_cases(",".join(names))]
    assert [r["name"] for r in report["results"]] == order
    assert {r["status"] for r in report["results"]} == {"not accelerated"}
    assert report["header"]["jobs"] == 2


@pytest.mark.parametrize("argv, words", [(["--jobs", "0"], "--jobs must be >= 1"),
                                         (["--jobs", "2", "--chunk", "0"], "give --chunk > 0 with it")])
def test_jobs_needs_children(capsys, argv, words):
    with pytest.raises(SystemExit):
        pipeline_probe.parse_args(argv)
    assert words in capsys.readouterr().err
