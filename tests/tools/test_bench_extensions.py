"""CPU tests of the benchmark's newer parts: the extra modes (attention policies, whole-module compile
under BCG, the partition ceiling, dynamic regional compile, compile of the leftover children), quantized
case variants, the step-cache row, the ratio table, scripts/bench_shapes.py, the row registry's imports,
--processes and its verdicts, the first-image row, compile-cache folders and context-parallel cases.

GPU numbers come from running the scripts on the H200; here the code paths run on the tiny pipelines
(BCG is a no-op without CUDA, so BCG output equals eager), and the CUDA-only modes report n/a.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "bcg_diffusion" / "benchmarks"
CPU_ONLY = pytest.mark.usefixtures("hide_cuda")  # checks the no-CUDA path of the script (CUDA hidden where present)

from bcg_diffusion.benchmarks.step import bench_step  # noqa: E402
from bcg_diffusion.benchmarks.shapes import bench_shapes  # noqa: E402
from bcg_diffusion.benchmarks.step import cache_row, measure, modes, report, rows  # noqa: E402
from bcg_diffusion.benchmarks.step.cases import VARIANTS, parse_case  # noqa: E402
from bcg_diffusion.benchmarks.timing import Clock  # noqa: E402

NEW_MODES = ("bcg_break", "compile_bcg_break", "compile_full_bcg", "partition_ceiling", "compile_bcg_dynamic")
FAST = ["--iters", "2", "--rounds", "2", "--warmup", "1"]


@pytest.fixture(autouse=True)
def _no_leftover_patches():
    """Every test ends with no attention wrapper installed (a leak would change every later eager call)."""
    from bcg_diffusion.integration.breaks.shared import installed_patches

    yield
    assert installed_patches() == []


def _tiny_ctx(family="flux", cuda=False):
    """A StepContext with the recorded inputs of one real step of the tiny pipeline."""
    import bcg_pipelines as pipelines

    pipe = pipelines.build_pipeline(family, "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    case = bench_step.select_cases([(f"{family}:tiny", None, False)], cuda=False, strict=True)[0][0]
    args, kwargs, _ = measure.record_step_inputs(pipe, measure.case_call(pipe, case, 1), 0, "cpu")
    return pipe, modes.StepContext(pipe.transformer, args, kwargs, cuda, {"check_weights": "per_pipeline_call"})


# ---------------------------------------------------------------------------------------------------------
# modes
# ---------------------------------------------------------------------------------------------------------
def test_new_modes_are_registered_and_selectable_but_not_in_the_default_matrix():
    reg = modes.MODE_REGISTRY
    for name in NEW_MODES:
        assert name in reg and name in bench_step.MODES
    assert modes.DEFAULT_MODES == ("eager", "bcg", "whole_graph", "compile", "compile_bcg", "reduce_overhead")
    for _, case_modes, _ in bench_step.DEFAULT_MATRIX:
        assert set(case_modes) <= set(modes.DEFAULT_MODES)
    assert not reg["bcg_break"].needs_cuda and reg["bcg_break"].bcg and not reg["bcg_break"].torch_compile
    for name in ("compile_bcg_break", "compile_full_bcg", "compile_bcg_dynamic"):
        assert reg[name].needs_cuda and reg[name].bcg and reg[name].torch_compile and reg[name].exclusive
    ceiling = reg["partition_ceiling"]
    assert ceiling.needs_cuda and ceiling.torch_compile and not ceiling.bcg and ceiling.exclusive
    assert set(modes.EXCLUSIVE_MODES) == set(modes.BCG_MODES) | {"partition_ceiling"}
    parser = bench_step.build_parser()
    assert bench_step.check_options(parser.parse_args(["--modes", ",".join(NEW_MODES)]), parser) == list(NEW_MODES)


@CPU_ONLY
def test_new_modes_on_cpu_bcg_break_runs_the_others_are_na(tmp_path):
    assert bench_step.main(["--cases", "pixart:tiny", "--modes", "eager,bcg," + ",".join(NEW_MODES), *FAST,
                            "--no-e2e", "--out-dir", str(tmp_path)]) == 0
    rep = json.loads(next(tmp_path.glob("*.json")).read_text())
    (case,) = rep["cases"]
    m = case["modes"]
    assert m["bcg_break"]["status"] == "ok" and m["bcg_break"]["bitwise_equal_to_eager"] is True
    assert m["bcg_break"]["bcg_config"] == {"check_weights": "per_pipeline_call", "attention": "break"}
    assert m["bcg"]["bcg_config"] == {"check_weights": "per_pipeline_call"}  # the library default policy
    for name in NEW_MODES[1:]:
        assert m[name]["status"] == "n/a" and m[name]["reason"] == "needs CUDA", name
    md = next(tmp_path.glob("*.md")).read_text()
    assert "| pixart:tiny:256x256:b1 | partition_ceiling | yes | n/a |" in md
    assert "BCGConfig(attention='break')" in md


def test_mode_unavailable_is_reported_na_without_a_traceback(monkeypatch):
    def unavailable(ctx):
        raise modes.ModeUnavailable("torch lacks the thing")

    monkeypatch.setitem(modes.MODE_REGISTRY, "fake", modes.Mode("fake", "a mode that cannot run here", unavailable))
    settings = measure.Settings(1, 1, 1, 0, False, None, {})
    ctx = types.SimpleNamespace(cuda=False, parallel=False, agree=lambda value: value)
    results, runners = measure.set_up_modes(ctx, ["fake"], settings, Clock(False), lambda msg: None)
    assert results["fake"]["status"] == "n/a" and results["fake"]["reason"] == "ModeUnavailable: torch lacks the thing"
    assert "traceback" not in results["fake"] and not runners


def test_a_mode_past_the_setup_timeout_is_given_up_and_the_others_still_run(monkeypatch):
    never = threading.Event()

    def slow(ctx):
        never.wait(60)  # never set: only the set-up time limit ends this wait (a bound, so no hang if it does not)
        raise AssertionError("the set-up time limit did not stop this mode")

    monkeypatch.setitem(modes.MODE_REGISTRY, "slow", modes.Mode("slow", "a set-up that never ends in time", slow))
    monkeypatch.setitem(modes.MODE_REGISTRY, "fine", modes.Mode(
        "fine", "a mode that is ready at once", lambda ctx: modes.Runner("fine", lambda: torch.ones(2))))
    settings = measure.Settings(1, 1, 1, 0, False, None, {}, setup_timeout=0.2)
    ctx = types.SimpleNamespace(cuda=False, parallel=False, agree=lambda value: value)
    results, runners = measure.set_up_modes(ctx, ["slow", "fine"], settings, Clock(False), lambda msg: None)
    assert results["slow"]["status"] == "n/a"
    assert results["slow"]["reason"] == "SetupTimeout: set-up took longer than 0.2 s (--setup-timeout)"
    assert list(runners) == ["fine"] and results["fine"]["status"] == "ok"


def test_partition_config_problem_names_the_missing_inductor_keys():
    assert modes.partition_config_problem() is None  # this torch has graph_partition and custom_should_partition_ops
    problem = modes.partition_config_problem(types.SimpleNamespace(graph_partition=True))
    assert "custom_should_partition_ops" in problem and "graph_partition" not in problem.split("config.")[1].split(",")[0]
    ctx = types.SimpleNamespace(cuda=True, transformer=None)
    with pytest.raises(modes.ModeUnavailable, match="custom_should_partition_ops"):
        modes.setup_partition_ceiling(ctx, inductor_config=types.SimpleNamespace(graph_partition=True))


def test_exclusive_runners_are_active_only_in_their_own_turn():
    """A mode that patches attention (partition_ceiling, BCG modes) is deactivated while the others run and
    reactivated, with untimed warm-up calls, before its own turn; close() tears it down once."""
    state = {"active": 0, "teardowns": 0, "log": []}

    def plain():
        state["log"].append(("eager", state["active"]))
        return torch.zeros(1)

    def patched():
        state["log"].append(("ceiling", state["active"]))
        return torch.zeros(1)

    eager = modes.Runner("eager", plain, iters=2)
    ceiling = modes.Runner("ceiling", patched, iters=2, teardown=lambda: state.update(teardowns=state["teardowns"] + 1),
                           on_activate=lambda: state.update(active=state["active"] + 1),
                           on_deactivate=lambda: state.update(active=state["active"] - 1))
    ceiling.activate(False)
    ceiling.activate(False)  # already active: no second install
    assert state["active"] == 1 and ceiling.patches_attention and not eager.patches_attention
    settings = measure.Settings(2, 3, 1, 0, False, None, {})
    runners = {"eager": eager, "ceiling": ceiling}
    times = measure.time_rounds(runners, {"eager": {}, "ceiling": {}}, settings, Clock(False), lambda msg: None)
    assert len(times["eager"]) == len(times["ceiling"]) == 6
    assert {a for who, a in state["log"] if who == "eager"} == {0}
    assert {a for who, a in state["log"] if who == "ceiling"} == {1}
    assert ceiling.activations == 1 + 3  # set-up, then in each of the 3 rounds after eager deactivated it
    ceiling.close()
    ceiling.close()
    assert state == {**state, "active": 0, "teardowns": 1}


def _recording_compile(monkeypatch, graphs):
    """torch.compile with a backend that records each graph's call targets and runs it eagerly (no
    Inductor on the CPU); ``mode`` is dropped (reduce-overhead needs CUDA)."""
    real = torch.compile

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    def fake(model=None, **kwargs):
        kwargs.pop("mode", None)
        return real(model, backend=backend, **{k: v for k, v in kwargs.items() if k == "dynamic"})

    monkeypatch.setattr(torch, "compile", fake)


def test_partition_ceiling_traces_attention_as_the_bcg_op_while_active(monkeypatch):
    from bcg_diffusion.integration.breaks.shared import installed_patches

    graphs = []
    _recording_compile(monkeypatch, graphs)
    torch._dynamo.reset()
    _, ctx = _tiny_ctx("pixart")
    with torch.inference_mode():
        eager = modes.first_tensor(ctx.call(ctx.transformer))
        runner = modes.setup_partition_ceiling(ctx)
        try:
            assert runner.accelerated and installed_patches()  # wrappers installed while active
            out = runner.fn()
            assert graphs and any("bcg.sdpa" in t or "bcg.dispatch_attention" in t for g in graphs for t in g), graphs
            assert torch.equal(out, eager)
            runner.deactivate()
            assert installed_patches() == []
            runner.activate(False)
            n = len(graphs)
            assert torch.equal(runner.fn(), eager) and len(graphs) == n  # reinstalled wrappers: no recompile
        finally:
            runner.close()
    torch._dynamo.reset()


def test_compile_full_bcg_compiles_forward_below_bcg_and_notes_the_time(monkeypatch):
    import bcg_diffusion

    graphs = []
    _recording_compile(monkeypatch, graphs)
    torch._dynamo.reset()
    _, ctx = _tiny_ctx("flux")
    with torch.inference_mode():
        eager = modes.first_tensor(ctx.call(ctx.transformer))
        runner = modes.setup_compile_full_bcg(ctx)
        try:
            assert "forward" in vars(runner.module)  # the compiled forward, an instance attribute
            assert graphs and runner.extra["compile_calls_s"] > 0
            assert runner.is_bcg and runner.accelerated  # accelerate_transformer ran (a no-op without CUDA)
            assert runner.bcg_options == {"check_weights": "per_pipeline_call"}
            assert torch.equal(runner.fn(), eager)
        finally:
            runner.close()
    assert not runner.accelerated and not bcg_diffusion.is_accelerated(runner.module)
    torch._dynamo.reset()


def test_ratios_of_the_report():
    m = {"bcg": {"median_ms": 10.4}, "bcg_break": {"median_ms": 11.0}, "whole_graph": {"median_ms": 10.0},
         "compile": {"median_ms": 8.0}, "compile_bcg": {"median_ms": 7.0}, "reduce_overhead": {"median_ms": 6.0},
         "compile_full_bcg": {"median_ms": 6.3}, "eager": {"median_ms": 30.0}, "partition_ceiling": {"status": "n/a"}}
    r = report.case_ratios(m)
    assert r == pytest.approx({"bcg/whole_graph": 1.04, "bcg/eager": 10.4 / 30, "bcg_break/whole_graph": 1.1,
                               "compile_bcg/compile": 0.875, "compile_bcg/reduce_overhead": 7 / 6,
                               "compile_full_bcg/reduce_overhead": 1.05})
    def filled(mode_results):
        return {k: {"torch_compile": False, "status": "ok", "p10_ms": 1.0, "p90_ms": 1.0, **v}
                for k, v in mode_results.items()}

    rep = {"environment": {"date": "d", "gpu": None, "torch": None, "cuda": None, "diffusers": None, "dtype": None},
           "settings": {"iters": 1, "rounds": 1, "warmup": 1},
           "cases": [{"case": "a", "modes": filled(m)}, {"case": "b", "modes": filled({"eager": {"median_ms": 1.0}})}]}
    md = report.markdown_report(rep)
    assert "| case | bcg/whole_graph | bcg/eager | bcg_break/whole_graph | compile_bcg/compile | " \
           "compile_bcg/reduce_overhead | compile_full_bcg/reduce_overhead |" in md
    assert "| a | 1.04 | 0.35 | 1.10 | 0.88 | 1.17 | 1.05 |" in md and "| b | - | - | - | - | - | - |" in md


# ---------------------------------------------------------------------------------------------------------
# variants
# ---------------------------------------------------------------------------------------------------------
def test_quant_variants_exist_and_unknown_ones_are_refused():
    assert {"fp8", "fp8wo", "int8wo", "int8"} <= set(VARIANTS)
    assert parse_case("flux:full:512x512:b1@fp8").variant == "fp8"
    with pytest.raises(ValueError, match="unknown variant 'int4'"):
        parse_case("flux:full@int4")


@CPU_ONLY
def test_variant_without_torchao_is_skipped_with_the_install_hint(tmp_path, monkeypatch, capsys):
    """A case of the matrix is skipped with the hint (the others run); one named in --cases exits 2 (issue 50)."""
    from bcg_diffusion.toolkit.quant_option import INSTALL_HINT

    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    assert bench_step.main(["--cases", "flux:tiny@int8wo,pixart:tiny", "--modes", "eager", *FAST, "--no-e2e",
                            "--out-dir", str(tmp_path)]) == 2
    assert f"--cases flux:tiny@int8wo: {INSTALL_HINT}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    cases, skipped = bench_step.select_cases([("flux:tiny@int8wo", None, True), ("pixart:tiny", None, True)],
                                             cuda=False, strict=False)
    assert [c.label for c in cases] == ["pixart:tiny:256x256:b1"]
    assert skipped == [{"case": "flux:tiny@int8wo", "error": INSTALL_HINT}]


@CPU_ONLY
def test_variant_with_torchao_quantizes_after_the_build_and_notes_the_config(tmp_path, fake_torchao):
    assert bench_step.main(["--cases", "flux:tiny@int8wo", "--modes", "eager,bcg", *FAST, "--no-e2e",
                            "--out-dir", str(tmp_path)]) == 0
    calls = [(type(module).__name__, config, inductor) for module, config, inductor in fake_torchao]
    assert calls == [("FluxTransformer2DModel", "Int8WeightOnlyConfig", False)]  # Inductor's settings left alone
    (case,) = json.loads(next(tmp_path.glob("*.json")).read_text())["cases"]
    assert case["case"] == "flux:tiny:64x64:b1@int8wo" and case["variant"] == "int8wo"
    assert "Int8WeightOnlyConfig" in case["variant_note"] and case["modes"]["bcg"]["status"] == "ok"
    assert "quantize_(transformer, Int8WeightOnlyConfig())" in next(tmp_path.glob("*.md")).read_text()


# ---------------------------------------------------------------------------------------------------------
# the cache row
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--cache-rows", "fbc:x"], "must be a number"),
    (["--cache-rows", "nocache"], "unknown cache"),
    (["--cache-rows", ","], "names no cache"),
    (["--cache-compile"], "--cache-compile needs --cache-rows"),
    (["--setup-timeout", "0"], "--setup-timeout must be > 0 seconds"),
])
def test_bench_bad_options_exit_2(capsys, argv, needle):
    assert bench_step.main(argv) == 2
    assert needle in capsys.readouterr().err


@CPU_ONLY
@pytest.mark.parametrize("family, specs", [("flux", ("fbc:0.5", "pab:2", "fastercache")), ("pixart", ("magcache",))])
def test_cache_row_on_cpu(family, specs):
    import bcg_diffusion
    import bcg_pipelines as pipelines
    from bcg_diffusion.step_caches import cached_modules

    pipe = pipelines.build_pipeline(family, "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    case = bench_step.select_cases([(f"{family}:tiny", None, True)], cuda=False, strict=True)[0][0]
    call = measure.case_call(pipe, case, 4)
    settings = measure.Settings(1, 1, 1, 0, None, 4, {}, cache_rows=specs, cache_compile=True)
    assert rows.ROW_REGISTRY["cache"].enabled(case, settings)
    assert not rows.ROW_REGISTRY["cache"].enabled(case, measure.Settings(1, 1, 1, 0, None, 4, {}))
    res = cache_row.run_cache_rows(pipe, call, 0, Clock(False), lambda msg: None, case=case, settings=settings)
    assert res["steps"] == 4 and [e["spec"] for e in res["specs"]] == list(specs)
    for e in res["specs"]:
        if e["spec"] == "fastercache":
            assert e["status"] == "n/a" and "cannot run on flux" in e["reason"]
            continue
        assert e["status"] == "ok", e
        eager, bcg = e["eager_passes"], e["bcg_passes"]
        assert eager["calls"] > 0 and eager["computed"] > 0 and eager["reused"] > 0  # mixed decisions
        assert bcg == eager == e["bcg_first_passes"]  # BCG is a no-op here: the same decisions
        assert e["bitwise_equal_to_eager_cache"] is True
        for key in ("eager_cache_s", "bcg_cache_first_s", "bcg_cache_second_s", "bcg_alone_second_s"):
            assert e[key] > 0, key
        assert e["eager_cache_over_bcg_cache"] > 0 and e["bcg_alone_over_bcg_cache"] > 0
        assert e["compile_cache"] == {"status": "n/a", "reason": "needs CUDA"}
    # afterwards: no cache, no acceleration, so later rows and cases are unaffected
    assert not cached_modules(pipe.transformer) and not bcg_diffusion.is_accelerated(pipe)
    md = "\n".join(cache_row.cache_markdown([{"case": case.label, "cache": res}]))
    assert "## Step caches end to end" in md and f"| {case.label} | {specs[0]} | 4 |" in md


@CPU_ONLY
def test_cache_rows_through_the_command_line(tmp_path):
    assert bench_step.main(["--cases", "flux:tiny", "--modes", "eager", *FAST, "--no-e2e", "--e2e-steps", "3",
                            "--cache-rows", "taylorseer:2", "--out-dir", str(tmp_path)]) == 0
    rep = json.loads(next(tmp_path.glob("*.json")).read_text())
    (case,) = rep["cases"]
    assert case["e2e"] is None  # --no-e2e: only the cache row ran
    (entry,) = case["cache"]["specs"]
    assert entry["status"] == "ok" and entry["bitwise_equal_to_eager_cache"] is True
    assert rep["settings"]["cache_rows"] == ["taylorseer:2"]
    assert "| flux:tiny:64x64:b1 | taylorseer:2 | 3 |" in next(tmp_path.glob("*.md")).read_text()


# ---------------------------------------------------------------------------------------------------------
# bench_shapes.py
# ---------------------------------------------------------------------------------------------------------
@CPU_ONLY
def test_bench_shapes_on_cpu(tmp_path, capsys):
    assert bench_shapes.main(["--family", "flux", "--steps", "1", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU" in out
    rep = json.loads(next(tmp_path.glob("bench_shapes_*.json")).read_text())
    assert rep["settings"]["size"] == "tiny" and rep["settings"]["shapes"] == ["64x64", "80x64", "64x80"]
    by_mode = {r["mode"]: r for r in rep["modes"]}
    assert list(by_mode) == ["eager", "bcg", "compile_bcg_dynamic", "compile_bcg", "reduce_overhead"]
    for name in ("eager", "bcg"):
        r = by_mode[name]
        assert r["status"] == "ok", r
        assert [(v["pass"], v["shape"]) for v in r["visits"]] == [(p, s) for p in (1, 2) for s in ("64x64", "80x64", "64x80")]
        for v in r["visits"]:
            assert v["first_image_s"] > 0 and v["later_image_s"] > 0 and v["steady_call_ms"] > 0
            assert v["calls_per_image"] == 1 and v["images"] == 2
    for name in ("compile_bcg_dynamic", "compile_bcg", "reduce_overhead"):
        assert by_mode[name]["status"] == "n/a" and by_mode[name]["reason"] == "needs CUDA"
    md = next(tmp_path.glob("bench_shapes_*.md")).read_text()
    assert "## Summary" in md and "| bcg | 2 | 80x64 |" in md and "| reduce_overhead | | | | | | n/a: needs CUDA |" in md


@CPU_ONLY
def test_bench_shapes_time_budget_and_explicit_tiny_shapes(tmp_path):
    assert bench_shapes.main(["--family", "pixart", "--size", "tiny", "--shapes", "64x64,64x96", "--steps", "1",
                              "--calls", "1", "--passes", "1", "--time-budget", "1e-9", "--out-dir", str(tmp_path)]) == 0
    rep = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert rep["settings"]["shapes"] == ["64x64", "64x96"]
    assert [r["mode"] for r in rep["modes"]] == ["eager"]  # the first mode always runs
    assert rep["not_run"] == ["bcg", "compile_bcg_dynamic", "compile_bcg", "reduce_overhead"]
    assert [v["shape"] for v in rep["modes"][0]["visits"]] == ["64x64", "64x96"]


@pytest.mark.parametrize("argv, needle", [
    (["--modes", "eager,turbo"], "unknown mode"),
    (["--shapes", "512x500"], "multiples of 16"),
    (["--shapes", "big"], "cannot read"),
    (["--family", "nope"], "unknown family"),
    (["--steps", "0"], "--steps must be >= 1"),
])
def test_bench_shapes_bad_arguments_exit_2(capsys, argv, needle):
    assert bench_shapes.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_bench_shapes_reduce_overhead_marks_steps_and_clones_outputs(monkeypatch):
    """The reduce_overhead set-up swaps the compiled module into the pipeline, with hooks outside the compiled
    code that mark a step before each call and clone the outputs after; teardown removes the hooks."""
    import bcg_pipelines as pipelines
    from bcg_diffusion.benchmarks.shapes import scenario as shapes

    marks, compiled = [], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))

    def fake_compile(module, **kwargs):  # no compiler on the CPU: a stand-in wrapper module
        compiled.append(kwargs)
        return _Delegating(module)

    monkeypatch.setattr(torch, "compile", fake_compile)
    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    original = pipe.transformer
    outputs = []
    original.register_forward_hook(lambda _m, _a, out: outputs.append(out[0]))
    notes, teardown = shapes.setup_reduce_overhead(pipe)
    assert compiled == [{"mode": "reduce-overhead"}] and pipe.transformer is not original
    seen = []
    pipe.transformer.register_forward_hook(lambda _m, _a, out: seen.append(out[0]))
    call = shapes.shape_call(pipe, "flux", "tiny", (64, 64, None), 2, 1)
    with torch.inference_mode():
        pipe(**call, output_type="latent")
    assert len(marks) == 2 and len(seen) == 2  # one mark per transformer call
    assert all(a is not b and torch.equal(a, b) for a, b in zip(outputs, seen))  # cloned
    teardown()
    assert not pipe.transformer._forward_pre_hooks


class _Delegating(torch.nn.Module):
    """Stands in for torch.compile's OptimizedModule: calls the module, delegates attributes to it."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module

    def forward(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_mod, name)


