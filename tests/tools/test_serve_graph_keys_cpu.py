"""How many captured keys a BCG server keeps: at least every key its warm-up may capture (the soak of 2026-12-07
21:16 warmed 22 keys into the library's default of 8, and requests at warmed sizes captured again while serving)."""

from __future__ import annotations

import dataclasses

import pytest

import bcg_diffusion
from bcg_diffusion.serving import command_line
from bcg_diffusion.serving.assembly.speed import graphs_to_keep
from bcg_diffusion.serving.server_plan import read_plan
from bcg_diffusion.serving.startup_warmup import most_warmup_keys
from bcg_diffusion.toolkit import speedups


def _plan(*extra: str, adapters: tuple[str, ...] = ()):
    parser = command_line.build_parser()
    plan = read_plan(parser.parse_args(["--model", "sana", "--size", "tiny", "--device", "cpu", "--bcg", *extra]),
                     parser)
    return dataclasses.replace(plan, catalog=dataclasses.replace(plan.catalog, adapters=adapters))


def test_the_most_warmup_keys_count_every_shape_and_adapter_state():
    assert most_warmup_keys(4, 4, batched=True, adapters=True) == 40  # the soak: 4 sizes x (batch + n 1..4) x 2
    assert most_warmup_keys(4, 4, batched=False, adapters=False) == 16
    assert most_warmup_keys(0, 4, batched=True, adapters=True) == 0


def test_a_server_whose_warmup_exceeds_the_default_keeps_every_warmed_key():
    keep, why = graphs_to_keep(_plan("--warmup", "256x256,256x320,512x512,448x576", "--max-batch", "8",
                                     adapters=("soak1", "soak2")))
    assert keep == 40 and bcg_diffusion.BCGConfig.max_graphs == 8
    assert why == ("BCG keeps up to 40 graph keys (the library's default is 8): the warm-up may capture that many "
                   "(4 size(s) x (the batch shape and n = 1 .. 4) x 2 (adapter slot on and off)), and a warmed key "
                   "evicted would capture again while serving")


@pytest.mark.parametrize("extra", [(), ("--warmup", "256x256", "--max-n", "2"), ("--warmup", "256x256,512x512")])
def test_a_small_warmup_keeps_the_library_default(extra):
    assert graphs_to_keep(_plan(*extra)) == (None, None)  # none, 2 and 8 keys: within the default


def test_a_compiled_server_without_warmup_counts_its_default_size():
    assert graphs_to_keep(_plan("--compile", "--max-n", "5")) == (None, None)  # the default size: n = 1 .. 5
    assert graphs_to_keep(_plan("--compile", "--max-n", "5", adapters=("a",)))[0] == 10  # x2 with an adapter
    assert graphs_to_keep(_plan("--max-n", "5", adapters=("a",))) == (None, None)  # nothing warmed


def test_speed_up_hands_max_graphs_to_the_library(monkeypatch):
    seen = []
    monkeypatch.setattr(bcg_diffusion, "accelerate_pipeline", lambda pipe, config=None: seen.append(config))
    speedups.speed_up(object(), compile=False, bcg=True, on_cuda=True, max_graphs=40)
    speedups.speed_up(object(), compile=False, bcg=True, on_cuda=True)
    assert seen[0] == bcg_diffusion.BCGConfig(max_graphs=40) and seen[1] is None
