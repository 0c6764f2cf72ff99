"""BCG under diffusers' context parallelism (Ulysses and ring, degree 2) on TWO GPUs, under NCCL.

The same checks as the one-GPU harness (``test_context_parallel_one_gpu.py``, ``cp_checks.py``),
with one GPU per rank, NCCL and diffusers' own functional collectives (observed by the harness:
counted, refused under a capture). Two torchrun launches of ``tests/cp_worker.py``: every
case, then a rank that raises mid-call (under NCCL the host of the other rank does not wait in the
collective, so it stops at its next agreement round: in that call or the next). Everything is
bounded: collectives by the worker's timeout, each launch by its own (its process group killed).

The GPU tests skip with the reason unless two CUDA devices are present. The CPU test checks the
worker's plan; its eager path over gloo on the CPU is checked by ``tests/integrations/test_parallel_cpu.py``
(in its one launch).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import cp_checks
import cp_harness
import cp_worker

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 540  # under the 10-minute limit of one device command
FAULT_LAUNCH_TIMEOUT_S = 240
COLLECTIVE_TIMEOUT_S = 120.0
CALLS = 100
NCCL_CASES = cp_worker.ALL_CASES + cp_worker.PIPE_CASES + ("flux:ulysses:refusals",)
ALL_SABOTAGE = ("fallback", "skip_segment", "stale_inputs")

_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
two_gpus = pytest.mark.skipif(
    _gpus < 2, reason=f"needs 2 CUDA GPUs (torchrun --nproc_per_node 2, NCCL); this machine has {_gpus}"
)


def _launch(report_dir: Path, *worker_args: str, env: dict | None = None, timeout_s: float = LAUNCH_TIMEOUT_S) -> dict:
    """Run the worker on 2 ranks; {rank: report}. Fails (never hangs) on a timeout or a crash."""
    command = cp_worker.launch_command(report_dir, *worker_args, nproc=2)
    launch = cp_harness.launch(command, timeout_s, env=env, log_path=report_dir / "launch.log")
    return cp_checks.load_reports(report_dir, launch)


@pytest.fixture(scope="module")
def cp_reports(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("context_parallel"), "--calls", str(CALLS), "--cases", ",".join(NCCL_CASES),
                   "--collective-timeout-s", str(COLLECTIVE_TIMEOUT_S))


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
def test_bcg_cp_is_bitwise_equal_to_eager_cp_on_every_rank(cp_reports, case):
    cp_checks.bitwise_equal_and_replayed(cp_reports, case, CALLS)


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="compares the ranks with each other, which sabotage breaks alike; "
                               "equality with eager and the replays are test_bcg_cp_is_bitwise_equal_to_eager_cp_on_every_rank's claim")
def test_ranks_agree_on_outputs_and_graph_decisions(cp_reports, case):
    cp_checks.ranks_agree(cp_reports, case)


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", cp_worker.MAIN_CASES)
def test_lora_load_after_capture_is_replayed_exactly(cp_reports, case):
    if not cp_checks.lora_replayed_exactly(cp_reports, case):
        pytest.skip(f"no LoRA load: {cp_reports[0]['lora_skipped']}")


@pytest.mark.gpu
@two_gpus
def test_accelerating_before_enabling_parallelism_works(cp_reports):
    cp_checks.bitwise_equal_and_replayed(cp_reports, cp_worker.ORDER_CASE, CALLS)
    cp_checks.ranks_agree(cp_reports, cp_worker.ORDER_CASE)


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", cp_worker.PIPE_CASES)
def test_whole_pipelines_are_bitwise_equal_on_every_rank(cp_reports, case):
    cp_checks.pipelines_equal(cp_reports, case)


@pytest.mark.gpu
@two_gpus
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="checks refusals at acceleration: no call replays")
def test_per_rank_caches_compile_and_uneven_modes_are_refused(cp_reports):
    cp_checks.refusals_clear(cp_reports, "flux:ulysses:refusals")


@pytest.mark.gpu
@two_gpus
@pytest.mark.survives_sabotage(*ALL_SABOTAGE, reason="checks that one rank's error reaches every rank; no replay is claimed")
def test_a_rank_that_raises_mid_call_is_reported_by_every_rank(tmp_path):
    reports = _launch(tmp_path, "--cases", cp_worker.FAULT_CASE, "--collective-timeout-s", str(COLLECTIVE_TIMEOUT_S),
                      timeout_s=FAULT_LAUNCH_TIMEOUT_S)
    cp_checks.fault_reported(reports, cp_worker.FAULT_CASE, COLLECTIVE_TIMEOUT_S, same_call=False)


# -- on the CPU: the worker itself ------------------------------------------------------------
def test_worker_plan_and_launch_command():
    schedule = cp_worker.call_schedule("flux", CALLS)
    shapes = cp_worker.SHAPES["flux"]
    assert len(schedule) == CALLS and set(schedule) == set(shapes)
    assert schedule[:6] == [shapes[0]] * 3 + [shapes[1]] * 2 + [shapes[0]]  # capture, replay, shape change, back
    for table in (cp_worker.SHAPES, cp_worker.FULL_SHAPES):
        for family, family_shapes in table.items():
            for shape in family_shapes:
                tokens = shape[1] * shape[2] if family == "flux" else shape[1] * (shape[2] // 2) * (shape[3] // 2)
                assert tokens % 2 == 0 and shape[-1] % 2 == 0, (family, shape)  # diffusers asserts even shards
    command = cp_worker.launch_command("/tmp/r", "--calls", "5")
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--nproc_per_node=2" in command
    env = cp_worker.launch_env({"PATH": "/bin"})
    assert {k: env[k] for k in cp_worker.MULTICAST_OFF} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
    assert cp_worker.Case.parse("wan:ring:bcg_first").bcg_first
    assert cp_worker.Case.parse("flux:ulysses:pipe").variant == "pipe"
    for bad in ("sd3:ulysses", "flux:ulysses:nope", "flux:ulysses:"):
        with pytest.raises(ValueError, match="family:mode"):
            cp_worker.Case.parse(bad)
