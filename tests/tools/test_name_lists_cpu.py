"""Comma-separated name options: one argparse type, so the benchmarks refuse alike (exit 2, the same words)."""

from __future__ import annotations

import argparse

import pytest

from bcg_diffusion.serving.load import batching_bench, step_bench
from bcg_diffusion.toolkit.name_lists import name_list


def test_names_in_the_order_given_blanks_and_repeats_dropped():
    parse = name_list(("a", "b", "c"))
    assert parse(" c, a,,c ") == ("c", "a")


@pytest.mark.parametrize("text, words", [("a,x,y", "unknown 'x', 'y'"), (" , ", "no name given")])
def test_unknown_or_no_names_are_a_usage_error_listing_the_choices(text, words):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{words}; give one or more of a,b, comma-separated$"):
        name_list(("a", "b"))(text)


@pytest.mark.parametrize("main, option, choices", [
    (batching_bench.main, "--families", "pixart,flux"),
    (step_bench.main, "--scenarios", ",".join(step_bench.ALL_SCENARIOS)),
])
def test_both_benchmarks_refuse_a_bogus_name_alike(capsys, main, option, choices):
    assert main(["--out-dir", "/tmp/unused", option, "bogus"]) == 2
    err = capsys.readouterr().err
    assert f"error: argument {option}: unknown 'bogus'; give one or more of {choices}, comma-separated" in err


def test_the_defaults_are_every_name():
    assert batching_bench.build_parser().parse_args(["--out-dir", "x"]).families == ("pixart", "flux")
    assert step_bench.build_parser().parse_args(["--out-dir", "x"]).scenarios == step_bench.ALL_SCENARIOS
