"""GPU tests: Python the graph key cannot see (tests/_patterns.py) runs eagerly on every call while
the modules it calls replay captured graphs; every call equals the eager twin given the same
change, bitwise, with inputs that change from call to call."""

import pytest
import torch

import bcg_diffusion as bcg
import _patterns as pat
from _replay import assert_replayed, counters

pytestmark = pytest.mark.gpu
CALLS = 6


def _replays_in_module_mode(model, before, reason):
    assert_replayed(model, CALLS, before)
    entry = bcg.get_stats(model).entries[-1]
    assert entry.module_mode and reason in entry.eager_reason, entry


@pytest.mark.parametrize("order", ["patch_first", "bcg_first"])
def test_a_replaced_forward_reusing_every_other_output(order):
    accelerated, twin = pat.tiny_flux("cuda"), pat.tiny_flux("cuda")
    pat.apply_reuse_every_other_call(twin)
    if order == "bcg_first":
        bcg.accelerate_transformer(accelerated)
        pat.compare(accelerated, pat.tiny_flux("cuda"), calls=3, device="cuda")
    pat.apply_reuse_every_other_call(accelerated)
    if order == "patch_first":
        bcg.accelerate_transformer(accelerated)
    pat.compare(accelerated, twin, calls=CALLS, device="cuda")  # warm-up and captures of the units
    before = counters(accelerated)
    pat.compare(accelerated, twin, calls=2 * CALLS, device="cuda", first_seed=CALLS)
    # the runner is outermost: it sees every call, runs the patch eagerly, and the units replay when it computes
    assert_replayed(accelerated, 2 * CALLS, before)
    assert bcg.get_stats(accelerated).entries[-1].module_mode


@pytest.mark.parametrize("pattern, where", [
    (pat.apply_pre_hook_flag, "transformer_blocks.0"),
    (pat.apply_closure_counter, "single_transformer_blocks.0"),
    (pat.apply_counting_processor, "custom attention processor"),
])
def test_python_in_a_submodule(pattern, where):
    accelerated, twin = pat.tiny_flux("cuda"), pat.tiny_flux("cuda")
    pattern(accelerated)
    pattern(twin)
    bcg.accelerate_transformer(accelerated)
    pat.compare(accelerated, twin, calls=CALLS, device="cuda")
    before = counters(accelerated)
    pat.compare(accelerated, twin, calls=CALLS, device="cuda", first_seed=CALLS)
    _replays_in_module_mode(accelerated, before, where)


def test_a_reassigned_class_forward():
    accelerated, twin = pat.tiny_flux("cuda"), pat.tiny_flux("cuda")
    bcg.accelerate_transformer(accelerated)
    pat.compare(accelerated, twin, calls=3, device="cuda")
    with pat.teacache_class_patch():
        pat.compare(accelerated, twin, calls=CALLS, device="cuda", first_seed=3)
        before = counters(accelerated)
        pat.compare(accelerated, twin, calls=CALLS, device="cuda", first_seed=3 + CALLS)
        _replays_in_module_mode(accelerated, before, "class forward reassigned")
    pat.compare(accelerated, twin, calls=3, device="cuda", first_seed=20)
    before = counters(accelerated)
    pat.compare(accelerated, twin, calls=CALLS, device="cuda", first_seed=30)
    assert_replayed(accelerated, CALLS, before)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode


def test_a_declared_pure_forward_is_one_graph():
    accelerated = pat.tiny_flux("cuda")
    original = accelerated.forward

    def fused_forward(*args, **kwargs):
        return original(*args, **kwargs)

    accelerated.forward = fused_forward
    name = f"{fused_forward.__module__}.{fused_forward.__qualname__}"
    bcg.accelerate_transformer(accelerated, bcg.BCGConfig(pure_forwards=(name,)))
    pat.compare(accelerated, pat.tiny_flux("cuda"), calls=3, device="cuda")
    before = counters(accelerated)
    pat.compare(accelerated, pat.tiny_flux("cuda"), calls=CALLS, device="cuda", first_seed=3)
    assert_replayed(accelerated, CALLS, before)
    stats = bcg.get_stats(accelerated)
    assert not stats.entries[-1].module_mode and stats.entries[-1].segments >= 1, str(stats)
    assert torch.cuda.is_available()
