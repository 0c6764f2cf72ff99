"""Break arguments, owning or not, decided by lifetime (core/nonowning.py), on CPU tensors; the opt-in pool
check (core/pool_check.py) against a planted allocator snapshot; and the guard that no allocator snapshot
(``torch.cuda.memory_snapshot``, ``torch._C._cuda_memorySnapshot``, ``MemPool.snapshot``) is taken on the
capture or replay paths: patched to raise while the capture core's CPU paths run, and an AST scan of the
product code (its one allowed call site is the opt-in check). The same rule with real pool intermediates
on a GPU: test_nonowning_gpu.py."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import types
from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import bcg_diffusion.core as bcg
from bcg_diffusion.core import capture as capture_module
from bcg_diffusion.core import pool_check
from bcg_diffusion.core.hooked_calls import CapturedBody, hooked_call
from bcg_diffusion.core.nonowning import BreakArguments, KeptNonOwning, is_plain_cuda_tensor

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_NAMES = ("memory_snapshot", "_cuda_memorySnapshot", "MemPool", "_snapshot")
# the opt-in check; the failed-capture probe, a diagnostic tool that counts pools at the end of its children and has
# one variant that takes the old path's snapshot on purpose; the capture-time job that counts the opt-in check's
# snapshots by wrapping torch.cuda.memory_snapshot for its run (none is on a capture or replay path)
ALLOWED = {Path("bcg_diffusion/core/pool_check.py"), Path("bcg_diffusion/checks/failed_capture_probe.py"),
           Path("bcg_diffusion/benchmarks/profile/capture_check_cost.py")}


def _any(t: torch.Tensor) -> bool:
    return True


def _owns(view: torch.Tensor, original_storage_ref: StorageWeakRef) -> bool:
    """``view`` keeps the recorded storage alive (the original's last reference is gone by now)."""
    gc.collect()
    return not original_storage_ref.expired() and view.untyped_storage().data_ptr() != 0


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: object


def test_an_argument_alive_at_the_end_is_upgraded_with_its_layout():
    arguments = BreakArguments(_any)
    base = torch.arange(24.0).reshape(4, 6)
    arg = base[1:, 2:5].t()  # an offset, non-contiguous view
    ref = StorageWeakRef(base.untyped_storage())
    recorded = arguments.detach(((arg,), {"k": arg}), "attention")
    view = recorded[0][0]
    assert view is not arg and view.data_ptr() == arg.data_ptr()
    assert (view.storage_offset(), view.shape, view.stride()) == (arg.storage_offset(), arg.shape, arg.stride())
    assert arguments.pending == 2
    assert arguments.finalize() == []  # base still holds the storage: both records upgraded
    expected = arg.clone()
    del base, arg
    assert _owns(view, ref) and torch.equal(view, expected)
    assert (view.storage_offset(), view.shape, view.stride()) == (6 + 2, expected.shape, (1, 6))
    assert recorded[1]["k"] is not view and _owns(recorded[1]["k"], ref)
    assert arguments.finalize() == [] and arguments.pending == 0


def test_an_argument_that_died_during_the_capture_stays_non_owning():
    arguments = BreakArguments(_any)
    intermediate = torch.ones(8) * 3
    ref = StorageWeakRef(intermediate.untyped_storage())
    (view,) = arguments.detach((intermediate,), "softmax")
    del intermediate  # the captured code dropped it before the capture ended
    gc.collect()
    assert ref.expired()
    kept = arguments.finalize()
    assert kept == [KeptNonOwning("softmax", view)]
    assert StorageWeakRef(view.untyped_storage()).cdata != ref.cdata  # its own (non-owning) storage


def test_containers_are_copied_and_only_detachable_tensors_recorded():
    arguments = BreakArguments(lambda t: t.dtype == torch.float32)
    x, ids, obj = torch.zeros(3), torch.arange(3), object()
    value = [Pair(x, obj), {"ids": ids, "n": 4}, (x,)]
    out = arguments.detach(value, "f")
    assert out is not value and out[0] is not value[0] and out[0].b is obj
    assert out[1]["ids"] is ids and out[1]["n"] == 4  # not detachable: held as it is
    assert out[0].a is not x and out[2][0] is not x and arguments.pending == 2
    empty = torch.zeros(0)
    assert arguments.detach((empty,), "f")[0] is empty and arguments.pending == 2  # no memory: nothing to record


def test_the_default_records_plain_cuda_tensors_only():
    class Sub(torch.Tensor):
        pass

    cpu = torch.zeros(2)
    assert not is_plain_cuda_tensor(cpu) and not is_plain_cuda_tensor(cpu.as_subclass(Sub))
    arguments = BreakArguments()
    assert arguments.detach((cpu,), "f")[0] is cpu and arguments.pending == 0


def test_a_storage_reallocated_during_the_capture_is_not_taken_for_the_recorded_memory():
    arguments = BreakArguments(_any)
    t = torch.zeros(4)
    (view,) = arguments.detach((t,), "f")
    t.untyped_storage().resize_(4096)  # the same storage object, other memory
    kept = arguments.finalize()
    assert [k.name for k in kept] == ["f"] and kept[0].view is view


def test_inference_tensors_are_upgraded_in_and_out_of_inference_mode():
    for finalize_in_inference in (True, False):
        arguments = BreakArguments(_any)
        with torch.inference_mode():
            t = torch.ones(3)
            (view,) = arguments.detach((t,), "f")
        with torch.inference_mode() if finalize_in_inference else contextlib.nullcontext():
            assert arguments.finalize() == []
        ref = StorageWeakRef(t.untyped_storage())
        del t
        assert _owns(view, ref) and view.is_inference()


# -- the wiring in capture.py: breaks and hooked calls of a capture, finalized at its end -----------------------
class _NoRng:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def _cpu_capture_state(monkeypatch):
    """A ``_CaptureState`` on the CPU: no segment is captured (begin/end are no-ops), the capture stream
    is a stand-in, and every tensor is recorded as a device tensor would be."""
    monkeypatch.setattr(capture_module._CaptureState, "begin_segment", lambda self: None)
    monkeypatch.setattr(capture_module._CaptureState, "end_segment", lambda self: None)
    monkeypatch.setattr(torch.random, "fork_rng", _NoRng)
    graph = bcg.BreakableCUDAGraph()
    graph._begin(("pool", 1), torch.device("cpu"), debug=False)
    stream = types.SimpleNamespace(device=torch.device("cpu"))
    state = capture_module._CaptureState(graph, ("pool", 1), stream, "thread_local", debug=False)
    state.arguments = BreakArguments(_any)
    token = capture_module.ACTIVE_CAPTURE.set(state)
    try:
        yield graph, state
    finally:
        capture_module.ACTIVE_CAPTURE.reset(token)


@bcg.eager_on_graph
def _scaled(x, factor):
    return x * factor


def _body_with_breaks(weight):
    """Three breaks and a hooked call: a break on a pool intermediate, a hooked call (whose body has a break
    of its own) on a tensor a cache keeps beyond the capture, a break on a weight."""
    h = torch.ones(4) * 2  # an intermediate: dies before the capture ends
    out = _scaled(h, 3)
    cache = {"y": out + 1}  # kept beyond the capture
    body = CapturedBody(lambda y: _scaled(y, 2) + 1, "body")
    out = out + hooked_call(lambda y: body(y), body, (cache["y"],), {})
    return out + _scaled(weight, 1), cache


def test_breaks_and_hooked_calls_are_finalized_when_the_capture_ends(monkeypatch):
    weight = torch.full((4,), 5.0)
    with _cpu_capture_state(monkeypatch) as (graph, state):
        _, cache = _body_with_breaks(weight)
        assert state.arguments.pending == 4  # three breaks and one hooked call, sub-capture included
        kept = state.finalize_arguments()
    steps = graph._steps
    scaled = _scaled.__wrapped__.__qualname__
    assert [s.name for s in steps] == [scaled, "body", scaled]
    hooked = steps[1]
    inner = hooked.sub._steps[0]
    # h died: left non-owning; the hooked call's argument (the cache holds it), the inner break's argument
    # (the same tensor) and the weight are alive: upgraded to owning
    assert kept == [KeptNonOwning(scaled, steps[0].args[0])] and state.arguments.pending == 0
    y_ref, w_ref = StorageWeakRef(cache["y"].untyped_storage()), StorageWeakRef(weight.untyped_storage())
    hooked_arg, inner_arg, weight_arg = hooked.args[0], inner.args[0], steps[2].args[0]
    y = cache["y"].clone()
    del cache, weight
    assert _owns(hooked_arg, y_ref) and _owns(inner_arg, y_ref) and _owns(weight_arg, w_ref)
    assert torch.equal(weight_arg, torch.full((4,), 5.0)) and torch.equal(hooked_arg, y)


def test_the_check_finds_a_kept_argument_outside_the_pool(monkeypatch):
    monkeypatch.setenv(pool_check.ENV_CHECK, "1")
    inside, outside = torch.zeros(16), torch.zeros(16)
    start = inside.untyped_storage().data_ptr()
    snapshot = [{"address": start - 64, "total_size": 64 + inside.untyped_storage().nbytes(),
                 "segment_pool_id": ("pool", 1), "device": None},
                {"address": outside.untyped_storage().data_ptr(), "total_size": 4096, "segment_pool_id": (0, 0),
                 "device": None}]
    monkeypatch.setattr(pool_check, "pool_ranges", lambda pool, device: sorted(
        (s["address"], s["address"] + s["total_size"]) for s in snapshot if tuple(s["segment_pool_id"]) == pool))
    views = {"inner": bcg.non_owning_view(inside), "planted": bcg.non_owning_view(outside)}
    pool_check.check_in_pool([KeptNonOwning("inner", views["inner"])], ("pool", 1), torch.device("cpu"))
    with pytest.raises(bcg.BreakArgumentOutsidePoolError, match="planted") as caught:
        pool_check.check_in_pool([KeptNonOwning(n, v) for n, v in views.items()], ("pool", 1), torch.device("cpu"))
    assert "inner" not in str(caught.value) and pool_check.ENV_CHECK in str(caught.value)

    with _cpu_capture_state(monkeypatch) as (graph, state):  # through the capture's end
        state.arguments.detach((outside.clone(),), "planted")
        with pytest.raises(bcg.BreakArgumentOutsidePoolError, match="planted"):
            state.finalize_arguments()


def test_the_check_is_off_by_default_and_reads_its_switch(monkeypatch):
    monkeypatch.delenv(pool_check.ENV_CHECK, raising=False)
    assert not pool_check.check_enabled()
    for value, on in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv(pool_check.ENV_CHECK, value)
        assert pool_check.check_enabled() is on
    monkeypatch.setenv(pool_check.ENV_CHECK, "maybe")
    with pytest.raises(ValueError, match=pool_check.ENV_CHECK):
        pool_check.check_enabled()


# -- no allocator snapshot on the capture and replay paths ---------------------------------------------------------
def _forbid_snapshots(monkeypatch) -> list[str]:
    calls: list[str] = []

    def forbidden(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called on the capture or replay path")
        return call

    monkeypatch.setattr(torch.cuda, "memory_snapshot", forbidden("torch.cuda.memory_snapshot"))
    monkeypatch.setattr(torch.cuda.memory, "memory_snapshot", forbidden("torch.cuda.memory.memory_snapshot"))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", forbidden("torch.cuda.memory._snapshot"))
    monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", forbidden("torch._C._cuda_memorySnapshot"), raising=False)
    mempool = getattr(torch.cuda, "MemPool", None)
    if mempool is not None:
        monkeypatch.setattr(mempool, "snapshot", forbidden("MemPool.snapshot"), raising=False)
    return calls


def test_no_allocator_snapshot_while_capturing_or_replaying(monkeypatch):
    monkeypatch.delenv(pool_check.ENV_CHECK, raising=False)
    calls = _forbid_snapshots(monkeypatch)
    with _cpu_capture_state(monkeypatch) as (graph, state):  # breaks, a hooked call, the end of the capture
        _body_with_breaks(torch.ones(4))
        state.finalize_arguments()
    graph._finish()
    debug_graph = bcg.BreakableCUDAGraph()
    for _ in range(2):  # a debug capture, then its replay-like second run
        with bcg.BreakableCUDAGraphCapture(debug_graph, debug=True):
            _body_with_breaks(torch.ones(4))
    assert calls == []


def _snapshot_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else \
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if name in SNAPSHOT_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_product_code_takes_allocator_snapshots_only_in_the_opt_in_check():
    files = [p for folder in ("bcg_diffusion", "pipelines", "scripts") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 100
    uses = [u for p in files if p.relative_to(ROOT) not in ALLOWED for u in _snapshot_uses(p)]
    assert uses == [], "allocator snapshots outside core/pool_check.py (the opt-in check) and the failed-capture probe:\n" + "\n".join(uses)
    assert _snapshot_uses(ROOT / "bcg_diffusion/core/pool_check.py")  # the scan sees the one that is allowed
