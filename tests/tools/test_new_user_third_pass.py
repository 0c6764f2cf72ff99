"""What a new user trips over, third pass (issue 50), one test (or a few) per point; the numbers in the section
titles are the issue's. The commands are run as a user runs them (``main(argv)``, their console scripts, HTTP); a
bad argument must exit with code 2 and one line saying what to change, before anything is built (``no_build``).

The live servers of the server points are in tests/tools/test_new_user_third_pass_server.py, the Ray points in
tests/tools/test_ray_serve_stop_cpu.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bcg_diffusion.cli import generate
from bcg_diffusion.serving import serve_command
from bcg_diffusion.toolkit import numbers
from bcg_diffusion.toolkit.cache_spec import CacheSpec

ROOT = Path(__file__).resolve().parents[2]


def last_error(capsys, code: int) -> str:
    """The command's last stderr line, after checking the exit code it returned."""
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-3:]
    return err[-1]


# -- 2. every float option of every command is finite --------------------------------------------------------------
def _float_options(path: Path) -> list[str]:
    """``--option`` names whose argparse ``type`` is the bare ``float`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            types = [k.value for k in node.keywords if k.arg == "type"]
            if types and isinstance(types[0], ast.Name) and types[0].id == "float":
                found.append(f"{path.relative_to(ROOT)}: {ast.literal_eval(node.args[0])}")
    return found


def test_no_command_takes_a_bare_float_option():
    found = [f for path in sorted((ROOT / "bcg_diffusion").rglob("*.py")) for f in _float_options(path)]
    assert found == [], "use bcg_diffusion.toolkit.numbers.finite_float: " + ", ".join(found)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "1e999", "x"])
def test_finite_float_refuses_what_is_not_a_finite_number(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="is not a finite number"):
        numbers.finite_float(text)
    assert numbers.finite_float("2.5") == 2.5 and numbers.finite_float(" 1e3 ") == 1000.0


@pytest.mark.parametrize("argv", [["--max-batch", "4", "--batch-window-ms", "nan"], ["--batch-window-ms", "inf"],
                                  ["--replicas", "2", "--gpus-per-replica", "nan"]])
def test_serve_refuses_non_finite_floats_before_building(capsys, no_build, argv):
    reason = last_error(capsys, serve_command.main(argv))
    assert "is not a finite number" in reason and reason.startswith("serve.py: error: argument --"), reason


def test_generate_and_load_refuse_non_finite_floats(capsys, no_build):
    from bcg_diffusion.serving.load import command as load_test

    assert "argument --guidance: 'nan' is not a finite number" in last_error(capsys, generate.main(["--guidance", "nan"]))
    reason = last_error(capsys, load_test.main(["--url", "http://127.0.0.1:9", "--request-timeout", "nan"]))
    assert "argument --request-timeout: 'nan' is not a finite number" in reason, reason


# -- 11. cache values: finite, whole where a count is meant ------------------------------------------------------
@pytest.mark.parametrize("text, needle", [
    ("fbc:nan", "must be a finite number"), ("fbc:inf", "must be a finite number"),
    ("taylorseer:nan", "must be a finite number"), ("taylorseer:2.5", "must be a whole number (got 2.5)"),
    ("pab:1.5", "must be a whole number"), ("fastercache:3.0000001", "must be a whole number"),
    ("fbc:-1", "must be positive"), ("taylorseer:abc", "must be a number"),
])
def test_a_cache_value_is_finite_and_whole_where_a_count_is_meant(text, needle):
    with pytest.raises(ValueError, match=re.escape(needle)) as info:
        CacheSpec.parse(text)
    assert "could not convert" not in str(info.value) and "Python" not in str(info.value)


def test_whole_cache_values_are_read_as_whole_numbers():
    assert CacheSpec.parse("taylorseer:3").value == 3 and CacheSpec.parse("pab:2.0").value == 2
    assert CacheSpec.parse("fbc:0.25").value == 0.25 and CacheSpec.parse("magcache").value is None


def test_generate_refuses_a_non_finite_cache_value(capsys, no_build):
    reason = last_error(capsys, generate.main(["--cache", "fbc:nan"]))
    assert "--cache: cache 'fbc:nan': the value after ':' must be a finite number" in reason, reason


# -- 1. the size limits come from the model's config, per family and size ---------------------------------------
def test_the_limits_come_from_the_configs_per_family_and_size():
    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit.model_limits import family_side_limit

    sd3, wan, flux = (pipelines.get_family(n) for n in ("sd3", "wan", "flux"))
    assert family_side_limit(sd3, "tiny").pixels == 16 * 16  # pos_embed_max_size 16 patches of 16 px
    assert "pos_embed_max_size" in family_side_limit(sd3, "tiny").reason
    assert family_side_limit(sd3, "full").pixels == 4096  # 384 x 16 = 6144: the 4x rule binds first
    assert family_side_limit(wan, "tiny").pixels == 32 * 16 and "rope_max_seq_len" in family_side_limit(wan, "tiny").reason
    assert family_side_limit(flux, "tiny").pixels == family_side_limit(flux, "full").pixels == 4096  # rope on the fly
    assert family_side_limit(None, "full").pixels == 4096


def test_sd3_runs_at_its_limit_and_its_transformer_refuses_beyond_it():
    """The limit is the real one: the tiny SD3 pipeline runs at 256x256 and diffusers refuses 272x272."""
    import bcg_pipelines as pipelines

    pipe = pipelines.build_pipeline("sd3", "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    call = dict(prompt="a fox", num_inference_steps=1, output_type="np")
    assert pipe(height=256, width=256, **call).images.shape == (1, 256, 256, 3)
    with pytest.raises(ValueError, match="pos_embed_max_size"):
        pipe(height=272, width=272, **call)


@pytest.mark.parametrize("argv, needle", [
    (["--model", "sd3", "--height", "512", "--width", "512"],
     "--height 512 is above the limit of 256 px for sd3 (tiny): its transformer's pos_embed_max_size is 16 patches "
     "of 16 px; the largest size is 256x256"),
    (["--model", "sd3", "--width", "272"], "--width 272 is above the limit of 256 px for sd3 (tiny)"),
    (["--model", "wan", "--height", "528"], "--height 528 is above the limit of 512 px for wan (tiny)"),
    (["--model", "sd3", "--warmup", "512x512"], "--warmup 512x512: above the limit of 256 px per side for sd3 (tiny)"),
])
def test_generate_refuses_a_size_beyond_the_models_limit_before_building(capsys, no_build, argv, needle):
    reason = last_error(capsys, generate.main(argv))
    assert needle in reason, reason


def test_list_models_and_the_docs_state_each_size_limit(capsys):
    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit.model_limits import family_side_limit

    assert generate.main(["--list-models"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    docs = " ".join((ROOT / "docs" / "generate.md").read_text().split())
    for name in pipelines.list_families():
        spec = pipelines.get_family(name)
        tiny, full = (family_side_limit(spec, size).pixels for size in ("tiny", "full"))
        assert rows[name].split()[-1] == f"{tiny}/{full}", rows[name]
        if tiny != full:
            assert f"{name} tiny: {tiny} px" in docs, name
    assert "4096 for Flux, SD3, PixArt" not in docs


# -- 9. a step count the scheduler cannot take is refused up front ------------------------------------------------
@pytest.mark.parametrize("model", ["ltx", "qwenimage"])
def test_one_step_on_a_terminal_stretched_scheduler_exits_2(capsys, no_build, model):
    reason = last_error(capsys, generate.main(["--model", model, "--steps", "1"]))
    assert f"--steps 1: {model}'s scheduler (FlowMatchEulerDiscreteScheduler, shift_terminal" in reason, reason
    assert "needs at least 2 steps" in reason


def test_the_fewest_steps_come_from_the_scheduler_config():
    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit.model_limits import min_steps

    fewest = {name: min_steps(pipelines.get_family(name).scheduler_config).steps for name in pipelines.list_families()}
    assert {name for name, steps in fewest.items() if steps > 1} == {"ltx", "qwenimage"}, fewest
    assert set(fewest.values()) == {1, 2}


def test_the_server_refuses_one_step_where_its_scheduler_needs_two():
    """Qwen-Image's one-step images are NaN: a request for one step is a 400 naming the scheduler, not a black PNG."""
    from bcg_diffusion.serving.replicas.state import build_server_state, parse_server_args, stop_server_state
    from bcg_diffusion.serving.errors import RequestError

    state = build_server_state(parse_server_args("--model qwenimage --device cpu --steps 2"))
    try:
        with pytest.raises(RequestError, match="num_inference_steps=1: this model's scheduler") as info:
            state.planner.parse(b'{"prompt": "a fox", "num_inference_steps": 1}')
        assert info.value.status == 400 and "needs at least 2 steps" in info.value.message
        assert state.planner.parse(b'{"prompt": "a fox", "num_inference_steps": 2}').steps == 2
        assert state.info["min_steps"] == 2
    finally:
        stop_server_state(state)


