"""Where a failed capture failed (frames -> site), narrowing to it, eager methods and functions,
module mode's plumbing, and host values in keys. CPU: no capture runs; these prove the decisions
and the undo paths, the GPU tests prove the replays (test_zoo_gpu.py)."""

import pytest
import torch

import _host_helpers as helpers

from bcg_diffusion.config import BCGConfig
from bcg_diffusion.integration import entries, failures
from bcg_diffusion.integration.breaks import narrowing
from bcg_diffusion.integration.breaks.eager_modules import EagerModules
from bcg_diffusion.integration.keys import Call, HostTensor, UncacheableInput, flatten_inputs, rebuild_inputs
from bcg_diffusion.integration.object_inputs import ObjectLayout, Opaque
from bcg_diffusion.integration.entry_kinds import EagerFallback
from bcg_diffusion.integration.events import RunnerEvents
from bcg_diffusion.integration.module_mode import UnitGraphs, replay_units
from bcg_diffusion.integration.replays import Replayer

host_value = helpers.host_value


class Block(torch.nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.fail = fail

    def route(self, x):  # a MoE router's host work, say
        return x

    def forward(self, x):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return self.proj(self.route(x))


class Rope(torch.nn.Module):
    def coords(self, x):
        raise RuntimeError("host copy")

    def forward(self, x):
        return x


class Model(torch.nn.Module):
    def __init__(self, where=""):
        super().__init__()
        self.where = where
        self.rope = Rope()
        self.blocks = torch.nn.ModuleList([Block(fail=where == "block"), Block()])
        self.out = torch.nn.Linear(4, 4)

    def patchify(self, x):
        raise RuntimeError("host tensor")

    @torch.no_grad()
    def decorated(self, x):  # HiDream's moe_infer is a @torch.no_grad() method
        raise RuntimeError("host tensor in a decorated method")

    def forward(self, x):
        if self.where == "method":
            self.patchify(x)
        if self.where == "decorated_method":
            self.decorated(x)
        if self.where == "child_method":
            self.rope.coords(x)
        if self.where == "function":
            host_value(x)
        if self.where == "inline":
            raise RuntimeError("inline host read")
        if self.where == "closure":
            def planted(x):
                raise RuntimeError("host sync in a forward set on one instance")

            self.blocks[1].forward = planted
        if self.where == "linear":
            self.out.weight = None  # makes Linear.forward raise inside torch
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _sites(where):
    model = Model(where)
    with pytest.raises(Exception) as info:
        model(torch.ones(2, 4))
    return failures.locate(info.value, model)


@pytest.mark.parametrize(
    "where, units",
    [
        ("block", [("module", "blocks.0", "")]),
        ("method", [("method", "", "patchify")]),
        ("decorated_method", [("method", "", "decorated")]),
        ("child_method", [("method", "rope", "coords")]),
        ("function", []),  # a free function belongs to the module that called it: here the transformer
        ("inline", []),
        ("closure", [("module", "blocks.1", "")]),
        ("linear", [("module", "out", "")]),  # torch's own modules are units too
    ],
)
def test_the_failure_is_attributed_to_the_modules_on_the_stack_innermost_first(where, units):
    sites = _sites(where)
    assert [(s.kind, s.path, s.name) for s in sites] == units + [("root", "", "")], sites
    assert all(s.owner_type is type(Model(where).get_submodule(s.path)) for s in sites)


class Gate(torch.nn.Module):
    """A model's activation module with a method of its own that calls ``F.gelu`` (diffusers' GELU)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def gelu(self, x):
        return torch.nn.functional.gelu(x)

    def forward(self, x):
        return self.gelu(self.proj(x))


class FeedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()
        self.act = torch.nn.GELU()  # torch's GELU: also calls F.gelu, has no method ``gelu``

    def forward(self, x):
        return self.act(self.gate(x))


class GeluModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([FeedForward(), FeedForward()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _reads_a_value(x, approximate="none"):
    """A process-wide stand-in for ``F.gelu`` that does host work (here: fails as under capture)."""
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_process_wide_patched_function_is_attributed_to_the_module_that_called_it(monkeypatch):
    # torch.nn.GELU and the model's Gate both call F.gelu; the patched function is a free function of
    # another file: the failure belongs to the innermost module on the stack, never to the function's name
    monkeypatch.setattr(torch.nn.functional, "gelu", _reads_a_value)
    model = GeluModel()
    with pytest.raises(RuntimeError) as info:
        model(torch.ones(2, 4))
    sites = failures.locate(info.value, model)
    assert [(s.kind, s.path, s.name) for s in sites] == [
        ("method", "blocks.0.gate", "gelu"), ("module", "blocks.0.gate", ""), ("module", "blocks.0", ""), ("root", "", "")]
    with pytest.raises(RuntimeError) as info:
        model.blocks[0].act(torch.ones(2, 4))
    assert [(s.kind, s.path) for s in failures.locate(info.value, model)] == [("module", "blocks.0.act")]


def test_classes_of_the_same_name_are_told_apart_when_a_whole_class_becomes_eager():
    # the crash this replaces: a second failing instance made "every GELU" eager by class *name*,
    # which took torch.nn.GELU for diffusers' GELU and looked up a method it does not have
    Gelu = type("GELU", (Gate,), {})
    model = GeluModel()
    for block in model.blocks:
        block.gate = Gelu()
    torch_gelu = type(model.blocks[0].act)
    model.blocks[0].act = type("GELU", (torch.nn.GELU,), {})()  # another class named GELU, too
    ctx = _ctx(model)
    narrowed = []
    site = failures.FailureSite("method", path="blocks.0.gate", name="gelu", owner_class="GELU", owner_type=Gelu)
    narrowed.append(narrowing.narrow(ctx, [site], narrowed))
    assert narrowed == ["blocks.0.gate.gelu()"]
    site = failures.FailureSite("method", path="blocks.1.gate", name="gelu", owner_class="GELU", owner_type=Gelu)
    assert narrowing.narrow(ctx, [site], narrowed) == "gelu() of every GELU (2 modules)"
    site = failures.FailureSite("module", path="blocks.1.act", owner_class="GELU", owner_type=torch_gelu)
    assert narrowing.narrow(ctx, [site], narrowed) == "blocks.1.act"
    assert sorted(ctx.eager_modules.names) == ["blocks.0.gate.gelu()", "blocks.1.act", "blocks.1.gate.gelu()"]
    ctx.eager_modules.restore()


def _ctx(model, **config):
    return entries.CaptureContext(model, model.forward, BCGConfig(**config), EagerModules(), None, lambda m: None, lambda: False)


def _module(path, cls):
    return failures.FailureSite("module", path=path, owner_class=cls.__name__, owner_type=cls)


def test_a_second_failing_instance_makes_the_class_eager():
    model = Model()
    ctx = _ctx(model)
    narrowed = []
    first = narrowing.narrow(ctx, [_module("blocks.0", Block)], narrowed)
    assert first == "blocks.0" and ctx.eager_modules.names == ["blocks.0"]
    narrowed.append(first)
    second = narrowing.narrow(ctx, [_module("blocks.1", Block)], narrowed)
    assert second == "every Block (2 modules)" and sorted(ctx.eager_modules.names) == ["blocks.0", "blocks.1"]
    ctx.eager_modules.restore()
    assert "forward" not in model.blocks[0].__dict__ and "forward" not in model.blocks[1].__dict__


def test_a_unit_that_is_eager_already_hands_the_failure_to_the_next_one_out():
    model = Model()
    ctx = _ctx(model)
    assert narrowing.narrow(ctx, [_module("blocks.0", Block)], []) == "blocks.0"
    # blocks.0 failed again (its call bypassed the eager wrapper): the next unit out is the transformer
    assert narrowing.narrow(ctx, [_module("blocks.0", Block)], ["blocks.0"]) is None  # nothing further out
    root = failures.FailureSite("root", owner_class="Model", owner_type=Model)
    assert narrowing.narrow(ctx, [_module("blocks.0", Block), root], ["blocks.0"]) is narrowing.MODULE_MODE
    ctx.eager_modules.restore()


def test_a_method_failing_in_a_second_instance_is_made_eager_in_every_instance():
    model = Model()
    ctx = _ctx(model)
    narrowed = []
    route = [failures.FailureSite("method", path="blocks.0", name="route", owner_class="Block", owner_type=Block)]
    first = narrowing.narrow(ctx, route, narrowed)
    assert first == "blocks.0.route()" and ctx.eager_modules.names == ["blocks.0.route()"]
    narrowed.append(first)
    route = [failures.FailureSite("method", path="blocks.1", name="route", owner_class="Block", owner_type=Block)]
    second = narrowing.narrow(ctx, route, narrowed)
    assert second == "route() of every Block (2 modules)"
    assert sorted(ctx.eager_modules.names) == ["blocks.0.route()", "blocks.1.route()"]
    assert ctx.eager_modules.method_paths(Block, "route") == ["blocks.0", "blocks.1"]
    x = torch.randn(2, 4)
    assert torch.equal(model.blocks[1](x), model.blocks[1].proj(x))  # outside a capture: a plain call
    ctx.eager_modules.restore()
    assert all("route" not in block.__dict__ for block in model.blocks)


def test_narrowing_stops_where_nothing_smaller_can_run_eagerly():
    model = Model()
    ctx = _ctx(model, max_narrowing=1)
    assert narrowing.narrow(ctx, [], []) is None
    assert narrowing.narrow(ctx, [_module("rope", Rope)], ["x"]) is None  # limit
    root = failures.FailureSite("root", owner_class="Model", owner_type=Model)
    assert narrowing.narrow(ctx, [root], []) is narrowing.MODULE_MODE
    child = entries.CaptureContext(model.blocks[0], model.blocks[0].forward, BCGConfig(), EagerModules(), None,
                                   lambda m: None, lambda: False, root=model)
    # a child captured in module mode cannot be narrowed to itself
    assert narrowing.narrow(child, [_module("blocks.0", Block)], []) is None


def test_a_problem_while_narrowing_never_reaches_the_caller(caplog):
    model = Model()
    ctx = _ctx(model)
    bogus = failures.FailureSite("method", path="rope", name="missing", owner_class="Rope", owner_type=Rope)
    with pytest.raises(Exception) as info:
        model.rope.coords(torch.ones(1))
    real_locate = failures.locate
    try:
        failures.locate = lambda exc, root: [bogus]
        assert narrowing.narrow_safely(ctx, info.value, []) == (None, " in rope.missing() (Rope)")
        failures.locate = lambda exc, root: 1 / 0
        assert narrowing.narrow_safely(ctx, info.value, []) == (None, "")
    finally:
        failures.locate = real_locate
    assert "narrowing after a failed capture of Model did not work (ZeroDivisionError" in caplog.text
    assert ctx.eager_modules.names == []


def test_eager_methods_are_undone_exactly():
    model = Model()
    parts = EagerModules()
    assert parts.add_method(model, "", "patchify") == "patchify()"
    assert parts.add_method(model, "rope", "coords") == "rope.coords()"
    with pytest.raises(ValueError, match="Rope at 'rope' has no method 'missing'"):
        parts.add_method(model, "rope", "missing")
    assert "patchify" in model.__dict__ and "coords" in model.rope.__dict__
    with pytest.raises(RuntimeError, match="host tensor"):  # outside a capture: a plain call
        model.patchify(torch.ones(1))
    parts.restore()
    assert "patchify" not in model.__dict__ and "coords" not in model.rope.__dict__
    assert parts.names == []


def test_module_mode_runs_units_through_their_slots_and_restores_them():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 4)
    expected = model(x)
    captured = []

    def capture(module, call, key, layouts, pool):
        captured.append(dict(key.state)["module_mode_unit"])
        return EagerFallback(reason="no CUDA here")

    units = replay_units(model, spine=set(), skip={"rope"})
    assert [p for p, _ in units] == ["blocks.0", "blocks.1"]  # leaf modules ("out", a Linear) run eagerly
    replayer = Replayer(RunnerEvents(), lambda message: None, "break")
    graphs = UnitGraphs(units, capture, BCGConfig(warmup_iters=1), replayer=replayer, reason="test", device_type="cpu")
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # first calls: eager, layouts recorded
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # then each slot is captured once
    assert captured == ["blocks.0", "blocks.1"]
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # fallback slots run eagerly
    assert captured == ["blocks.0", "blocks.1"]
    assert (graphs.counters.warmup_calls, graphs.counters.failed_captures, graphs.counters.eager_calls) == (2, 2, 4)
    assert all("_call_impl" not in m.__dict__ for m in model.modules())


def test_module_mode_captures_a_unit_on_static_inputs_with_the_live_strides():
    model = Model()
    gapped = torch.randn(2, 8)[:, ::2]  # a gapped view (a slice): its buffer keeps the gaps, as static_copy does
    strides = []

    def capture(module, call, key, layouts, pool):
        strides.append([(t.stride(), t.data_ptr() != gapped.data_ptr()) for t in call.tensors])
        return EagerFallback(reason="no CUDA here")

    graphs = UnitGraphs([("blocks.0", model.blocks[0])], capture, BCGConfig(warmup_iters=1),
                        replayer=Replayer(RunnerEvents(), lambda message: None, "break"), reason="test",
                        fresh_outputs=True, device_type="cpu")
    forward = lambda x: model.blocks[0](x)  # noqa: E731 - the transformer's own Python, calling the unit
    for _ in range(2):
        graphs.run(forward, (gapped,), {})
    assert strides == [[(gapped.stride(), True)]]  # a copy, with the live (2, 8)-gapped strides


def test_replay_units_follow_the_eager_spine_and_skip_leaves_and_hooked_modules():
    model = Model()
    assert [p for p, _ in replay_units(model, spine={"blocks.0"}, skip=set())] == ["blocks.1"]  # blocks.0 runs eagerly, its Linear too
    assert [p for p, _ in replay_units(model, spine=set(), skip={"blocks.1"})] == ["blocks.0"]


def test_small_host_tensors_are_keyed_by_value_and_left_in_place():
    idx = torch.arange(3)
    x = torch.zeros(2, 2)
    fields, tensors = flatten_inputs((x,), {"indices": idx}, device_type="meta")
    assert tensors == [] and dict(fields)["indices"] == HostTensor((3,), torch.int64, (0, 1, 2))
    other, _ = flatten_inputs((x,), {"indices": torch.arange(1, 4)}, device_type="meta")
    assert other != fields
    with pytest.raises(UncacheableInput, match="cpu tensor of 5000 elements"):
        flatten_inputs((torch.zeros(5000),), {}, device_type="meta")
    meta = torch.empty(2, device="meta")
    _, tensors = flatten_inputs((meta,), {"indices": idx}, device_type="meta")
    (a,), k = rebuild_inputs((meta,), {"indices": idx}, [torch.empty(2, device="meta")], device_type="meta")
    assert a is not meta and k["indices"] is idx


def test_plain_objects_are_keyed_by_structure_and_their_tensors_are_inputs():
    class Cache:
        def __init__(self):
            self.mode = "read"
            self.tensors = [torch.ones(2), None]

    cache = Cache()
    first, tensors = flatten_inputs((), {"kv": cache}, device_type="cpu")
    layout = dict(first)["kv"]
    assert isinstance(layout, ObjectLayout) and layout.names == ("mode", "tensors") and "Cache object" in str(layout)
    assert dict(first)["kv.mode"] == "read" and len(tensors) == 1 and tensors[0] is cache.tensors[0]
    assert flatten_inputs((), {"kv": Cache()}, device_type="cpu")[0] == first  # a new object of one structure
    cache.mode = "write"
    assert flatten_inputs((), {"kv": cache}, device_type="cpu")[0] != first
    cache.mode = "read"
    cache.tensors[0].add_(1)  # new values: the same key (a replay copies them in)
    assert flatten_inputs((), {"kv": cache}, device_type="cpu")[0] == first
    cache.tensors[1] = torch.ones(3)
    assert flatten_inputs((), {"kv": cache}, device_type="cpu")[0] != first
    cache.tensors[1] = None
    cache.other = torch.nn.Linear(1, 1)  # a module inside an object: keyed by identity
    assert dict(flatten_inputs((), {"kv": cache}, device_type="cpu")[0])["kv.other"] == Opaque("Linear", id(cache.other))
    with pytest.raises(UncacheableInput):  # without a device type objects stay uncacheable
        flatten_inputs((), {"kv": cache})


def test_a_plain_object_input_is_copied_with_static_tensors_and_its_changes_are_seen():
    class LayerCache:
        def __init__(self):
            self.k = torch.ones(2)

    class Cache:
        def __init__(self):
            self.layers = [LayerCache(), LayerCache()]
            self.scale = 2.0

    cache, x = Cache(), torch.zeros(2)
    call = Call.read(lambda x, kv: x + kv.layers[1].k, (x,), {"kv": cache}, "cpu")
    static = [torch.full((2,), float(i)) for i in range(3)]
    copied = call.on(static)
    kv = copied.kwargs["kv"]
    assert kv is not cache and type(kv) is Cache and kv.scale == 2.0 and kv.layers[0] is not cache.layers[0]
    assert copied.args[0] is static[0] and kv.layers[0].k is static[1] and kv.layers[1].k is static[2]
    assert cache.layers[0].k is not static[1]  # the live object is left as it was
    assert call.changes() is None and call.refusal(call.run()) is None
    cache.layers[1].k.mul_(3)  # written in place by the call, say
    assert call.changes() == "kv.layers[1].k: reassigned or written in place"
    call = Call.read(lambda x, kv: x, (x,), {"kv": cache}, "cpu")
    cache.layers[0].k = torch.zeros(2)  # reassigned
    assert call.refusal(x).startswith("the call changes its own input kv.layers[0].k, which a replay would not do")
    made = Call.read(lambda x: (x, Cache()), (x,), {}, "cpu")
    reason = made.refusal(made.run())
    assert "returns a" in reason and "Cache object (out[1])" in reason


def test_a_container_on_the_eager_spine_lists_no_unit_twice():
    # blocks.0's Linear replaced on the instance puts blocks and blocks.0 on the spine; blocks (a ModuleList)
    # is looked through by the root too: listed twice, a unit captured its own interceptor (a nested capture)
    model = Model()
    units = [p for p, _ in replay_units(model, spine={"blocks", "blocks.0", "blocks.0.proj"}, skip=set())]
    assert units == ["blocks.1"]


class HostReadBlock(torch.nn.Module):
    """Reads a value on the host: under a debug-mode capture, raises what CUDA raises in a real one."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        from bcg_diffusion.core import is_recording_segment

        if is_recording_segment():
            raise RuntimeError("operation not permitted when stream is capturing")
        return self.proj(x) * (1.0 + (x.abs().mean().item() % 1.0) * 1e-2)


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), HostReadBlock(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x + torch.randn_like(x) * 1e-2  # torch random numbers in the captured part


def test_debug_mode_narrows_a_failed_capture_as_a_real_capture_does():
    import warnings

    import bcg_diffusion as bcg

    torch.manual_seed(0)
    model, twin = Noisy(), Noisy()
    twin.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    expected = []
    with torch.no_grad():
        for i, x in enumerate(inputs):
            torch.manual_seed(100 + i)
            expected.append(twin(x))
    bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, allow_unknown=True))
    try:
        got = []
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            for i, x in enumerate(inputs):
                torch.manual_seed(100 + i)  # the capture run keeps the generator: the replay draws as eagerly
                got.append(model(x))
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert stats.hits == 3 and stats.failed_captures == 0 and stats.entries[0].eager_modules == ("blocks.1",), str(stats)
    messages = [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]
    assert len(messages) == 1 and "failed in blocks.1 (HostReadBlock)" in messages[0], messages


