"""GPU tests of accelerate_pipeline on the tiny pipelines of every family.

Every claim of capture, recapture or replay is checked on the runner's counters (tests/_replay.py):
a comparison with eager alone passes when every call ran eagerly. Each generation runs STEPS steps
(latents and timesteps change between the calls, so a replay of stale inputs or a skipped segment
gives another result); two-call CFG families (Flux with true CFG here) make two calls per step.
"""

import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from bcg_diffusion.integration.breaks.shared import installed_patches

from _pipes import build, run, transformer_calls
from _replay import assert_recaptured, assert_replayed, counters

pytestmark = pytest.mark.gpu

FAMILIES = pipelines.list_families()
STEPS = 3


@pytest.mark.parametrize("policy", ["capture_safe", "break"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_bitwise_equal_to_eager_with_replays(family, policy):
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    eager = run(pipe, family, steps=STEPS)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention=policy))
    first = run(pipe, family, steps=STEPS)
    assert_replayed(pipe, calls)  # first calls of each key eager, every later call replayed
    before = counters(pipe)
    second = run(pipe, family, steps=STEPS)
    assert_replayed(pipe, calls, before)  # all of them replayed
    stats = bcg.get_stats(pipe)
    assert torch.equal(first, eager), f"{family}: first accelerated generation differs from eager"
    assert torch.equal(second, eager), f"{family}: replayed generation differs from eager"
    if policy == "break":
        assert all(e.breaks >= 1 and e.segments >= 2 for e in stats.entries if not e.module_mode), str(stats)
    bcg.remove_acceleration(pipe)
    assert "forward" not in pipe.transformer.__dict__
    assert torch.equal(run(pipe, family, steps=STEPS), eager)
    assert installed_patches() == []


def _pixart_sizes():
    spec = pipelines.get_family("pixart")
    h, w = spec.tiny.height, spec.tiny.width
    return dict(height=h, width=w), dict(height=h * 2, width=w)


def test_resolutions_a_b_a_capture_twice():
    family = "pixart"
    calls = transformer_calls(family, STEPS)
    a, b = _pixart_sizes()
    pipe = build(family)
    eager_a, eager_b = run(pipe, family, **a), run(pipe, family, **b)
    bcg.accelerate_pipeline(pipe)
    before = counters(pipe)
    assert torch.equal(run(pipe, family, **a), eager_a)
    assert_recaptured(pipe, calls, before, captures=1)
    before = counters(pipe)
    assert torch.equal(run(pipe, family, **b), eager_b)
    assert_recaptured(pipe, calls, before, captures=1)  # B: a key of its own
    before = counters(pipe)
    assert torch.equal(run(pipe, family, **a), eager_a)
    assert_replayed(pipe, calls, before)  # A again: its graph, no capture
    stats = bcg.get_stats(pipe)
    assert stats.captures == 2 and len(stats.entries) == 2, str(stats)
    bcg.remove_acceleration(pipe)


@pytest.mark.parametrize(
    "config",
    [bcg.BCGConfig(max_graphs=1), bcg.BCGConfig(memory_budget_bytes=1)],
    ids=["max_graphs=1", "memory_budget=1B"],
)
def test_lru_eviction_keeps_one_graph_and_recaptures(config):
    """Either limit keeps only the newest key; an evicted key is recaptured at its next call (no
    eager warm-up: it ran before) and still equal to eager."""
    family = "pixart"
    calls = transformer_calls(family, STEPS)
    a, b = _pixart_sizes()
    pipe = build(family)
    eager_a, eager_b = run(pipe, family, **a), run(pipe, family, **b)
    bcg.accelerate_pipeline(pipe, config)
    assert torch.equal(run(pipe, family, **a), eager_a)
    assert torch.equal(run(pipe, family, **b), eager_b)  # B evicts A
    before = counters(pipe)
    assert torch.equal(run(pipe, family, **a), eager_a)  # A again evicts B
    assert_recaptured(pipe, calls, before, captures=1, warmups=0)
    stats = bcg.get_stats(pipe)
    assert stats.captures == 3 and len(stats.entries) == 1, str(stats)
    assert stats.entries[0].memory_bytes > 0, str(stats)
    bcg.remove_acceleration(pipe)