def test_bench_shapes_helpers():
    from bcg_diffusion.benchmarks.shapes import scenario as shapes

    assert shapes.parse_shapes(shapes.DEFAULT_SHAPES) == [(512, 512, None), (640, 768, None), (768, 768, None),
                                                          (896, 640, None), (1024, 1024, None)]
    assert shapes.parse_shapes("32x32x9") == [(32, 32, 9)]
    assert shapes.tiny_shapes("wan") == [(32, 32, 9), (48, 32, 9), (32, 48, 9)]
    res = {"setup_s": 1.0, "visits": [
        {"pass": 1, "shape": "a", "first_image_s": 5.0, "extra_s": 4.0, "steady_call_ms": 2.0},
        {"pass": 1, "shape": "b", "first_image_s": 3.0, "extra_s": 2.0, "steady_call_ms": 3.0},
        {"pass": 1, "shape": "c", "first_image_s": 2.0, "extra_s": 1.0, "steady_call_ms": 4.0},
        {"pass": 2, "shape": "a", "first_image_s": 1.0, "extra_s": 0.0, "steady_call_ms": 1.5},
        {"pass": 2, "shape": "b", "first_image_s": 1.2, "extra_s": 0.0, "steady_call_ms": 2.5},
        {"pass": 2, "shape": "c", "first_image_s": 1.4, "extra_s": 0.0, "steady_call_ms": 3.5}]}
    assert shapes.summary(res, ["a", "b", "c"]) == {
        "first_shape_first_image_s": 6.0, "new_shape_extra_median_s": 1.5, "new_shape_extra_max_s": 2.0,
        "second_pass_first_image_median_s": 1.2, "steady_call_ms": {"a": 1.5, "b": 2.5, "c": 3.5}}



