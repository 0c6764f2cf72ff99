"""CPU tests of BCG under context parallelism: the lockstep (integration/parallel.py), the gather
break (cp_gather.py), the refusals (cp_support.py), gapped static inputs, and the one-GPU harness's
stand-in collectives (tests/cp_harness.py).

Three kinds: units with fakes (no waiting: fake clocks and works); ranks as threads of this process
agreeing over an in-process ``HashStore`` (every rank always arrives, so nothing waits for a
timeout); and one torchrun launch of two real processes over gloo: first the worker's own eager path over
torch's functional collectives (``--torch-cases``), then ``--pretend-cuda`` (the runner is installed
and its lockstep runs, CPU inputs run eagerly through it) over the harness's collectives. No
assertion on elapsed time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import types

import pytest
import torch
import torch.distributed as dist

import bcg_diffusion as bcg
import cp_checks
import cp_harness
import cp_worker
from bcg_diffusion.integration import cp_support, parallel
from bcg_diffusion.integration.breaks import cp_gather
from bcg_diffusion.integration.entry_kinds import CapturedGraph, EagerFallback
from bcg_diffusion.integration.events import RunnerEvents, RunnerWatcher
from bcg_diffusion.integration.keys import GraphKey, HostTensor, TensorSpec
from bcg_diffusion.integration.object_inputs import Opaque
from bcg_diffusion.integration.lockstep import RankAbortedError, RankAgreement, RankDisagreementError
from bcg_diffusion.integration.model_state import ModelState
from bcg_diffusion.integration.slots import Slot
from bcg_diffusion.integration.static_inputs import static_copy


@pytest.fixture
def pretend_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("BCG_DIFFUSION", raising=False)


@contextlib.contextmanager
def one_rank_world():
    """A gloo world of one rank in this process (what ``follow`` reads), torn down afterwards."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _cp_config(**overrides):
    cp = types.SimpleNamespace(ulysses_anything=False, ring_anything=False, _flattened_mesh=None)
    for name, value in overrides.items():
        setattr(cp, name, value)
    return types.SimpleNamespace(context_parallel_config=cp, tensor_parallel_config=None)


def _key(device="cuda:0", ptr_hash=123, object_id=1, shape=(1, 16, 64), adapters=()):
    spec = TensorSpec(shape, (shape[1] * shape[2], shape[2], 1), torch.bfloat16, torch.device(device), False)
    inputs = (("hidden_states", spec), ("return_dict", False), ("obj.fn", Opaque("Cfg", object_id)),
              ("ids", HostTensor((2,), torch.int64, (0, 1))))
    state = (("grad_enabled", False), ("attention_backend", None))
    return GraphKey(inputs, state, (100, ptr_hash, 7, adapters))


# -- what the ranks compare -------------------------------------------------------------------
def test_key_digest_is_equal_across_ranks_and_sees_what_matters():
    rank0, rank1 = _key("cuda:0", 1, 10), _key("cuda:1", 2, 20)  # other GPU, weight addresses, object identity
    assert rank0 != rank1 and parallel.key_digest(rank0) == parallel.key_digest(rank1)
    assert parallel.key_digest(_key(shape=(1, 24, 64))) != parallel.key_digest(rank0)
    assert parallel.key_digest(_key(adapters=(("scale", 1.0),))) != parallel.key_digest(rank0)  # a LoRA on one rank
    assert parallel.key_shapes(rank0) == "hidden_states[1, 16, 64]"


def test_inputs_digest_sees_shapes_and_values_not_identities():
    a = parallel.inputs_digest((torch.zeros(2, 3),), {"flag": True, "obj": object()})
    b = parallel.inputs_digest((torch.ones(2, 3),), {"flag": True, "obj": object()})
    assert a == b
    assert parallel.inputs_digest((torch.zeros(2, 4),), {"flag": True, "obj": object()}) != a
    assert parallel.inputs_digest((torch.zeros(2, 3),), {"flag": False, "obj": object()}) != a


