"""Where a failed capture failed (frames -> site), narrowing to it, eager methods and functions,
module mode's plumbing, and host values in keys. CPU: no capture runs; these prove the decisions
and the undo paths, the GPU tests prove the replays (test_zoo_gpu.py)."""

import pytest
import torch

import _host_helpers as helpers

from bcg_diffusion.config import BCGConfig
from bcg_diffusion.integration import entries, failures
from bcg_diffusion.integration.eager_modules import EagerModules
from bcg_diffusion.integration.keys import HostTensor, ObjectState, UncacheableInput, flatten_inputs, rebuild_inputs
from bcg_diffusion.integration.module_mode import ChildGraphs, replay_units

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


def _site(where):
    model = Model(where)
    with pytest.raises(Exception) as info:
        model(torch.ones(2, 4))
    return failures.locate(info.value, model)


@pytest.mark.parametrize(
    "where, kind, path, name",
    [
        ("block", "module", "blocks.0", ""),
        ("method", "method", "", "patchify"),
        ("decorated_method", "method", "", "decorated"),
        ("child_method", "method", "rope", "coords"),
        ("function", "function", "", "host_value"),
        ("inline", "root", "", ""),
        ("closure", "module", "blocks.1", ""),
        ("linear", "builtin", "out", ""),
    ],
)
def test_the_failing_frame_names_what_can_run_eagerly(where, kind, path, name):
    site = _site(where)
    assert site is not None and (site.kind, site.path, site.name) == (kind, path, name), site
    if kind == "function":
        assert site.module_name == __name__  # the name is patched where the caller looks it up


def _ctx(model, **config):
    return entries.CaptureContext(model, model.forward, BCGConfig(**config), EagerModules(), None, lambda m: None, lambda: False)


def test_a_second_failing_instance_makes_the_class_eager():
    model = Model()
    ctx = _ctx(model)
    narrowed = []
    first = entries._narrow(ctx, failures.FailureSite("module", path="blocks.0", owner_class="Block"), narrowed)
    assert first == "blocks.0" and ctx.eager_modules.names == ["blocks.0"]
    narrowed.append(first)
    second = entries._narrow(ctx, failures.FailureSite("module", path="blocks.1", owner_class="Block"), narrowed)
    assert second == "every Block (2 modules)" and sorted(ctx.eager_modules.names) == ["blocks.0", "blocks.1"]
    ctx.eager_modules.restore()
    assert "forward" not in model.blocks[0].__dict__ and "forward" not in model.blocks[1].__dict__


def test_a_method_failing_in_a_second_instance_is_made_eager_in_every_instance():
    model = Model()
    ctx = _ctx(model)
    narrowed = []
    first = entries._narrow(ctx, failures.FailureSite("method", path="blocks.0", name="route", owner_class="Block"),
                            narrowed)
    assert first == "blocks.0.route()" and ctx.eager_modules.names == ["blocks.0.route()"]
    narrowed.append(first)
    second = entries._narrow(ctx, failures.FailureSite("method", path="blocks.1", name="route", owner_class="Block"),
                             narrowed)
    assert second == "route() of every Block (2 modules)"
    assert sorted(ctx.eager_modules.names) == ["blocks.0.route()", "blocks.1.route()"]
    assert ctx.eager_modules.method_paths("Block", "route") == ["blocks.0", "blocks.1"]
    x = torch.randn(2, 4)
    assert torch.equal(model.blocks[1](x), model.blocks[1].proj(x))  # outside a capture: a plain call
    ctx.eager_modules.restore()
    assert all("route" not in block.__dict__ for block in model.blocks)


def test_narrowing_stops_where_nothing_smaller_can_run_eagerly():
    model = Model()
    ctx = _ctx(model, max_narrowing=1)
    assert entries._narrow(ctx, None, []) is None
    assert entries._narrow(ctx, failures.FailureSite("builtin", path="out", owner_class="Linear"), []) is None
    assert entries._narrow(ctx, failures.FailureSite("module", path="rope", owner_class="Rope"), ["x"]) is None  # limit
    assert entries._narrow(ctx, failures.FailureSite("root", owner_class="Model"), []) is entries.MODULE_MODE
    child = entries.CaptureContext(model.blocks[0], model.blocks[0].forward, BCGConfig(), EagerModules(), None,
                                   lambda m: None, lambda: False, root=model)
    # a child captured in module mode cannot be narrowed to itself
    assert entries._narrow(child, failures.FailureSite("module", path="blocks.0", owner_class="Block"), []) is None


def test_eager_methods_and_functions_are_undone_exactly():
    model = Model()
    parts = EagerModules()
    assert parts.add_method(model, "", "patchify") == "patchify()"
    assert parts.add_method(model, "rope", "coords") == "rope.coords()"
    assert parts.add_function("_host_helpers", "host_value") == "_host_helpers.host_value()"
    assert "patchify" in model.__dict__ and "coords" in model.rope.__dict__
    assert helpers.host_value is not host_value
    with pytest.raises(RuntimeError, match="host tensor"):  # outside a capture: a plain call
        model.patchify(torch.ones(1))
    parts.restore()
    assert "patchify" not in model.__dict__ and "coords" not in model.rope.__dict__
    assert helpers.host_value is host_value and parts.names == []


def test_module_mode_runs_children_through_their_slots_and_restores_them():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 4)
    expected = model(x)
    captured = []

    def capture(path, module, chain, key, static, s_args, s_kwargs, layouts):
        captured.append(path)
        return entries.GraphEntry(key, None, static, None, fallback="no CUDA here")

    units = replay_units(model, spine=set(), skip={"rope"})
    assert [p for p, _ in units] == ["blocks.0", "blocks.1"]  # leaf modules ("out", a Linear) run eagerly
    graphs = ChildGraphs(units, capture=capture, warmup_iters=1, device_type="cpu")
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # first calls: eager, layouts recorded
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # then each slot is captured once
    assert captured == ["blocks.0", "blocks.1"]
    assert torch.equal(graphs.run(model.forward, (x,), {}), expected)  # fallback slots run eagerly
    assert captured == ["blocks.0", "blocks.1"]
    assert (graphs.counters.warmup_calls, graphs.counters.failed_captures, graphs.counters.eager_calls) == (2, 2, 4)
    assert all("_call_impl" not in m.__dict__ for m in model.modules())


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


def test_plain_objects_are_keyed_by_identity_and_state():
    class Cache:
        def __init__(self):
            self.mode = "read"
            self.tensors = [torch.ones(2)]

    cache = Cache()
    first, _ = flatten_inputs((), {"kv": cache}, device_type="cuda")
    state = dict(first)["kv"]
    assert isinstance(state, ObjectState) and state.identity == id(cache) and "Cache object" in str(state)
    assert flatten_inputs((), {"kv": cache}, device_type="cuda")[0] == first
    cache.mode = "write"
    assert flatten_inputs((), {"kv": cache}, device_type="cuda")[0] != first
    cache.mode = "read"
    cache.tensors[0].add_(1)  # an in-place write bumps the version: another key
    assert flatten_inputs((), {"kv": cache}, device_type="cuda")[0] != first
    with pytest.raises(UncacheableInput):  # without a device type objects stay uncacheable
        flatten_inputs((), {"kv": cache})
