"""Rank agreement (bcg_diffusion.integration.lockstep) between real processes on the CPU.

Two processes (torch.multiprocessing spawn) join a gloo group over a TCPStore on 127.0.0.1 and run
every scenario once, each on its own agreement group; the tests check what each rank saw. Every
wait is bounded: the store rounds by their timeouts, the result queue and the joins by deadlines,
and the children are killed in teardown. A third kind of test runs ranks as threads of this
process (three ranks, cheaply). How long a wait lasts (a timeout, an abort seen at once) is checked
with a fake clock on an in-memory store, never with a stopwatch.
"""

from __future__ import annotations

import datetime
import queue
import socket
import threading
import time
import traceback

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from bcg_diffusion import AccelerationError
from bcg_diffusion.integration.lockstep import (
    RankAbortedError,
    RankAgreement,
    RankDisagreementError,
    RankOutOfStepError,
    RankTimeoutError,
)

WORLD = 2
ROUNDS = 200
TIMEOUT_S = 1.5  # the round a rank never joins
RESULTS_DEADLINE_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outcome(fn):
    """What a call did, in picklable form: its value or its error (type, message, attributes)."""
    try:
        return {"value": fn(), "error": None}
    except Exception as exc:  # noqa: BLE001 - the tests look at which error
        attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (int, float, str, list, dict))}
        return {"value": None, "error": type(exc).__name__, "message": str(exc), "attrs": attrs}


def _scenarios(rank: int, store) -> dict:
    new = lambda group, **kw: RankAgreement(store, rank, WORLD, kw.pop("timeout_s", 20.0), group=group, **kw)  # noqa: E731
    out = {}

    # the default group's store, as the context-parallel runner makes its agreement (parallel._agreement_for)
    env = RankAgreement(dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size(), 20.0,
                        group="equal")
    out["equal_same"] = _outcome(lambda: env.same("call 0: key", "key A"))
    out["equal_gather"] = _outcome(lambda: env.gather("call 0: memory", f"rank{rank}"))

    a = new("disagree")
    out["disagree"] = _outcome(lambda: a.same("call 17: key", "key A" if rank == 0 else "key B"))
    out["disagree_after"] = _outcome(lambda: a.same("call 18: key", "key C"))  # still in step
    out["out_of_step"] = _outcome(lambda: a.same("call 19: key", "k") if rank == 0 else a.gather("capture", "1"))

    a = new("abort")
    out["abort_before"] = _outcome(lambda: a.same("call 4: key", "k"))
    if rank == 1:
        time.sleep(0.3)  # rank 0 is already waiting in the next round
        a.abort("CUDA out of memory during capture", where="call 5")
        out["abort_self_after"] = _outcome(lambda: a.same("call 5: key", "k"))
    else:
        out["abort_seen"] = _outcome(lambda: a.same("call 5: key", "k"))

    if rank == 0:  # rank 1 never joins this group
        a = new("timeout", timeout_s=TIMEOUT_S, first_wait_s=0.5)
        out["timeout"] = _outcome(lambda: a.same("call 3: key", "k"))
        out["timeout_after"] = _outcome(lambda: a.same("call 4: key", "k"))

    a = new("many")
    master = store if rank == 0 else None
    before = master.num_keys() if master is not None else None
    a.same("warm", "w")  # both ranks are here (rank 0 came back from its timeout)
    for i in range(ROUNDS // 2):
        a.same(f"call {i}: key", f"key {i % 3}")
        a.gather(f"capture {i}", "1")
    out["many_rounds"] = a.rounds
    dist.barrier()  # the other rank has deleted its old keys too
    if master is not None:
        out["many_keys_added"] = master.num_keys() - before
    return out


def _worker(rank: int, port: int, results) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
        try:
            results.put((rank, _scenarios(rank, store)))
            dist.barrier()  # rank 0 holds the store's server: it stays until rank 1 is done with it
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, {"crash": traceback.format_exc()}))