def test_the_planned_path_names_where_the_key_s_slot_stands():
    slot = Slot(_key())  # what the runner tells its watchers (the lockstep) before a call
    assert slot.path(warmup_iters=1) == "warmup"
    slot.calls = 1
    assert slot.path(warmup_iters=1) == "capture"
    slot.refused = "changes its inputs"
    assert slot.path(warmup_iters=1) == "eager"
    slot.entry = CapturedGraph(graph=_Graph(), static_inputs=[])
    assert slot.path(warmup_iters=1) == "replay"
    slot.entry = slot.entry.fall_back("failed")
    assert slot.path(warmup_iters=1) == "fallback"


def test_capture_context_breaks_attention_and_neither_narrows_nor_evicts():
    ctx = types.SimpleNamespace(config=bcg.BCGConfig(attention="capture_safe", max_narrowing=6), evict_all=lambda: True)
    ctx = dataclasses.make_dataclass("Ctx", ["config", "evict_all"])(ctx.config, ctx.evict_all)
    lockstep = parallel.Lockstep(object(), None)
    changed = lockstep.capturing(ctx)
    assert changed.config.attention == "break" and changed.config.max_narrowing == 0 and changed.evict_all() is False
    assert ctx.config.attention == "capture_safe"  # the runner's own config is left alone
    assert RunnerWatcher().capturing(ctx) is ctx  # without parallelism nothing changes
    lockstep.close()


def test_a_replay_that_stops_part_way_raises_only_under_context_parallelism():
    RunnerWatcher().replay_failed(RuntimeError("shape"))  # one rank: the runner falls back
    with pytest.raises(bcg.AccelerationError, match="cannot run again eagerly on this rank alone"):
        parallel.Lockstep(object(), None).replay_failed(RuntimeError("break output changed shape"))


def test_communication_errors_are_told_from_a_rank_s_own():
    assert parallel.is_communication_error(TimeoutError("all_to_all did not complete"))
    assert parallel.is_communication_error(RuntimeError("[../gloo/pair.cc:534] Connection closed by peer"))
    if hasattr(dist, "DistBackendError"):
        assert parallel.is_communication_error(dist.DistBackendError("NCCL error"))
    assert not parallel.is_communication_error(bcg.AccelerationError("FirstBlockCache is refused"))
    assert not parallel.is_communication_error(ValueError("bad shape"))


# -- ranks as threads over one in-process store -----------------------------------------------
def _ranks(world, body):
    """Run ``body(rank, lockstep)`` on ``world`` threads sharing a HashStore; {rank: result or exception}."""
    store = dist.HashStore()
    results = {}

    def run(rank):
        agreement = RankAgreement(store, rank, world, 30.0, group="threads", generation=0, first_wait_s=0.05)
        lockstep = parallel.Lockstep(_cp_config(), agreement)
        try:
            results[rank] = body(rank, lockstep)
        except Exception as exc:  # noqa: BLE001 - the tests look at it
            results[rank] = exc
        finally:
            lockstep.close()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank thread is still waiting"
    return results


def test_equal_plans_pass_and_other_inputs_raise_on_every_rank_naming_both():
    def body(rank, lockstep):
        lockstep.call_began()
        key = _key(f"cuda:{rank}", rank, rank)  # equal calls on two GPUs
        lockstep.planned("warmup", key)
        lockstep.planned("warmup", key)  # one plan per call
        lockstep.call_ended()
        lockstep.call_began()
        other = _key(shape=(1, 16 + 8 * rank, 64))
        lockstep.planned("warmup", other)

    results = _ranks(2, body)
    for rank, error in results.items():
        assert isinstance(error, RankDisagreementError), (rank, error)
        assert "call 1: plan" in str(error) and "hidden_states[1, 16, 64]" in str(error) and "hidden_states[1, 24, 64]" in str(error)


def test_a_key_missing_on_one_rank_is_a_disagreement_not_a_hang():
    def body(rank, lockstep):
        lockstep.call_began()
        key = _key()
        lockstep.planned("capture" if rank == 0 else "warmup", key)  # a key seen on rank 0 only

    for rank, error in _ranks(2, body).items():
        assert isinstance(error, RankDisagreementError) and "capture" in str(error) and "warmup" in str(error), error


class _Graph:
    def reset(self):
        pass


class _Entry(CapturedGraph):
    released = False

    def release(self):
        self.released = True
        super().release()


