"""GPU tests of weight streaming (issue 48): streamed pipelines replay their graphs bitwise equal to twins that
do not stream, with the copy stream, events and page-locked host copies of a CUDA device.

Each claim of replay is checked on the runner's counters (tests/_replay.py), each claim of streaming on
``get_stats(...).offload``: every block loaded once per call as predicted, none on demand, the waits measured.
The decisions themselves are tested on the CPU (test_weight_streaming_cpu.py). Tiny models: each test takes
seconds.
"""

from __future__ import annotations

import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from bcg_diffusion.integration.offload import streaming_of

from _pipes import build, run, transformer_calls, with_cache
from _replay import assert_replayed, counters, since

pytestmark = pytest.mark.gpu
STEPS = 3  # _pipes.run's default
LAYERS = {"flux": dict(num_layers=3, num_single_layers=3), "wan": dict(num_layers=4), "pixart": dict(num_layers=4)}


def _pipe(family, dtype=torch.float32):
    """A tiny CUDA pipeline of ``family`` whose transformer has more blocks (:data:`LAYERS`), seeded alike."""
    pipe = build(family, dtype=dtype)
    config = {**pipelines.get_family(family).tiny.transformer, **LAYERS[family]}
    torch.manual_seed(0)
    with torch.device("cuda"):
        transformer = type(pipe.transformer)(**config).to(dtype).eval()
    pipe.register_modules(transformer=transformer)
    return pipe


def _blocks_on_host(transformer):
    weights = streaming_of(transformer).weights
    return all(weights.on_host(i) and all(v.device.type == "cpu" for v in weights.host_views[i])
               for i in range(len(weights.layouts)))


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_streamed_pipeline_replays_bitwise_and_streams_each_block_once_per_call(family):
    calls = transformer_calls(family, STEPS)
    twin, streamed = _pipe(family), _pipe(family)
    resident_before = torch.cuda.memory_allocated()
    bcg.accelerate_pipeline(streamed, bcg.BCGConfig(offload=bcg.OffloadConfig(slots=2, measure_waits=True)))
    offload = bcg.get_stats(streamed).offload
    assert offload.pinned and offload.blocks == sum(LAYERS[family].values())
    assert _blocks_on_host(streamed.transformer)
    assert torch.cuda.memory_allocated() < resident_before  # the blocks left the device (the slots are smaller)
    assert torch.equal(run(streamed, family), run(twin, family))  # warm-up, capture, replays
    assert_replayed(streamed, calls)
    stats = bcg.get_stats(streamed)
    assert all(e.breaks >= offload.blocks for e in stats.entries), str(stats)  # each block's entry is a break
    before, loads_before = counters(streamed), stats.offload
    assert torch.equal(run(streamed, family), run(twin, family))
    assert_replayed(streamed, calls, before)
    assert since(streamed, before)["captures"] == 0  # no capture after warm-up
    after = bcg.get_stats(streamed).offload
    assert after.sync_loads == loads_before.sync_loads  # every load of the replays was predicted
    assert after.bytes_last_call == after.host_bytes  # each block once per call
    assert after.bytes_streamed - loads_before.bytes_streamed == calls * after.host_bytes
    assert after.wait_s is not None and after.wait_s >= 0.0
    bcg.remove_acceleration(streamed)
    assert not bcg.is_streaming(streamed.transformer)
    assert all(p.device.type == "cuda" for p in streamed.transformer.parameters())  # back where they were
    assert torch.equal(run(streamed, family), run(twin, family))


@pytest.mark.survives_sabotage("fallback", "skip_segment", "stale_inputs",
                               reason="streams with acceleration off: no graph is captured or replayed")
def test_eager_streaming_on_cuda_is_bitwise():
    family = "pixart"
    twin, streamed = _pipe(family), _pipe(family)
    bcg.apply_weight_streaming(streamed.transformer, bcg.OffloadConfig(slots=3))
    assert torch.equal(run(streamed, family), run(twin, family))
    offload = bcg.get_stats(streamed).offload
    assert offload.sync_loads == 0 and offload.bytes_last_call == offload.host_bytes and offload.wait_s is None
    bcg.remove_weight_streaming(streamed.transformer)


