"""CPU tests of weight streaming (issue 48, docs/accelerate.md "Weight streaming").

On the CPU the host copies and the slots are plain memory and the copies are synchronous, but the mechanism is
the GPU's: the same slot mapping, the same decisions of what to load when, the same pointing of each block's
tensors at its host copy or its slot, the same eager break at each block's entry (captured by debug mode). So
these tests compare streamed models bitwise with twins that do not stream, count what was loaded, and check every
refusal leaves the model as it was. The CUDA copy stream, events and page-locked memory: test_weight_streaming_gpu.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig, apply_group_offloading

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from bcg_pipelines.lora_files import write_family_lora
from bcg_diffusion.integration.offload import buffers, streaming as streaming_module, streaming_of
from bcg_diffusion.integration.offload.checks import room_problem
from bcg_diffusion.integration.offload.residency import Residency

from _pipes import build, flux_inputs, run, tiny_flux_transformer

LAYERS = {"flux": dict(num_layers=3, num_single_layers=3), "pixart": dict(num_layers=4)}


class RecordingOps:
    """The work behind the decisions, recorded: ("load", block, slot), ("wait", slot), ("attach"/"detach", block)."""

    def __init__(self):
        self.log = []

    def mark(self):
        pass

    def load(self, block, slot):
        self.log.append(("load", block, slot))

    def wait(self, slot):
        self.log.append(("wait", slot))

    def attach(self, block):
        self.log.append(("attach", block))

    def detach(self, block):
        self.log.append(("detach", block))

    def loads(self):
        return [(b, s) for kind, *rest in self.log if kind == "load" for b, s in [rest]]


def _call(residency, order):
    residency.begin_call()
    for block in order:
        residency.enter(block)
    residency.end_call()


# -- the decisions ---------------------------------------------------------------------------------------------
def test_slots_map_blocks_by_index_and_the_next_block_loads_ahead():
    ops = RecordingOps()
    residency = Residency([10, 20, 30, 40, 50], slots=2, ops=ops)
    _call(residency, range(5))
    # block i in slot i % 2; the first block at the call's start, each next one at the previous one's entry
    assert ops.loads() == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]
    assert ops.log.index(("load", 2, 0)) > ops.log.index(("attach", 1))  # loaded while block 1 computes
    assert ops.log.index(("detach", 0)) < ops.log.index(("load", 2, 0))  # block 0 off its slot before it is reused
    c = residency.counters
    assert (c.prefetched, c.sync_loads, c.bytes_last_call, c.calls) == (5, 0, 150, 1)
    assert not residency.attached  # every block back on its host copy after the call

    ops = RecordingOps()
    residency = Residency([1] * 6, slots=3, ops=ops)
    residency.begin_call()
    residency.enter(0)
    assert ops.loads() == [(0, 0), (1, 1), (2, 2)]  # three slots: two blocks ahead


def test_a_skipped_block_is_loaded_on_demand_counted_and_the_order_is_learnt():
    ops = RecordingOps()
    residency = Residency([1] * 5, slots=2, ops=ops)
    _call(residency, range(5))
    ops.log.clear()
    _call(residency, [0, 3, 4])  # a step cache computing block 0, then the tail from block 3
    assert ops.loads() == [(0, 0), (1, 1), (3, 1), (4, 0)]  # 1 was predicted after 0; 3 loaded on demand
    assert residency.counters.sync_loads == 1
    ops.log.clear()
    _call(residency, [0, 3, 4])  # the same order again: learnt, nothing loaded on demand
    assert ops.loads() == [(0, 0), (3, 1), (4, 0)]
    assert residency.counters.sync_loads == 1
    assert residency.successors[:1] == [3] and residency.first == 0


def test_a_second_pass_in_one_call_learns_no_wrap_around():
    residency = Residency([1] * 4, slots=2, ops=RecordingOps())
    _call(residency, [0, 1, 2, 3, 0, 1, 2, 3])  # a capture's run, then its replay, in one call
    assert residency.successors == [1, 2, 3, None]


def test_a_block_outside_a_call_of_its_transformer_is_refused():
    residency = Residency([1, 1], slots=2, ops=RecordingOps(), owner="Tiny")
    with pytest.raises(bcg.AccelerationError, match="block 1 of Tiny was called outside a call of the transformer"):
        residency.enter(1)


# -- streamed models against twins --------------------------------------------------------------------------------
def _pipe(family, seed=0):
    """A tiny pipeline of ``family`` whose transformer has more blocks (:data:`LAYERS`), from ``seed``."""
    pipe = build(family, device="cpu")
    config = {**pipelines.get_family(family).tiny.transformer, **LAYERS[family]}
    torch.manual_seed(seed)
    pipe.register_modules(transformer=type(pipe.transformer)(**config).eval())
    return pipe


def _on_host_copies(transformer):
    """Every streamed tensor is a view of its block's host copy (what holds between calls)."""
    weights = streaming_of(transformer).weights
    return all(weights.on_host(i) for i in range(len(weights.layouts)))