def test_inputs_the_forward_moves_to_the_device_are_moved_before_keying():
    from bcg_diffusion.families import KNOWN_TRANSFORMERS, TransformerInfo
    from bcg_diffusion.integration.device_inputs import move_device_inputs

    info = KNOWN_TRANSFORMERS["LuminaNextDiT2DModel"]  # LuminaPipeline's rotary table: 384 x 384 on the CPU
    table = torch.randn(384 * 384 * 4)
    kwargs = {"hidden_states": torch.empty(1, 4, device="meta"), "image_rotary_emb": table, "steps": torch.arange(2)}
    moved = move_device_inputs(info, kwargs, "meta")
    assert moved["image_rotary_emb"].device.type == "meta" and moved["image_rotary_emb"].shape == table.shape
    assert moved["steps"] is kwargs["steps"] and kwargs["image_rotary_emb"] is table  # only the named, not in place
    fields, tensors = flatten_inputs((), moved, device_type="meta")
    assert len(tensors) == 2  # keyed, no longer uncacheable
    with pytest.raises(UncacheableInput, match="image_rotary_emb is a cpu tensor"):
        flatten_inputs((), kwargs, device_type="meta")
    assert move_device_inputs(TransformerInfo(), kwargs, "meta") is kwargs
    assert move_device_inputs(info, {"image_rotary_emb": table}, "meta")["image_rotary_emb"] is table  # no device


def test_an_object_a_capture_could_not_copy_is_uncacheable():
    class Made:
        def __new__(cls, size):  # takes arguments: no empty instance to fill
            made = super().__new__(cls)
            made.k = torch.zeros(size)
            return made

    class Holder:
        def __init__(self):
            self.inner = Made(2)

    for value, path in ((Made(2), "kv"), (Holder(), "kv.inner")):
        with pytest.raises(UncacheableInput, match=f"{path} is a Made object whose class takes arguments"):
            flatten_inputs((), {"kv": value}, device_type="cpu")