# ---------------------------------------------------------------------------------------------------------
# imports of the bench package: no circle (rows <-> cache_row was one)
# ---------------------------------------------------------------------------------------------------------
def _bench_imports() -> dict[str, set[str]]:
    """``module -> modules of the step benchmark it imports`` for benchmarks/step/*.py (its relative imports; the
    whole tree's import circles are tests/tools/test_layers.py's)."""
    import ast

    graph = {}
    for path in sorted((BENCHMARKS / "step").glob("*.py")):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    targets.add(node.module.split(".")[0])
                elif node.level == 1:
                    targets.update(alias.name for alias in node.names)
                elif node.module and node.module.startswith("bench."):
                    targets.add(node.module.split(".")[1])
        graph[path.stem] = targets - {path.stem}
    return graph


def test_bench_package_imports_point_one_way():
    graph = _bench_imports()
    assert graph["rows"] >= {"cache_row", "e2e_row", "first_image", "row_base"}
    for module in ("cache_row", "e2e_row", "first_image", "row_base"):
        assert "rows" not in graph[module], module

    def reaches(start, goal, seen=()):
        return any(t == goal or (t not in seen and reaches(t, goal, (*seen, t))) for t in graph.get(start, ()))

    circles = [m for m in graph if reaches(m, m)]
    assert circles == [], circles