def test_a_capture_that_failed_on_one_rank_falls_back_on_every_rank():
    def body(rank, lockstep):
        lockstep.call_began()
        if rank == 1:
            mine = EagerFallback(reason="RuntimeError: operation not permitted when stream is capturing")
        else:
            mine = _Entry(graph=_Graph(), static_inputs=[], memory_bytes=1000 + rank)
        entry = lockstep.captured(mine)
        both = _Entry(graph=_Graph(), static_inputs=[], memory_bytes=1000 + 10 * rank)
        return mine, entry, both, lockstep.captured(both)

    results = _ranks(2, body)
    for rank, (mine, entry, both, kept) in results.items():
        assert isinstance(entry, EagerFallback), entry
        assert entry.reason.startswith("capture failed on rank 1: RuntimeError: operation not permitted"), entry.reason
        assert entry.memory_bytes == 0
        assert kept is both and both.memory_bytes == 1010  # the largest rank's: budget evictions agree
    assert results[0][0].released  # rank 0's own graph is given up


def test_a_rank_that_raises_is_named_by_the_others_with_its_call():
    told = threading.Event()

    def body(rank, lockstep):
        for _ in range(3):
            lockstep.call_began()
            lockstep.planned_eager("uncacheable input")
            lockstep.call_ended()
        lockstep.call_began()  # call 3
        lockstep.planned_eager("uncacheable input")
        if rank == 1:
            error = ValueError("bad latents")
            lockstep.call_failed(error)
            told.set()
            return error
        assert told.wait(30)
        with pytest.raises(RankAbortedError) as aborted:  # where it waits in a collective
            parallel.raise_if_peer_aborted()
        with pytest.raises(RankAbortedError) as reported:
            lockstep.call_failed(TimeoutError("all_to_all did not complete"))  # its collective failed: the peer is the cause
        own = bcg.AccelerationError("own refusal")
        lockstep.call_failed(own)  # its own error stays its own
        return aborted.value, reported.value, own

    results = _ranks(2, body)
    assert "bcg: rank 1 raised this in transformer call 3 (eager); the other ranks were told" in results[1].__notes__[0]
    aborted, reported, own = results[0]
    for error in (aborted, reported):
        assert error.rank == 1 and error.where == "in transformer call 3 (eager)" and "ValueError: bad latents" in error.reason
        assert "rank 1 aborted in transformer call 3 (eager): ValueError: bad latents" in str(error)
    assert "rank 1 had aborted before" in own.__notes__[0]


def test_calling_numbers_the_calls_and_follows_a_new_ranks_object():
    lockstep = parallel.Lockstep(object(), None)
    events = RunnerEvents()
    events.subscribe(lockstep)
    for _ in range(2):
        with events.calling():
            pass
    assert lockstep.calls == 2 and lockstep._current is None
    events.unsubscribe(lockstep)
    swapped = parallel.Lockstep(object(), None)
    with events.calling():
        events.subscribe(swapped)  # parallelism enabled during the call (the structure watch follows it)
        assert swapped.where() == "in transformer call 0 (before its plan)"
    assert swapped._current is None and swapped.calls == 1
    with pytest.raises(ValueError), events.calling():
        raise ValueError("no agreement: nothing to tell")
    lockstep.close()
    swapped.close()


# -- the gather break, refusals, hooks ---------------------------------------------------------
def test_gather_break_is_reference_counted_and_undone_exactly():
    from diffusers.hooks.context_parallel import EquipartitionSharder

    original = EquipartitionSharder.__dict__["unshard"]
    first, second = cp_gather.acquire(), cp_gather.acquire()
    patched = EquipartitionSharder.__dict__["unshard"]
    assert cp_gather.is_patched() and patched is not original and isinstance(patched, classmethod)
    assert patched.__func__.__bcg_original__.__func__ is original.__func__
    first.remove()
    first.remove()  # idempotent
    assert EquipartitionSharder.__dict__["unshard"] is patched  # the second user still needs it
    second.remove()
    assert EquipartitionSharder.__dict__["unshard"] is original and not cp_gather.is_patched()


def test_gathered_like_allocates_the_all_gather_s_shape():
    mesh = types.SimpleNamespace(size=lambda: 2)
    out = cp_gather.gathered_like(torch.zeros(2, 8, 4).transpose(0, 1), 1, mesh)
    assert out.shape == (8, 4, 4) and out.is_contiguous()


