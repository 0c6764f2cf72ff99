"""cache-dit under BCG on the CPU (debug mode: the runner's real path, segments run eagerly).

cache-dit decides per step in Python (step counters, residual differences read with ``.item()``).
Under BCG its Python must run on every call exactly as eagerly: the same cached steps in its
``summary``, the same output bitwise, in both orders of ``enable_cache`` and ``accelerate_pipeline``,
while the blocks it calls replay (module mode). The GPU tests (test_cache_dit_gpu.py) prove the
replays with captured graphs.
"""

import cache_dit
import pytest
import torch

import bcg_diffusion as bcg
import _cache_dit as cd
from _pipes import transformer_calls

DEBUG = bcg.BCGConfig(debug=True)
STEPS = 6


def _check(family, case, order, steps=STEPS):
    threshold = cd.median_threshold(family, "cpu", steps) if case == "dbcache_threshold" else None
    twin, accelerated = cd.twins(family, "cpu")
    cd.enable(twin, case, steps, threshold=threshold)
    cd.enable(accelerated, case, steps, order=order, config=DEBUG, threshold=threshold)
    eager = cd.generate(twin, family, steps)
    eager_steps = cd.cached_steps(twin)
    first = cd.generate(accelerated, family, steps)
    assert cd.cached_steps(accelerated) == eager_steps, "cache-dit decided differently under BCG"
    second = cd.generate(accelerated, family, steps)
    assert cd.cached_steps(accelerated) == eager_steps
    assert torch.equal(first, eager) and torch.equal(second, eager), f"{family} {case} {order}: output differs"
    calls = transformer_calls(family, steps)
    reused = sorted({s for entry in eager_steps for lists in entry for s in lists})
    assert reused and len(reused) < calls, f"premise: the twin must cache some steps and compute others: {eager_steps}"
    stats = bcg.get_stats(accelerated)
    assert stats.calls == 2 * calls and stats.eager_calls == 0, str(stats)
    entry = stats.entries[-1]
    assert entry.module_mode and "cache_dit" in entry.eager_reason, str(stats)
    assert stats.child_hits > 0 and stats.child_eager_calls == 0 and stats.failed_captures == 0, str(stats)
    return accelerated


@pytest.mark.parametrize(
    "family, case, order",
    [
        ("flux", "dbcache", "cache_first"),
        ("flux", "dbcache", "bcg_first"),
        ("flux", "dbcache_f2b1", "cache_first"),
        ("flux", "dbcache_threshold", "bcg_first"),
        ("flux", "dbprune", "cache_first"),
        ("flux", "taylorseer", "bcg_first"),
        ("flux", "scm", "cache_first"),
        ("wan", "separate_cfg", "bcg_first"),
        ("qwenimage", "separate_cfg", "cache_first"),
    ],
)
def test_cache_dit_decides_per_step_under_bcg_as_eagerly(family, case, order):
    _check(family, case, order)


@pytest.mark.parametrize("order", ["cache_first", "bcg_first"])
def test_disable_cache_after_acceleration_gives_the_uncached_output_and_replays_whole(order):
    family = "flux"
    reference, accelerated = cd.twins(family, "cpu")
    cd.enable(reference, "dbcache", STEPS)  # one pipeline of the class at a time: cache-dit patches the class
    cached = cd.generate(reference, family, STEPS)
    cache_dit.disable_cache(reference)
    uncached = cd.generate(reference, family, STEPS)
    cd.enable(accelerated, "dbcache", STEPS, order=order, config=DEBUG)
    assert torch.equal(cd.generate(accelerated, family, STEPS), cached)
    cache_dit.disable_cache(accelerated)
    assert torch.equal(cd.generate(accelerated, family, STEPS), uncached)
    stats = bcg.get_stats(accelerated)
    hits = stats.hits
    assert torch.equal(cd.generate(accelerated, family, STEPS), uncached)
    stats = bcg.get_stats(accelerated)
    assert not stats.entries[-1].module_mode, "cache-dit's own patched forward is pure: one graph per call"
    assert stats.hits - hits == transformer_calls(family, STEPS) and stats.eager_calls == 0, str(stats)
    bcg.remove_acceleration(accelerated)
    assert "_call_impl" not in accelerated.transformer.__dict__
    assert torch.equal(cd.generate(accelerated, family, STEPS), uncached)


def test_refresh_context_between_calls_with_another_step_count():
    family = "flux"
    twin, accelerated = cd.twins(family, "cpu")
    cd.enable(twin, "dbcache", 8, target=twin.transformer)  # transformer-only: persistent contexts
    cd.enable(accelerated, "dbcache", 8, config=DEBUG, target=accelerated.transformer)
    for steps in (8, 5):
        for pipe in (twin, accelerated):
            cache_dit.refresh_context(pipe.transformer, num_inference_steps=steps)
        eager = cd.generate(twin, family, steps)
        assert torch.equal(cd.generate(accelerated, family, steps), eager), steps
        assert cd.cached_steps(accelerated.transformer) == cd.cached_steps(twin.transformer), steps
    assert bcg.get_stats(accelerated).eager_calls == 0


def test_bcg_compile_true_with_cache_dit_is_refused_with_what_to_do():
    pipe = cd.twins("flux", "cpu", layers=False)[0]
    cd.enable(pipe, "dbcache")
    with pytest.raises(bcg.AccelerationError, match="compile_repeated_blocks"):
        bcg.accelerate_pipeline(pipe, bcg.BCGConfig(debug=True, compile=True))
    assert not bcg.is_accelerated(pipe)
