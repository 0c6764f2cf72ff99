"""GPU tests of the capture core: capture, breaks, replay, memory, streams, threads."""

import dataclasses
import threading

import pytest
import torch

import bcg_diffusion.core as bcg
from bcg_diffusion.core import _cudart, side_streams

from _hooked import hooked_input, hooked_setup

# The sabotage switch (BCG_DIFFUSION_TEST_SABOTAGE, docs/testing.md) acts in the graph runner; these
# tests drive the capture core directly, so no mode reaches them.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.survives_sabotage(
        "fallback", "skip_segment", "stale_inputs",
        reason="drives bcg_diffusion.core directly; the switch acts in the graph runner (integration)"),
]

DEV = "cuda"


def _assert_clean():
    assert not bcg.is_capturing_breakable()
    assert not side_streams.is_hook_installed()
    assert not _cudart.is_stream_capturing(torch.cuda.current_stream())


def _capture(fn, *args, **kw):
    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph, **kw):
        out = fn(*args)
    torch.cuda.synchronize()
    _assert_clean()
    return graph, out


@bcg.eager_on_graph
def softmax_break(x):
    return torch.softmax(x, dim=-1)


def _mlp(x, w, n_breaks):
    h = x
    for _ in range(n_breaks):
        h = torch.nn.functional.gelu(h @ w)
        h = h + softmax_break(h)
    return h @ w


@pytest.mark.parametrize("n_breaks", [0, 1, 7])
def test_segments_and_replay_match_eager(n_breaks):
    torch.manual_seed(0)
    w = torch.randn(64, 64, device=DEV) / 8
    x = torch.randn(16, 64, device=DEV)
    graph, out = _capture(_mlp, x, w, n_breaks)
    assert graph.num_breaks == n_breaks
    assert graph.num_segments == n_breaks + 1
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _mlp(x, w, n_breaks))


def test_back_to_back_breaks_leave_no_empty_segment():
    x = torch.randn(8, device=DEV)

    def body(x):
        y = x * 2
        bcg.break_graph()
        bcg.break_graph()
        return softmax_break(y) + 1

    graph, out = _capture(body, x)
    assert graph.num_breaks == 3 and graph.num_segments == 2
    x.fill_(3.0)
    graph.replay()
    assert torch.equal(out, torch.softmax(x * 2, -1) + 1)


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    scaled: torch.Tensor


@bcg.eager_on_graph
def tuple_break(x):
    return x.sum(-1, keepdim=True), x * 3


@bcg.eager_on_graph
def dict_break(x):
    return {"neg": -x, "nested": [x + 1, (x.abs(),)]}


@bcg.eager_on_graph
def dataclass_break(x):
    return Stats(mean=x.mean(-1, keepdim=True), scaled=x * 0.5)


def _structured(x):
    s, t = tuple_break(x * 1.5)
    d = dict_break(t)
    st = dataclass_break(d["neg"] + d["nested"][1][0])
    return s + st.mean + st.scaled + d["nested"][0]


def test_tuple_dict_dataclass_results_are_copied_back():
    x = torch.randn(4, 32, device=DEV)
    graph, out = _capture(_structured, x)
    assert graph.num_breaks == 3
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _structured(x))


def test_changed_break_structure_raises_at_replay():
    state = {"n": 4}

    @bcg.eager_on_graph
    def flaky(x):
        return x[: state["n"]].clone()

    x = torch.randn(4, device=DEV)
    graph, _ = _capture(lambda x: flaky(x) * 2, x)
    state["n"] = 2
    with pytest.raises(bcg.BreakOutputMismatchError, match="captured tensor\\(4,\\)"):
        graph.replay()


def test_side_stream_forked_and_not_joined_is_joined():
    side = torch.cuda.Stream()
    x = torch.randn(1024, device=DEV)

    def body(x):
        main = torch.cuda.current_stream()
        side.wait_stream(main)  # fork, never joined by the user
        with torch.cuda.stream(side):
            y = x * 2
        z = x + 1
        bcg.break_graph()
        with torch.cuda.stream(side):
            y2 = y + 10  # still forked in the next segment
        main.wait_stream(side)
        return y2 + z

    graph, out = _capture(body, x)
    assert graph.num_segments == 2
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, (x * 2 + 10) + (x + 1))