def test_row_registry_order_and_placement():
    assert list(rows.ROW_REGISTRY) == ["first_image", "e2e", "cache"]
    assert rows.ROW_REGISTRY["first_image"].before_modes
    assert not rows.ROW_REGISTRY["e2e"].before_modes and not rows.ROW_REGISTRY["cache"].before_modes


# ---------------------------------------------------------------------------------------------------------
# --processes: parsing, the children's command lines, the verdicts and the combined report
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--processes", "0"], "--processes must be >= 1"),
    (["--compile-cache", "shared"], "--compile-cache shared needs --processes"),
    (["--first-image", "eager,turbo"], "--first-image: unknown mode(s) turbo"),
    (["--merge", "x.json", "--processes", "2"], "cannot take --processes"),
    (["--proc", "2"], "unrecognized arguments"),  # no abbreviations: --processes rewrites options by name
])
def test_bench_new_bad_options_exit_2(capsys, argv, needle):
    assert bench_step.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_modes_none_and_first_image_default():
    parser = bench_step.build_parser()
    assert bench_step.check_options(parser.parse_args(["--modes", "none"]), parser) == []
    opts = parser.parse_args(["--first-image"])
    assert bench_step.first_image_modes(opts) == ("eager", "bcg", "bcg_warmup", "compile_bcg")
    assert bench_step.first_image_modes(parser.parse_args(["--first-image", "bcg,eager,bcg"])) == ("bcg", "eager")
    assert bench_step.first_image_modes(parser.parse_args([])) == ()