# -- 20. known-harmless library notices stay quiet: the pipelines example, torchao's Triton notice --------------------
def test_the_pipelines_example_prints_no_library_noise():
    text = (ROOT / "docs" / "pipelines.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    noise = [line for line in done.stderr.splitlines() if "it/s]" not in line and "denoising" not in line and line.strip()]
    assert not [line for line in noise if any(n in line for n in ("torchao", "_pytree", "torchvision", "Failed to load"))], noise


def test_torchaos_no_triton_notice_is_dropped_on_a_cpu_build(caplog, monkeypatch):
    import logging

    import torch

    import bcg_diffusion  # noqa: F401 - its import installed the filters

    monkeypatch.setattr(torch.version, "cuda", None)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao.kernel.intmm").warning(
            "Warning: Detected no triton, on systems without Triton certain kernels will not work")
        logging.getLogger("torchao.kernel.intmm").warning("another notice")
    assert [r.getMessage() for r in caplog.records] == ["another notice"]


# -- 8. --out with a name the filesystem cannot take is refused before the build ---------------------------------
@pytest.mark.parametrize("argv, grown", [([], ""), (["--compare"], "with the 4 characters this run adds")])
def test_an_out_name_too_long_exits_2_before_building(capsys, no_build, tmp_path, argv, grown):
    name = "x" * (300 if not argv else 250) + ".png"
    reason = last_error(capsys, generate.main(["--out", str(tmp_path / name), *argv]))
    assert "cannot be written: the name 'xxxx" in reason and "takes names of at most 255 bytes" in reason, reason
    assert grown in reason and "Traceback" not in reason