def test_two_graphs_sharing_one_pool_replayed_alternately():
    w = torch.randn(32, 32, device=DEV)
    x1, x2 = torch.randn(8, 32, device=DEV), torch.randn(8, 32, device=DEV)
    pool = torch.cuda.graph_pool_handle()
    g1, o1 = _capture(_mlp, x1, w, 2, pool=pool)
    g2, o2 = _capture(_mlp, x2, w, 3, pool=pool)
    assert tuple(g1.pool) == tuple(g2.pool) == tuple(pool)
    for i in range(3):
        x1.normal_()
        x2.normal_()
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.equal(o1, _mlp(x1, w, 2)) and torch.equal(o2, _mlp(x2, w, 3))


def test_exception_inside_capture_cleans_up_and_later_capture_works():
    x = torch.randn(16, device=DEV)
    graph = bcg.BreakableCUDAGraph()
    with pytest.raises(RuntimeError):
        with bcg.BreakableCUDAGraphCapture(graph):
            y = x * 2
            y.sum().item()  # a host sync: not capturable
    _assert_clean()
    with pytest.raises(RuntimeError, match="capture failed"):
        graph.replay()
    eye = torch.eye(16, device=DEV)  # kept alive: the graph reads it at replay
    graph2, out = _capture(_mlp, x.view(1, 16), eye, 1)
    x.normal_()
    graph2.replay()
    assert torch.equal(out, _mlp(x.view(1, 16), eye, 1))


def test_exception_in_user_code_after_break_cleans_up():
    x = torch.randn(8, device=DEV)
    graph = bcg.BreakableCUDAGraph()
    with pytest.raises(KeyError):
        with bcg.BreakableCUDAGraphCapture(graph):
            softmax_break(x * 2)
            raise KeyError("user bug")
    _assert_clean()


def test_nested_capture_inside_torch_graph_raises():
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device=DEV)
    with pytest.raises(RuntimeError, match="nested capture"):
        with torch.cuda.graph(g):
            y = x + 1
            with bcg.BreakableCUDAGraphCapture(bcg.BreakableCUDAGraph()):
                pass
    _assert_clean()


def test_two_threads_capture_at_once():
    barrier = threading.Barrier(2)
    results, errors = {}, []
    # No random ops in the threads: torch's CUDA generator is process-wide and refuses eager
    # draws while another thread captures.
    data = [(torch.randn(32, 32, device=DEV) / 6, torch.randn(4, 32, device=DEV), torch.randn(4, 32, device=DEV)) for _ in range(2)]
    torch.cuda.synchronize()

    def worker(i):
        try:
            torch.cuda.set_device(0)
            # Each thread works on its own stream: the legacy default stream would synchronize
            # implicitly with the other thread's capturing stream, which CUDA forbids.
            with torch.cuda.stream(torch.cuda.Stream()):
                w, x, x_new = data[i]
                graph = bcg.BreakableCUDAGraph()
                with bcg.BreakableCUDAGraphCapture(graph, capture_error_mode="thread_local"):
                    barrier.wait(timeout=30)  # both captures are active now
                    out = _mlp(x, w, 2 + i)
                    seen_own = bcg.is_capturing_breakable()
                x.copy_(x_new)
                graph.replay()
                expected = _mlp(x, w, 2 + i)
                torch.cuda.current_stream().synchronize()
                results[i] = (graph.num_breaks, seen_own, torch.equal(out, expected))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {0: (2, True, True), 1: (3, True, True)}
    _assert_clean()