def test_children_command_lines():
    from bcg_diffusion.benchmarks.step import processes

    argv = ["--cases", "pixart:tiny", "--processes", "3", "--out-dir", "old", "--compile-cache=shared", "--iters", "2"]
    child = processes.child_argv(argv, 2, 3, Path("new/p2"), "/c")
    assert child == ["--cases", "pixart:tiny", "--iters", "2", "--out-dir", "new/p2", "--compile-cache", "/c",
                     "--process-index", "2/3"]
    assert processes.child_command(Path("s.py"), ["-x"], None) == [sys.executable, "s.py", "-x"]
    assert processes.child_command(Path("s.py"), ["-x"], 2) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "s.py", "-x"]
    assert processes.cache_folders(None, 2) == (["fresh", "fresh"], [])
    shared, remove = processes.cache_folders("shared", 3)
    assert len(set(shared)) == 1 and remove == [Path(shared[0])] and Path(shared[0]).is_dir()
    processes.remove_folders(remove)
    assert not Path(shared[0]).exists()
    assert processes.parse_process_index("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "x"):
        with pytest.raises(ValueError, match="--process-index"):
            processes.parse_process_index(bad)


@pytest.mark.parametrize("values, word", [
    ([0.995, 1.004, 1.002], "level with"),   # median within 1 %, spread straddles 1.00
    ([0.97, 0.98, 0.99], "ahead of"),        # every process faster
    ([0.995, 0.998, 0.999], "ahead of"),     # within 1 %, but never slower: ahead
    ([1.02, 1.07, 1.03], "behind"),
    ([0.95, 0.97, 1.02], "unsettled"),       # median 3 % off, but one process disagrees
    ([1.0], "-"),                            # one process: no spread
])
def test_verdicts(values, word):
    from bcg_diffusion.benchmarks.step import across

    s = across.ratio_spread(values)
    assert s["verdict"] == word
    assert (s["n"], s["min"], s["max"]) == (len(values), min(values), max(values))


def _synthetic_result(index: int, cb_ro: float, first_image_s: float, cache_state: str) -> dict:
    """A result file as one process writes it: one case, three modes, a first-image row."""
    env = {k: "x" for k in ("gpu", "torch", "cuda", "diffusers", "dtype", "git_commit")}
    modes = {"eager": {"status": "ok", "torch_compile": False, "median_ms": 30.0 + index},
             "compile_bcg": {"status": "ok", "torch_compile": True, "median_ms": 7.0 * cb_ro, "setup_s": 3.0},
             "reduce_overhead": {"status": "ok", "torch_compile": True, "median_ms": 7.0, "setup_s": 40.0}}
    first = {"steps": 20, "asked": "512x512", "modes": {
        "compile_bcg": {"status": "ok", "setup_s": 0.1, "first_call": {"s": first_image_s - 0.1, "first_step_over_median": 5.0},
                        "second_call": {"s": 0.3}, "first_image_s": first_image_s, "one_off_s": first_image_s - 0.3,
                        "compile_cache": {"state": cache_state}},
        "compile": {"status": "n/a", "reason": "needs CUDA"}}}
    return {"environment": dict(env, date=f"d{index}"), "settings": {"iters": 2, "rounds": 1, "warmup": 1},
            "modes": {}, "total_s": 10.0 + index, "compile_cache": {"where": "/c", "state_at_start": cache_state},
            "cases": [{"case": "pixart:full:512x512:b1", "modes": modes, "first_image": first,
                       "ratios": report.case_ratios(modes)}]}


def test_processes_run_combines_each_childs_result(tmp_path, monkeypatch, capsys):
    """The parent starts one child per process (here a stand-in that writes a result file where the child's
    --out-dir says), then writes medians, spreads and verdicts of every ratio."""
    from bcg_diffusion.benchmarks.step import processes

    started = []

    def fake_run(command):
        started.append(command)
        argv = command[2:]
        out_dir = Path(argv[argv.index("--out-dir") + 1])
        index = int(argv[argv.index("--process-index") + 1].split("/")[0])
        state = "cold" if index == 1 else "warm"
        result = _synthetic_result(index, (0.99, 1.004, 1.008)[index - 1], (4.0, 1.5, 1.7)[index - 1], state)
        (out_dir / "bench_step_2026-01-01_000000.json").write_text(json.dumps(result))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(processes.subprocess, "run", fake_run)
    assert bench_step.main(["--cases", "pixart:tiny", "--modes", "eager", "--processes", "3", "--compile-cache",
                            "shared", "--out-dir", str(tmp_path)]) == 0
    assert len(started) == 3 and all(c[1] == str(bench_step.SCRIPT) for c in started)
    caches = {c[c.index("--compile-cache") + 1] for c in started}
    assert len(caches) == 1 and not Path(caches.pop()).exists()  # one shared folder, removed afterwards
    out = json.loads(next(tmp_path.glob("bench_step_*.json")).read_text())
    assert out["kind"] == "across_processes" and out["settings"]["processes"] == 3
    (case,) = out["cases"]
    ratio = case["ratios"]["compile_bcg/reduce_overhead"]
    assert ratio["values"] == pytest.approx([0.99, 1.004, 1.008]) and ratio["median"] == pytest.approx(1.004)
    assert ratio["verdict"] == "level with"
    assert case["modes"]["eager"]["median_ms"]["median"] == 32.0
    cold, warm = (case["first_image"]["modes"]["compile_bcg"][s] for s in ("cold", "warm"))
    assert cold["n"] == 1 and warm["n"] == 2 and warm["first_image_s"]["median"] == pytest.approx(1.6)
    assert case["first_image"]["modes"]["compile"]["n/a"]["reasons"] == ["needs CUDA"]
    md = next(tmp_path.glob("bench_step_*.md")).read_text()
    assert "| pixart:full:512x512:b1 | compile_bcg/reduce_overhead | 1.004 | 0.990-1.008 | 3 | compile_bcg level " \
           "with reduce_overhead |" in md
    assert "| pixart:full:512x512:b1 | compile_bcg | warm | 2 | 0.10 (0.10 to 0.10) |" in md
    # an across-process summary is not a file to --merge
    capsys.readouterr()
    assert bench_step.main(["--merge", str(next(tmp_path.glob("bench_step_*.json"))), "--out-dir", str(tmp_path)]) == 2
    assert "across-process summary" in capsys.readouterr().err


def test_processes_children_that_disagree_are_refused(tmp_path, monkeypatch, capsys):
    from bcg_diffusion.benchmarks.step import processes

    def fake_run(command):
        argv = command[2:]
        index = int(argv[argv.index("--process-index") + 1].split("/")[0])
        result = _synthetic_result(index, 1.0, 1.0, "cold")
        result["environment"]["git_commit"] = f"commit{index}"
        (Path(argv[argv.index("--out-dir") + 1]) / "bench_step_1.json").write_text(json.dumps(result))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(processes.subprocess, "run", fake_run)
    assert bench_step.main(["--cases", "pixart:tiny", "--processes", "2", "--out-dir", str(tmp_path)]) == 2
    assert "git_commit" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# compile-cache folders
# ---------------------------------------------------------------------------------------------------------
def test_process_compile_cache_folders(tmp_path, monkeypatch):
    import os

    from bcg_diffusion.benchmarks import compile_cache_dirs as compile_cache

    for key in compile_cache.ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    fresh = compile_cache.open_process_cache("fresh")
    assert fresh.state == "cold" and os.environ["TORCHINDUCTOR_CACHE_DIR"] == fresh.inductor_folder
    root = Path(fresh.inductor_folder).parent
    fresh.close()
    assert not root.exists()
    given = compile_cache.open_process_cache(str(tmp_path / "cc"))
    assert given.inductor_folder == str(tmp_path / "cc" / "inductor") and given.state == "cold"
    folder = given.first_image_folder("pixart:full:512x512:b1", "compile_bcg")
    assert folder == tmp_path / "cc" / "first_image" / "pixart_full_512x512_b1" / "compile_bcg"
    (tmp_path / "cc" / "inductor" / "x.bin").write_text("x")
    assert compile_cache.open_process_cache(str(tmp_path / "cc")).state == "warm"  # a second process: warm
    before = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    with compile_cache.mode_cache(folder) as record:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(folder))  # this mode's folder (or the library's in it)
        assert record["state"] == "cold" and record.get("library")  # what use_compile_cache said, or that there is none
        (folder / "inductor" / "y.bin").write_text("y")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == before  # restored
    with compile_cache.mode_cache(folder) as record:
        assert record["state"] == "warm"


