"""What the context-parallel reports of ``cp_worker.py`` must show, shared by the one-GPU harness
tests, the two-GPU tests and the CPU tests. Each check takes ``{rank: report}`` and fails with the
rank, the case and what differed."""

from __future__ import annotations

import json
from pathlib import Path

import cp_harness
import cp_worker


def load_reports(report_dir: Path, launch: cp_harness.Launch, ranks: int = 2) -> dict:
    """{rank: report}; fails (with the launch's output) on a timeout, a crash or a missing report."""
    tail = launch.output[-6000:]
    assert not launch.timed_out, f"the {ranks}-rank launch did not finish within its timeout (a hang?):\n{tail}"
    assert launch.returncode == 0, f"torchrun failed ({launch.returncode}):\n{tail}"
    reports = {}
    for rank in range(ranks):
        path = report_dir / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report:\n{tail}"
        reports[rank] = json.loads(path.read_text())
    return reports


def case(reports: dict, rank: int, name: str) -> dict:
    record = reports[rank]["cases"][name]
    assert "error" not in record, f"rank {rank}, {name}:\n{record['error']}"
    return record


def bitwise_equal_and_replayed(reports: dict, name: str, calls: int, accelerated: bool = True) -> None:
    """Every call bitwise equal to eager CP on every rank; with ``accelerated`` (a GPU), graphs
    replayed (no fallback, breaks in every graph, hits for all but a few calls per key) and one
    agreement round per call and per capture."""
    family = name.split(":")[0]
    for rank in reports:
        record = case(reports, rank, name)
        assert "refused" not in record, f"rank {rank}, {name}: {record['refused']}"
        assert record["calls"] == calls, f"rank {rank}, {name}: {record['calls']} calls"
        assert record["mismatch_count"] == 0, f"rank {rank}, {name}: {record['mismatches']}"
        stats = record["stats"]
        assert stats["accelerated"] and stats["context_parallel"], f"rank {rank}, {name}: {stats}"
        assert stats["lockstep_calls"] >= calls, f"rank {rank}, {name}: {stats}"
        if not accelerated:
            assert stats["agreement_rounds"] == stats["lockstep_calls"], f"rank {rank}, {name}: {stats}"
            continue
        assert not stats["fallbacks"], f"rank {rank}, {name}: {stats}"
        assert stats["breaks"] and all(b > 0 for b in stats["breaks"]), f"rank {rank}, {name}: attention and gather breaks {stats}"
        assert stats["agreement_rounds"] == stats["lockstep_calls"] + stats["captures"], f"rank {rank}, {name}: {stats}"
        shapes = len(cp_worker.SHAPES[family])
        keys = 2 * shapes  # every shape, captured again after the LoRA load
        assert stats["hits"] >= calls - 2 * keys, f"rank {rank}, {name}: {stats}"


def ranks_agree(reports: dict, name: str) -> None:
    """The gathered outputs and BCG's decisions are the same on every rank."""
    first = case(reports, 0, name)
    for rank in list(reports)[1:]:
        other = case(reports, rank, name)
        assert first["digest"] == other["digest"], f"{name}: the gathered outputs of rank 0 and rank {rank} differ"
        for field in ("hits", "misses", "captures", "eager_calls", "lockstep_calls", "agreement_rounds"):
            assert first["stats"][field] == other["stats"][field], (
                f"{name}: {field} differs: rank 0 {first['stats']} vs rank {rank} {other['stats']}"
            )


def lora_replayed_exactly(reports: dict, name: str) -> bool:
    """False where the launch skipped the LoRA load (no peft)."""
    if reports[0]["lora_skipped"]:
        return False
    for rank in reports:
        record = case(reports, rank, name)
        assert record["lora"] == f"added before call {cp_worker.LORA_AT_CALL}", record["lora"]
        assert record["lora_changed_output"], f"rank {rank}, {name}: the LoRA did not change the output (test is void)"
        late = [m for m in record["mismatches"] if m["call"] >= cp_worker.LORA_AT_CALL]
        assert not late, f"rank {rank}, {name}: differs after the LoRA load: {late}"
        at, end = record["stats_at_lora"], record["stats"]
        if not end["accelerated"]:
            continue  # no CUDA: equality is the claim
        # the LoRA changes the weights: every shape is captured again, and the calls after it replay
        shapes = len(cp_worker.SHAPES[name.split(":")[0]])
        assert end["captures"] - at["captures"] >= 1 and not end["fallbacks"], f"rank {rank}, {name}: {at} -> {end}"
        after = record["calls"] - cp_worker.LORA_AT_CALL
        assert end["hits"] - at["hits"] >= after - 2 * shapes, f"rank {rank}, {name}: replays after the LoRA {at} -> {end}"
    return True