@pytest.mark.parametrize(
    "parallel_config, fragment",
    [
        (types.SimpleNamespace(tensor_parallel_config=object(), context_parallel_config=None), "tensor parallelism"),
        (types.SimpleNamespace(tensor_parallel_config=None, context_parallel_config=None), "ContextParallelConfig only"),
        (_cp_config(ulysses_anything=True), "ulysses_anything=True"),
        (_cp_config(ring_anything=True), "ring_anything=True"),
    ],
)
def test_parallel_set_ups_bcg_cannot_replay_are_refused(parallel_config, fragment):
    module = torch.nn.Linear(2, 2)
    module._parallel_config = parallel_config
    with pytest.raises(bcg.AccelerationError, match=fragment):
        cp_support.context_parallel_config(module)
    module._parallel_config = None
    assert cp_support.context_parallel_config(module) is None


def test_structure_refusals_name_the_module_and_what_to_do():
    from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, ModelHook

    model = cp_worker.build_transformer("flux", 0, "cpu", torch.float32)
    cp_support.check_structure(model, ["proj_out", "transformer_blocks.0.norm1"])  # nothing to refuse
    with pytest.raises(bcg.AccelerationError, match="'transformer_blocks.0'.*attention module"):
        cp_support.check_structure(model, ["transformer_blocks.0"])

    class ContextParallelGatherHook(ModelHook):  # stands for diffusers' (matched by class name)
        pass

    HookRegistry.check_if_exists_or_initialize(model.proj_out).register_hook(ContextParallelGatherHook(), "cp_output---proj_out")
    with pytest.raises(bcg.AccelerationError, match="'proj_out', which holds a context-parallel hook"):
        cp_support.check_structure(model, ["proj_out"])
    assert not [h for h in ModelState(model, every_call=True).structure().hooked if h.path == "proj_out"]  # runs inline
    handle = model.proj_out.register_forward_hook(lambda *a: None)
    with pytest.raises(bcg.AccelerationError, match="proj_out has diffusers' context-parallel hook and torch:forward_hooks"):
        cp_support.check_structure(model, [])
    handle.remove()
    model.enable_cache(FirstBlockCacheConfig(threshold=0.5))
    with pytest.raises(bcg.AccelerationError, match="FirstBlockCache.*TaylorSeer, PyramidAttentionBroadcast or FasterCache"):
        cp_support.check_structure(model, [])


def test_compile_is_refused_under_context_parallelism():
    with pytest.raises(bcg.AccelerationError, match="compile_repeated_blocks"):
        cp_support.check_config(torch.nn.Linear(2, 2), bcg.BCGConfig(compile=True))
    cp_support.check_config(torch.nn.Linear(2, 2), bcg.BCGConfig())


def test_rank_timeout_is_validated():
    assert bcg.BCGConfig().rank_timeout_s == 300.0
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(ValueError, match="rank_timeout_s"):
            bcg.BCGConfig(rank_timeout_s=bad)


# -- the runner on the CPU (no capture: CPU inputs run eagerly through it) ----------------------
def test_accelerating_a_context_parallel_transformer_in_either_order(pretend_cuda):
    from diffusers.hooks.context_parallel import EquipartitionSharder

    original = EquipartitionSharder.__dict__["unshard"]
    model = cp_worker.build_transformer("flux", 0, "cpu", torch.float32)
    inputs = cp_worker.make_inputs("flux", cp_worker.SHAPES["flux"][0], 0, "cpu", torch.float32)
    with torch.no_grad():
        eager = model(**inputs)[0]
    with one_rank_world():
        model._parallel_config = _cp_config()
        bcg.accelerate_transformer(model)  # enable_parallelism first
        runner = bcg.accelerate._runners(model)[0]
        lockstep = runner.watch.lockstep
        assert isinstance(lockstep, parallel.Lockstep) and lockstep.agreement is None  # one rank: nothing to agree
        assert cp_gather.is_patched()
        with torch.no_grad():
            assert torch.equal(model(**inputs)[0], eager)
        assert lockstep.calls == 1
        bcg.remove_acceleration(model)
        assert EquipartitionSharder.__dict__["unshard"] is original
        model._parallel_config = None
        bcg.accelerate_transformer(model)  # accelerate first, then enable_parallelism
        runner = bcg.accelerate._runners(model)[0]
        assert runner.watch.lockstep is None
        model._parallel_config = _cp_config()
        with torch.no_grad():
            assert torch.equal(model(**inputs)[0], eager)
        lockstep = runner.watch.lockstep
        assert isinstance(lockstep, parallel.Lockstep) and lockstep.calls == 1 and cp_gather.is_patched()
        model._parallel_config = types.SimpleNamespace(tensor_parallel_config=object(), context_parallel_config=None)
        with pytest.raises(bcg.AccelerationError, match="tensor parallelism"):
            model(**inputs)
        model._parallel_config = None  # parallelism gone: the lockstep and the gather break go too
        with torch.no_grad():
            model(**inputs)
        assert runner.watch.lockstep is None and not cp_gather.is_patched()
        bcg.remove_acceleration(model)