# ---------------------------------------------------------------------------------------------------------
# the first-image row
# ---------------------------------------------------------------------------------------------------------
def test_step_times_and_first_step_summary():
    from bcg_diffusion.benchmarks.probe import first_step_summary, step_times

    assert step_times([1.0, 2.0, 3.0, 4.0], 2) == [3.0, 7.0]  # two calls per step (CFG as two calls)
    assert step_times([1.0, 2.0, 3.0], 2) is None and step_times([], 3) is None
    s = first_step_summary([0.5, 0.1, 0.1, 0.2])
    assert s["first_step_ms"] == 500.0 and s["median_later_step_ms"] == pytest.approx(100.0)
    assert s["first_step_over_median"] == pytest.approx(5.0)


@CPU_ONLY
def test_first_image_row_on_the_tiny_model(tmp_path):
    import bcg_diffusion
    import bcg_pipelines as pipelines

    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    original = pipe.transformer
    case = bench_step.select_cases([("flux:tiny", None, True)], cuda=False, strict=True)[0][0]
    call = measure.case_call(pipe, case, 3)
    settings = measure.Settings(1, 1, 1, 0, None, 3, {}, first_image=("eager", "bcg", "bcg_warmup", "compile_bcg"))
    row = rows.ROW_REGISTRY["first_image"]
    assert row.enabled(case, settings) and not row.enabled(case, measure.Settings(1, 1, 1, 0, None, 3, {}))
    res = row.run(pipe, call, 0, Clock(False), lambda msg: None, case=case, settings=settings)
    assert res["steps"] == 3 and res["asked"] == "64x64"
    m = res["modes"]
    for name in ("eager", "bcg", "bcg_warmup"):
        e = m[name]
        assert e["status"] == "ok", e
        first, second = e["first_call"], e["second_call"]
        assert first["s"] > 0 and second["s"] > 0 and e["setup_s"] >= 0
        assert first["transformer_input"] == "float32[1, 16, 64]"  # 64x64 px: 16 packed latent tokens
        assert first["transformer_calls"] == 3 and len(first["step_ms"]) == 3 and first["first_step_over_median"] > 0
        assert e["first_image_s"] == pytest.approx(e["setup_s"] + first["s"])
        assert e["first_image_over_eager"] == pytest.approx(e["first_image_s"] / m["eager"]["second_call"]["s"])
    assert m["bcg"]["bitwise_equal_to_eager"] is True and m["bcg_warmup"]["bitwise_equal_to_eager"] is True
    assert m["bcg_warmup"]["warmup"]["total_s"] > 0  # bcg_diffusion.warmup ran in the set-up
    assert m["compile_bcg"] == {"status": "n/a", "reason": "needs CUDA", "description": m["compile_bcg"]["description"],
                                "torch_compile": True}
    assert pipe.transformer is original and not bcg_diffusion.is_accelerated(pipe)  # left as found
    md = "\n".join(row.markdown([{"case": case.label, "first_image": res}]))
    assert "## First image" in md and f"| {case.label} | bcg | - | 64x64 | float32[1, 16, 64] | 3 |" in md
    assert f"| {case.label} | compile_bcg | - |" in md and "n/a: " in md


