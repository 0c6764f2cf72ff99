"""GPU tests: cache-dit under BCG is bitwise equal to the same cache-dit settings without BCG, its
decisions (``cache_dit.summary``) are the same, and the blocks it computes replay captured graphs.

The eager twin is built with the same seed and given the same cache-dit settings; every setting
makes its decisions change from step to step (checked: some steps cached, some computed).
"""

import cache_dit
import pytest
import torch

import bcg_diffusion as bcg
import _cache_dit as cd
from _pipes import transformer_calls
from _replay import assert_replayed, counters

pytestmark = pytest.mark.gpu

STEPS = cd.STEPS
CACHE_DIT_FAMILIES = ["flux", "sd3", "pixart", "sana", "wan", "qwenimage", "hunyuanvideo", "ltx", "cogvideox",
                      "lumina2", "zimage", "chroma", "flux2"]


def _premise(steps_lists, calls):
    reused = sorted({s for entry in steps_lists for lists in entry for s in lists})
    assert reused and len(reused) < calls, f"premise: the eager twin must cache some steps and compute others: {steps_lists}"


# Chroma's time_text_embed builds a CPU tensor inline (torch.tensor([0] * batch_size)) and has no
# submodule that could replay instead: that one unit runs eagerly on every call, by design.
EAGER_UNITS = {"chroma": 1}


def _check(family, case, order, steps=STEPS, config=None):
    config = config or bcg.BCGConfig()
    threshold = cd.median_threshold(family, "cuda", steps) if case == "dbcache_threshold" else None
    twin, accelerated = cd.twins(family, "cuda")
    cd.enable(twin, case, steps, threshold=threshold)
    cd.enable(accelerated, case, steps, order=order, config=config, threshold=threshold)
    eager = cd.generate(twin, family, steps)
    eager_steps = cd.cached_steps(twin)
    calls = transformer_calls(family, steps)
    _premise(eager_steps, calls)
    first = cd.generate(accelerated, family, steps)
    assert cd.cached_steps(accelerated) == eager_steps, "cache-dit decided differently under BCG"
    before = counters(accelerated)
    second = cd.generate(accelerated, family, steps)
    assert cd.cached_steps(accelerated) == eager_steps
    assert torch.equal(first, eager), f"{family} {case} {order}: first accelerated generation differs"
    assert torch.equal(second, eager), f"{family} {case} {order}: replayed generation differs"
    assert_replayed(accelerated, calls, before, eager_units_per_call=EAGER_UNITS.get(family, 0))
    stats = bcg.get_stats(accelerated)
    assert stats.entries[-1].module_mode and "cache_dit" in stats.entries[-1].eager_reason, str(stats)
    return accelerated


COMBINATIONS = [
    ("flux", "dbcache", "cache_first"),
    ("flux", "dbcache", "bcg_first"),
    ("flux", "dbcache_f2b1", "cache_first"),
    ("flux", "dbcache_f2b1", "bcg_first"),
    ("flux", "dbcache_threshold", "cache_first"),
    ("flux", "dbprune", "cache_first"),
    ("flux", "dbprune", "bcg_first"),
    ("flux", "taylorseer", "cache_first"),
    ("flux", "taylorseer", "bcg_first"),
    ("flux", "scm", "cache_first"),
    ("flux", "scm", "bcg_first"),
    ("wan", "separate_cfg", "cache_first"),
    ("wan", "separate_cfg", "bcg_first"),
    ("wan", "dbcache_f2b1", "cache_first"),
    ("wan", "taylorseer", "bcg_first"),
    ("qwenimage", "separate_cfg", "cache_first"),
    ("qwenimage", "separate_cfg", "bcg_first"),
    ("qwenimage", "dbprune", "cache_first"),
]


