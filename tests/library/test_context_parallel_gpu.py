"""BCG under diffusers' context parallelism (Ulysses and ring, degree 2) on two GPUs.

One torchrun launch of ``tests/library/cp_worker.py`` (2 ranks, NCCL, NVLink multicast off) runs every case;
the tests read each rank's report. What must hold, on every rank: BCG CP is bitwise equal to eager
CP on all 100 calls (shape changes, a LoRA load after capture), BCG really replayed graphs, and the
ranks agree (same outputs, same hits and captures). Everything is bounded: the collectives by the
worker's timeout, the launch by ``LAUNCH_TIMEOUT_S`` (its whole process group is killed).

The GPU tests skip with the reason unless two CUDA devices are present. The CPU tests check the
worker itself: it imports, its plan is sound, and its eager path runs over gloo on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import cp_worker

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 540  # under the 10-minute limit of one device command
CALLS = 100
MAIN_CASES = [c for c in cp_worker.ALL_CASES if c != cp_worker.ORDER_CASE]

_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
# BCG under context parallelism is not built yet: accelerate refuses such transformers (issue 19 is blocked
# without a multi-GPU machine to develop and verify it on). These tests describe the behaviour to build.
cp_built = pytest.mark.skip(reason="BCG under context parallelism is not built yet; accelerate refuses it (issue 19)")
two_gpus = pytest.mark.skipif(
    _gpus < 2, reason=f"needs 2 CUDA GPUs (torchrun --nproc_per_node 2, NCCL); this machine has {_gpus}"
)


def _launch(report_dir: Path, *worker_args: str, env: dict | None = None, timeout_s: float = LAUNCH_TIMEOUT_S) -> dict:
    """Run the worker on 2 ranks; {rank: report}. Fails (never hangs) on a timeout or a crash."""
    command = cp_worker.launch_command(report_dir, *worker_args, nproc=2)
    proc = subprocess.Popen(command, env=cp_worker.launch_env(env), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks
        output, _ = proc.communicate()
        pytest.fail(f"the 2-rank launch did not finish within {timeout_s} s (a hang?):\n{output[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{output[-6000:]}"
    reports = {}
    for rank in range(2):
        path = report_dir / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report:\n{output[-6000:]}"
        reports[rank] = json.loads(path.read_text())
    return reports


def _case(reports: dict, rank: int, case: str) -> dict:
    record = reports[rank]["cases"][case]
    assert "error" not in record, f"rank {rank}, {case}:\n{record['error']}"
    return record


@pytest.fixture(scope="module")
def cp_reports(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("context_parallel"), "--calls", str(CALLS))


@cp_built
@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", MAIN_CASES)
def test_bcg_cp_is_bitwise_equal_to_eager_cp_on_every_rank(cp_reports, case):
    for rank in range(2):
        record = _case(cp_reports, rank, case)
        assert record["calls"] == CALLS
        assert record["mismatch_count"] == 0, f"rank {rank}, {case}: {record['mismatches']}"
        stats = record["stats"]
        assert stats["accelerated"] and not stats["fallbacks"], f"rank {rank}, {case}: {stats}"
        # graphs were replayed, not eager calls passed off as BCG: every key (three shapes, each
        # captured again after the LoRA load) may cost a few eager calls, the rest replay
        keys = 2 * len(cp_worker.SHAPES[case.split(":")[0]])
        assert stats["hits"] >= CALLS - 2 * keys, f"rank {rank}, {case}: {stats}"


@cp_built
@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", MAIN_CASES)
def test_ranks_agree_on_outputs_and_graph_decisions(cp_reports, case):
    first, second = _case(cp_reports, 0, case), _case(cp_reports, 1, case)
    assert first["digest"] == second["digest"], f"{case}: the ranks' gathered outputs differ"
    for field in ("hits", "misses", "captures", "eager_calls"):
        assert first["stats"][field] == second["stats"][field], f"{case}: {field} differs: {first['stats']} vs {second['stats']}"


@cp_built
@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", MAIN_CASES)
def test_lora_load_after_capture_is_replayed_exactly(cp_reports, case):
    if cp_reports[0]["lora_skipped"]:
        pytest.skip(f"no LoRA load: {cp_reports[0]['lora_skipped']}")
    for rank in range(2):
        record = _case(cp_reports, rank, case)
        assert record["lora"] == f"added before call {cp_worker.LORA_AT_CALL}"
        assert record["lora_changed_output"], f"rank {rank}, {case}: the LoRA did not change the output (test is void)"
        late = [m for m in record["mismatches"] if m["call"] >= cp_worker.LORA_AT_CALL]
        assert not late, f"rank {rank}, {case}: differs after the LoRA load: {late}"


@cp_built
@pytest.mark.gpu
@two_gpus
def test_accelerating_before_enabling_parallelism_works_or_is_refused_clearly(cp_reports):
    for rank in range(2):
        record = _case(cp_reports, rank, cp_worker.ORDER_CASE)
        if "refused" in record:
            assert record["refused"].startswith(("AccelerationError", "Rank")), record["refused"]
            assert "enable_parallelism" in record["refused"] or "context parallel" in record["refused"]
            continue
        assert record["mismatch_count"] == 0, f"rank {rank}: {record['mismatches']}"
        assert record["stats"]["hits"] > 0 and not record["stats"]["fallbacks"], f"rank {rank}: {record['stats']}"


# -- on the CPU: the worker itself ------------------------------------------------------------
def test_worker_plan_and_launch_command():
    schedule = cp_worker.call_schedule("flux", CALLS)
    shapes = cp_worker.SHAPES["flux"]
    assert len(schedule) == CALLS and set(schedule) == set(shapes)
    assert schedule[:6] == [shapes[0]] * 3 + [shapes[1]] * 2 + [shapes[0]]  # capture, replay, shape change, back
    for family, family_shapes in cp_worker.SHAPES.items():
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
    with pytest.raises(ValueError, match="family:mode"):
        cp_worker.Case.parse("sd3:ulysses")


def test_worker_runs_eager_context_parallel_on_cpu_over_gloo(tmp_path):
    """The worker's own path on the CPU: two gloo ranks, Ulysses (ring needs a GPU backend); BCG is
    a no-op here, so both models run eager CP and must agree bitwise, on both ranks."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    reports = _launch(tmp_path, "--device", "cpu", "--dtype", "fp32", "--calls", "8",
                      "--cases", "flux:ulysses,wan:ulysses", env=env, timeout_s=240)
    for case in ("flux:ulysses", "wan:ulysses"):
        first, second = _case(reports, 0, case), _case(reports, 1, case)
        for record in (first, second):
            assert record["calls"] == 8 and record["mismatch_count"] == 0, record
            assert record["gather_output_type"], record  # the gather hook ran on proj_out
            if not reports[0]["lora_skipped"]:
                assert record["lora_changed_output"] is True
        assert first["digest"] == second["digest"]
