"""GPU tests of accelerate_pipeline on the tiny pipelines of every family."""

import warnings

import pytest
import torch

import bcg_diffusion as bcg
from bcg_diffusion.integration import attention_breaks

pipelines = pytest.importorskip("bcg_pipelines")

pytestmark = pytest.mark.gpu

FAMILIES = pipelines.list_families() if hasattr(pipelines, "list_families") else []
PROMPT = "a red fox jumping over a frozen river at dawn"


def _build(family, seed=0):
    return pipelines.build_pipeline(family, size="tiny", device="cuda", dtype=torch.float32, seed=seed)


def _call_kwargs(family, steps=3, seed=0, prompt=PROMPT, **overrides):
    spec = pipelines.get_family(family)
    kwargs = dict(spec.call_kwargs)
    kwargs.update(
        prompt=prompt,
        num_inference_steps=steps,
        height=spec.tiny.height,
        width=spec.tiny.width,
        generator=torch.Generator("cuda").manual_seed(seed),
        output_type="latent",
    )
    if spec.tiny.num_frames:
        kwargs["num_frames"] = spec.tiny.num_frames
    kwargs.update(overrides)
    return kwargs


def _run(pipe, family, **kw):
    with torch.no_grad():
        out = pipe(**_call_kwargs(family, **kw))
    result = out[0]
    return result.clone() if isinstance(result, torch.Tensor) else torch.as_tensor(result)


@pytest.mark.parametrize("policy", ["capture_safe", "break"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_bitwise_equal_to_eager_with_replays(family, policy):
    pipe = _build(family)
    eager = _run(pipe, family)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention=policy))
    first = _run(pipe, family)
    second = _run(pipe, family)
    stats = bcg.get_stats(pipe)
    assert torch.equal(first, eager), f"{family}: first accelerated call differs from eager"
    assert torch.equal(second, eager), f"{family}: replayed call differs from eager"
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)
    if policy == "break":
        assert all(e.breaks >= 1 and e.segments >= 2 for e in stats.entries), str(stats)
    assert stats.hits >= 2 * 3 - stats.misses, str(stats)  # 2 calls x 3 steps, minus first calls
    bcg.remove_acceleration(pipe)
    assert "forward" not in pipe.transformer.__dict__
    assert torch.equal(_run(pipe, family), eager)
    assert attention_breaks.installed_patches() == []


def test_resolutions_a_b_a_capture_twice():
    family = "pixart"
    spec = pipelines.get_family(family)
    h, w = spec.tiny.height, spec.tiny.width
    pipe = _build(family)
    eager_a = _run(pipe, family, height=h, width=w)
    eager_b = _run(pipe, family, height=h * 2, width=w)
    bcg.accelerate_pipeline(pipe)
    assert torch.equal(_run(pipe, family, height=h, width=w), eager_a)
    assert torch.equal(_run(pipe, family, height=h * 2, width=w), eager_b)
    assert torch.equal(_run(pipe, family, height=h, width=w), eager_a)
    assert bcg.get_stats(pipe).captures == 2
    bcg.remove_acceleration(pipe)


@pytest.mark.parametrize(
    "config",
    [bcg.BCGConfig(max_graphs=1), bcg.BCGConfig(memory_budget_bytes=1)],
    ids=["max_graphs=1", "memory_budget=1B"],
)
def test_lru_eviction_keeps_one_graph_and_recaptures(config):
    """Either limit keeps only the newest key; an evicted key is recaptured and still equal to eager."""
    family = "pixart"
    spec = pipelines.get_family(family)
    h, w = spec.tiny.height, spec.tiny.width
    pipe = _build(family)
    eager_a = _run(pipe, family, height=h, width=w)
    eager_b = _run(pipe, family, height=h * 2, width=w)
    bcg.accelerate_pipeline(pipe, config)
    assert torch.equal(_run(pipe, family, height=h, width=w), eager_a)
    assert torch.equal(_run(pipe, family, height=h * 2, width=w), eager_b)
    assert torch.equal(_run(pipe, family, height=h, width=w), eager_a)
    stats = bcg.get_stats(pipe)
    assert stats.captures == 3 and len(stats.entries) == 1, str(stats)  # A, B (evicts A), A again (evicts B)
    assert stats.entries[0].memory_bytes > 0 and stats.eager_calls == 0, str(stats)
    bcg.remove_acceleration(pipe)


def test_prompts_of_different_lengths_exact_and_bucketed():
    family = "qwenimage"
    pipe = _build(family)
    short, long = "a cat", "a very long prompt about a cat sitting on a red chair in a sunny garden with flowers"
    eager_short, eager_long = _run(pipe, family, prompt=short), _run(pipe, family, prompt=long)
    bcg.accelerate_pipeline(pipe)
    assert torch.equal(_run(pipe, family, prompt=short), eager_short)
    assert torch.equal(_run(pipe, family, prompt=long), eager_long)
    # exact text length is part of the key by default: short, long and the negative prompt (CFG)
    assert bcg.get_stats(pipe).captures == 3
    bcg.remove_acceleration(pipe)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(text_buckets=(256,)))
    torch.testing.assert_close(_run(pipe, family, prompt=short), eager_short, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(_run(pipe, family, prompt=long), eager_long, rtol=1e-4, atol=1e-4)
    stats = bcg.get_stats(pipe)
    assert stats.captures == 1 and stats.entries[0].fallback is None, str(stats)  # one padded graph serves both
    assert stats.hits >= 2 * 3 * 2 - 1 and stats.eager_calls == 0, str(stats)
    bcg.remove_acceleration(pipe)


def test_second_accelerate_raises_and_debug_mode_is_identical():
    family = "flux"
    pipe = _build(family)
    eager = _run(pipe, family)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True, attention="break"))
    with pytest.raises(bcg.AccelerationError, match="already accelerated"):
        bcg.accelerate_pipeline(pipe)
    assert torch.equal(_run(pipe, family), eager)
    stats = bcg.get_stats(pipe)
    assert stats.debug and stats.entries[0].breaks >= 1
    bcg.remove_acceleration(pipe)