@pytest.fixture(scope="module")
def ranks():
    """Every rank's results of every scenario: {rank: {scenario: outcome}}."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, results), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        got = {}
        deadline = time.monotonic() + RESULTS_DEADLINE_S
        while len(got) < WORLD:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"ranks {sorted(set(range(WORLD)) - set(got))} gave no result within {RESULTS_DEADLINE_S} s")
            try:
                rank, result = results.get(timeout=min(left, 5.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    pytest.fail(f"a rank died: exit codes {[p.exitcode for p in procs]}")
                continue
            assert "crash" not in result, f"rank {rank} crashed:\n{result['crash']}"
            got[rank] = result
        for p in procs:
            p.join(timeout=30)
        yield got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def test_equal_values_agree_through_the_default_group_store(ranks):
    for rank in range(WORLD):
        r = ranks[rank]
        assert r["equal_same"]["error"] is None
        assert r["equal_gather"]["value"] == ["rank0", "rank1"]


def test_disagreement_raises_on_every_rank_naming_both_values(ranks):
    for rank in range(WORLD):
        d = ranks[rank]["disagree"]
        assert d["error"] == "RankDisagreementError", d
        assert "rank 0 has 'key A'" in d["message"] and "rank 1 has 'key B'" in d["message"]
        assert "call 17: key" in d["message"]
        assert d["attrs"]["values"] == {0: "key A", 1: "key B"}
        assert ranks[rank]["disagree_after"]["error"] is None  # the ranks are still in step


def test_different_call_sequences_are_reported_as_out_of_step(ranks):
    for rank in range(WORLD):
        o = ranks[rank]["out_of_step"]
        assert o["error"] == "RankOutOfStepError", o
        assert "rank 0 is at 'call 19: key'" in o["message"] and "rank 1 is at 'capture'" in o["message"]


def test_abort_stops_the_waiting_rank_at_once_naming_rank_step_and_reason(ranks):
    assert ranks[0]["abort_before"]["error"] is None
    seen = ranks[0]["abort_seen"]
    assert seen["error"] == "RankAbortedError", seen
    assert seen["attrs"]["rank"] == 1 and seen["attrs"]["where"] == "call 5"
    assert "rank 1 aborted call 5: CUDA out of memory during capture" in seen["message"]  # not the 20 s timeout
    own = ranks[1]["abort_self_after"]
    assert own["error"] == "RankAbortedError" and "this rank (1) aborted" in own["message"]


def test_a_rank_that_never_arrives_gives_a_timeout_naming_it(ranks):
    t = ranks[0]["timeout"]
    assert t["error"] == "RankTimeoutError", t
    assert t["attrs"]["missing"] == [1]
    assert "rank 1 did not answer 'call 3: key'" in t["message"] and f"within {TIMEOUT_S:g} s" in t["message"]
    # the agreement is broken for good: the next round raises the same error (round 3's) without a new wait
    assert ranks[0]["timeout_after"]["error"] == "RankTimeoutError"
    assert ranks[0]["timeout_after"]["message"] == t["message"]


def test_many_rounds_keep_the_store_bounded(ranks):
    assert ranks[0]["many_keys_added"] <= 2 * WORLD
    assert ranks[0]["many_rounds"] == ranks[1]["many_rounds"] == 1 + ROUNDS  # "warm" and every round done


# -- ranks as threads of this process (no spawn: three ranks cheaply) -------------------------
def _thread_ranks(world: int, body, **kw) -> dict:
    port = _free_port()
    master = dist.TCPStore("127.0.0.1", port, world, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    results: dict = {}

    def run(rank: int) -> None:
        store = master if rank == 0 else dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=30))
        agreement = RankAgreement(store, rank, world, kw.get("timeout_s", 20.0), group="threads", generation=0,
                                  first_wait_s=kw.get("first_wait_s", 0.2))
        results[rank] = body(rank, agreement)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a rank thread is still waiting"
    return results


def test_abort_reaches_a_rank_that_also_waits_for_an_absent_one():
    def body(rank, agreement):
        if rank == 1:
            time.sleep(0.4)
            agreement.abort("shape mismatch", where="call 2")
            return None
        if rank == 2:
            return None  # never arrives
        return _outcome(lambda: agreement.same("call 2: key", "k"))

    seen = _thread_ranks(3, body, first_wait_s=0.2)[0]
    assert seen["error"] == "RankAbortedError" and seen["attrs"]["rank"] == 1, seen  # not the 20 s timeout


def test_timeout_names_every_missing_rank():
    def body(rank, agreement):
        return _outcome(lambda: agreement.same("call 0: key", "k")) if rank == 0 else None

    seen = _thread_ranks(3, body, timeout_s=0.5, first_wait_s=0.2)[0]
    assert seen["error"] == "RankTimeoutError" and seen["attrs"]["missing"] == [1, 2], seen
    assert "ranks 1, 2 did not answer" in seen["message"]


def test_three_ranks_name_every_value_grouped():
    def body(rank, agreement):
        return _outcome(lambda: agreement.same("call 9: key", "B" if rank == 1 else "A"))

    for rank, seen in _thread_ranks(3, body).items():
        assert seen["error"] == "RankDisagreementError", (rank, seen)
        assert "ranks 0, 2 have 'A'; rank 1 has 'B'" in seen["message"]


# -- without processes -----------------------------------------------------------------------
def test_errors_are_acceleration_errors_and_arguments_are_checked():
    for error in (RankAbortedError, RankDisagreementError, RankOutOfStepError, RankTimeoutError):
        assert issubclass(error, AccelerationError)
    with pytest.raises(ValueError, match="at least 2 ranks"):
        RankAgreement(object(), 0, 1, 5.0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        RankAgreement(object(), 0, 2, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        RankAgreement(object(), 2, 2, 5.0)


# -- waits on a fake clock (an in-memory store without blocking reads: the polling path) -------
class _FakeClock:
    """``monotonic`` and ``sleep`` of the lockstep module: time passes only when the code sleeps;
    ``at(t, fn)`` runs ``fn`` once the clock has reached ``t`` (another rank acting meanwhile)."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = 0
        self._events: list[tuple[float, object]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        for event in [e for e in self._events if e[0] <= self.now]:
            self._events.remove(event)
            event[1]()

    def at(self, t: float, fn) -> None:
        self._events.append((t, fn))


class _MemoryStore:
    """The store calls RankAgreement makes, in memory; no ``clone`` or ``multi_get``, so rounds poll."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def set(self, key, value):
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)

    def delete_key(self, key):
        return self.data.pop(key, None) is not None


@pytest.fixture
def fake_clock(monkeypatch):
    from bcg_diffusion.integration import lockstep

    clock = _FakeClock()
    monkeypatch.setattr(lockstep, "time", clock)  # the module's only use of time: monotonic() and sleep()
    return clock


def _pair(timeout_s: float, group: str):
    store = _MemoryStore()
    return [RankAgreement(store, r, 2, timeout_s, group=group, generation=0) for r in range(2)]


def test_a_round_times_out_after_timeout_s_of_waiting(fake_clock):
    rank0, _ = _pair(1.5, "fake_timeout")  # rank 1 never joins
    seen = _outcome(lambda: rank0.same("call 3: key", "k"))
    assert seen["error"] == "RankTimeoutError" and seen["attrs"]["missing"] == [1], seen
    polls = 0.02  # the longest pause between two looks at the store
    assert 1.5 <= fake_clock.now <= 1.5 + polls, fake_clock.now
    sleeps, now = fake_clock.sleeps, fake_clock.now
    again = _outcome(lambda: rank0.same("call 4: key", "k"))
    assert again["message"] == seen["message"] and (fake_clock.sleeps, fake_clock.now) == (sleeps, now)  # no new wait


def test_an_abort_stops_the_waiting_rank_at_its_next_look(fake_clock):
    rank0, rank1 = _pair(20.0, "fake_abort")
    fake_clock.at(0.3, lambda: rank1.abort("CUDA out of memory during capture", where="call 5"))
    seen = _outcome(lambda: rank0.same("call 5: key", "k"))
    assert seen["error"] == "RankAbortedError" and seen["attrs"]["where"] == "call 5", seen
    assert 0.3 <= fake_clock.now <= 0.3 + 0.02, fake_clock.now  # seen at the first look after it, not at 20 s


def test_a_late_rank_is_waited_for_and_agrees(fake_clock):
    rank0, rank1 = _pair(5.0, "fake_late")
    fake_clock.at(2.0, lambda: rank1._store.set(rank1._key(0, 1), b"Vcall 0: key\x00k"))  # rank 1 writes its value
    assert _outcome(lambda: rank0.same("call 0: key", "k")) == {"value": None, "error": None}
    assert 2.0 <= fake_clock.now < 5.0