def test_prompts_of_different_lengths_exact_and_bucketed():
    family = "qwenimage"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    short, long = "a cat", "a very long prompt about a cat sitting on a red chair in a sunny garden with flowers"
    eager_short, eager_long = run(pipe, family, prompt=short), run(pipe, family, prompt=long)
    bcg.accelerate_pipeline(pipe)
    assert torch.equal(run(pipe, family, prompt=short), eager_short)
    assert torch.equal(run(pipe, family, prompt=long), eager_long)
    # exact text length is part of the key by default: short, long and the negative prompt (CFG)
    assert_replayed(pipe, 2 * calls)
    assert bcg.get_stats(pipe).captures == 3, str(bcg.get_stats(pipe))
    bcg.remove_acceleration(pipe)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(text_buckets=(256,)))
    # padded to the bucket, attention reduces over the masked padding too: not bitwise, within 1e-4
    torch.testing.assert_close(run(pipe, family, prompt=short), eager_short, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(run(pipe, family, prompt=long), eager_long, rtol=1e-4, atol=1e-4)
    assert_replayed(pipe, 2 * calls)
    stats = bcg.get_stats(pipe)
    assert stats.captures == 1 and stats.warmup_calls == 1, str(stats)  # one padded graph serves both
    bcg.remove_acceleration(pipe)


@pytest.mark.survives_sabotage("skip_segment", reason="debug mode runs its segments eagerly: no graph replay to cut short")
def test_second_accelerate_raises_and_debug_mode_is_identical():
    family = "flux"
    pipe = build(family)
    eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True, attention="break"))
    with pytest.raises(bcg.AccelerationError, match="already accelerated"):
        bcg.accelerate_pipeline(pipe)
    assert torch.equal(run(pipe, family), eager)
    assert_replayed(pipe, transformer_calls(family, STEPS))
    stats = bcg.get_stats(pipe)
    assert stats.debug and stats.entries[0].breaks >= 1, str(stats)
    bcg.remove_acceleration(pipe)


def test_weights_changed_after_capture_recapture():
    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    bcg.accelerate_pipeline(pipe)
    run(pipe, family)
    with torch.no_grad():
        next(pipe.transformer.parameters()).mul_(1.5)  # in place: version counter bumps
    before = counters(pipe)
    accelerated = run(pipe, family)
    assert_recaptured(pipe, calls, before, captures=1)  # the new weights are a new key
    before = counters(pipe)
    again = run(pipe, family)
    assert_replayed(pipe, calls, before)
    bcg.remove_acceleration(pipe)
    expected = run(pipe, family)
    assert torch.equal(accelerated, expected) and torch.equal(again, expected)


def test_lora_loaded_after_capture_matches_eager_with_lora():
    from peft import LoraConfig

    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    bcg.accelerate_pipeline(pipe)
    run(pipe, family)
    torch.manual_seed(1)
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False))
    before = counters(pipe)
    with_lora = run(pipe, family)
    assert_recaptured(pipe, calls, before, captures=1, structure_changes=1)  # new modules: graphs dropped
    before = counters(pipe)
    again = run(pipe, family)
    assert_replayed(pipe, calls, before)
    bcg.remove_acceleration(pipe)
    expected = run(pipe, family)
    assert torch.equal(with_lora, expected) and torch.equal(again, expected)


def test_attention_backend_reading_item_runs_in_breaks(monkeypatch):
    from diffusers.models import attention_dispatch as ad

    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    registry = ad._AttentionBackendRegistry._backends
    name = ad.AttentionBackendName.NATIVE
    native = registry[name]
    seen = {"n": 0}

    def reads_item(query, key, value, *args, **kwargs):
        seen["n"] += 1
        _ = int((key.abs().sum() > -1).item())  # host read: not capturable
        return native(query, key, value, *args, **kwargs)

    monkeypatch.setitem(registry, name, reads_item)
    eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    run(pipe, family)
    n_before, before = seen["n"], counters(pipe)
    out = run(pipe, family)
    assert_replayed(pipe, calls, before)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    assert torch.equal(out, eager)
    assert seen["n"] > n_before, "the backend did not run at replay: it is not in a break"
    assert all(e.breaks >= 1 for e in stats.entries), str(stats)


def test_uncapturable_op_in_one_block_costs_only_that_block():
    """Class code of one block syncs the host: its capture fails there, that block becomes one eager
    break (narrowing) and everything else is captured and replays."""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    block = pipe.transformer.transformer_blocks[0]
    cls = type(block)

    class Planted(cls):  # class code (not a replaced forward): the key trusts it, the capture meets the sync
        def forward(self, *args, **kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            _ = hidden.abs().sum().item()  # host sync: cannot be captured
            return super().forward(*args, **kwargs)

    eager_clean = run(pipe, family)
    config = bcg.BCGConfig(attention="break")
    bcg.accelerate_pipeline(pipe, config)
    run(pipe, family)
    clean = bcg.get_stats(pipe).entries[0]
    bcg.remove_acceleration(pipe)
    block.__class__ = Planted
    try:
        bcg.accelerate_pipeline(pipe, config)
        with pytest.warns(bcg.BCGCaptureWarning, match="transformer_blocks.0"):
            first = run(pipe, family)
        assert_replayed(pipe, calls)
        before = counters(pipe)
        out = run(pipe, family)
        assert_replayed(pipe, calls, before)
        entry = bcg.get_stats(pipe).entries[0]
        bcg.remove_acceleration(pipe)
    finally:
        block.__class__ = cls
    assert torch.equal(first, eager_clean) and torch.equal(out, eager_clean)
    assert entry.eager_modules == ("transformer_blocks.0",), entry
    # the block's attention break is replaced by one break around the whole block; all else captured
    assert entry.breaks == clean.breaks and entry.segments == clean.segments, (entry, clean)


def test_a_forward_replaced_on_a_block_runs_eagerly_and_the_rest_replays():
    """A block whose forward was replaced on the instance (Python the key cannot see, here with a
    host read) runs that Python eagerly on every call (module mode); the modules it calls, and
    every other unit of the transformer, replay their graphs."""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    block = pipe.transformer.transformer_blocks[0]
    original = block.forward
    host_reads = {"n": 0}

    def planted(*args, **kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        host_reads["n"] += 1
        _ = hidden.abs().sum().item()  # host sync: cannot be captured
        return original(*args, **kwargs)

    eager_clean = run(pipe, family)
    block.forward = planted
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention="break"))
    first = run(pipe, family)
    assert_replayed(pipe, calls)
    before, reads_before = counters(pipe), host_reads["n"]
    out = run(pipe, family)
    assert_replayed(pipe, calls, before)
    assert host_reads["n"] - reads_before == calls  # the planted Python ran on every call
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    assert block.forward is planted
    del block.forward
    assert torch.equal(first, eager_clean) and torch.equal(out, eager_clean)
    assert all(e.module_mode for e in stats.entries), str(stats)


