"""GPU tests: diffusers step caches under BCG are bitwise equal to the same cache without BCG.

Whole generations with mixed decisions (some module passes computed, some reused), CFG as two
calls (Flux with true CFG, Wan, QwenImage) and as one batched call (CogVideoX), the cache enabled
before or after acceleration, disabled and switched. Each premise is asserted (the eager twin's
cache computes some module passes and reuses others), and each replay claim on the runner's
counters (tests/_replay.py): a comparison alone passes when every call ran eagerly.
"""

import pytest
import torch

import bcg_diffusion as bcg
from bcg_diffusion.integration.breaks.shared import installed_patches
from bcg_diffusion.step_caches import count_cache_passes

from _pipes import build, run, transformer_calls, with_cache
from _replay import assert_recaptured, assert_replayed, counters

pytestmark = pytest.mark.gpu

STEPS = 6
# FasterCache runs only where diffusers 0.42.1 runs it eagerly: batched CFG with unpacked video
# latents (CogVideoX); it fails eagerly on two-call CFG pipelines and on LTX's packed latents.
# PAB shares one cache between CFG calls, which fails eagerly when the negative prompt's text
# length differs (QwenImage trims text per prompt).
CASES = [
    *[("flux", c) for c in ("fbc:0.5", "taylorseer:2", "magcache", "pab:2")],
    *[("wan", c) for c in ("fbc:0.5", "taylorseer:2", "magcache", "pab:2")],
    *[("qwenimage", c) for c in ("fbc:0.5", "taylorseer:2", "magcache")],
    *[("cogvideox", c) for c in ("fbc:0.5", "taylorseer:2", "magcache", "pab:2", "fastercache:2")],
]


@pytest.mark.parametrize("family, cache", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_cache_under_bcg_is_bitwise_equal_to_the_same_cache_eagerly(family, cache):
    twin = with_cache(build(family), family, cache, STEPS)
    accelerated = with_cache(build(family), family, cache, STEPS)
    bcg.accelerate_pipeline(accelerated)
    with count_cache_passes(twin.transformer) as eager_passes:
        eager = run(twin, family, steps=STEPS)
    calls = transformer_calls(family, STEPS)
    with count_cache_passes(accelerated.transformer) as passes:
        first = run(accelerated, family, steps=STEPS)
    assert_replayed(accelerated, calls, child_warmups=True)
    before = counters(accelerated)
    second = run(accelerated, family, steps=STEPS)  # cache state was reset at the end of the call
    assert_replayed(accelerated, calls, before, child_warmups=True)
    assert torch.equal(first, eager), f"{family} {cache}: first accelerated generation differs from eager + cache"
    assert torch.equal(second, eager), f"{family} {cache}: replayed generation differs from eager + cache"
    assert 0 < eager_passes.computed < eager_passes.calls, f"decisions not mixed: {eager_passes}"
    assert (passes.calls, passes.computed) == (eager_passes.calls, eager_passes.computed), (passes, eager_passes)
    bcg.remove_acceleration(accelerated)
    assert installed_patches() == []


def test_enable_switch_and_disable_caches_on_an_accelerated_pipeline():
    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)
    bcg.accelerate_pipeline(accelerated)
    assert torch.equal(run(accelerated, family, steps=STEPS), run(twin, family, steps=STEPS))
    assert_replayed(accelerated, calls)
    for cache in ("fbc:0.5", "taylorseer:2"):
        for pipe in (twin, accelerated):
            if pipe.transformer.is_cache_enabled:
                pipe.transformer.disable_cache()
            with_cache(pipe, family, cache, STEPS)
        before = counters(accelerated)
        with count_cache_passes(twin.transformer) as eager_passes:
            expected = run(twin, family, steps=STEPS)
        assert 0 < eager_passes.computed < eager_passes.calls, f"{cache}: decisions not mixed: {eager_passes}"
        assert torch.equal(run(accelerated, family, steps=STEPS), expected), cache
        assert_recaptured(accelerated, calls, before, captures=1, structure_changes=1)
    for pipe in (twin, accelerated):
        pipe.transformer.disable_cache()
    before = counters(accelerated)
    assert torch.equal(run(accelerated, family, steps=STEPS), run(twin, family, steps=STEPS))
    assert_recaptured(accelerated, calls, before, captures=1, structure_changes=1)
    bcg.remove_acceleration(accelerated)


def test_cache_hooks_keep_fresh_tensors_across_calls_of_two_contexts():
    """True CFG: cond and uncond share the captured graph but keep separate cache state; the tensors
    the hooks keep (FBC's head output) must survive the other context's replay."""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin = with_cache(build(family), family, "fbc:1000", STEPS)  # compute the first step, reuse all others
    accelerated = with_cache(build(family), family, "fbc:1000", STEPS)
    bcg.accelerate_pipeline(accelerated)
    with count_cache_passes(twin.transformer) as eager_passes:
        eager = run(twin, family, steps=STEPS)
    assert 0 < eager_passes.computed < eager_passes.calls, f"decisions not mixed: {eager_passes}"
    with count_cache_passes(accelerated.transformer) as passes:
        first = run(accelerated, family, steps=STEPS)
    assert_replayed(accelerated, calls, child_warmups=True)
    before = counters(accelerated)
    second = run(accelerated, family, steps=STEPS)
    assert_replayed(accelerated, calls, before, child_warmups=True)
    assert torch.equal(first, eager) and torch.equal(second, eager)
    assert (passes.calls, passes.computed) == (eager_passes.calls, eager_passes.computed), (passes, eager_passes)
    bcg.remove_acceleration(accelerated)


@pytest.mark.parametrize("cache", ["fbc:0.5", "taylorseer:2"])
def test_cache_enabled_after_acceleration_before_the_first_call(cache):
    family = "wan"
    calls = transformer_calls(family, STEPS)
    twin = with_cache(build(family), family, cache, STEPS)
    accelerated = build(family)
    bcg.accelerate_pipeline(accelerated)
    with_cache(accelerated, family, cache, STEPS)
    with count_cache_passes(twin.transformer) as eager_passes:
        eager = run(twin, family, steps=STEPS)
    assert 0 < eager_passes.computed < eager_passes.calls, f"decisions not mixed: {eager_passes}"
    with count_cache_passes(accelerated.transformer) as passes:
        out = run(accelerated, family, steps=STEPS)
    assert_replayed(accelerated, calls, child_warmups=True)
    assert torch.equal(out, eager)
    assert (passes.calls, passes.computed) == (eager_passes.calls, eager_passes.computed)
    bcg.remove_acceleration(accelerated)
