"""CPU tests of the full-size zoo cases (``pipelines.zoo.full``) and of ``scripts/zoo_bench.py``.

The published configs are checked against the installed classes and counted on the meta device (no memory);
the small configs run their pipeline-faithful forward on the CPU in fp32; the script runs end to end on the
small configs (acceleration is a no-op without CUDA). The GPU counterpart is ``test_zoo_bench_gpu.py``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from _scripts import load_file

from bcg_pipelines.zoo import full

CPU_ONLY = pytest.mark.usefixtures("hide_cuda")  # checks the no-CUDA path of the script (CUDA hidden where present)


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("bcg_diffusion.benchmarks.zoo.zoo_bench")


# -- the cases -------------------------------------------------------------------------------------------
def test_three_cases_with_published_configs_the_classes_take():
    assert list(full.FULL_CASES) == ["ltx2", "hunyuanvideo15", "hidream"]
    assert full._check_signatures() == []
    classes = {name: case.class_name for name, case in full.FULL_CASES.items()}
    assert classes == {"ltx2": "LTX2VideoTransformer3DModel", "hunyuanvideo15": "HunyuanVideo15Transformer3DModel",
                       "hidream": "HiDreamImageTransformer2DModel"}
    for case in full.FULL_CASES.values():
        assert case.source and case.checkpoint and case.note
        assert set(case.small_config) == set(case.config)  # the small variant changes values, not the code path


@pytest.mark.parametrize("name, billions", [("ltx2", 18.9), ("hunyuanvideo15", 8.3), ("hidream", 17.1)])
def test_full_configs_have_the_published_sizes(name, billions):
    assert full.estimated_parameters(full.FULL_CASES[name]) == pytest.approx(billions, abs=0.05)


def test_full_shapes_and_tokens_per_call():
    tokens = {name: case.tokens(case.config, case.shape_for("full")) for name, case in full.FULL_CASES.items()}
    assert tokens == {
        "ltx2": {"video": 2 * 2 * 8 * 12, "audio": 2 * 9, "text": 2 * 1024 * 2},  # 9 frames 256x384, CFG batch 2
        "hunyuanvideo15": {"video": 3 * 15 * 26, "text": 1000 + 256 + 729},  # 9 frames 240x416, batch 1
        "hidream": {"image": 2 * 32 * 32, "text": 2 * 3 * 128},  # 512x512, 64x64 latents in 2x2 patches, CFG
    }


def test_full_inputs_have_the_pipelines_widths_and_devices():
    """The full configs' inputs (no model): channel counts and text widths of the real encoders."""
    ltx2 = full.FULL_CASES["ltx2"].inputs("full", dtype=torch.bfloat16)
    assert ltx2["hidden_states"].shape == (2, 192, 128) and ltx2["audio_hidden_states"].shape == (2, 9, 128)
    assert ltx2["encoder_hidden_states"].shape == ltx2["audio_encoder_hidden_states"].shape == (2, 1024, 3840)
    assert ltx2["encoder_attention_mask"].dtype == torch.int64 and bool(ltx2["encoder_attention_mask"].all())
    assert ltx2["video_coords"].shape == (2, 3, 192, 2) and ltx2["audio_coords"].shape == (2, 1, 9, 2)
    assert ltx2["timestep"].dtype == torch.float32 and ltx2["timestep"].stride() == (0,)  # t.expand(B)
    assert (ltx2["num_frames"], ltx2["height"], ltx2["width"], ltx2["audio_num_frames"]) == (2, 8, 12, 9)
    hv = full.FULL_CASES["hunyuanvideo15"].inputs("full", dtype=torch.bfloat16)
    assert hv["hidden_states"].shape == (1, 65, 3, 15, 26) and not hv["hidden_states"][:, 32:].any()
    assert hv["encoder_hidden_states"].shape == (1, 1000, 3584) and int(hv["encoder_attention_mask"].sum()) == 64
    assert hv["encoder_hidden_states_2"].shape == (1, 256, 1472) and not hv["encoder_attention_mask_2"].any()
    assert hv["image_embeds"].shape == (1, 729, 1152) and not hv["image_embeds"].any()
    assert hv["timestep"].dtype == torch.bfloat16
    hidream = full.FULL_CASES["hidream"].inputs("full", dtype=torch.bfloat16)
    assert hidream["hidden_states"].shape == (2, 16, 64, 64)
    assert hidream["encoder_hidden_states_t5"].shape == (2, 128, 4096)
    assert hidream["encoder_hidden_states_llama3"].shape == (32, 2, 128, 4096)
    assert hidream["pooled_embeds"].shape == (2, 2048)


def _expected_shapes(name, config, shape):
    if name == "ltx2":
        frames, height, width, audio = full._ltx2_latent_shape(config, shape)
        return [(shape["batch"], frames * height * width, config["out_channels"]),
                (shape["batch"], audio, config["audio_out_channels"])]
    if name == "hunyuanvideo15":
        return [(shape["batch"], config["out_channels"], *full._hv15_latent_shape(config, shape))]
    return [(shape["batch"], config["out_channels"], *full._hidream_latent_shape(config, shape))]


