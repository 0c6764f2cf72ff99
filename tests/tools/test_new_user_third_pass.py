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
    from bcg_diffusion.serving import load_test

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