def _state(module):
    return [(t, t.data_ptr(), t.device) for t in [*module.parameters(), *module.buffers()]]


def _same_state(module, before):
    return all(t is t0 and t.data_ptr() == p0 and t.device == d0 for (t, p0, d0), (t0, _, _) in
               zip(((t, t.data_ptr(), t.device) for t in [*module.parameters(), *module.buffers()]), before))


@pytest.mark.parametrize("family", ["flux", "pixart"])  # blocks from _repeated_blocks / from the block lists
def test_eager_streaming_is_bitwise_and_streams_every_block_once_per_call(family):
    want = run(_pipe(family), family, steps=2)
    pipe = _pipe(family)
    bcg.apply_weight_streaming(pipe.transformer, bcg.OffloadConfig(slots=3))
    got = run(pipe, family, steps=2)
    assert torch.equal(got, want)
    stats = bcg.get_stats(pipe).offload
    calls = 4 if family == "flux" else 2  # Flux: true CFG, two calls per step
    assert (stats.blocks, stats.slots, stats.calls, stats.sync_loads) == (sum(LAYERS[family].values()), 3, calls, 0)
    assert stats.bytes_last_call == stats.host_bytes and stats.bytes_streamed == calls * stats.host_bytes
    assert stats.wait_s is None and not stats.pinned and "weight streaming:" in str(bcg.get_stats(pipe))
    assert _on_host_copies(pipe.transformer)
    bcg.remove_weight_streaming(pipe.transformer)
    assert not bcg.is_streaming(pipe.transformer) and bcg.get_stats(pipe).offload is None
    assert torch.equal(run(pipe, family, steps=2), want)
    assert not any("forward" in b.__dict__ for b in pipe.transformer.modules())
    assert not pipe.transformer._forward_hooks and not pipe.transformer._forward_pre_hooks


def test_debug_replays_stream_bitwise_with_a_step_cache_skipping_blocks():
    """BCGConfig(debug=True) runs the break structure on the CPU: each block's entry is a break of the replay."""
    family, steps = "flux", 6
    twin = _pipe(family)
    twin.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.6))
    want = run(twin, family, steps=steps)
    pipe = _pipe(family)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.6))
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True, offload=2))
    assert torch.equal(run(pipe, family, steps=steps), want)
    stats = bcg.get_stats(pipe)
    assert stats.hits > 0 and stats.entries[0].breaks >= 1  # replayed; the head block's entry is a break
    # the cache skipped the tail blocks in some calls, which loaded less than every block
    assert stats.offload.bytes_last_call < stats.offload.host_bytes
    bcg.remove_acceleration(pipe)
    assert not bcg.is_streaming(pipe.transformer)  # streaming made by the acceleration goes with it
    assert torch.equal(run(pipe, family, steps=steps), want)


def test_module_mode_units_replay_their_block_entries():
    """A forward replaced on the instance runs eagerly; its blocks replay unit graphs, each with its entry."""
    import types

    def opaque(self, *args, **kwargs):
        return type(self).forward(self, *args, **kwargs)

    twin, model = tiny_flux_transformer(), tiny_flux_transformer()
    model.forward = types.MethodType(opaque, model)
    bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, offload=2))
    with torch.no_grad():
        want = twin(**flux_inputs())[0]
        assert all(torch.equal(model(**flux_inputs())[0], want) for _ in range(3))
    stats = bcg.get_stats(model)
    assert stats.entries[0].module_mode and stats.child_hits > 0 and stats.entries[0].breaks == 2, str(stats)
    bcg.remove_acceleration(model)
    assert not bcg.is_streaming(model)


def test_streaming_applied_first_is_used_by_the_acceleration_and_kept():
    pipe = _pipe("flux")
    bcg.apply_weight_streaming(pipe.transformer)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True))
    streaming = streaming_of(pipe.transformer)
    assert streaming.accelerated and streaming.on_relayout
    with pytest.raises(bcg.AccelerationError, match="remove_acceleration"):
        bcg.remove_weight_streaming(pipe.transformer)
    with pytest.raises(bcg.AccelerationError, match="accelerated"):
        bcg.apply_weight_streaming(pipe.transformer)
    bcg.remove_acceleration(pipe)
    assert bcg.is_streaming(pipe.transformer) and not streaming.accelerated and not streaming.on_relayout
    bcg.remove_weight_streaming(pipe.transformer)


