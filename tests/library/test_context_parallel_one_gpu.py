"""BCG under diffusers' context parallelism with two ranks on ONE GPU (the harness, gloo).

Two torchrun launches of ``tests/cp_worker.py --one-gpu`` (every rank on ``cuda:0``,
gloo, the harness's stand-in collectives: ``tests/cp_harness.py``):

1. Flux.1 and Wan 2.1 tiny transformers, Ulysses 2 and ring 2, 100 calls each with shape changes
   and a LoRA load after capture; accelerating before ``enable_parallelism``; whole tiny pipelines
   (``accelerate_pipeline``: a shape change, a LoRA load, TaylorSeer); the refusals; ranks given
   different inputs once;
2. a rank that raises in the middle of a replayed call.

What must hold on every rank: BCG CP bitwise equal to eager CP, graphs really replayed, the ranks'
decisions equal, no collective under a capture (the stand-ins raise), refusals clear, a fault
reported by every rank, naming the rank and the call, long before any timeout. Every wait is
bounded: collectives by the worker's timeouts, each launch by its own (its process group killed).

Full-size Flux.1-dev and Wan 2.1 1.3B (one model per rank, reference first) run only with
``BCG_CP_FULL=1`` (``-m cp_full``): GPU time is scarce. Reports go to ``$BCG_CP_REPORT_DIR`` when set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import cp_checks
import cp_harness
import cp_worker

CALLS = 100
COLLECTIVE_TIMEOUT_S = 60.0
RANK_TIMEOUT_S = 90.0
# the launches' bounds fit run_cp_gpu.sh's 4 minutes; BCG_CP_MAIN_TIMEOUT_S / BCG_CP_FAULT_TIMEOUT_S override
MAIN_LAUNCH_TIMEOUT_S = float(os.environ.get("BCG_CP_MAIN_TIMEOUT_S", 160))
FAULT_LAUNCH_TIMEOUT_S = float(os.environ.get("BCG_CP_FAULT_TIMEOUT_S", 55))
FULL_LAUNCH_TIMEOUT_S = 340
ONE_GPU_CASES = cp_worker.ALL_CASES + cp_worker.CHECK_CASES + cp_worker.PIPE_CASES  # the heaviest last
FULL_CASES = ("flux:ulysses", "wan:ulysses")
ALL_SABOTAGE = ("fallback", "skip_segment", "stale_inputs")

_cuda = torch.cuda.is_available()
one_gpu = pytest.mark.skipif(not _cuda, reason="needs a CUDA GPU (two ranks share cuda:0 under gloo)")
full_size = pytest.mark.skipif(
    os.environ.get("BCG_CP_FULL") != "1",
    reason="full-size context parallelism on one GPU is optional (GPU time): set BCG_CP_FULL=1",
)


def _report_dir(tmp_path_factory, name: str) -> Path:
    root = os.environ.get("BCG_CP_REPORT_DIR")
    if root:
        path = Path(root) / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp(name)


def _run(report_dir: Path, timeout_s: float, *args: str) -> dict:
    command = cp_worker.launch_command(
        report_dir, "--one-gpu", "--collective-timeout-s", str(COLLECTIVE_TIMEOUT_S),
        "--rank-timeout-s", str(RANK_TIMEOUT_S), *args,
    )
    launch = cp_harness.launch(command, timeout_s, log_path=report_dir / "launch.log")
    return cp_checks.load_reports(report_dir, launch)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return _run(_report_dir(tmp_path_factory, "one_gpu_main"), MAIN_LAUNCH_TIMEOUT_S,
                "--calls", str(CALLS), "--cases", ",".join(ONE_GPU_CASES))


@pytest.fixture(scope="module")
def fault_reports(tmp_path_factory):
    return _run(_report_dir(tmp_path_factory, "one_gpu_fault"), FAULT_LAUNCH_TIMEOUT_S, "--cases", cp_worker.FAULT_CASE)


@pytest.mark.gpu
@one_gpu
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
def test_bcg_cp2_is_bitwise_equal_to_eager_cp2_on_every_rank(reports, case):
    cp_checks.bitwise_equal_and_replayed(reports, case, CALLS)


@pytest.mark.gpu
@one_gpu
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="compares the ranks with each other, which sabotage breaks alike; "
                               "equality with eager and the replays are test_bcg_cp2_is_bitwise_equal_to_eager_cp2_on_every_rank's claim")
def test_ranks_agree_on_outputs_and_graph_decisions(reports, case):
    cp_checks.ranks_agree(reports, case)


@pytest.mark.gpu
@one_gpu
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
def test_lora_load_after_capture_is_replayed_exactly(reports, case):
    if not cp_checks.lora_replayed_exactly(reports, case):
        pytest.skip(f"no LoRA load: {reports[0]['lora_skipped']}")


@pytest.mark.gpu
@one_gpu
def test_accelerating_before_enabling_parallelism_works(reports):
    cp_checks.bitwise_equal_and_replayed(reports, cp_worker.ORDER_CASE, CALLS)
    cp_checks.ranks_agree(reports, cp_worker.ORDER_CASE)


@pytest.mark.gpu
@one_gpu
@pytest.mark.parametrize("case", cp_worker.PIPE_CASES)
def test_whole_pipelines_are_bitwise_equal_on_every_rank(reports, case):
    cp_checks.pipelines_equal(reports, case)


@pytest.mark.gpu
@one_gpu
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="checks refusals at acceleration: no call replays")
def test_per_rank_caches_compile_and_uneven_modes_are_refused(reports):
    cp_checks.refusals_clear(reports, "flux:ulysses:refusals")


@pytest.mark.gpu
@one_gpu
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="checks the error raised before the first collective: no call replays")
def test_different_inputs_raise_on_every_rank_before_any_collective(reports):
    cp_checks.disagreement_raised_before_collectives(reports, "flux:ulysses:disagree")


@pytest.mark.gpu
@one_gpu
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="checks that one rank's error reaches every rank; no replay is claimed")
def test_a_rank_that_raises_mid_call_is_reported_by_every_rank(fault_reports):
    cp_checks.fault_reported(fault_reports, cp_worker.FAULT_CASE, COLLECTIVE_TIMEOUT_S)


@pytest.mark.gpu
@pytest.mark.cp_full
@one_gpu
@full_size
def test_full_size_bcg_cp2_is_bitwise_equal_to_eager_cp2(tmp_path_factory):
    calls = 6
    reports = _run(_report_dir(tmp_path_factory, "one_gpu_full"), FULL_LAUNCH_TIMEOUT_S,
                   "--size", "full", "--calls", str(calls), "--cases", ",".join(FULL_CASES))
    for case in FULL_CASES:
        for rank in reports:
            record = cp_checks.case(reports, rank, case)
            assert record["calls"] == calls and record["mismatch_count"] == 0, f"rank {rank}, {case}: {record['mismatches']}"
            stats = record["stats"]
            assert stats["hits"] >= calls - 2 * len(cp_worker.FULL_SHAPES[case.split(':')[0]]) and not stats["fallbacks"], stats
        assert cp_checks.case(reports, 0, case)["digest"] == cp_checks.case(reports, 1, case)["digest"]
