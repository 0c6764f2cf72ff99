"""CPU tests of the user-facing scripts: scripts/generate.py and scripts/bench_step.py.

They call each script's ``main([...])`` in-process on the tiny random-weight pipelines.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"generate": "bcg_diffusion.cli.generate", "bench_step": "bcg_diffusion.benchmarks.step.bench_step"}
CPU_ONLY = pytest.mark.usefixtures("hide_cuda")  # checks the no-CUDA path of the script (CUDA hidden where present)
ACROSS_KIND = "across_processes"  # the "kind" of a --processes summary (scripts/bench/across.py)


def _load(name: str):
    return importlib.import_module(TOOLS[name])


@pytest.fixture(scope="module")
def generate():
    return _load("generate")


@pytest.fixture(scope="module")
def bench():
    return _load("bench_step")


# ---------------------------------------------------------------------------------------------------------
# generate.py: arguments
# ---------------------------------------------------------------------------------------------------------
def test_generate_defaults(generate):
    from bcg_diffusion.cli import args as generate_args

    args = generate_args.build_parser().parse_args([])
    assert args.model == generate_args.DEFAULT_MODEL == "flux"
    assert args.size == "tiny"
    assert (args.batch, args.seed) == (1, 0)
    assert args.steps is None and args.height is None and args.guidance is None
    assert not (args.bcg or args.compare or args.compile or args.debug_cuda_graph)
    assert args.prompt


def test_generate_bad_family_names_the_families(generate, capsys):
    assert generate.main(["--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "known families" in err
    for family in ("flux", "pixart", "sd3"):
        assert family in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--height", "65"], "multiples of"),
        (["--model", "pixart", "--width", "100"], "multiples of"),
        (["--steps", "0"], "--steps must be in 1 .. 100 (got 0)"),
        (["--batch", "0"], "--batch must be in 1 .. 64 (got 0)"),
        (["--frames", "5"], "makes images"),
        (["--out", "video.mp4"], "use one of"),
        (["--attention-backend", "no-such-backend"], "not a diffusers backend"),
        (["--size", "huge"], "invalid choice"),
    ],
)
def test_generate_bad_arguments_exit_2(generate, capsys, argv, needle):
    assert generate.main(argv) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_generate_seed_out_of_range_exits_2(generate, capsys, seed):
    assert generate.main(["--seed", seed]) == 2
    assert "--seed must be in 0 .. 2**64 - 1" in capsys.readouterr().err


def test_generate_unwritable_out_fails_before_building(generate, tmp_path, capsys, no_build):
    not_a_folder = tmp_path / "file.txt"
    not_a_folder.write_text("x")
    (tmp_path / "taken.png").mkdir()
    for out in (not_a_folder / "sub" / "fox.png", tmp_path / "taken.png"):
        assert generate.main(["--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "cannot be written" in err and str(out) in err, err


@CPU_ONLY
def test_generate_full_size_without_cuda_says_the_memory_and_wants_yes(generate, capsys, monkeypatch, no_build):
    assert generate.main(["--model", "flux", "--size", "full"]) == 2
    err = capsys.readouterr().err
    assert "--size full without CUDA" in err and "--yes" in err
    assert re.search(r"11\.9B transformer .* about \d+ GiB of memory in float32", err), err

    import bcg_pipelines as pipelines

    def sentinel(*args, **kwargs):
        raise RuntimeError("sentinel: the build was reached")

    monkeypatch.setattr(pipelines, "build_pipeline", sentinel)
    assert generate.main(["--model", "flux", "--size", "full", "--yes"]) == 1
    assert "sentinel: the build was reached" in capsys.readouterr().err


def test_generate_list_models(generate, capsys):
    assert generate.main(["--list-models"]) == 0
    out = capsys.readouterr().out
    assert "flux" in out and "pixart" in out


# ---------------------------------------------------------------------------------------------------------
# generate.py: runs on the tiny pipelines
# ---------------------------------------------------------------------------------------------------------
def test_generate_tiny_writes_pngs_of_the_requested_size(generate, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "fox.png"
    rc = generate.main(["--model", "flux", "--height", "48", "--width", "80", "--steps", "3", "--batch", "2",
                        "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    files = [tmp_path / "fox_0.png", tmp_path / "fox_1.png"]
    for f in files:
        assert f.exists(), text
        assert Image.open(f).size == (80, 48)
        assert f"wrote {f}" in text
    assert "3 steps, median step" in text and "total" in text


@CPU_ONLY
def test_generate_compare_on_cpu_says_bcg_needs_cuda(generate, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert generate.main(["--compare", "--steps", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("BCG needs a CUDA GPU") == 1, text
    assert "(no speed-up to expect: both runs were eager on this machine)" in text, text  # says what YES means here
    assert "outputs bitwise identical: YES" in text
    assert out.exists() and (tmp_path / "cmp_bcg.png").exists()


@CPU_ONLY
def test_generate_bcg_on_cpu_is_a_noop(generate, tmp_path, capsys):
    eager, accel = tmp_path / "eager.png", tmp_path / "bcg.png"
    assert generate.main(["--model", "pixart", "--steps", "2", "--height", "64", "--width", "64", "--out", str(eager)]) == 0
    assert generate.main(["--model", "pixart", "--steps", "2", "--height", "64", "--width", "64", "--bcg",
                          "--out", str(accel)]) == 0
    text = capsys.readouterr().out
    assert "BCG needs a CUDA GPU" in text
    assert eager.read_bytes() == accel.read_bytes()


def test_step_timer_sees_through_a_call_wrapper(generate):
    """accelerate_pipeline gives the pipeline a subclass whose __call__ is (*args, **kwargs); the step
    callback must still be found (PixArt-Sigma: the legacy ``callback``)."""
    import bcg_pipelines as pipelines

    pipe = pipelines.build_pipeline("pixart", "tiny", device="cpu")
    cls = type(pipe)
    pipe.__class__ = type(cls.__name__, (cls,), {"__call__": lambda self, *a, **k: cls.__call__(self, *a, **k)})
    assert "callback" in pipelines.call_parameters(pipe)
    from bcg_diffusion.toolkit.timed_run import run_pipeline

    result = run_pipeline(pipe, {"prompt": "x", "num_inference_steps": 3, "height": 64, "width": 64,
                                          "clean_caption": False}, 0, torch.device("cpu"), "wrapped")
    assert len(result.step_times) == 3 and result.latents is not None


# ---------------------------------------------------------------------------------------------------------
# bench_step.py
# ---------------------------------------------------------------------------------------------------------
def test_bench_parse_case(bench):
    c = bench.parse_case("pixart:full:512x512:b2")
    assert (c.family, c.size, c.height, c.width, c.frames, c.batch) == ("pixart", "full", 512, 512, None, 2)
    c = bench.parse_case("wan:full:480x832:f81:b1")
    assert (c.height, c.width, c.frames, c.batch) == (480, 832, 81, 1)
    c = bench.parse_case("wan:tiny:32x32x9")
    assert (c.size, c.frames, c.batch) == ("tiny", 9, 1)
    assert bench.parse_case("flux").label == "flux:full:b1"
    with pytest.raises(ValueError, match="cannot read"):
        bench.parse_case("flux:big")


def test_bench_default_matrix_covers_the_families(bench):
    families = {bench.parse_case(c).family for c in bench.DEFAULT_CASES}
    assert {"pixart", "sd3", "sana", "wan", "flux", "qwenimage"} <= families
    for text in bench.DEFAULT_CASES:
        assert bench.parse_case(text).size == "full"
    # per family: one launch-bound shape with every mode and the end-to-end row, one compute-bound shape
    for family in families:
        entries = [e for e in bench.DEFAULT_MATRIX if bench.parse_case(e[0]).family == family]
        assert len(entries) == 2, entries
        assert sorted(e[1] == bench.DEFAULT_MODES for e in entries) == [False, True], entries
        assert all(e[2] == (e[1] == bench.DEFAULT_MODES) for e in entries), entries
        assert all({"eager", "bcg", "whole_graph", "compile", "compile_bcg"} <= set(e[1]) for e in entries)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7])
def test_bench_shards_split_the_matrix_by_family(bench, n):
    texts = list(bench.DEFAULT_CASES)
    shards = [bench.shard_cases(texts, k, n) for k in range(1, n + 1)]
    assert sorted(i for shard in shards for i in shard) == list(range(len(texts)))  # each case exactly once
    for shard in shards:
        for i in shard:  # a family's shapes stay together
            family = texts[i].split(":")[0]
            assert all(j in shard for j, t in enumerate(texts) if t.split(":")[0] == family)
    if n == 3:  # the split docs/benchmarks.md describes
        assert [{texts[i].split(":")[0] for i in shard} for shard in shards] == [
            {"pixart", "qwenimage"}, {"sd3", "flux"}, {"sana", "wan"}]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0"])
def test_bench_bad_shard(bench, text, capsys):
    with pytest.raises(ValueError, match="K/N"):
        bench.parse_shard(text)
    assert bench.main(["--shard", text]) == 2
    assert "--shard" in capsys.readouterr().err


def test_bench_auto_iters(bench):
    assert bench.auto_iters(0.001) == bench.DEFAULT_ITERS  # fast steps: the cap
    assert bench.auto_iters(10.0) == bench.MIN_AUTO_ITERS  # slow steps: the floor
    mid = bench.AUTO_ROUND_S / 7
    assert bench.auto_iters(mid) == 7


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--modes", "eager,turbo"], "unknown mode"),
        (["--cases", "no-such-model:tiny"], "unknown family"),
        (["--cases", "flux:full:1000x1000"], "multiples of"),
        (["--iters", "0"], "--iters must be >= 1"),
        (["--cases", ","], "names no case"),
        (["--modes", ","], "unknown mode"),
    ],
)
def test_bench_bad_arguments_exit_2(bench, capsys, argv, needle):
    assert bench.main(argv) == 2
    assert needle in capsys.readouterr().err


@CPU_ONLY
def test_bench_cpu_run_writes_json_markdown_png(bench, tmp_path, capsys):
    rc = bench.main(["--cases", "flux:tiny", "--iters", "2", "--rounds", "2", "--warmup", "1", "--e2e-steps", "2",
                     "--out-dir", str(tmp_path)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "no CUDA GPU" in text
    jsons, mds, pngs = (sorted(tmp_path.glob(f"bench_step_*.{ext}")) for ext in ("json", "md", "png"))
    assert len(jsons) == len(mds) == len(pngs) == 1
    report = json.loads(jsons[0].read_text())
    env = report["environment"]
    for key in ("date", "torch", "diffusers", "cuda", "gpu"):
        assert key in env
    (case,) = report["cases"]
    assert case["case"] == "flux:tiny:64x64:b1" and case["error"] is None
    modes = case["modes"]
    assert set(modes) == set(bench.DEFAULT_MODES)  # --cases without --modes: the six default modes
    assert modes["eager"]["status"] == "ok" and modes["eager"]["n"] == 4 and modes["eager"]["median_ms"] > 0
    assert modes["eager"]["repeatable"] is True  # a second eager call equals the first (else "= eager" cannot hold)
    for mode in set(bench.CUDA_ONLY) & set(bench.DEFAULT_MODES):
        assert modes[mode]["status"] == "n/a" and modes[mode]["reason"] == "needs CUDA"
    assert modes["compile"]["torch_compile"] is True and modes["eager"]["torch_compile"] is False
    assert case["e2e"]["steps"] == 2 and case["e2e"]["eager_s"] > 0
    md = mds[0].read_text()
    assert "| flux:tiny:64x64:b1 | eager |" in md and "needs CUDA" in md
    assert pngs[0].stat().st_size > 0


@CPU_ONLY
def test_bench_without_matplotlib_writes_json_markdown_and_one_line(bench, tmp_path, capsys, monkeypatch):
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib` now raises ImportError
    rc = bench.main(["--cases", "flux:tiny", "--modes", "eager", "--iters", "1", "--rounds", "1", "--warmup", "1",
                     "--no-e2e", "--out-dir", str(tmp_path)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "chart" in line] == [bench.CHART_NEEDS_MATPLOTLIB], lines
    assert 'pip install -e ".[bench]"' in bench.CHART_NEEDS_MATPLOTLIB
    assert len(list(tmp_path.glob("bench_step_*.json"))) == len(list(tmp_path.glob("bench_step_*.md"))) == 1
    assert not list(tmp_path.glob("*.png"))


def test_bench_chart_legend_is_outside_the_bars(bench):
    from bcg_diffusion.benchmarks.step.chart import draw_chart

    modes = {m: {"median_ms": 1.0, "speedup_vs_eager": 1.0 + i, "torch_compile": False}
             for i, m in enumerate(bench.MODES)}
    report = {"environment": {"gpu": None, "date": "2026-01-01"},
              "cases": [{"case": f"case{i}", "modes": modes} for i in range(3)]}
    fig = draw_chart(report)
    fig.canvas.draw()
    (ax,) = fig.axes
    legend, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert not legend.overlaps(axes_box), (legend, axes_box)  # so it covers no bar, whatever their heights


@pytest.mark.parametrize(
    "drop, field",
    [(("settings", "rounds"), "settings.rounds"), (("environment", "gpu"), "environment.gpu"),
     (("cases", 0, "modes"), "cases[0].modes"), (("cases",), "cases")],
)
def test_bench_merge_names_the_missing_field(bench, tmp_path, capsys, drop, field):
    report = {"environment": {k: None for k in ("date", "gpu", "torch", "cuda", "diffusers", "dtype", "git_commit")},
              "settings": {"iters": 1, "rounds": 1, "warmup": 1}, "cases": [{"case": "x", "modes": {}}]}
    part = report
    for key in drop[:-1]:
        part = part[key]
    del part[drop[-1]]
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert bench.main(["--merge", str(tmp_path / "r.json"), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"has no field {field}" in err and "r.json" in err, err


def test_bench_merge_reads_the_committed_results(bench, tmp_path):
    """Result files written by earlier versions of the benchmark still merge."""
    results = sorted((ROOT / "bench_results").glob("bench_step_*.json"))
    summaries = [p for p in results if json.loads(p.read_text()).get("kind") == ACROSS_KIND]
    assert results and len(summaries) < len(results)
    for path in results:
        if path in summaries:  # an across-process summary is refused: its per-process files are what merges
            assert bench.main(["--merge", str(path), "--out-dir", str(tmp_path)]) == 2, path
        else:
            assert bench.main(["--merge", str(path), "--out-dir", str(tmp_path)]) == 0, path


def test_bench_kernel_summary_counts_kernels_and_busy_time(bench):
    from bcg_diffusion.benchmarks.timing import kernel_summary

    events = [("gemm", 0.0, 10.0), ("Memcpy HtoD", 5.0, 12.0), ("softmax", 20.0, 25.0), ("Memset (Device)", 21.0, 22.0)]
    assert kernel_summary(events) == {"kernels": 2, "memory_ops": 2, "kernel_time_ms": 0.015, "gpu_busy_ms": 0.017}


@CPU_ONLY
def test_bench_cpu_bcg_mode_runs_as_noop(bench, tmp_path):
    assert bench.main(["--cases", "pixart:tiny", "--modes", "eager,bcg", "--iters", "2", "--rounds", "2",
                       "--warmup", "1", "--e2e-steps", "2", "--out-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("bench_step_*.json")).read_text())
    (case,) = report["cases"]
    bcg = case["modes"]["bcg"]
    assert bcg["status"] == "ok" and bcg["n"] == 4, bcg
    assert bcg["bitwise_equal_to_eager"] is True
    assert case["e2e"]["bitwise_equal_to_eager"] is True and case["e2e"]["bcg_second_s"] > 0


@CPU_ONLY
def test_bench_shards_merge_into_one_report(bench, tmp_path, capsys):
    runs = tmp_path / "runs"
    common = ["--iters", "2", "--rounds", "1", "--warmup", "1", "--e2e-steps", "1", "--modes", "eager,bcg",
              "--out-dir", str(runs)]
    assert bench.main(["--cases", "pixart:tiny,sd3:tiny", "--shard", "2/2", *common]) == 0
    assert bench.main(["--cases", "pixart:tiny,sd3:tiny", "--shard", "1/2", *common]) == 0
    files = sorted(runs.glob("bench_step_*.json"))
    assert len(files) == 2
    assert [c["case"] for c in json.loads(files[0].read_text())["cases"]] == ["sd3:tiny:64x64:b1"]
    merged_dir = tmp_path / "merged"
    assert bench.main(["--merge", *map(str, files), "--out-dir", str(merged_dir)]) == 0
    report = json.loads(next(merged_dir.glob("*.json")).read_text())
    assert sorted(c["case"] for c in report["cases"]) == ["pixart:tiny:256x256:b1", "sd3:tiny:64x64:b1"]
    assert [m["shard"] for m in report["merged_from"]] == ["2/2", "1/2"]
    md = next(merged_dir.glob("*.md")).read_text()
    assert "Merged from" in md and "| sd3:tiny:64x64:b1 | bcg |" in md and "| pixart:tiny:256x256:b1 | eager |" in md
    assert next(merged_dir.glob("*.png")).stat().st_size > 0
    # a case in two files, and files from different code, are refused
    capsys.readouterr()
    assert bench.main(["--merge", str(files[0]), str(files[0]), "--out-dir", str(merged_dir)]) == 2
    assert "is in both" in capsys.readouterr().err
    other = json.loads(files[1].read_text())
    other["environment"]["git_commit"] = "0000000"
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert bench.main(["--merge", str(files[0]), str(tmp_path / "other.json"), "--out-dir", str(merged_dir)]) == 2
    assert "git_commit" in capsys.readouterr().err
    assert bench.main(["--merge", str(files[0]), str(tmp_path / "other.json"), "--allow-different-commits",
                       "--out-dir", str(tmp_path / "mixed")]) == 0
    mixed = json.loads(next((tmp_path / "mixed").glob("*.json")).read_text())
    assert "0000000" in mixed["environment"]["git_commit"] and "+" in mixed["environment"]["git_commit"]
    assert bench.main(["--merge", str(tmp_path / "missing.json")]) == 2


@CPU_ONLY
def test_bench_time_budget_reports_cases_not_run(bench, tmp_path):
    assert bench.main(["--cases", "pixart:tiny,sd3:tiny,flux:tiny", "--modes", "eager", "--iters", "1", "--rounds", "1",
                       "--warmup", "1", "--no-e2e", "--time-budget", "1e-9", "--out-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [c["case"] for c in report["cases"]] == ["pixart:tiny:256x256:b1"]  # the first case always runs
    assert report["not_run"] == ["sd3:tiny:64x64:b1", "flux:tiny:64x64:b1"]
    assert "Not run (time budget spent): sd3:tiny:64x64:b1, flux:tiny:64x64:b1" in next(tmp_path.glob("*.md")).read_text()


def test_bench_commit_given_by_the_environment_wins(bench, monkeypatch):
    import torch

    monkeypatch.setenv("BENCH_GIT_COMMIT", "abc1234")
    assert bench.environment(torch.device("cpu"), torch.float32, False)["git_commit"] == "abc1234"


@CPU_ONLY
def test_bench_merge_drops_not_run_cases_that_ran_elsewhere(bench, tmp_path):
    common = ["--modes", "eager", "--iters", "1", "--rounds", "1", "--warmup", "1", "--no-e2e"]
    assert bench.main(["--cases", "pixart:tiny,sd3:tiny", "--time-budget", "1e-9", *common,
                       "--out-dir", str(tmp_path / "a")]) == 0
    assert bench.main(["--cases", "sd3:tiny", *common, "--out-dir", str(tmp_path / "b")]) == 0
    files = [str(next((tmp_path / d).glob("*.json"))) for d in ("a", "b")]
    assert json.loads(open(files[0]).read())["not_run"] == ["sd3:tiny:64x64:b1"]
    assert bench.main(["--merge", *files, "--out-dir", str(tmp_path / "m")]) == 0
    merged = json.loads(next((tmp_path / "m").glob("*.json")).read_text())
    assert merged["not_run"] == [] and len(merged["cases"]) == 2


# ---------------------------------------------------------------------------------------------------------
# generate.py --cache and --quant; the [quant] extra
# ---------------------------------------------------------------------------------------------------------
COUNTS_LINE = re.compile(r"^    step cache: (\d+) module passes computed, (\d+) reused \(of (\d+)\)$", re.M)


def _count_lines(text: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, m)) for m in COUNTS_LINE.findall(text)]


@pytest.mark.parametrize("model, spec", [("flux", "fbc:0.5"), ("flux", "taylorseer:2"), ("flux", "magcache"),
                                          ("flux", "pab:2"), ("cogvideox", "fastercache:2"), ("pixart", "magcache")])
def test_generate_cache_prints_the_passes_computed_and_reused(generate, tmp_path, capsys, model, spec):
    out = tmp_path / ("v.gif" if model == "cogvideox" else "i.png")
    assert generate.main(["--model", model, "--cache", spec, "--steps", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    (counts,) = _count_lines(text)  # one run, one line
    computed, reused, total = counts
    assert total > 0 and computed > 0 and computed + reused == total, text
    assert f"(--cache {spec})" in text  # the cache config was applied and said so


@CPU_ONLY
def test_generate_cache_counts_both_runs_of_compare(generate, tmp_path, capsys):
    out = tmp_path / "c.png"
    assert generate.main(["--cache", "fbc:0.5", "--steps", "4", "--compare", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    eager, accel = _count_lines(text)
    assert eager == accel and eager[1] > 0, text  # the same decisions in both runs, some passes reused
    # without CUDA both runs are eager: YES says that the cache state was reset between the two runs
    assert "(no speed-up to expect: both runs were eager on this machine)" in text, text
    assert "outputs bitwise identical: YES" in text


@CPU_ONLY
def test_generate_compare_in_debug_mode_runs_the_graph_runner_on_the_cpu(generate, tmp_path, capsys):
    """--debug-cuda-graph on the CPU: the BCG run goes through the graph runner (keys, breaks, static
    inputs, copies; segments run eagerly), and --compare checks it against the eager run."""
    assert generate.main(["--steps", "3", "--compare", "--debug-cuda-graph", "--out", str(tmp_path / "d.png")]) == 0
    text = capsys.readouterr().out
    assert "outputs bitwise identical: YES" in text, text
    counts = _bcg_counts(text)  # tiny Flux, 3 steps, one call per step: one first call, then replays
    assert (counts["calls"], counts["first"], counts["replayed"], counts["eager"]) == (3, 1, 2, 0), text
    assert counts["captures"] == 1 and counts["failed"] == 0, text


def test_generate_cache_off_prints_no_counts(generate, tmp_path, capsys):
    assert generate.main(["--steps", "2", "--out", str(tmp_path / "n.png")]) == 0
    assert "step cache:" not in capsys.readouterr().out


@pytest.mark.parametrize("spec, needle", [("bogus", "unknown cache 'bogus'"), ("fbc:abc", "must be a number"),
                                          ("fbc:-1", "must be positive")])
def test_generate_unknown_cache_spec_exits_2(generate, capsys, no_build, spec, needle):
    assert generate.main(["--cache", spec]) == 2
    err = capsys.readouterr().err
    assert "--cache" in err and needle in err, err


@pytest.mark.parametrize("model, spec, why", [
    ("pixart", "fbc", "opens no transformer.cache_context"),
    ("sd3", "pab", "has no current_timestep"),
    ("flux", "fastercache", "one batched call"),
    ("qwenimage", "pab:2", "text length"),
    ("sana", "magcache", "TransformerBlockRegistry"),
])
def test_generate_cache_on_a_family_it_cannot_run_on_exits_2(generate, capsys, no_build, model, spec, why):
    import bcg_diffusion.toolkit.cache_option as caches

    assert generate.main(["--model", model, "--cache", spec]) == 2
    err = capsys.readouterr().err
    name = spec.split(":")[0]
    assert f"cannot run on {model}" in err and why in err, err
    assert "It runs on: " + ", ".join(caches.CACHE_FAMILIES[name]) in err, err


def _no_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao...` raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)


@pytest.mark.parametrize("name", ["fp8", "fp8wo", "int8wo", "int8"])
def test_generate_quant_without_torchao_exits_2_with_the_install_hint(generate, capsys, monkeypatch, no_build, name):
    from bcg_diffusion.toolkit.quant_option import INSTALL_HINT

    _no_torchao(monkeypatch)
    assert generate.main(["--quant", name]) == 2
    err = capsys.readouterr().err
    assert INSTALL_HINT in err and f"--quant {name}" in err, err


def test_generate_quant_unknown_name_exits_2(generate, capsys, no_build):
    assert generate.main(["--quant", "int4"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name, config", [("int8wo", "Int8WeightOnlyConfig"),  # fp8 needs CUDA: exit 2 on a CPU
                                          ("int8", "Int8DynamicActivationInt8WeightConfig")])
def test_generate_quant_quantizes_the_transformer_after_the_build(generate, tmp_path, capsys, monkeypatch, fake_torchao,
                                                                  name, config):
    import bcg_pipelines as pipelines

    built = []
    real_build = pipelines.build_pipeline

    def build(*args, **kwargs):
        pipe = real_build(*args, **kwargs)
        built.append(pipe)
        return pipe

    monkeypatch.setattr(pipelines, "build_pipeline", build)
    assert generate.main(["--quant", name, "--cache", "fbc", "--steps", "2", "--out", str(tmp_path / "q.png")]) == 0
    text = capsys.readouterr().out
    (pipe,) = built
    # once, on the built pipeline's transformer, with the config, which leaves Inductor's settings alone
    assert fake_torchao == [(pipe.transformer, config, False)]
    assert f"torchao quantize_(transformer, {config}())" in text
    assert ("run eagerly as breaks" in text) == (name == "int8")  # int8 dynamic's Linear layers cannot be captured: said
    assert len(_count_lines(text)) == 1


@pytest.mark.parametrize("name", ["int8wo", "int8"])
def test_quantize_leaves_inductor_settings_alone(name):
    """torchao's configs switch on coordinate-descent tuning for the whole process by default (a 7x slower
    first compile of Flux fp8 on the H200); ours do not (real torchao, on a tiny CPU model)."""
    import torch._inductor.config as inductor_config

    from bcg_diffusion.toolkit.quant_option import quantize

    keys = ("coordinate_descent_tuning", "coordinate_descent_check_all_directions")
    with inductor_config.patch(dict.fromkeys(keys, False)):  # off before, whatever ran earlier; restored after
        quantize(torch.nn.Sequential(torch.nn.Linear(64, 64)).to(torch.bfloat16), name)
        after = {key: getattr(inductor_config, key) for key in keys}
    assert after == dict.fromkeys(keys, False)


def test_pyproject_quant_extra_pins_torchao():
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [Requirement(r) for r in project["optional-dependencies"]["quant"]]
    assert req.name == "torchao"
    assert "0.17.0" in req.specifier and "0.18.1" in req.specifier  # 0.17.0 runs with torch 2.11 on the GPU machine
    assert "0.16.0" not in req.specifier and "0.19.0" not in req.specifier
    from bcg_diffusion.toolkit.quant_option import INSTALL_HINT

    assert 'pip install -e ".[quant]"' in INSTALL_HINT  # the hint names this extra


# ---------------------------------------------------------------------------------------------------------
# generate.py: the size the transformer ran, resolution binning
# ---------------------------------------------------------------------------------------------------------
def _size_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("  size: ")]
    return line


def test_generate_names_the_size_the_transformer_ran(generate, tmp_path, capsys):
    assert generate.main(["--steps", "2", "--height", "48", "--width", "80", "--out", str(tmp_path / "f.png")]) == 0
    # Flux packs 2x2 latent patches: 48x80 px -> 6x10 latents -> 3x5 = 15 tokens of 64 channels
    assert _size_line(capsys.readouterr().out) == (
        "  size: asked 80x48 px (WxH); the transformer ran 15 tokens (hidden_states 1x15x64)")


def test_generate_says_when_resolution_binning_ran_another_size(generate, tmp_path, capsys):
    from PIL import Image

    common = ["--model", "pixart", "--steps", "2", "--height", "64", "--width", "64"]
    assert generate.main([*common, "--out", str(tmp_path / "binned.png")]) == 0
    text = capsys.readouterr().out
    # the tiny PixArt (sample size 32) bins every request to 256 px: 32x32 latents, CFG batch 2
    assert "the transformer ran 32x32 latents (WxH; 256 tokens at patch 2; hidden_states 2x4x32x32)" in _size_line(text)
    assert ("  PixArtSigmaPipeline's resolution binning ran 256x256 and resized to 64x64 (WxH); "
            "--no-resolution-binning runs 64x64") in text.splitlines()
    assert generate.main([*common, "--no-resolution-binning", "--out", str(tmp_path / "exact.png")]) == 0
    text = capsys.readouterr().out
    assert "use_resolution_binning=False" in text
    assert "the transformer ran 8x8 latents (WxH; 16 tokens at patch 2; hidden_states 2x4x8x8)" in _size_line(text)
    assert "resolution binning ran" not in text
    for name in ("binned.png", "exact.png"):  # both resized / generated at the asked size
        assert Image.open(tmp_path / name).size == (64, 64)


def test_generate_no_resolution_binning_where_the_pipeline_does_not_bin_exits_2(generate, capsys, no_build):
    assert generate.main(["--model", "flux", "--no-resolution-binning"]) == 2
    err = capsys.readouterr().err
    assert "--no-resolution-binning: FluxPipeline does not bin resolutions" in err, err


@pytest.mark.parametrize("shapes, config, text", [
    ((2, 4, 64, 64), {"in_channels": 4, "patch_size": 2},
     "64x64 latents (WxH; 1024 tokens at patch 2; hidden_states 2x4x64x64)"),
    ((1, 4096, 64), {"in_channels": 64, "patch_size": 1}, "4096 tokens (hidden_states 1x4096x64)"),
    ((1, 16, 9, 60, 104), {"in_channels": 16, "patch_size": (1, 2, 2)},
     "9 frames of 104x60 latents (WxH; 14040 tokens at patch 1x2x2; hidden_states 1x16x9x60x104)"),
    ((2, 9, 16, 60, 90), {"in_channels": 16, "patch_size": 2, "patch_size_t": None},  # CogVideoX: frames first
     "9 frames of 90x60 latents (WxH; 12150 tokens at patch 1x2x2; hidden_states 2x9x16x60x90)"),
    (((16, 1, 128, 96),), {"in_channels": 16, "all_patch_size": (2,), "all_f_patch_size": (1,)},  # Z-Image: a list
     "96x128 latents (WxH; 3072 tokens at patch 2; hidden_states a list of 1: 16x1x128x96)"),
])
def test_ran_size_reads_each_layout(shapes, config, text):
    from bcg_diffusion.toolkit.timed_run import ran_size

    assert ran_size(shapes, config).describe() == text


def test_input_shapes_hook_is_removed_after_the_run():
    from bcg_diffusion.toolkit.timed_run import InputShapes

    module = torch.nn.Linear(3, 3)
    with InputShapes(module) as seen:
        module(torch.zeros(2, 3))
        module(input=torch.zeros(5, 3))  # not a name it reads: the first positional argument is absent
        module(torch.zeros(2, 3))
    assert seen.shapes == [(2, 3)]
    assert not module._forward_pre_hooks
    module(torch.zeros(4, 3))
    assert seen.shapes == [(2, 3)]


# ---------------------------------------------------------------------------------------------------------
# generate.py --warmup
# ---------------------------------------------------------------------------------------------------------
def test_generate_warmup_leaves_the_image_bitwise_the_same(generate, tmp_path, capsys):
    plain, warmed = tmp_path / "plain.png", tmp_path / "warmed.png"
    assert generate.main(["--steps", "3", "--out", str(plain)]) == 0
    assert "warm-up" not in capsys.readouterr().out
    assert generate.main(["--steps", "3", "--warmup", "--out", str(warmed)]) == 0
    text = capsys.readouterr().out
    assert "warm-up before the eager run: bcg_diffusion.warmup at 64x64 (WxH)" in text
    assert "  warm-up: 1 shape(s), 0 graph key(s) captured" in text  # str(WarmupReport), indented
    assert re.search(r"first step after the warm-up: [\d.]+ ms, [\d.]+x the median step", text), text
    assert plain.read_bytes() == warmed.read_bytes()


def test_generate_warmup_passes_the_sizes_and_the_run_settings(generate, tmp_path, capsys, monkeypatch):
    import bcg_diffusion

    seen = []

    def fake_warmup(pipe, shapes, **call):
        seen.append((shapes, call))
        return bcg_diffusion.WarmupReport((), 0.25, 2)

    monkeypatch.setattr(bcg_diffusion, "warmup", fake_warmup)
    assert generate.main(["--steps", "2", "--batch", "2", "--warmup", "80x48,64x64", "--compare",
                          "--out", str(tmp_path / "w.png")]) == 0
    text = capsys.readouterr().out
    assert len(seen) == 2  # before the eager run and before the BCG run
    for shapes, call in seen:
        assert shapes == [{"height": 48, "width": 80}, {"height": 64, "width": 64}]  # WxH, width first
        assert call["num_images_per_prompt"] == 2 and call["guidance_scale"] == 3.5 and call["prompt"]
        assert not {"height", "width", "num_inference_steps"} & set(call)
    assert "warm-up before the eager run: 0 shape(s), 0 graph key(s) captured, 0.25 s" in text
    assert "warm-up before the bcg (inactive: no CUDA) run:" in text


def test_generate_warmup_of_a_video_family_keeps_the_run_frames(generate, tmp_path, monkeypatch):
    import bcg_diffusion

    seen = []
    monkeypatch.setattr(bcg_diffusion, "warmup",
                        lambda pipe, shapes, **call: seen.append(shapes) or bcg_diffusion.WarmupReport((), 0.0, 2))
    assert generate.main(["--model", "wan", "--steps", "1", "--frames", "5", "--warmup", "48x32,32x32x9",
                          "--out", str(tmp_path / "v.gif")]) == 0
    assert seen == [[{"height": 32, "width": 48, "num_frames": 5}, {"height": 32, "width": 32, "num_frames": 9}]]


@pytest.mark.parametrize("argv, needle", [
    (["--warmup", "big"], "cannot read 'big'; give sizes as WxH"),
    (["--warmup", "64x64,"], "cannot read ''"),
    (["--warmup", "64x65"], "multiples of"),
    (["--warmup", "64x64x9"], "makes images; give WxH"),
    (["--model", "wan", "--warmup", "32x32x6"], "--warmup 32x32x6"),
])
def test_generate_bad_warmup_sizes_exit_2(generate, capsys, no_build, argv, needle):
    assert generate.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err


# ---------------------------------------------------------------------------------------------------------
# generate.py --compile-cache
# ---------------------------------------------------------------------------------------------------------
def test_generate_compile_cache_needs_compile(generate, tmp_path, capsys, no_build):
    assert generate.main(["--compile-cache", str(tmp_path / "cc")]) == 2
    assert "nothing compiles without --compile" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert generate.main(["--compile", "--compile-cache", str(tmp_path / "file")]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err


def test_generate_compile_cache_prints_its_status_and_the_compile_setup(generate, tmp_path, capsys, monkeypatch):
    """The real use_compile_cache; regional compile replaced by a no-op (compiling on this CPU takes minutes)."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # use_compile_cache sets it; restored after
    from bcg_diffusion.cli import run

    monkeypatch.setattr(run, "regional_compile", lambda transformer: "regional compile (a no-op here)")
    assert generate.main(["--steps", "2", "--compile", "--compile-cache", str(tmp_path / "cc"),
                          "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].startswith("compile cache: cold: nothing compiled yet"), text
    assert re.search(r"  compile set-up: the first step of the eager \+ compile run took [\d.]+ s .*; a later step "
                     r"takes [\d.]+ ms", text), text
    assert "  compile cache: cold:" in text  # repeated in the summary
    # save() writes what this process compiled so far: nothing here, unless an earlier test compiled something
    saved = re.search(r"^compile cache: (nothing was compiled, nothing saved|saved this process's compile artifacts "
                      r"to (.+))$", text, re.M)
    assert saved, text
    if saved[2]:
        assert Path(saved[2]).is_file() and Path(saved[2]).is_relative_to(tmp_path / "cc"), saved[2]
    assert (tmp_path / "cc").is_dir()


# ---------------------------------------------------------------------------------------------------------
# generate.py --cp (argument errors; the runs themselves need torchrun and 2 GPUs)
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def torchrun_env(monkeypatch):
    """Sets torchrun's variables (restored after); call it with the values."""
    def set_env(**values):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            if name in values:
                monkeypatch.setenv(name, str(values[name]))
            else:
                monkeypatch.delenv(name, raising=False)
    return set_env


def test_generate_cp_without_torchrun_exits_2(generate, capsys, no_build, torchrun_env):
    torchrun_env()
    assert generate.main(["--cp", "ulysses"]) == 2
    err = capsys.readouterr().err
    assert "--cp ulysses runs one process per GPU under torchrun" in err
    assert "RANK, WORLD_SIZE, LOCAL_RANK are not set" in err and "torchrun --nproc_per_node 2" in err, err


def test_generate_cp_with_one_rank_exits_2(generate, capsys, no_build, torchrun_env):
    torchrun_env(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0)
    assert generate.main(["--cp", "ring"]) == 2
    err = capsys.readouterr().err
    assert "--cp ring splits each step over the ranks of a torchrun launch, but WORLD_SIZE is 1" in err, err


def test_generate_cp_on_a_family_without_a_cp_plan_exits_2(generate, capsys, no_build, torchrun_env):
    torchrun_env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0)
    assert generate.main(["--model", "sd3", "--cp", "ulysses"]) == 2
    err = capsys.readouterr().err
    assert "SD3Transformer2DModel (sd3) has no _cp_plan, so diffusers cannot split it over GPUs" in err, err
    assert "families that have one: flux, wan, qwenimage, ltx" in err, err


@CPU_ONLY
def test_generate_cp_without_cuda_exits_2(generate, capsys, no_build, torchrun_env):
    torchrun_env(RANK=1, WORLD_SIZE=2, LOCAL_RANK=1)
    assert generate.main(["--model", "flux", "--cp", "ulysses"]) == 2
    assert "needs one CUDA GPU per rank (NCCL), and torch sees no CUDA device" in capsys.readouterr().err


def test_generate_keeps_nvlink_multicast_off(generate, monkeypatch, capsys):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")  # the user's own setting stays
    import os

    assert generate.main(["--list-models"]) == 0
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["NVSHMEM_DISABLE_NVLS"] == "1"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "0"


# ---------------------------------------------------------------------------------------------------------
# generate.py on a GPU (the lead runs these: pytest -m gpu tests/tools/test_scripts.py)
# ---------------------------------------------------------------------------------------------------------
BCG_LINE = re.compile(
    r"BCG: \w+(?: \(debug[^)]*\))?: (?P<keys>\d+) graph key\(s\), (?P<calls>\d+) calls: (?P<replayed>\d+) replayed, "
    r"(?P<first>\d+) first calls, (?P<eager>\d+) eager; (?P<captures>\d+) captures(?: \((?P<failed>\d+) failed\))?, "
    r"(?P<misses>\d+) misses")


def _bcg_counts(text: str) -> dict[str, int]:
    """The counters of generate.py's ``BCG:`` line (``str(get_stats(pipe))``, indented)."""
    found = BCG_LINE.search(text)
    assert found, text
    return {k: int(v or 0) for k, v in found.groupdict().items()}


def test_bcg_line_reads_str_of_the_stats():
    from bcg_diffusion.stats import BCGStats

    generate = _load("generate")
    stats = BCGStats("FluxTransformer2DModel", False, hits=5, misses=2, captures=1, eager_calls=3, capture_time_s=0.5,
                     graph_memory_bytes=0, warmup_calls=2, failed_captures=1)
    from bcg_diffusion.cli.report import format_bcg_stats

    counts = _bcg_counts(format_bcg_stats(stats, indent="    "))
    assert counts == {"keys": 0, "calls": 10, "replayed": 5, "first": 2, "eager": 3, "captures": 1, "failed": 1,
                      "misses": 2}


# ---------------------------------------------------------------------------------------------------------
# generate.py on a GPU (the lead runs these: pytest -m gpu tests/tools/test_scripts.py)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["flux", "pixart"])
def test_generate_gpu_warmup_leaves_the_bcg_image_bitwise_the_same(generate, tmp_path, capsys, model):
    common = ["--model", model, "--steps", "4", "--height", "64", "--width", "64"]
    eager, plain, warmed = tmp_path / "eager.png", tmp_path / "plain.png", tmp_path / "warmed.png"
    assert generate.main([*common, "--out", str(eager)]) == 0
    assert generate.main([*common, "--bcg", "--out", str(plain)]) == 0
    capsys.readouterr()
    assert generate.main([*common, "--bcg", "--warmup", "--out", str(warmed)]) == 0
    text = capsys.readouterr().out
    captured = re.search(r"warm-up: 1 shape\(s\), (\d+) graph key\(s\) captured", text)
    assert captured and int(captured[1]) >= 1, text
    assert re.search(r"  bcg: 4 steps", text), text
    assert plain.read_bytes() == eager.read_bytes() and warmed.read_bytes() == eager.read_bytes()
    # the timed run after the warm-up replayed from its first step: every first call and capture was the warm-up's
    counts = _bcg_counts(text)
    keys = int(captured[1])
    assert counts["eager"] == 0 and counts["failed"] == 0, text
    assert counts["first"] == counts["misses"] == counts["captures"] == keys, text
    assert counts["replayed"] == counts["calls"] - keys and counts["replayed"] >= 4, text
    assert re.search(r"first step after the warm-up: [\d.]+ ms, [\d.]+x the median step", text), text


@pytest.mark.gpu
def test_generate_gpu_compare_with_warmup_is_bitwise_identical(generate, tmp_path, capsys):
    assert generate.main(["--model", "pixart", "--steps", "4", "--height", "64", "--width", "64",
                          "--no-resolution-binning", "--warmup", "--compare", "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "outputs bitwise identical: YES" in text, text
    assert "the transformer ran 8x8 latents" in text, text
    counts = _bcg_counts(text)  # the BCG run's: replays, not eager calls
    assert counts["eager"] == 0 and counts["failed"] == 0 and counts["replayed"] >= 4, text