def test_weights_written_between_calls_are_streamed():
    """LoRA load, hot-swap, fuse, unfuse, unload, load_state_dict and replaced data all reach the next call."""
    family = "flux"
    tmp = Path(tempfile.mkdtemp())
    loras = [write_family_lora(family, "tiny", tmp / n, 4, seed=s) for n, s in (("a", 1), ("b", 2))]
    twin, pipe = build(family, device="cpu"), build(family, device="cpu")
    for p in (twin, pipe):
        p.transformer.enable_lora_hotswap(target_rank=8)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True, offload=2))
    changes = [
        lambda p: p.load_lora_weights(loras[0], adapter_name="x"),  # new tensors: the blocks are packed again
        lambda p: p.load_lora_weights(loras[1], adapter_name="x", hotswap=True),  # swap_tensors: data replaced
        lambda p: p.fuse_lora(),  # param.data += delta: written into the host copies
        lambda p: p.unfuse_lora(),
        lambda p: p.unload_lora_weights(),
        lambda p: p.transformer.load_state_dict({k: v * 1.5 for k, v in p.transformer.state_dict().items()}),
        lambda p: setattr(p.transformer.transformer_blocks[0].attn.to_q.weight, "data",
                          torch.ones_like(p.transformer.transformer_blocks[0].attn.to_q.weight)),
    ]
    for change in changes:
        for p in (twin, pipe):
            change(p)
        assert torch.equal(run(pipe, family, steps=1), run(twin, family, steps=1))
        assert _on_host_copies(pipe.transformer)
    stats = bcg.get_stats(pipe).offload
    assert stats.bytes_last_call == stats.host_bytes and stats.sync_loads == 0
    bcg.remove_acceleration(pipe)


def test_torchao_weights_stream_their_inner_tensors():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    twin, model = tiny_flux_transformer(), tiny_flux_transformer()
    for m in (twin, model):
        quantize_(m, Int8WeightOnlyConfig())
    with torch.no_grad():
        want = twin(**flux_inputs())[0]
        bcg.apply_weight_streaming(model)
        assert torch.equal(model(**flux_inputs())[0], want)
    assert bcg.get_stats(model).offload.host_bytes > 0 and _on_host_copies(model)
    bcg.remove_weight_streaming(model)