def test_weights_changed_after_capture_recapture():
    family = "flux"
    pipe = _build(family)
    bcg.accelerate_pipeline(pipe)
    _run(pipe, family)
    with torch.no_grad():
        next(pipe.transformer.parameters()).mul_(1.5)  # in place: version counter bumps
    accelerated = _run(pipe, family)
    captures = bcg.get_stats(pipe).captures
    bcg.remove_acceleration(pipe)
    assert torch.equal(accelerated, _run(pipe, family))
    assert captures == 2


def test_lora_loaded_after_capture_matches_eager_with_lora():
    pytest.importorskip("peft")
    from peft import LoraConfig

    family = "flux"
    pipe = _build(family)
    bcg.accelerate_pipeline(pipe)
    _run(pipe, family)
    torch.manual_seed(1)
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v"], init_lora_weights=False))
    with_lora = _run(pipe, family)
    assert bcg.get_stats(pipe).captures == 2
    bcg.remove_acceleration(pipe)
    assert torch.equal(with_lora, _run(pipe, family))


def test_attention_backend_reading_item_runs_in_breaks(monkeypatch):
    from diffusers.models import attention_dispatch as ad

    family = "flux"
    pipe = _build(family)
    registry = ad._AttentionBackendRegistry._backends
    name = ad.AttentionBackendName.NATIVE
    native = registry[name]
    calls = {"n": 0}

    def reads_item(query, key, value, *args, **kwargs):
        calls["n"] += 1
        _ = int((key.abs().sum() > -1).item())  # host read: not capturable
        return native(query, key, value, *args, **kwargs)

    monkeypatch.setitem(registry, name, reads_item)
    eager = _run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    _run(pipe, family)
    n_before = calls["n"]
    out = _run(pipe, family)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    assert torch.equal(out, eager)
    assert calls["n"] > n_before and stats.entries[0].fallback is None and stats.hits >= 3


def test_a_replaced_block_forward_with_a_host_read_runs_eagerly_and_the_rest_replays():
    """A forward replaced on one block (here with a host read) is Python the key cannot see: it runs
    eagerly on every call (module mode, the block on the eager spine) and everything else replays."""
    from _replay import assert_replayed, counters

    family = "flux"
    pipe = _build(family)
    block = pipe.transformer.transformer_blocks[0]
    original = block.forward

    def planted(*args, **kwargs):
        kwargs_or_args = args[0] if args else kwargs["hidden_states"]
        _ = kwargs_or_args.abs().sum().item()  # host sync: cannot be captured
        return original(*args, **kwargs)

    eager_clean = _run(pipe, family)
    block.forward = planted
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention="break"))
    first = _run(pipe, family)
    before = counters(pipe)
    second = _run(pipe, family)
    assert_replayed(pipe, 3, before)  # 3 steps, one call each: this file's helpers run Flux without true CFG
    entry = bcg.get_stats(pipe).entries[0]
    bcg.remove_acceleration(pipe)
    assert block.forward is planted
    del block.forward
    assert torch.equal(first, eager_clean) and torch.equal(second, eager_clean)
    assert entry.module_mode and "transformer_blocks.0: forward replaced" in entry.eager_reason, entry


@pytest.mark.parametrize("policy", ["capture_safe", "break"])
def test_regional_compile_with_acceleration_matches_compile_alone(policy):
    """Blocks compile with fullgraph=True: attention is one custom-op node, not a graph break."""
    family = "flux"
    pipe = _build(family)
    torch._dynamo.reset()
    pipe.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
    compiled = _run(pipe, family)
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(attention=policy))
    first = _run(pipe, family)
    second = _run(pipe, family)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    torch.testing.assert_close(first, compiled, rtol=1e-4, atol=1e-4)
    assert torch.equal(first, second)
    entry = stats.entries[0]
    assert entry.fallback is None and (entry.breaks >= 1 if policy == "break" else entry.breaks == 0), str(stats)


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
    """Within 1e-3 (relative and absolute): compiled code is not bitwise equal to eager, and the
    attention custom op changes what Inductor fuses around attention."""
    pipe = _build(family)
    torch._dynamo.reset()
    _compile_blocks(pipe.transformer)
    compiled = _run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    accelerated = _run(pipe, family)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    torch.testing.assert_close(accelerated, compiled, rtol=1e-3, atol=1e-3)
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)


def test_whole_forward_compile_under_bcg_is_one_captured_graph():
    """BCGConfig(compile=True): the compiled forward is captured whole (no breaks with native SDPA)."""
    family = "flux"
    pipe = _build(family)
    eager = _run(pipe, family)
    torch._dynamo.reset()
    bcg.accelerate_pipeline(pipe, bcg.BCGConfig(compile=True))
    first, second = _run(pipe, family), _run(pipe, family)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    torch.testing.assert_close(first, eager, rtol=1e-3, atol=1e-3)
    assert torch.equal(first, second)
    entry = stats.entries[0]
    assert entry.fallback is None and entry.breaks == 0 and entry.segments == 1, str(stats)
