"""CPU tests of the capture core: everything that needs no CUDA device."""

import dataclasses
import sys
import threading

import pytest
import torch

import bcg_diffusion.core as bcg
from bcg_diffusion.core import _cudart, side_streams
from bcg_diffusion.core.boxing import box_tuple, unbox_tuple

from _hooked import hooked_input, hooked_setup
from _tensors import tensors


def test_eager_on_graph_is_a_plain_call_outside_capture():
    calls = []

    @bcg.eager_on_graph
    def add(a, b, scale=1):
        calls.append((a, b, scale))
        return (a + b) * scale

    x = torch.ones(3)
    assert torch.equal(add(x, x, scale=2), torch.full((3,), 4.0))
    assert len(calls) == 1 and add.__name__ == "add"


def test_eager_on_graph_called_form_and_disabled():
    def f(x):
        return x

    assert bcg.eager_on_graph(enable=False)(f) is f
    wrapped = bcg.eager_on_graph()(f)
    assert wrapped is not f and wrapped.__bcg_eager_fn__ is f


def test_break_graph_outside_capture_is_a_no_op():
    assert bcg.break_graph() is None
    assert not bcg.is_capturing_breakable()


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


class Holder:
    def __init__(self, t, n):
        self.t = t
        self.n = n


@pytest.mark.parametrize(
    "make, n_tensors",
    [
        (lambda v: v, 1),
        (lambda v: (v, v * 2), 2),
        (lambda v: [v, (v + 1, v + 2)], 3),
        (lambda v: {"x": v, "y": [v * 3]}, 2),
        (lambda v: Pair(v, v - 1), 2),
        (lambda v: Holder(v * 5, 7), 1),
        (lambda v: {"nested": Pair(v, v), "obj": Holder(v, None), "tuple": (v, 1, "s")}, 4),
        (lambda v: box_tuple((v, None, v * 2)), 2),
    ],
    ids=["tensor", "tuple", "list", "dict", "dataclass", "object", "nested", "boxed"],
)
def test_copy_into_writes_every_structure_in_place(make, n_tensors):
    dst = make(torch.zeros(4))
    dst_tensors = tensors(dst)
    assert len(dst_tensors) == n_tensors  # the walker finds every tensor (it is the library's own)
    ids_before = [id(t) for t in dst_tensors]
    src = make(torch.arange(4.0))
    bcg.copy_into(dst, src)
    assert [id(t) for t in tensors(dst)] == ids_before
    for d, s in zip(tensors(dst), tensors(src)):
        assert torch.equal(d, s)
    assert all(bool((d != 0).any()) for d in tensors(dst))  # every one written: arange(4) * k has non-zeros


@pytest.mark.parametrize(
    "dst, src, fragment",
    [
        (torch.zeros(3), torch.zeros(4), "tensor(3,) torch.float32 on cpu"),
        (torch.zeros(3), torch.zeros(3, dtype=torch.float64), "torch.float64"),
        ((torch.zeros(3),), (torch.zeros(3), torch.zeros(3)), "1 elements"),
        ({"a": torch.zeros(1)}, {"b": torch.zeros(1)}, "keys ['a']"),
        ([torch.zeros(1)], (torch.zeros(1),), "a list of 1"),
        (torch.zeros(1), None, "got None"),
        ((torch.zeros(1), 3), (torch.zeros(1), 4), "output[1]"),
        (Pair(torch.zeros(1), torch.zeros(1)), Holder(torch.zeros(1), 1), "Pair"),
        (Holder(torch.zeros(1), 1), Holder(torch.zeros(2), 1), "output.t"),
    ],
)
def test_copy_into_rejects_changed_structure(dst, src, fragment):
    with pytest.raises(bcg.BreakOutputMismatchError) as err:
        bcg.copy_into(dst, src)
    assert fragment in str(err.value)
    assert "same structure" in str(err.value)


def test_boxing_round_trip_keeps_elements_and_namedtuple_type():
    from collections import namedtuple

    Out = namedtuple("Out", "x y")
    a, b = torch.zeros(2), torch.ones(2)
    boxed = box_tuple(Out(a, b))
    assert isinstance(boxed, bcg._BCGBoxedTupleOutput)
    assert boxed.item_0 is a and boxed.item_1 is b and len(boxed) == 2
    back = unbox_tuple(boxed)
    assert isinstance(back, Out) and back.x is a and back.y is b
    assert box_tuple(a) is a and unbox_tuple(a) is a
    with pytest.raises(AttributeError):
        boxed.item_5
    with pytest.raises(TypeError, match="boxes tuples"):
        bcg._BCGBoxedTupleOutput([a])


def test_returns_boxed_tuples_only_under_capture():
    fn = bcg.returns_boxed_tuples_under_capture(lambda x: (x, x + 1))
    out = fn(torch.zeros(1))
    assert type(out) is tuple
    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph, debug=True):
        boxed = fn(torch.zeros(1))
    assert isinstance(boxed, bcg._BCGBoxedTupleOutput)


def test_replay_token_scoping():
    assert bcg.get_current_replay_token() is None
    with bcg.replay_token_scope() as first:
        assert bcg.get_current_replay_token() == first
        with bcg.replay_token_scope() as inner:
            assert inner != first and bcg.get_current_replay_token() == inner
        assert bcg.get_current_replay_token() == first
    with bcg.replay_token_scope() as second:
        assert second != first
    assert bcg.get_current_replay_token() is None


def test_replay_token_is_per_thread():
    seen = []
    with bcg.replay_token_scope():
        t = threading.Thread(target=lambda: seen.append(bcg.get_current_replay_token()))
        t.start()
        t.join()
    assert seen == [None]


