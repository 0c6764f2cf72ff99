"""What a new user trips over with ``bcg-generate`` / ``bcg-serve``, second pass (issue 39), one test per point.

Bad arguments exit with code 2 and one line naming what to do, before anything is built (``no_build``). The
numbers in the section titles are the issue's. Quiet runs (point 1) and the README example (point 2) are
tested in tests/tools/test_quiet_runs.py; the docs' figures and links (point 9) in tests/tools/test_docs_facts.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bcg_diffusion.cli import args as generate_args
from bcg_diffusion.cli import generate, plan as generate_plan
from bcg_diffusion.toolkit import choices, options

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's console scripts (pip install -e .)


def usage_error(capsys, argv: list[str]) -> str:
    """Run the command, expect exit code 2, return its last stderr line (the reason)."""
    assert generate.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("generate.py: error: "), err
    return err[-1]


def plan(argv: list[str]):
    parser = generate_args.build_parser()
    return generate_plan.make_plan(parser.parse_args(argv), parser)


# -- 3. a negative prompt the pipeline would ignore is refused -------------------------------------------------
def test_a_negative_prompt_flux_ignores_exits_2_saying_what_to_do(capsys, no_build):
    reason = usage_error(capsys, ["--negative-prompt", "blurry"])
    assert "--negative-prompt has no effect on flux: FluxPipeline uses negative_prompt only with classifier-free " \
           "guidance, which it runs with true_cfg_scale > 1" in reason, reason
    assert "leave --negative-prompt out" in reason and "true_cfg_scale" in reason


def test_a_negative_prompt_without_cfg_says_raise_the_guidance(capsys, no_build):
    reason = usage_error(capsys, ["--model", "sd3", "--guidance", "1", "--negative-prompt", "blurry"])
    assert "--negative-prompt has no effect on sd3" in reason and "give --guidance above 1" in reason, reason
    assert plan(["--model", "sd3", "--negative-prompt", "blurry"]).call["negative_prompt"] == "blurry"  # CFG on
    reason = usage_error(capsys, ["--model", "flux2", "--negative-prompt", "blurry"])
    assert "Flux2Pipeline.__call__ takes no negative_prompt" in reason and "leave --negative-prompt out" in reason


# -- 4. steps and batch are bounded, as the server's are --------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--steps", "1000000"], f"--steps must be in 1 .. {choices.MAX_STEPS} (got 1000000)"),
    (["--steps", str(choices.MAX_STEPS + 1)], f"--steps must be in 1 .. {choices.MAX_STEPS}"),
    (["--batch", "100000"], f"--batch must be in 1 .. {choices.MAX_BATCH} (got 100000)"),
    (["--steps", "0"], "--steps must be in 1 .."),
])
def test_steps_and_batch_out_of_range_exit_2(capsys, no_build, argv, needle):
    assert needle in usage_error(capsys, argv)


def test_the_step_limit_is_the_servers():
    from bcg_diffusion.serving import command_line

    assert command_line.DEFAULT_MAX_STEPS == choices.MAX_STEPS == 100
    assert plan(["--steps", str(choices.MAX_STEPS), "--batch", str(choices.MAX_BATCH)]).call["num_inference_steps"] == 100


# -- 5. a prompt that is not UTF-8 is refused before the build ---------------------------------------------------
@pytest.mark.parametrize("option", ["--prompt", "--negative-prompt"])
def test_a_prompt_that_is_not_utf8_exits_2_before_building(capsys, no_build, option):
    text = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # how Python hands over such argv bytes
    reason = usage_error(capsys, ["--model", "sd3", option, text])
    assert f"{option} is not valid UTF-8 (byte 0xe9 at character 3)" in reason, reason


# -- 6. --model "", an empty model_index.json, --out newdir/ ------------------------------------------------------
def test_an_empty_model_name_exits_2(capsys, no_build, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')  # the current folder is one
    reason = usage_error(capsys, ["--model", ""])
    assert "--model is empty" in reason and "flux" in reason, reason


@pytest.mark.parametrize("index, needle", [
    ("{}", "has no _class_name"),
    ("[1, 2]", "is not a JSON object"),
    ("{not json", "is not valid JSON"),
])
def test_a_model_index_that_names_no_pipeline_exits_2(capsys, no_build, tmp_path, index, needle):
    (tmp_path / "model_index.json").write_text(index)
    reason = usage_error(capsys, ["--model", str(tmp_path)])
    assert f"--model {tmp_path}: model_index.json {needle}" in reason, reason
    assert "save_pretrained" in reason


def test_out_missing_folder_with_a_trailing_slash_is_a_folder(capsys, no_build, tmp_path):
    reason = usage_error(capsys, ["--out", f"{tmp_path}/newdir/"])
    assert f"--out '{tmp_path}/newdir/' cannot be written: it is a folder; give a file in it" in reason, reason
    assert f"{tmp_path}/newdir/flux.png" in reason


# -- 7. the commands name themselves as they were run ---------------------------------------------------------------
@pytest.mark.parametrize("argv0, name", [("/venv/bin/bcg-generate", "bcg-generate"), ("scripts/generate.py", "generate.py"),
                                         ("/x/bcg_diffusion/cli/generate.py", "generate.py"), ("pytest", "generate.py")])
def test_generate_takes_its_name_from_how_it_was_run(monkeypatch, argv0, name):
    monkeypatch.setattr(sys, "argv", [argv0])
    assert generate_args.build_parser().prog == name
    assert options.command_name("generate.py", "bcg-generate") == name


@pytest.mark.skipif(shutil.which("bcg-serve", path=str(BIN)) is None, reason="the console scripts are not installed")
@pytest.mark.parametrize("command, argv, name", [
    ("bcg-generate", ["--steps", "0"], "bcg-generate"),
    ("bcg-serve", ["--max-steps", "0"], "bcg-serve"),
    ("scripts/serve.py", ["--max-steps", "0"], "serve.py"),
])
def test_usage_and_error_lines_name_the_command(command, argv, name):
    exe = [str(BIN / command)] if command.startswith("bcg-") else [sys.executable, str(ROOT / command)]
    done = subprocess.run([*exe, *argv], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"usage: {name} ") and lines[-1].startswith(f"{name}: error: "), done.stderr


# -- 8. the side limit reads as an upper bound -------------------------------------------------------------------------
def test_the_height_help_and_docs_state_the_limit_as_an_upper_bound():
    help_text = " ".join(generate_args.build_parser().format_help().split())
    docs = " ".join((ROOT / "docs" / "generate.md").read_text().split())
    for text in (help_text, docs):
        assert "at least 4096" not in text and "never below 4096 px (" not in text
    assert choices.SIDE_LIMIT_RULE in help_text and choices.SIDE_LIMIT_RULE in docs
    assert choices.SIDE_LIMIT_RULE == "4x the largest side of the family's published size, or 4096 px where that is more"


def test_the_side_limit_error_states_the_rule(capsys, no_build):
    reason = usage_error(capsys, ["--height", "8192"])
    assert f"--height 8192 is above the limit of 4096 px for flux ({choices.SIDE_LIMIT_RULE};" in reason, reason


# -- 1. quiet runs: the known-harmless library messages are dropped, precisely ------------------------------------
def test_torchao_and_pytree_messages_are_dropped_only_where_known_harmless(caplog, monkeypatch):
    import logging

    import torch

    import bcg_diffusion  # noqa: F401 - its import installed the filters

    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    failed = "Failed to load /venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load"
    enum = "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an opaque"
    with caplog.at_level(logging.WARNING):
        monkeypatch.setattr(torch.version, "cuda", None)  # the CPU build: torchao's CUDA kernels cannot load
        torchao.warning(failed)
        monkeypatch.setattr(torch.version, "cuda", "13.0")  # a CUDA build: a kernel that fails to load is news
        torchao.warning(failed)
        pytree.warning(enum)  # logged from here, not from torchao: kept
        torchao.warning("Failed to load something else")
    assert [r.getMessage() for r in caplog.records] == [failed, enum, "Failed to load something else"]
    caplog.clear()
    code = compile("pytree.warning(enum)", "/venv/site-packages/torchao/utils.py", "exec")
    with caplog.at_level(logging.WARNING):
        exec(code, {"pytree": pytree, "enum": enum})  # as torchao's register_as_pytree_constant logs it
    assert caplog.records == []


# -- 2. the no-GPU notice points at the user's line -------------------------------------------------------------------
def test_the_no_gpu_warning_points_at_the_callers_line(hide_cuda, monkeypatch):
    import inspect
    import warnings

    import bcg_diffusion
    import bcg_diffusion.accelerate as accelerate
    import bcg_pipelines as pipelines

    monkeypatch.setattr(accelerate, "_warned", set())  # once per process: this test's warning is the first
    pipe = pipelines.build_pipeline("flux", "tiny", device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        bcg_diffusion.accelerate_pipeline(pipe)
    notices = [(w.filename, w.lineno) for w in caught if "needs a CUDA GPU" in str(w.message)]
    assert notices == [(__file__, line)], [(w.filename, w.lineno, str(w.message)) for w in caught]
