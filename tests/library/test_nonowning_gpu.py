"""GPU tests of the lifetime rule of break arguments (core/nonowning.py, docs/capture-core.md "Break
arguments: owning or not"): a pool intermediate stays non-owning and its block is reused (capture memory
does not grow by one copy per break, against the same capture with every argument held strongly); a tensor
made before the capture and dropped after it is owned by the graph (replays stay right after ``del``,
``empty_cache`` and new allocations); the opt-in check (``BCG_DIFFUSION_CHECK_BREAK_ARGS=1``) names a break
whose argument was freed outside the pool; no allocator snapshot is taken by default. Replays are compared
bitwise with eager runs of the same kernels."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import bcg_diffusion.core as bcg
from bcg_diffusion.core import _cudart, capture, pool_check, side_streams
from bcg_diffusion.core.nonowning import BreakArguments

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.survives_sabotage(
        "fallback", "skip_segment", "stale_inputs",
        reason="drives bcg_diffusion.core directly; the switch acts in the graph runner (integration)"),
]

DEV = "cuda"
N_BREAKS = 8
NUMEL = 4 * 1024 * 1024  # 16 MiB of fp32 per intermediate: blocks of their own in the allocator
BIG = NUMEL * 4


@bcg.eager_on_graph
def reduce_break(h):
    return h.view(64, -1).sum(-1)


def _body(x):
    acc = torch.zeros(64, device=DEV)
    for i in range(N_BREAKS):
        h = x * (i + 1)  # a fresh pool intermediate per break, dropped by the next iteration
        acc = acc + reduce_break(h)
    return acc


def _assert_clean():
    assert not bcg.is_capturing_breakable()
    assert not side_streams.is_hook_installed()
    assert not _cudart.is_stream_capturing(torch.cuda.current_stream())


def _recording_kept(monkeypatch) -> list:
    """Every capture's list of arguments left non-owning, appended as the capture ends."""
    seen = []
    real = capture._CaptureState.finalize_arguments

    def finalize(self):
        kept = real(self)
        seen.append(kept)
        return kept

    monkeypatch.setattr(capture._CaptureState, "finalize_arguments", finalize)
    return seen


def _captured(body, *args):
    """``(graph, out, allocated, reserved)``: the capture of ``body(*args)`` and the device memory it added."""
    gc.collect()
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph):
        out = body(*args)
    torch.cuda.synchronize()
    _assert_clean()
    return graph, out, torch.cuda.memory_allocated() - allocated, torch.cuda.memory_reserved() - reserved


def test_pool_intermediates_stay_non_owning_and_their_blocks_are_reused(monkeypatch):
    kept = _recording_kept(monkeypatch)
    x = torch.randn(NUMEL, device=DEV)
    _captured(_body, x)  # once before measuring: library handles and cached cuBLAS workspaces exist from now on
    graph, out, allocated, reserved = _captured(_body, x)
    assert len(kept[-1]) == N_BREAKS and {k.name for k in kept[-1]} == {reduce_break.__wrapped__.__qualname__}
    with monkeypatch.context() as strong:  # the same capture with every argument held strongly
        strong.setattr(BreakArguments, "detach", lambda self, value, name: value)
        strong_graph, strong_out, strong_allocated, strong_reserved = _captured(_body, x)
    assert allocated < 3 * BIG, f"the capture holds {allocated / 2**20:.0f} MiB for {N_BREAKS} breaks"
    assert strong_allocated >= N_BREAKS * BIG  # the comparison pins one copy per break
    assert reserved <= strong_reserved - (N_BREAKS - 3) * BIG, (reserved / 2**20, strong_reserved / 2**20)
    for _ in range(3):
        x.normal_()
        torch.cuda.synchronize()
        expected = _body(x)  # the same kernels eagerly: bitwise
        graph.replay()
        strong_graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected) and torch.equal(strong_out, expected)


def test_an_argument_made_before_the_capture_is_owned_by_the_graph(monkeypatch):
    kept = _recording_kept(monkeypatch)
    torch.manual_seed(0)
    w = torch.randn(64, 64, device=DEV) / 8
    bias = torch.randn(NUMEL // 64, 64, device=DEV)  # made before the capture, passed to a break

    @bcg.eager_on_graph
    def add_bias(h, b):
        return h + b

    def body(x):
        return add_bias(x @ w, bias) * 2

    x = torch.randn(NUMEL // 64, 64, device=DEV)
    graph, out, _, _ = _captured(body, x)
    # x @ w died during the capture: left non-owning; bias is alive at the end (the test holds it): upgraded
    assert len(kept[-1]) == 1 and kept[-1][0].view.data_ptr() != bias.data_ptr()
    expected = body(x).clone()
    ref = StorageWeakRef(bias.untyped_storage())
    del bias  # the caller drops it: only the graph holds it now
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fill = [torch.full((NUMEL // 64, 64), 7.0, device=DEV) for _ in range(4)]  # would take a freed block
    assert not ref.expired()
    for _ in range(2):
        out.zero_()
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert all(bool((f == 7.0).all()) for f in fill)
    del graph
    gc.collect()
    assert ref.expired()  # the graph was its last owner


def test_the_opt_in_check_names_the_break_whose_argument_left_the_pool(monkeypatch):
    monkeypatch.setenv(pool_check.ENV_CHECK, "1")
    x = torch.randn(NUMEL, device=DEV)
    graph, out, _, _ = _captured(_body, x)  # pool intermediates only: the check passes
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _body(x))

    cache = {"t": torch.randn(NUMEL, device=DEV)}  # made before the capture

    @bcg.eager_on_graph
    def read_cache(t):
        return t.sum()

    def planted(x):
        return x * read_cache(cache.pop("t"))  # its last owner drops it during the capture

    failed = bcg.BreakableCUDAGraph()
    with pytest.raises(bcg.BreakArgumentOutsidePoolError, match="read_cache"):
        with bcg.BreakableCUDAGraphCapture(failed):
            planted(x)
    _assert_clean()
    assert failed.state is bcg.GraphState.FAILED and "BreakArgumentOutsidePoolError" in repr(failed)
    monkeypatch.delenv(pool_check.ENV_CHECK)
    cache["t"] = torch.randn(NUMEL, device=DEV)
    unchecked = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(unchecked):  # off by default: the capture does not look (never replayed)
        planted(x)
    assert unchecked.state is bcg.GraphState.CAPTURED


def test_no_allocator_snapshot_by_default(monkeypatch):
    monkeypatch.delenv(pool_check.ENV_CHECK, raising=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("an allocator snapshot on the capture or replay path")

    monkeypatch.setattr(torch.cuda, "memory_snapshot", forbidden)
    monkeypatch.setattr(torch.cuda.memory, "memory_snapshot", forbidden)
    monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", forbidden, raising=False)
    x = torch.randn(NUMEL, device=DEV)
    graph, out, _, _ = _captured(_body, x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _body(x))