def test_refusals_at_acceleration_leave_the_model_untouched(pretend_cuda):
    model = cp_worker.build_transformer("flux", 0, "cpu", torch.float32)
    with one_rank_world():
        model._parallel_config = _cp_config(ulysses_anything=True)
        with pytest.raises(bcg.AccelerationError, match="ulysses_anything"):
            bcg.accelerate_transformer(model)
        model._parallel_config = _cp_config()
        with pytest.raises(bcg.AccelerationError, match="compile=True"):
            bcg.accelerate_transformer(model, bcg.BCGConfig(compile=True))
        with pytest.raises(bcg.AccelerationError, match="eager_modules names 'transformer_blocks.0'"):
            bcg.accelerate_transformer(model, bcg.BCGConfig(eager_modules=("transformer_blocks.0",)))
    assert not bcg.is_accelerated(model) and "forward" not in model.__dict__ and not cp_gather.is_patched()


# -- static inputs ------------------------------------------------------------------------------
def test_static_inputs_keep_gapped_strides_and_densify_overlaps():
    x = torch.randn(2, 8, 4)
    shard = x.chunk(2, dim=1)[1]  # diffusers' split of a batch of 2: a gapped view
    copy = static_copy(shard)
    assert copy.stride() == shard.stride() and torch.equal(copy, shard) and copy.data_ptr() != shard.data_ptr()
    expanded = torch.randn(1, 4).expand(3, 4)
    assert static_copy(expanded).stride() == (4, 1) and torch.equal(static_copy(expanded), expanded)
    permuted = torch.randn(2, 3, 4).permute(0, 2, 1)
    assert static_copy(permuted).stride() == permuted.stride()
    overlapping = torch.randn(8).as_strided((3, 3), (2, 1))
    assert static_copy(overlapping).is_contiguous() and torch.equal(static_copy(overlapping), overlapping)


# -- the harness's stand-in collectives (fake works and clocks: nothing waits) -----------------
class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class _Work:
    def __init__(self, done_after):
        self.polls, self.done_after, self.waited = 0, done_after, False

    def is_completed(self):
        self.polls += 1
        return self.polls > self.done_after

    def wait(self):
        self.waited = True


def _collectives(check=lambda: None, **config):
    clock = _Clock()
    return cp_harness.Collectives(cp_harness.HarnessConfig(**config), 1, clock=clock, sleep=clock.sleep, check_peers=check), clock


def test_stand_in_waits_until_done_checking_peers_on_the_way():
    checks = []
    collectives, _ = _collectives(check=lambda: checks.append(1), abort_poll_s=0.0001)
    work = _Work(done_after=50)
    collectives.wait(work, "all_to_all")
    assert work.waited and checks


def test_stand_in_stops_when_a_peer_aborted_and_after_its_timeout():
    def aborted():
        raise RankAbortedError("rank 0 aborted in transformer call 2 (replay): boom", 0, "in transformer call 2", "boom")

    collectives, _ = _collectives(check=aborted)
    with pytest.raises(RankAbortedError, match="rank 0 aborted"):
        collectives.wait(_Work(done_after=10**9), "all_gather")
    collectives, clock = _collectives(collective_timeout_s=2.0)
    with pytest.raises(TimeoutError, match="rank 1: all_gather did not complete within 2 s"):
        collectives.wait(_Work(done_after=10**9), "all_gather")
    assert clock.now >= 2.0