def test_resolution_binning_case_suffix():
    from dataclasses import replace

    c = parse_case("pixart:full:512x512:b1:bin")
    assert c.binning and c.label == "pixart:full:512x512:b1:bin"
    assert not parse_case("pixart:full:512x512:b1:nobin").binning
    assert parse_case("pixart:full:512x512:b1:nobin").label == "pixart:full:512x512:b1"
    fake = type("FakePixArtPipeline", (), {"__call__": lambda self, prompt=None, height=None, width=None,
                                           num_inference_steps=None, use_resolution_binning=True,
                                           num_images_per_prompt=1: None})()
    tiny = bench_step.select_cases([("pixart:tiny", None, True)], cuda=False, strict=True)[0][0]
    assert measure.case_call(fake, tiny, 2)["use_resolution_binning"] is False  # default: the exact asked size
    assert "use_resolution_binning" not in measure.case_call(fake, replace(tiny, binning=True), 2)  # diffusers' default


@CPU_ONLY
def test_first_image_through_the_command_line(tmp_path):
    assert bench_step.main(["--cases", "flux:tiny", "--modes", "none", "--no-e2e", "--first-image", "eager,bcg",
                            "--e2e-steps", "2", "--out-dir", str(tmp_path)]) == 0
    rep = json.loads(next(tmp_path.glob("*.json")).read_text())
    (case,) = rep["cases"]
    assert case["modes"] == {} and case["e2e"] is None
    assert list(case["first_image"]["modes"]) == ["eager", "bcg"]
    assert rep["settings"]["first_image"] == ["eager", "bcg"] and rep["compile_cache"]["where"] == "inductor default"
    assert not list(tmp_path.glob("*.png"))  # no per-step modes: no chart
    assert "| flux:tiny:64x64:b1 | bcg | - | 64x64 | float32[1, 16, 64] | 2 |" in next(tmp_path.glob("*.md")).read_text()


# ---------------------------------------------------------------------------------------------------------
# compile of the leftover children (compile_all, compile_bcg_all)
# ---------------------------------------------------------------------------------------------------------
def test_regional_compile_all_compiles_the_leftover_children_and_keeps_the_output():
    import bcg_pipelines as pipelines
    from bcg_diffusion.toolkit import speedups

    torch._dynamo.reset()
    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    case = bench_step.select_cases([("flux:tiny", None, False)], cuda=False, strict=True)[0][0]
    args, kwargs, _ = measure.record_step_inputs(pipe, measure.case_call(pipe, case, 1), 0, "cpu")
    transformer = pipe.transformer
    leftovers = [name for name, _ in speedups.leftover_children(transformer)]
    assert leftovers == ["pos_embed", "time_text_embed", "context_embedder", "x_embedder", "norm_out", "proj_out"]
    with torch.inference_mode():
        eager = modes.first_tensor(transformer(*args, **kwargs))
        copy = modes.weight_sharing_copy(transformer)
        desc = speedups.regional_compile_all(copy, backend="eager")  # dynamo without Inductor: the CPU has no compiler
        for name in leftovers:
            assert copy.get_submodule(name)._compiled_call_impl is not None, name
            assert transformer.get_submodule(name)._compiled_call_impl is None  # the original is untouched
        assert all(b._compiled_call_impl is not None for b in copy.transformer_blocks)
        assert type(copy).forward is type(transformer).forward and "forward" not in vars(copy)  # forward stays eager
        assert "leftover children pos_embed, time_text_embed" in desc
        assert torch.equal(modes.first_tensor(copy(*args, **kwargs)), eager)
        assert speedups.leftover_children(copy) == []  # compiled already: nothing left
    torch._dynamo.reset()


def test_compile_all_modes_are_registered_and_need_cuda():
    reg = modes.MODE_REGISTRY
    for name in ("compile_all", "compile_bcg_all"):
        assert reg[name].needs_cuda and reg[name].torch_compile and reg[name].with_context_parallel
        assert name not in modes.DEFAULT_MODES
    assert reg["compile_bcg_all"].bcg and not reg["compile_all"].bcg
    settings = measure.Settings(1, 1, 1, 0, False, None, {})
    ctx = types.SimpleNamespace(cuda=False, parallel=False, agree=lambda value: value)
    results, runners = measure.set_up_modes(ctx, ["compile_all", "compile_bcg_all"], settings, Clock(False),
                                            lambda msg: None)
    assert {r["status"] for r in results.values()} == {"n/a"} and not runners
    assert ("compile_bcg_all", "reduce_overhead") in report.RATIOS and ("compile_all", "compile") in report.RATIOS


# ---------------------------------------------------------------------------------------------------------
# context-parallel cases (cp2, cp2r): parsing, the launch check, the ranks, the report
# ---------------------------------------------------------------------------------------------------------
def test_cp_case_parsing():
    c = parse_case("flux:full:1024x1024:b1:cp2")
    assert (c.cp, c.cp_kind, c.label) == (2, "ulysses", "flux:full:1024x1024:b1:cp2")
    r = parse_case("flux:full:1024x1024:b1:cp2r")
    assert (r.cp, r.cp_kind, r.label) == (2, "ring", "flux:full:1024x1024:b1:cp2r")
    assert parse_case("wan:full:480x832:f33:b1:cp2u").label == "wan:full:480x832:f33:b1:cp2"
    assert parse_case("flux:full").cp is None and parse_case("flux:full").cp_kind is None
    with pytest.raises(ValueError, match="degree must be >= 2"):
        parse_case("flux:full:cp1")