@pytest.mark.parametrize("family, case, order", COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_cache_dit_setting_under_bcg_is_bitwise_equal_and_replays(family, case, order):
    _check(family, case, order)


@pytest.mark.parametrize("family", CACHE_DIT_FAMILIES)
def test_every_family_cache_dit_supports_replays_under_it(family):
    _check(family, "dbcache", "cache_first")


@pytest.mark.parametrize("order", ["cache_first", "bcg_first"])
def test_disable_cache_after_acceleration(order):
    family = "flux"
    reference, accelerated = cd.twins(family, "cuda")
    cd.enable(reference, "dbcache")  # one pipeline of the class under cache-dit at a time (it patches the class)
    cached = cd.generate(reference, family)
    cache_dit.disable_cache(reference)
    uncached = cd.generate(reference, family)
    cd.enable(accelerated, "dbcache", order=order, config=bcg.BCGConfig())
    assert torch.equal(cd.generate(accelerated, family), cached)
    cache_dit.disable_cache(accelerated)
    assert torch.equal(cd.generate(accelerated, family), uncached)
    before = counters(accelerated)
    assert torch.equal(cd.generate(accelerated, family), uncached)
    assert_replayed(accelerated, transformer_calls(family, STEPS), before)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode  # cache-dit's patched forward is pure: one graph


def test_refresh_context_between_calls_with_another_step_count():
    family = "flux"
    twin, accelerated = cd.twins(family, "cuda")
    cd.enable(twin, "dbcache", 8, target=twin.transformer)
    cd.enable(accelerated, "dbcache", 8, config=bcg.BCGConfig(), target=accelerated.transformer)
    for steps in (8, 5, 8):
        for pipe in (twin, accelerated):
            cache_dit.refresh_context(pipe.transformer, num_inference_steps=steps)
        eager = cd.generate(twin, family, steps)
        before = counters(accelerated)
        assert torch.equal(cd.generate(accelerated, family, steps), eager), steps
        assert cd.cached_steps(accelerated.transformer) == cd.cached_steps(twin.transformer), steps
        if steps == 8 and before["hits"]:  # the second 8-step generation: everything was captured before
            assert_replayed(accelerated, transformer_calls(family, steps), before)


@pytest.mark.parametrize("order", ["cache_first", "bcg_first"])
def test_cache_dit_with_compiled_blocks(order):
    """Blocks compiled with compile_repeated_blocks, with the attention custom op installed before
    compiling in both runs (so both trace it): bitwise equal to the compiled run without BCG. The
    reference runs first, alone under cache-dit (cache-dit patches the pipeline class)."""
    family = "flux"
    reference, accelerated = cd.twins(family, "cuda")
    torch._dynamo.reset()
    handle = bcg.install_attention_breaks(reference.transformer)
    try:
        cd.enable(reference, "dbcache")
        reference.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
        eager = cd.generate(reference, family)
        eager_steps = cd.cached_steps(reference)
        cache_dit.disable_cache(reference)
        _premise(eager_steps, transformer_calls(family, STEPS))
        del reference
        cd.enable(accelerated, "dbcache", order=order, config=bcg.BCGConfig())
        accelerated.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
        first = cd.generate(accelerated, family)
        before = counters(accelerated)
        second = cd.generate(accelerated, family)
        assert cd.cached_steps(accelerated) == eager_steps
        assert torch.equal(first, eager) and torch.equal(second, eager)
        assert_replayed(accelerated, transformer_calls(family, STEPS), before)
    finally:
        handle.remove()
        torch._dynamo.reset()


@pytest.mark.survives_sabotage("fallback", "skip_segment", "stale_inputs", reason="checks a refusal at acceleration: no call runs")
def test_bcg_compile_true_with_cache_dit_is_refused():
    pipe = cd.twins("flux", "cuda", layers=False)[0]
    cd.enable(pipe, "dbcache")
    with pytest.raises(bcg.AccelerationError, match="compile_repeated_blocks"):
        bcg.accelerate_pipeline(pipe, bcg.BCGConfig(compile=True))