@pytest.mark.parametrize("name", list(full.FULL_CASES))
def test_small_config_runs_the_pipeline_call_on_the_cpu(name):
    case = full.FULL_CASES[name]
    model = full.build_model(case, "small", "cpu", torch.float32, seed=0)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    kwargs = case.inputs("small", "cpu", torch.float32, seed=0)
    with torch.no_grad():
        out = model(**kwargs)
    config, shape = case.config_for("small"), case.shape_for("small")
    assert [tuple(t.shape) for t in out] == _expected_shapes(name, config, shape)
    assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in out)
    again = full.build_model(case, "small", "cpu", torch.float32, seed=0)  # seeded: the same weights
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_shape_overrides_change_the_derived_shapes():
    case = full.FULL_CASES["hidream"]
    assert full.parse_shape_overrides("height=1024:width=768:timestep=1.5") == {
        "height": 1024, "width": 768, "timestep": 1.5}
    kwargs = case.inputs("small", **full.parse_shape_overrides("height=256:width=128"))
    assert kwargs["hidden_states"].shape[-2:] == (32, 16)
    with pytest.raises(ValueError, match="unknown shape keys frames; the keys are batch, height"):
        case.shape_for("full", frames=3)
    with pytest.raises(ValueError, match="known cases are: ltx2, hunyuanvideo15, hidream"):
        full.get_case("flux")


# -- scripts/zoo_bench.py --------------------------------------------------------------------------------
def _docs_result_name():
    return load_file(Path(__file__).with_name("test_bench_docs.py"), "_bcg_test_bench_docs").RESULT_NAME


@CPU_ONLY
def test_bench_runs_on_the_cpu_and_writes_json_and_md(bench, tmp_path, capsys):
    assert bench.main(["--cases", "ltx2,hunyuanvideo15,hidream", "--size", "small", "--iters", "2",
                       "--out", str(tmp_path)]) == 0
    jsons, mds = sorted(tmp_path.glob("zoo_bench_*.json")), sorted(tmp_path.glob("zoo_bench_*.md"))
    assert len(jsons) == len(mds) == 1 and jsons[0].stem == mds[0].stem
    assert _docs_result_name().fullmatch(jsons[0].stem)  # docs/benchmarks.md may name the file
    report = json.loads(jsons[0].read_text())
    header = report["header"]
    assert header["device"] == "cpu" and header["size"] == "small" and header["done"] == header["total"] == 3
    assert any("no-op" in note for note in header["notes"])
    results = {r["case"]: r for r in report["results"]}
    assert list(results) == ["ltx2", "hunyuanvideo15", "hidream"]
    for r in results.values():
        assert r["status"] == "ok" and r["error"] == "" and r["params_b"] > 0 and r["tokens"] and r["shape_text"]
        assert r["eager"]["n"] == 2 and r["eager"]["median_ms"] > 0 and r["eager"]["repeatable"] is True
        assert r["bcg"]["status"] == "not accelerated" and r["bcg"]["bitwise"] == [True] * 4
        assert r["bcg"]["eager_restored"] is True and r["bcg"]["n"] == 2
        assert r["whole_graph"] == {"status": "n/a", "reason": "needs CUDA"}
        assert set(r["speedup"]) == {"bcg", "whole_graph", "limit"} and r["speedup"]["bcg"] > 0
    table = mds[0].read_text()
    assert "| case | shape | tokens per call | params (B) | eager ms | eager kernels | GPU-busy fraction" in table
    assert "| ltx2 | 9 frames 256x384 (2x8x12 latents, 9 audio latents), batch 2 (CFG), text 64 |" in table
    out = capsys.readouterr().out
    assert "hidream: 512x512" in out and "wrote " in out


def test_bench_records_a_failing_case_and_goes_on(bench, tmp_path, monkeypatch):
    build = bench.full.build_model

    def failing(case, *args, **kwargs):
        if case.name == "ltx2":
            raise ValueError("broken on purpose")
        return build(case, *args, **kwargs)

    monkeypatch.setattr(bench.full, "build_model", failing)
    bench.main(["--cases", "ltx2,hidream", "--size", "small", "--iters", "1", "--out", str(tmp_path)])
    results = json.loads(next(tmp_path.glob("*.json")).read_text())["results"]
    assert [(r["case"], r["status"], r["phase"]) for r in results] == [
        ("ltx2", "error", "build"), ("hidream", "ok", "")]
    assert results[0]["error"].startswith("ValueError: broken on purpose")
    assert "| ltx2 |" in next(tmp_path.glob("*.md")).read_text()


def test_bench_time_budget_skips_the_rest(bench, tmp_path):
    bench.main(["--cases", "hidream", "--size", "small", "--time-budget", "-1", "--out", str(tmp_path)])
    results = json.loads(next(tmp_path.glob("*.json")).read_text())["results"]
    assert [(r["case"], r["status"], r["error"]) for r in results] == [("hidream", "skipped", "time budget -1 s spent")]


def test_bench_bad_case_names_the_known_ones(bench):
    with pytest.raises(SystemExit, match="unknown case 'flux'; the known cases are: ltx2, hunyuanvideo15, hidream"):
        bench.parse_cases("ltx2,flux")
    with pytest.raises(SystemExit, match="unknown shape keys frames"):
        bench.parse_cases("hidream:frames=3")
    with pytest.raises(SystemExit, match="known cases"):
        bench.main(["--cases", "nope"])
    assert bench.parse_cases("ltx2, hidream:height=1024:width=1024") == [
        ("ltx2", {}), ("hidream", {"height": 1024, "width": 1024})]


def test_bench_calls_per_mode(bench):
    assert bench.calls_for(0.5, 20, 3.0) == 6
    assert bench.calls_for(2.0, 20, 3.0) == 3  # at least 3
    assert bench.calls_for(0.001, 20, 3.0) == 20  # at most --iters
    assert bench.calls_for(0.5, 2, 3.0) == 2  # --iters below 3 wins