def test_stand_in_faults_on_request_and_refuses_to_run_under_a_capture():
    from bcg_diffusion.core.active_capture import ACTIVE_CAPTURE

    collectives, _ = _collectives()
    collectives.arm_fault(after=2)
    collectives._before("first")
    with pytest.raises(cp_harness.InjectedFault, match="injected fault on rank 1 in second"):
        collectives._before("second")
    collectives._before("third")  # one fault only
    token = ACTIVE_CAPTURE.set(types.SimpleNamespace(debug=False))
    try:
        with pytest.raises(cp_harness.CollectiveUnderCapture):
            collectives._before("captured")
    finally:
        ACTIVE_CAPTURE.reset(token)
    token = ACTIVE_CAPTURE.set(types.SimpleNamespace(debug=True))  # debug mode runs breaks for real: allowed
    try:
        collectives._before("debug")
    finally:
        ACTIVE_CAPTURE.reset(token)


def test_stand_ins_install_and_undo_exactly():
    import torch.distributed._functional_collectives as funcol

    before = {name: getattr(funcol, name) for name in cp_harness.REPLACED}
    collectives, _ = _collectives(replace=("all_gather_tensor",))
    undo = collectives.install()
    assert funcol.all_gather_tensor == collectives.all_gather_tensor
    assert funcol.all_to_all_single is not before["all_to_all_single"]  # observed
    undo()
    assert {name: getattr(funcol, name) for name in cp_harness.REPLACED} == before
    with pytest.raises(ValueError, match="can replace"):
        cp_harness.HarnessConfig(replace=("broadcast",))


# -- two real processes over gloo --------------------------------------------------------------
@pytest.fixture(scope="module")
def gloo_reports(tmp_path_factory):
    path = tmp_path_factory.mktemp("parallel_cpu")
    cases = "flux:ulysses,wan:ulysses,flux:ulysses:refusals,flux:ulysses:disagree," + cp_worker.FAULT_CASE
    command = cp_worker.launch_command(path, "--device", "cpu", "--pretend-cuda", "--dtype", "fp32", "--calls", "8",
                                       "--collectives", "harness", "--collective-timeout-s", "900", "--cases", cases,
                                       "--torch-cases", "flux:ulysses,wan:ulysses")
    # the collectives' own timeout is far beyond the launch's: a fault that is not reported ends the launch
    launch = cp_harness.launch(command, 300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    return cp_checks.load_reports(path, launch)


def test_worker_runs_eager_context_parallel_on_cpu_over_gloo(gloo_reports):
    """The worker's own path on the CPU (``--torch-cases``, before the harness and the pretence):
    two gloo ranks, Ulysses (ring needs a GPU backend), torch's functional collectives; BCG is a no-op
    here, so both models run eager CP and must agree bitwise, on both ranks."""
    assert not gloo_reports[0]["lora_skipped"], gloo_reports[0]["lora_skipped"]  # peft is a test dependency
    for case in ("torch/flux:ulysses", "torch/wan:ulysses"):
        first, second = cp_checks.case(gloo_reports, 0, case), cp_checks.case(gloo_reports, 1, case)
        for record in (first, second):
            assert record["calls"] == 8 and record["mismatch_count"] == 0, record
            assert record["gather_output_type"], record  # the gather hook ran on proj_out
            assert record["lora_changed_output"] is True
        assert first["digest"] == second["digest"]


@pytest.mark.parametrize("case", ["flux:ulysses", "wan:ulysses"])
def test_two_processes_run_eager_cp_in_lockstep_through_the_runner(gloo_reports, case):
    cp_checks.bitwise_equal_and_replayed(gloo_reports, case, 8, accelerated=False)
    cp_checks.ranks_agree(gloo_reports, case)


def test_two_processes_refuse_what_cannot_run_in_lockstep(gloo_reports):
    cp_checks.refusals_clear(gloo_reports, "flux:ulysses:refusals")


def test_two_processes_with_other_inputs_raise_before_any_collective(gloo_reports):
    cp_checks.disagreement_raised_before_collectives(gloo_reports, "flux:ulysses:disagree")


def test_a_process_that_raises_mid_call_is_named_by_the_other(gloo_reports):
    cp_checks.fault_reported(gloo_reports, cp_worker.FAULT_CASE)