# -- 10. a full disk leaves no empty or cut image --------------------------------------------------------------------
def _full_disk(monkeypatch, after: int = 10):
    """PIL's writes fail with ENOSPC after ``after`` bytes, as on a full disk."""
    import errno

    from PIL import Image

    real_save = Image.Image.save

    def save(self, fp, *args, **kwargs):
        real_save(self, fp, *args, **kwargs)
        with open(fp, "r+b") as f:
            f.truncate(after)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", save)


def test_a_full_disk_leaves_no_partial_image_and_keeps_the_old_one(monkeypatch, tmp_path):
    import numpy as np

    from bcg_diffusion.toolkit.media import save_output

    image = np.zeros((1, 16, 16, 3), dtype=np.float32)
    (old := tmp_path / "old.png").write_bytes(b"an earlier image")
    _full_disk(monkeypatch)
    for path in (tmp_path / "new.png", old):
        with pytest.raises(OSError, match="No space left"):
            save_output(image, path, is_video=False, fps=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.png"] and old.read_bytes() == b"an earlier image"


def test_generate_on_a_full_disk_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    _full_disk(monkeypatch)
    out = tmp_path / "fox.png"
    assert generate.main(["--steps", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"error: writing {out} failed: [Errno 28] No space left on device" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


# -- 23. --warmup: an empty value is refused, a negative size is named -------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--warmup", ""], "--warmup '': give sizes such as 512x512,768x512, or --warmup alone (no value)"),
    (["--warmup="], "--warmup '': give sizes"),
    (["--warmup", " "], "--warmup ' ': give sizes"),
    (["--warmup", "-64x64"], "--warmup -64x64: sizes are positive whole numbers"),
    (["--height", "-64"], "--height -64: sizes are positive whole numbers"),
])
def test_warmup_values_that_are_not_sizes_exit_2(capsys, no_build, argv, needle):
    reason = last_error(capsys, generate.main(argv))
    assert needle in reason and "unrecognized arguments" not in reason, reason


def test_warmup_alone_still_warms_the_runs_own_size(no_build):
    from bcg_diffusion.cli import args as generate_args
    from bcg_diffusion.cli import plan as generate_plan

    parser = generate_args.build_parser()
    plan = generate_plan.make_plan(parser.parse_args(["--warmup", "--height", "96"]), parser)
    assert plan.warmup == [{"height": 96, "width": 64}]


# -- 6, 7 and 21. bcg-bench: user runs outside bench_results/, outputs checked first, failures said ----------------
FAST_BENCH = ["--cases", "pixart:tiny", "--modes", "eager", "--iters", "1", "--rounds", "1", "--warmup", "1",
              "--no-e2e"]


def test_a_bench_run_without_out_dir_writes_outside_bench_results(hide_cuda, monkeypatch, tmp_path):
    from bcg_diffusion.benchmarks.step import bench_step

    monkeypatch.chdir(tmp_path)
    assert bench_step.build_parser().get_default("out_dir") == Path("outputs") / "bench"
    assert bench_step.main(FAST_BENCH) == 0
    assert {".json", ".md"} <= {p.suffix for p in (tmp_path / "outputs" / "bench").iterdir()}
    assert not (tmp_path / "bench_results").exists()


@pytest.mark.parametrize("where, needle", [("file", "is a file, not a folder"), ("/proc/bench", "proc filesystem"),
                                           ("long", "takes names of at most 255 bytes")])
def test_bench_refuses_an_out_dir_that_cannot_take_files_before_measuring(capsys, tmp_path, where, needle):
    from bcg_diffusion.benchmarks.step import bench_step

    out = {"file": tmp_path / "a-file", "long": tmp_path / ("d" * 300)}.get(where, Path(where))
    if where == "file":
        out.write_text("x")
    reason = last_error(capsys, bench_step.main([*FAST_BENCH, "--out-dir", str(out)]))
    assert reason.startswith("bench_step.py: error: --out-dir") and needle in reason, reason


def test_bench_refuses_a_compile_cache_that_is_a_file(capsys, tmp_path):
    from bcg_diffusion.benchmarks.step import bench_step

    (cache := tmp_path / "cache").write_text("x")
    reason = last_error(capsys, bench_step.main([*FAST_BENCH, "--compile-cache", str(cache), "--out-dir", str(tmp_path)]))
    assert f"--compile-cache '{cache}' cannot be the compile caches' folder: {cache} is a file" in reason, reason


def test_a_full_disk_at_the_end_of_a_bench_run_keeps_no_empty_file_and_says_so(hide_cuda, monkeypatch, tmp_path, capsys):
    import errno

    from bcg_diffusion.benchmarks.step import bench_step
    from bcg_diffusion.toolkit import files

    real = Path.write_text

    def full(self, text, *args, **kwargs):  # the disk fills after the first bytes of each file
        real(self, text[:3], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.Path, "write_text", full)
    assert bench_step.main([*FAST_BENCH, "--out-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "No space left on device" in captured.err and "Traceback" not in captured.err + captured.out
    assert list(tmp_path.iterdir()) == []  # no 0-byte or cut file


@pytest.mark.parametrize("argv, needle", [
    (["--time-budget", "nan"], "argument --time-budget: 'nan' is not a finite number"),
    (["--cache-rows", "fbc:nan"], "the value after ':' must be a finite number"),
    (["--seed", "-1"], "--seed must be in 0 .. 2**64 - 1 (got -1)"),
    (["--cases", "flux:tiny@fp8"], "--cases flux:tiny@fp8: fp8 runs torchao's float8 kernels, which need a CUDA GPU"),
])
def test_bench_refuses_bad_options_up_front(hide_cuda, capsys, tmp_path, argv, needle):
    from bcg_diffusion.benchmarks.step import bench_step

    reason = last_error(capsys, bench_step.main([*argv, "--out-dir", str(tmp_path)]))
    assert needle in reason, reason
    assert not list(tmp_path.iterdir())


def test_a_failed_bench_case_exits_1(hide_cuda, monkeypatch, tmp_path, capsys):
    import bcg_pipelines

    from bcg_diffusion.benchmarks.step import bench_step

    def broken(*args, **kwargs):
        raise RuntimeError("no such pipeline here")

    monkeypatch.setattr(bcg_pipelines, "build_pipeline", broken)
    assert bench_step.main([*FAST_BENCH, "--out-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "case failed: RuntimeError: no such pipeline here" in captured.out
    assert "error: 1 of 1 case(s) failed: pixart:tiny:256x256:b1" in captured.err


# -- 15 and 16. bcg-load and bcg-bench name themselves; --help imports no torch ----------------------------------
@pytest.mark.parametrize("module, script, command", [
    ("bcg_diffusion.serving.load.command", "load.py", "bcg-load"),
    ("bcg_diffusion.benchmarks.step.bench_step", "bench_step.py", "bcg-bench"),
])
def test_load_and_bench_take_their_name_from_how_they_were_run(monkeypatch, module, script, command):
    import importlib

    parser_of = importlib.import_module(module).build_parser
    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{command}"])
    assert parser_of().prog == command
    monkeypatch.setattr(sys, "argv", [f"scripts/{script}"])
    assert parser_of().prog == script


@pytest.mark.parametrize("module", ["bcg_diffusion.cli.generate", "bcg_diffusion.serving.serve_command",
                                    "bcg_diffusion.serving.load.command", "bcg_diffusion.benchmarks.step.bench_step"])
def test_help_imports_no_torch(module):
    code = (f"import sys, contextlib, io\nfrom {module} import main\nwith contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    code = main(['--help'])\nassert code == 0 and 'usage:' in out.getvalue(), code\n"
            "print(sorted(m for m in ('torch', 'diffusers', 'transformers', 'bcg_pipelines') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


# -- 22. bcg-load checks its options before any traffic ---------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--request-timeout", "nan"], "argument --request-timeout: 'nan' is not a finite number"),
    (["--time-limit", "inf"], "argument --time-limit: 'inf' is not a finite number"),
    (["--prompts", ""], "--prompts '' holds no prompt"),
    (["--prompts", "a fox||a cat"], "--prompts 'a fox||a cat': prompt 2 is empty"),
    (["--out", "/proc/load.json"], "--out '/proc/load.json' cannot be written"),
])
def test_load_refuses_bad_options_before_any_traffic(capsys, argv, needle):
    from bcg_diffusion.serving.load import command as load_test

    reason = last_error(capsys, load_test.main(["--url", "http://127.0.0.1:9", "--requests", "1", *argv]))
    assert needle in reason, reason


# -- 3. replicas this machine cannot place are refused before Ray starts --------------------------------------------
@pytest.mark.parametrize("argv, gpus", [(["--replicas", "1", "--gpus-per-replica", "1"], "1"),
                                        (["--replicas", "3", "--gpus-per-replica", "0.5", "--device", "cpu"], "0.5")])
def test_replicas_that_need_gpus_this_machine_lacks_exit_2_before_ray(argv, gpus):
    """In a process of its own, bounded: before the fix such a command waited for the GPU for ever."""
    import os

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on a GPU machine too
    done = subprocess.run([sys.executable, "-m", "bcg_diffusion.serving.serve_command", *argv], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)
    reason = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and reason.startswith("serve.py: error: --replicas"), done.stderr[-2000:]
    assert f"with {gpus} GPU(s) each" in reason and "this machine has 0 GPU(s)" in reason, reason
    assert "starting Ray Serve" not in done.stdout


def test_placement_counts_shared_and_whole_gpus():
    from bcg_diffusion.serving.replicas.options import ReplicaOptions, placement_problem

    assert placement_problem(ReplicaOptions(replicas=4, gpus_per_replica=0.5), True, 2) is None
    assert placement_problem(ReplicaOptions(replicas=5, gpus_per_replica=0.5), True, 2) is not None
    assert placement_problem(ReplicaOptions(replicas=1, gpus_per_replica=2), True, 2) is None
    assert placement_problem(ReplicaOptions(replicas=2, gpus_per_replica=2), True, 3) is not None
    assert placement_problem(ReplicaOptions(replicas=8), False, 0) is None  # CPU replicas: no GPU asked
    assert placement_problem(ReplicaOptions(replicas=1), True, 0) is not None  # on CUDA the default is one GPU each


# -- 13 and 24. what docs/serving.md says of the Ray proxy's own answers and of the replicas' output -----------------
def test_the_serving_docs_say_what_the_ray_proxy_answers_and_how_to_see_every_replica():
    docs = " ".join((ROOT / "docs" / "serving.md").read_text().split())
    assert "gets the proxy's own plain-text `400 Bad Request`, not the single server's OpenAI error JSON" in docs
    assert "`RAY_DEDUP_LOGS=0`, unless set), so every replica's lines are there" in docs
    assert "`/stats` adds `server.replica`" in docs and "appears in the command's output, prefixed by Ray" in docs
    assert "two of Ray's agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) were seen to outlive it" not in docs