def test_capture_stub_is_used_at_capture_and_real_fn_at_replay():
    calls = {"real": 0, "stub": 0}

    def stub(x):
        calls["stub"] += 1
        return torch.empty_like(x)

    @bcg.eager_on_graph(capture_stub=stub)
    def needs_real_values(x):
        calls["real"] += 1
        n = int(x.abs().argmax().item())  # host read: only valid on real data
        return x * n

    x = torch.randn(8, device=DEV)
    graph, out = _capture(lambda x: needs_real_values(x + 1) - 1, x)
    assert calls == {"real": 0, "stub": 1}
    graph.replay()
    torch.cuda.synchronize()
    assert calls["real"] == 1
    n = int((x + 1).abs().argmax().item())
    assert torch.equal(out, (x + 1) * n - 1)


def test_replay_token_changes_per_replay_and_is_shared_within_one():
    tokens = []

    @bcg.eager_on_graph
    def record(x):
        tokens.append(bcg.get_current_replay_token())
        return x + 1

    x = torch.zeros(4, device=DEV)
    graph, _ = _capture(lambda x: record(record(x)), x)
    assert tokens == [None, None]
    graph.replay()
    graph.replay()
    assert tokens[2] == tokens[3] and tokens[4] == tokens[5] and tokens[2] != tokens[4]
    assert bcg.get_current_replay_token() is None


def test_pool_allocated_bridges_do_not_accumulate():
    n_breaks, numel = 8, 4 * 1024 * 1024
    big_bytes = numel * 4

    def alloc(h):
        return torch.empty_like(h)  # allocation only: runs inside the capture, lands in the pool

    @bcg.eager_on_graph(capture_allocator=alloc)
    def same_size_break(h):
        return torch.tanh(h)

    def body(x):
        h = x
        for _ in range(n_breaks):
            h = same_size_break(h * 0.5) + 1
        return h

    x = torch.randn(numel, device=DEV)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    graph, out = _capture(body, x)
    held = torch.cuda.memory_allocated() - before
    assert graph.num_breaks == n_breaks
    assert held < 4 * big_bytes, f"capture holds {held / 2**20:.0f} MiB for {n_breaks} bridges"
    for _ in range(2):
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, body(x))


_WORKSPACE_CHILD = r"""
import torch, bcg_diffusion.core as bcg
torch.manual_seed(0)
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32
b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)

@bcg.eager_on_graph
def brk(h):
    return torch.softmax(h.float(), -1).to(h.dtype)

def f(x):
    h = x
    for _ in range(4):
        h = torch.nn.functional.linear(h, w, b)
        h = h + brk(h)
    return h @ w

ref = f(x)
graph = bcg.BreakableCUDAGraph()
with bcg.BreakableCUDAGraphCapture(graph):
    out = f(x)
torch.cuda.synchronize()
torch._C._cuda_clearCublasWorkspaces()  # what CUDA graph trees do on every recording
torch.cuda.empty_cache()
fill = [torch.full((2**24,), 7.0, device="cuda", dtype=torch.bfloat16) for _ in range(8)]  # take freed memory
for _ in range(3):
    out.zero_()
    graph.replay()
torch.cuda.synchronize()
print("RESULT", torch.equal(out, ref), all(bool((t == 7).all()) for t in fill))
"""


def test_replay_survives_cleared_cublas_workspaces():
    """A graph owns the cuBLAS workspace its kernels were captured with: clearing torch's workspace
    cache (as torch.compile's CUDA graph trees do), freeing cached memory and reallocating it must
    neither fault nor let replays write into other tensors. Run in a child process, since the
    failure is a crash of the process."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _WORKSPACE_CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT True True" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_hooked_call_replays_the_body_only_when_the_hooks_compute_it():
    f, body, body_fn, state = hooked_setup(DEV)
    x = hooked_input(DEV)
    graph, out = _capture(f, x)
    assert state["n"] == 0 and graph.num_breaks == 1
    kept = None
    for n in range(1, 7):
        x.copy_(hooked_input(DEV))  # new values in the captured input buffer on every replay
        graph.replay()
        torch.cuda.synchronize()
        if n % 2 == 1:
            kept = body_fn(x * 3)
            assert torch.equal(out, kept - 1)
        else:
            assert torch.equal(out, kept * 2 - 1)
    assert (body.calls, body.computed, state["n"]) == (6, 3, 6)