class _Block(torch.nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.shared = shared
        self.register_buffer("expanded", torch.ones(4).expand(3, 4))

    def forward(self, x):
        return self.shared(self.inner(x)) + self.expanded.sum(0)


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        shared = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([_Block(shared) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_tied_and_overlapping_tensors_stay_where_they_are():
    torch.manual_seed(0)
    model = _Stack()
    x = torch.randn(2, 4)
    want = model(x)
    shared = model.blocks[0].shared.weight
    bcg.apply_weight_streaming(model, 2)
    assert torch.equal(model(x), want)
    layout = streaming_of(model).weights.layouts[0]
    assert [s.name for s in layout.sites] == ["weight", "bias"]  # only the block's own Linear
    assert model.blocks[1].shared.weight is shared and shared.data_ptr() == shared.data_ptr()
    bcg.remove_weight_streaming(model)


# -- refusals: a clear error before anything moves ------------------------------------------------------------------
def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="slots must be an int >= 2"):
        bcg.OffloadConfig(slots=1)
    with pytest.raises(ValueError, match="offload must be None, an OffloadConfig or a slot count"):
        bcg.BCGConfig(offload="yes")
    assert bcg.BCGConfig(offload=3).offload == bcg.OffloadConfig(slots=3)
    with pytest.raises(TypeError, match="pass pipe.transformer"):
        bcg.apply_weight_streaming(build("flux", device="cpu"))


def _forwards(model):
    return [(m, m.__dict__.get("forward"), dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]


def _refused(model, match, config=None):
    before, forwards = _state(model), _forwards(model)
    with pytest.raises(bcg.AccelerationError, match=match):
        bcg.apply_weight_streaming(model, config)
    assert _same_state(model, before) and not bcg.is_streaming(model)
    assert _forwards(model) == forwards


def test_refusals_leave_the_model_as_it_was(monkeypatch):
    model = tiny_flux_transformer()
    _refused(model, r"slots=3.*only 2 repeated blocks; use at most 2 slots", 3)
    _refused(torch.nn.Sequential(torch.nn.Linear(2, 2)), "found no repeated blocks in Sequential")
    grouped = tiny_flux_transformer()
    apply_group_offloading(grouped, torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    _refused(grouped, r"group offloading \(GroupOffloadingHook\).*OffloadConfig\(slots=2\)")
    hooked = tiny_flux_transformer()
    hooked.transformer_blocks[0].__dict__["_hf_hook"] = object()
    _refused(hooked, "accelerate hooks.*weight streaming instead")
    bcg.apply_weight_streaming(model)
    with pytest.raises(bcg.AccelerationError, match="already streams its weights"):
        bcg.apply_weight_streaming(model)
    model.__dict__["_hf_hook"] = object()  # accelerate's offload hook added afterwards: refused at the next call
    with pytest.raises(bcg.AccelerationError, match="accelerate hooks"), torch.no_grad():
        model(**flux_inputs())
    del model.__dict__["_hf_hook"]
    with torch.no_grad():
        model(**flux_inputs())  # the refused call left nothing half-done
    bcg.remove_weight_streaming(model)


@pytest.mark.parametrize("where", ["room", "host", "install"])
def test_a_failure_on_the_way_undoes_every_step(monkeypatch, where):
    """The device cap checked first; page-locking, then installing the hooks failing after weights moved."""
    def fail(*args, **kwargs):
        raise bcg.AccelerationError(f"{where} failed")

    target = {"room": "check_room", "host": "allocate_host", "install": "_install"}[where]
    monkeypatch.setattr(streaming_module, target, fail)
    model = tiny_flux_transformer()
    with torch.no_grad():
        want = model(**flux_inputs())[0]
    _refused(model, f"{where} failed")
    with torch.no_grad():
        assert torch.equal(model(**flux_inputs())[0], want)


def test_page_locking_that_fails_says_what_to_do_and_unpins_what_it_pinned(monkeypatch):
    pinned, unpinned = [], []

    def register(ptr, nbytes):
        if pinned:
            raise RuntimeError("cudaErrorMemoryAllocation")
        pinned.append(ptr)

    monkeypatch.setattr(buffers, "_register", register)
    monkeypatch.setattr(buffers, "_unregister", unpinned.append)
    with pytest.raises(bcg.AccelerationError, match=r"page-lock .*OffloadConfig\(pin_memory=False\)"):
        buffers.allocate_host([100, 5000], pin=True)
    assert pinned == unpinned and len(pinned) == 1


def test_the_room_check_names_the_numbers():
    gib = 2**30
    assert room_problem(16 * gib, 2 * gib, 2, gib, 3 * gib) is None
    text = room_problem(8 * gib, 6 * gib, 2, gib, gib // 2)
    assert "needs 2.50 GiB" in text and "2 slots of 1.00 GiB" in text and "6.00 GiB already in use" in text
    assert "memory cap of 8.00 GiB" in text and "Use fewer slots" in text


def test_model_cpu_offload_is_refused_with_what_to_use():
    pipe = build("flux", device="cpu")
    pipe._offload_gpu_id, pipe._all_hooks = 0, [object()]
    with pytest.raises(bcg.AccelerationError, match=r"model CPU offload.*new addresses.*OffloadConfig\(slots=2\)"):
        bcg.accelerate_pipeline(pipe, bcg.BCGConfig(offload=2))
    assert not bcg.is_streaming(pipe.transformer)


# -- the commands ----------------------------------------------------------------------------------------------------
def test_generate_offload_streams_both_compared_runs_bitwise(tmp_path, capsys, hide_cuda):
    from bcg_diffusion.cli import generate

    out = tmp_path / "fox.png"
    assert generate.main(["--offload", "--compare", "--steps", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "building flux (tiny) on cpu" in text and "weight streaming: transformer: 2 blocks in host memory" in text
    assert "outputs bitwise identical: YES" in text and "weight streaming: 2 blocks through 2 slots" in text


@pytest.mark.parametrize("argv, reason", [
    (["--offload", "1"], "--offload 1: give K >= 2 device buffers"),
    (["--offload", "--quant", "int8wo"], "--offload with --quant int8wo"),
])
def test_generate_offload_usage_errors(capsys, no_build, argv, reason):
    from bcg_diffusion.cli import generate

    assert generate.main(argv) == 2
    assert reason in capsys.readouterr().err


def test_serve_offload_usage_error(capsys, no_build):
    from bcg_diffusion.serving import serve_command

    assert serve_command.main(["--offload", "1"]) == 2
    assert "--offload 1: give K >= 2 device buffers" in capsys.readouterr().err


def test_the_offload_benchmark_runs_the_tiny_model_and_writes_its_files(tmp_path, hide_cuda, capsys):
    import json

    from bcg_diffusion.benchmarks.offload import bench_offload

    assert bench_offload.main(["--case", "flux:full:1024x1024", "--out-dir", str(tmp_path)]) == 0
    [result] = [json.loads(p.read_text()) for p in tmp_path.glob("bench_offload_*.json")]
    assert result["case"] == "flux:tiny:64x64:b1"  # without CUDA: the tiny model
    modes = result["modes"]
    assert list(modes) == ["eager (no CUDA)", "stream_eager", "stream_bcg"]
    assert all(m["bitwise"] and m["error"] is None for m in modes.values())
    assert modes["stream_eager"]["stats"]["bytes_per_call"] == modes["stream_eager"]["stats"]["host_bytes"]
    assert "| stream_bcg |" in (tmp_path / next(tmp_path.glob("*.md")).name).read_text()