@pytest.mark.parametrize("policy", ["capture_safe", "break"])
def test_regional_compile_with_acceleration_matches_compile_alone(policy):
    """Blocks compile with fullgraph=True: attention is one custom-op node, not a graph break."""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    torch._dynamo.reset()
    pipe.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
    compiled = run(pipe, family)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention=policy))
    first = run(pipe, family)
    before = counters(pipe)
    second = run(pipe, family)
    assert_replayed(pipe, calls, before)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    # the attention custom op changes what Inductor fuses around attention: not bitwise to compile alone
    torch.testing.assert_close(first, compiled, rtol=1e-4, atol=1e-4)
    assert torch.equal(first, second)
    entry = stats.entries[0]
    assert entry.breaks >= 1 if policy == "break" else entry.breaks == 0, str(stats)


MATRIX_FAMILIES = ["pixart", "sd3", "sana", "qwenimage", "flux", "wan"]


def _compile_blocks(transformer):
    """Each block of every block list compiled with fullgraph=True (SD3 and PixArt list no
    _repeated_blocks, so compile_repeated_blocks does not apply to them)."""
    for child in transformer.children():
        if isinstance(child, torch.nn.ModuleList):
            for block in child:
                block.compile(fullgraph=True, dynamic=False)


@pytest.mark.parametrize("family", MATRIX_FAMILIES)
def test_compiled_blocks_with_acceleration_match_compiled_blocks_alone(family):
    """Within 1e-3 (relative and absolute): the attention custom op changes what Inductor fuses
    around attention, so compiled blocks under BCG are not the same kernels as compiled blocks alone."""
    pipe = build(family)
    torch._dynamo.reset()
    _compile_blocks(pipe.transformer)
    compiled = run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    accelerated = run(pipe, family)
    assert_replayed(pipe, transformer_calls(family, STEPS))
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    torch.testing.assert_close(accelerated, compiled, rtol=1e-3, atol=1e-3)


def test_whole_forward_compile_under_bcg_is_one_captured_graph():
    """BCGConfig(compile=True): the compiled forward is captured whole (no breaks with native SDPA).
    Compiled code fuses differently from eager: within 1e-3 of eager, bitwise between replays."""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    pipe = build(family)
    eager = run(pipe, family)
    torch._dynamo.reset()
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(compile=True))
    first = run(pipe, family)
    before = counters(pipe)
    second = run(pipe, family)
    assert_replayed(pipe, calls, before)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    torch.testing.assert_close(first, eager, rtol=1e-3, atol=1e-3)
    assert torch.equal(first, second)
    entry = stats.entries[0]
    assert entry.breaks == 0 and entry.segments == 1, str(stats)


@pytest.mark.parametrize("module_mode", [False, True])
def test_a_break_that_changes_shape_stops_the_replay_and_the_call_returns_the_eager_result(module_mode):
    """The one replay path on captured graphs, whole-call and for a unit in module mode: a break whose output
    shape follows a host value stops the replay (BreakOutputMismatchError); the call still returns the eager
    result, with one warning, and the key (or the unit call) runs eagerly from then on. The replay before
    (new inputs) is checked against eager and on the counters, so a broken replay fails here."""
    import _shape_break

    model, twin = _shape_break.models("cuda")
    bcg.accelerate_transformer(model)
    if module_mode:
        _shape_break.opaque_forward(model)
    equal, messages = _shape_break.calls_until_a_break_changes_shape(model, twin, "cuda")
    stats = bcg.get_stats(model)
    assert equal == [True] * 4, (equal, str(stats))
    what = "blocks.0 (Block) in module mode" if module_mode else "WideningModel"
    assert len(messages) == 1 and f"replay of {what} stopped" in messages[0], messages
    entry = stats.entries[0]
    if module_mode:
        assert entry.module_mode and entry.child_graphs == 1 and entry.child_failed_captures == 1, str(stats)
        assert stats.child_hits >= 3 and stats.eager_calls == 0, str(stats)
    else:
        assert entry.fallback.startswith("break output changed shape") and stats.failed_captures == 1, str(stats)
        assert (stats.captures, stats.hits, stats.eager_calls) == (1, 2, 1), str(stats)
    bcg.remove_acceleration(model)