def test_replay_token_is_none_during_capture_body():
    graph = bcg.BreakableCUDAGraph()
    with bcg.replay_token_scope():
        with bcg.BreakableCUDAGraphCapture(graph, debug=True):
            assert bcg.get_current_replay_token() is None


def test_capture_without_cuda_raises_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    graph = bcg.BreakableCUDAGraph()
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        with bcg.BreakableCUDAGraphCapture(graph):
            pass
    assert not bcg.is_capturing_breakable()
    assert not side_streams.is_hook_installed()


def test_missing_cuda_python_gives_install_hint(monkeypatch):
    _cudart.cudart.cache_clear()
    for name in ["cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"]:
        monkeypatch.setitem(sys.modules, name, None)
    try:
        with pytest.raises(RuntimeError, match="pip install cuda-bindings"):
            _cudart.cudart()
    finally:
        _cudart.cudart.cache_clear()


def test_replay_of_uncaptured_or_failed_graph_raises():
    graph = bcg.BreakableCUDAGraph()
    with pytest.raises(RuntimeError, match="capture it first"):
        graph.replay()
    with pytest.raises(ValueError, match="boom"):
        with bcg.BreakableCUDAGraphCapture(graph, debug=True):
            raise ValueError("boom")
    with pytest.raises(RuntimeError, match="capture failed .*boom"):
        graph.replay()
    assert "failed" in repr(graph)


def test_nested_capture_raises():
    outer = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(outer, debug=True):
        with pytest.raises(RuntimeError, match="nested BreakableCUDAGraphCapture"):
            with bcg.BreakableCUDAGraphCapture(bcg.BreakableCUDAGraph(), debug=True):
                pass


def test_bad_capture_arguments():
    with pytest.raises(TypeError, match="needs a BreakableCUDAGraph"):
        bcg.BreakableCUDAGraphCapture(object())
    with pytest.raises(ValueError, match="capture_error_mode"):
        bcg.BreakableCUDAGraphCapture(bcg.BreakableCUDAGraph(), capture_error_mode="loose")


def _step(x, w, attn):
    h = x @ w
    a = attn(h)
    h = h + a
    b = attn(h * 2)
    return h + b


def test_debug_mode_runs_breaks_and_copies_into_first_bridges():
    calls = []

    @bcg.eager_on_graph
    def attn(h):
        calls.append(bcg.get_current_replay_token())
        return torch.tanh(h)

    graph = bcg.BreakableCUDAGraph()
    w = torch.randn(4, 4)
    x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
    with bcg.BreakableCUDAGraphCapture(graph, debug=True):
        out1 = _step(x1, w, attn)
    assert graph.num_breaks == 2 and graph.num_segments == 3 and graph.is_debug
    bridges = list(graph._debug.outputs)
    with bcg.BreakableCUDAGraphCapture(graph, debug=True):
        out2 = _step(x2, w, attn)
    assert torch.equal(out1, _step(x1, w, torch.tanh))
    assert torch.equal(out2, _step(x2, w, torch.tanh))
    assert [id(b) for b in graph._debug.outputs] == [id(b) for b in bridges]
    assert len(calls) == 4
    with pytest.raises(RuntimeError, match="debug"):
        graph.replay()


def test_debug_mode_reports_structure_change():
    @bcg.eager_on_graph
    def f(h):
        return h if h.shape[0] == 2 else h[:1]

    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph, debug=True):
        f(torch.zeros(2, 3))
    with pytest.raises(bcg.BreakOutputMismatchError, match="result of .*f"):
        with bcg.BreakableCUDAGraphCapture(graph, debug=True):
            f(torch.zeros(3, 3))
    assert not bcg.is_capturing_breakable()


def test_capture_state_is_per_thread():
    seen = []
    with bcg.BreakableCUDAGraphCapture(bcg.BreakableCUDAGraph(), debug=True):
        t = threading.Thread(target=lambda: seen.append(bcg.is_capturing_breakable()))
        t.start()
        t.join()
        assert bcg.is_capturing_breakable()
    assert seen == [False]


def test_hooked_call_in_debug_mode_runs_hooks_once_per_call_and_not_at_capture():
    f, body, body_fn, state = hooked_setup("cpu")
    x = hooked_input("cpu")
    graph = bcg.BreakableCUDAGraph()
    with bcg.BreakableCUDAGraphCapture(graph, debug=True):
        f(x)
    assert state["n"] == 0 and graph.num_breaks == 1  # the capture pass ran the body only
    kept = None
    for n in range(1, 5):
        x = hooked_input("cpu")
        with bcg.BreakableCUDAGraphCapture(graph, debug=True):
            out = f(x)
        if n % 2 == 1:
            kept = body_fn(x * 3)
            assert torch.equal(out, kept - 1)
        else:
            assert torch.equal(out, kept * 2 - 1)
    assert state["n"] == 4


def test_patch_attribute_puts_back_exactly_what_the_owner_held():
    from bcg_diffusion.core.handles import live_handles, patch_attribute

    class Owner:
        def method(self):
            return "class"

    module = torch.nn.Linear(2, 2)
    own = Owner()
    handles = [patch_attribute(module, "forward", lambda x: x), patch_attribute(own, "method", lambda: "instance"),
               patch_attribute(Owner, "method", lambda self: "patched class")]
    assert "forward" in vars(module) and own.method() == "instance" and Owner().method() == "patched class"
    assert not any(h in live_handles() for h in handles)  # their owner removes them, no leftover sweep
    again = patch_attribute(own, "method", lambda: "again")  # a patch over a patch puts back the first one
    again.remove()
    assert own.method() == "instance"
    for handle in reversed(handles):
        handle.remove()
        handle.remove()  # idempotent
    assert "forward" not in vars(module) and "method" not in vars(own) and own.method() == "class"
    assert Owner.__dict__["method"](own) == "class"