def pipelines_equal(reports: dict, name: str, accelerated: bool = True) -> None:
    """Whole generations (a shape change, a LoRA load, TaylorSeer) bitwise equal to eager CP on every rank."""
    for rank in reports:
        record = case(reports, rank, name)
        assert record["mismatch_count"] == 0, f"rank {rank}, {name}: {record['mismatches']}"
        expected = [g for g in cp_worker.PIPE_GENERATIONS if g != "lora" or not reports[0]["lora_skipped"]]
        assert record["generations"] == expected, f"rank {rank}, {name}: {record['generations']}"
        stats = record["stats"]
        assert stats["context_parallel"], stats
        if accelerated:
            assert stats["hits"] > 0 and not stats["fallbacks"], f"rank {rank}, {name}: {stats}"
    ranks_agree(reports, name)


def refusals_clear(reports: dict, name: str) -> None:
    """Every set-up that must be refused under CP is, with the reason in the message."""
    expected = {
        "first_block_cache": ("FirstBlockCache", "context parallelism"),
        "mag_cache": ("MagCache", "context parallelism"),
        "first_block_cache_after_accelerating": ("FirstBlockCache", "context parallelism"),
        "compile": ("compile=True", "compile_repeated_blocks"),
    }
    if name.split(":")[1] == "ulysses":
        expected["ulysses_anything"] = ("ulysses_anything=True", "split evenly")
    for rank in reports:
        got = case(reports, rank, name)["refusals"]
        for label, fragments in expected.items():
            message = got.get(label)
            assert message is not None, f"rank {rank}: {label} was accepted under context parallelism"
            assert message.startswith("AccelerationError: "), f"rank {rank}, {label}: {message}"
            for fragment in fragments:
                assert fragment in message, f"rank {rank}, {label}: {fragment!r} not in {message!r}"


def disagreement_raised_before_collectives(reports: dict, name: str) -> None:
    for rank in reports:
        record = case(reports, rank, name)
        first = record["first"]
        assert first is not None and first["type"] == "RankDisagreementError", f"rank {rank}: {first}"
        assert "call 0: plan" in first["message"] and "rank 0 has" in first["message"] and "rank 1 has" in first["message"]
        if "collectives_in_first" in record:
            assert record["collectives_in_first"] == 0, f"rank {rank}: a collective ran before the disagreement"
        assert record["second_equal"], f"rank {rank}: the call after the disagreement differs from eager CP"


def fault_reported(reports: dict, name: str, collective_timeout_s: float | None = None, same_call: bool = True) -> None:
    """The rank that raised has its own error with a note; every other rank raises
    ``RankAbortedError`` naming that rank and call (in the same call where its host waits in the
    collective, as under gloo; with NCCL in that call or the next), and, given
    ``collective_timeout_s``, well before that timeout."""
    fault_rank = case(reports, 0, name)["fault_rank"]
    fault_call = case(reports, 0, name)["fault_call"]
    for rank in reports:
        error = case(reports, rank, name)["raised"]
        assert error is not None, f"rank {rank} never raised: it went on past the fault"
        if rank == fault_rank:
            assert error["type"] == "InjectedFault" and error["call"] == fault_call, f"rank {rank}: {error}"
            assert any(f"rank {fault_rank} raised this in transformer call {fault_call}" in n for n in error["notes"]), error
            continue
        assert error["type"] == "RankAbortedError", f"rank {rank}: {error}"
        assert error["rank"] == fault_rank and f"in transformer call {fault_call}" in error["where"], f"rank {rank}: {error}"
        assert "InjectedFault" in error["message"], f"rank {rank}: {error}"
        calls = (fault_call,) if same_call else (fault_call, fault_call + 1)
        assert error["call"] in calls, f"rank {rank} stopped in call {error['call']}, expected {calls}: {error}"
        if collective_timeout_s is not None:
            assert error["seconds_after_fault_call_began"] < collective_timeout_s / 2, f"rank {rank}: {error}"