def test_cp_launch_check():
    from bcg_diffusion.benchmarks.step import parallel

    cp2, cp4, single = (parse_case(t) for t in ("flux:full:1024x1024:b1:cp2", "wan:full:cp4", "flux:full:512x512:b1"))
    problem = parallel.launch_problem([cp2], {})
    assert "needs 2 ranks" in problem and "torchrun --nproc_per_node 2 scripts/bench_step.py --cases " \
           "flux:full:1024x1024:b1:cp2" in problem and "not started by torchrun" in problem
    assert parallel.launch_problem([cp2], {"WORLD_SIZE": "2"}) is None
    assert "WORLD_SIZE=4" in parallel.launch_problem([cp2], {"WORLD_SIZE": "4"})
    assert "no case is context parallel" in parallel.launch_problem([single], {"WORLD_SIZE": "2"})
    assert parallel.launch_problem([single], {}) is None
    assert "cannot share a launch" in parallel.launch_problem([cp2, single], {"WORLD_SIZE": "2"})
    assert "one launch each" in parallel.launch_problem([cp2, cp4], {"WORLD_SIZE": "2"})
    env = {"NCCL_NVLS_ENABLE": "1"}
    assert parallel.multicast_off(env) == ["TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"]
    assert env == {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_cp_case_without_torchrun_exits_2_saying_how_to_launch(capsys):
    assert bench_step.main(["--cases", "flux:tiny:cp2", "--modes", "eager"]) == 2
    err = capsys.readouterr().err
    assert "torchrun --nproc_per_node 2 scripts/bench_step.py --cases flux:tiny:64x64:b1:cp2" in err
    assert "--processes" in err


def test_combine_ranks_reports_the_slowest_rank():
    from bcg_diffusion.benchmarks.step import parallel

    def ok(ms, equal=True, busy=None):
        res = {"status": "ok", "median_ms": ms, "notes": [], "bitwise_equal_to_eager": equal,
               "max_abs_diff_vs_eager": 0.0 if equal else 0.5}
        if busy is not None:
            res["profile"] = {"gpu_busy_fraction": busy}
        return res

    rank0 = {"eager": ok(50.0, busy=0.41), "bcg": ok(30.0), "compile": ok(20.0),
             "whole_graph": {"status": "n/a", "reason": "not measured with context parallelism"}}
    rank1 = {"eager": ok(52.0, busy=0.39), "bcg": ok(29.0, equal=False), "compile": {"status": "error", "reason": "OOM"},
             "whole_graph": {"status": "n/a", "reason": "not measured with context parallelism"}}
    out = parallel.combine_ranks([rank0, rank1])
    assert out["eager"]["median_ms"] == 52.0 and out["eager"]["slowest_rank"] == 1
    assert out["eager"]["per_rank_median_ms"] == [50.0, 52.0]
    assert out["eager"]["per_rank_gpu_busy_fraction"] == [0.41, 0.39]
    assert out["bcg"]["median_ms"] == 30.0 and out["bcg"]["slowest_rank"] == 0
    assert out["bcg"]["bitwise_equal_to_eager"] is False and out["bcg"]["max_abs_diff_vs_eager"] == 0.5
    assert out["compile"] == {"status": "error", "reason": "rank 1: OOM"}
    assert out["whole_graph"]["reason"] == "not measured with context parallelism"  # all ranks agree: no rank named
    measure.add_relative_fields(out)
    assert out["bcg"]["speedup_vs_eager"] == pytest.approx(52.0 / 30.0)
    case = {"case": "flux:full:1024x1024:b1:cp2", "modes": out, "context_parallel": {"degree": 2, "kind": "ulysses"},
            "ratios": report.case_ratios(out)}
    rep = {"environment": {"date": "d", "gpu": "g", "torch": None, "cuda": None, "diffusers": None, "dtype": None},
           "settings": {"iters": 1, "rounds": 1, "warmup": 1}, "ranks": {"world_size": 2, "backend": "nccl"},
           "cases": [dict(case, modes={k: {"torch_compile": False, "p10_ms": 1.0, "p90_ms": 1.0, **v}
                                       for k, v in out.items()})]}
    md = report.markdown_report(rep)
    assert "Context parallel: 2 ranks (nccl)" in md and "slowest of 2 ranks: rank 1" in md
    assert "context parallel: ulysses x2, times of the slowest rank; eager GPU-busy fraction per rank 0.41, 0.39" in md


def test_torch_ranks_agree_and_gather_over_gloo(tmp_path):
    """Two real ranks (torchrun, gloo on the CPU): every rank gets rank 0's value and everyone's values."""
    import subprocess

    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, sys\n"
        "from bcg_diffusion.benchmarks.step.parallel import TorchRanks\n"
        "ranks = TorchRanks(cuda=False)\n"
        "agreed = ranks.agree({'iters': 10 + ranks.rank})\n"
        "gathered = ranks.gather({'rank': ranks.rank, 'median_ms': 1.0 + ranks.rank})\n"
        f"out = {str(tmp_path)!r}\n"
        "open(f'{out}/rank{ranks.rank}.json', 'w').write(json.dumps([ranks.rank, ranks.world, agreed, gathered]))\n"
        "ranks.close()\n")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    # one file per rank: two ranks printing to one stdout can interleave on a line
    results = sorted(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    gathered = [{"rank": 0, "median_ms": 1.0}, {"rank": 1, "median_ms": 2.0}]
    assert results == [[0, 2, {"iters": 10}, gathered], [1, 2, {"iters": 10}, gathered]]


def test_the_first_image_row_warms_up_in_the_grad_mode_of_its_images(monkeypatch):
    """A warm-up outside ``inference_mode`` captures other keys than the row's images use (void rows, 2026-12-01)."""
    import bcg_diffusion
    from bcg_diffusion.benchmarks.step import first_image
    from bcg_diffusion.benchmarks.step.seeded_images import SeededImages

    modes = []
    monkeypatch.setattr(bcg_diffusion, "warmup", lambda pipe, shapes, **call: modes.append(torch.is_inference_mode_enabled()))
    images = SeededImages(types.SimpleNamespace(), {"height": 64, "width": 64, "num_inference_steps": 2}, 0,
                          types.SimpleNamespace(cuda=False))
    mode = first_image.FirstImageMode("bcg_warmup", "warm-up only", warmup=True)
    first_image._set_up(mode, images, {})
    assert modes == [True]  # SeededImages.image runs the row's calls under inference_mode too