def test_a_step_cache_skipping_blocks_replays_bitwise_under_streaming():
    """FirstBlockCache as test_step_caches_gpu.py runs it (its premise: mixed decisions): bitwise and replaying; a
    skipped block may have been prefetched (a wasted copy, never a wrong one), so each call streams at most every
    block once and nothing is loaded on demand."""
    from bcg_diffusion.step_caches import count_cache_passes

    family, steps, cache = "flux", 6, "fbc:0.5"
    calls = transformer_calls(family, steps)
    twin = with_cache(build(family), family, cache, steps)
    streamed = with_cache(build(family), family, cache, steps)
    bcg.accelerate_pipeline(streamed, bcg.BCGConfig(offload=2))
    with count_cache_passes(twin.transformer) as eager_passes:
        want = run(twin, family, steps=steps)
    assert 0 < eager_passes.computed < eager_passes.calls, f"decisions not mixed: {eager_passes}"
    assert torch.equal(run(streamed, family, steps=steps), want)
    before, loaded = counters(streamed), bcg.get_stats(streamed).offload.bytes_streamed
    assert torch.equal(run(streamed, family, steps=steps), want)
    assert_replayed(streamed, calls, before, child_warmups=True)
    offload = bcg.get_stats(streamed).offload
    assert offload.bytes_streamed - loaded <= calls * offload.host_bytes, str(offload)  # at most one pass a call
    assert offload.sync_loads == 0, str(offload)  # the prediction followed the real order
    bcg.remove_acceleration(streamed)


def test_lora_loaded_and_fused_between_calls_replays_bitwise(tmp_path):
    from bcg_pipelines.lora_files import write_family_lora

    family = "flux"
    lora = write_family_lora(family, "tiny", tmp_path / "a", 4, seed=1)
    twin, streamed = build(family), build(family)
    bcg.accelerate_pipeline(streamed, bcg.BCGConfig(offload=2))
    assert torch.equal(run(streamed, family), run(twin, family))
    for change in (lambda p: p.load_lora_weights(lora, adapter_name="a"), lambda p: p.fuse_lora()):
        for pipe in (twin, streamed):
            change(pipe)
        assert torch.equal(run(streamed, family), run(twin, family))  # recaptured where the weights moved
        before = counters(streamed)
        assert torch.equal(run(streamed, family), run(twin, family))
        assert_replayed(streamed, transformer_calls(family, STEPS), before)
        assert _blocks_on_host(streamed.transformer)
    bcg.remove_acceleration(streamed)


def test_torchao_int8_weights_stream_and_replay():
    from bcg_diffusion.toolkit.quant_option import quantize

    family = "flux"
    twin, streamed = build(family, dtype=torch.bfloat16), build(family, dtype=torch.bfloat16)
    for pipe in (twin, streamed):
        quantize(pipe.transformer, "int8wo")
    bcg.accelerate_pipeline(streamed, bcg.BCGConfig(offload=2))
    assert torch.equal(run(streamed, family), run(twin, family))
    before = counters(streamed)
    assert torch.equal(run(streamed, family), run(twin, family))
    assert_replayed(streamed, transformer_calls(family, STEPS), before)
    assert bcg.get_stats(streamed).offload.host_bytes > 0
    bcg.remove_acceleration(streamed)


@pytest.mark.survives_sabotage("fallback", "skip_segment", "stale_inputs",
                               reason="checks a refusal before the first call: no call runs")
def test_a_memory_cap_too_small_for_the_slots_is_refused_before_anything_moves():
    pipe = _pipe("flux")
    transformer = pipe.transformer
    state = [(p, p.data_ptr()) for p in transformer.parameters()]
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(1024 / total)  # a cap with no room for two slots
    try:
        with pytest.raises(bcg.AccelerationError, match="over the memory cap"):
            bcg.apply_weight_streaming(transformer)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert not bcg.is_streaming(transformer) and all(p.data_ptr() == ptr for p, ptr in state)
