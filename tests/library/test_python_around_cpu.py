"""Python the graph key cannot see runs eagerly on every call (CPU, debug mode: the runner's real
path with segments run eagerly). Each pattern (tests/_patterns.py) decides per call on the host;
the accelerated model must give what its un-accelerated twin, given the same change, gives on
every call, and the runner must say it ran that Python eagerly (module mode) while the modules it
calls replayed. test_python_around_gpu.py proves the same with captured graphs."""

import pytest

from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

import bcg_diffusion as bcg
import _patterns as pat
from bcg_diffusion.integration.python_code import classify_forward, qualified_name

DEBUG = bcg.BCGConfig(debug=True)


def _module_mode(model, reason):
    stats = bcg.get_stats(model)
    entry = stats.entries[-1]
    assert entry.module_mode and reason in entry.eager_reason, str(stats)
    assert stats.child_hits > 0 and stats.child_eager_calls == 0 and stats.eager_calls == 0, str(stats)


@pytest.mark.parametrize("order", ["patch_first", "bcg_first"])
def test_a_replaced_transformer_forward_runs_eagerly_every_call(order):
    accelerated, twin = pat.tiny_flux(), pat.tiny_flux()
    pat.apply_reuse_every_other_call(twin)
    if order == "patch_first":
        pat.apply_reuse_every_other_call(accelerated)
        bcg.accelerate_transformer(accelerated, DEBUG)
    else:
        bcg.accelerate_transformer(accelerated, DEBUG)
        pat.compare(accelerated, pat.tiny_flux(), calls=2)  # replays before the patch
        pat.apply_reuse_every_other_call(accelerated)
    pat.compare(accelerated, twin)
    _module_mode(accelerated, "forward replaced")
    bcg.remove_acceleration(accelerated)
    assert "_call_impl" not in accelerated.__dict__ and "_diffusers_hook" not in accelerated.__dict__
    pat.compare(accelerated, twin, calls=2, first_seed=10)


@pytest.mark.parametrize("pattern, where", [
    (pat.apply_pre_hook_flag, "transformer_blocks.0"),
    (pat.apply_closure_counter, "single_transformer_blocks.0"),
    (pat.apply_counting_processor, "custom attention processor"),
])
def test_python_in_a_submodule_runs_eagerly_and_the_rest_replays(pattern, where):
    accelerated, twin = pat.tiny_flux(), pat.tiny_flux()
    pattern(accelerated)
    pattern(twin)
    bcg.accelerate_transformer(accelerated, DEBUG)
    pat.compare(accelerated, twin)
    _module_mode(accelerated, where)


def test_a_class_forward_reassigned_after_acceleration_is_followed():
    accelerated, twin = pat.tiny_flux(), pat.tiny_flux()
    bcg.accelerate_transformer(accelerated, DEBUG)
    pat.compare(accelerated, twin, calls=2)
    with pat.teacache_class_patch():
        pat.compare(accelerated, twin)
        _module_mode(accelerated, "class forward reassigned")
    pat.compare(accelerated, twin, calls=2)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode  # the class code again: one graph


def test_a_declared_pure_forward_is_captured_whole():
    accelerated = pat.tiny_flux()
    original = accelerated.forward

    def fused_forward(*args, **kwargs):  # pure: decides nothing per call
        return original(*args, **kwargs)

    accelerated.forward = fused_forward
    bcg.accelerate_transformer(accelerated, bcg.BCGConfig(debug=True, pure_forwards=(qualified_name(fused_forward),)))
    pat.compare(accelerated, pat.tiny_flux(), calls=3)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode


def test_compile_true_is_refused_with_opaque_python():
    model = pat.tiny_flux()
    pat.apply_reuse_every_other_call(model)
    with pytest.raises(bcg.AccelerationError, match="compile_repeated_blocks"):
        bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, compile=True))
    assert "_call_impl" not in model.__dict__ and "_diffusers_hook" not in model.__dict__


def test_classification_of_forwards():
    model = pat.tiny_flux()
    assert classify_forward(model, model.forward, "", ()) is None
    block = model.transformer_blocks[0]
    assert classify_forward(block, block.forward, "b", ()) is None

    def replacement(*args, **kwargs):
        return None

    opaque = classify_forward(block, replacement, "b", ())
    assert opaque is not None and opaque.what == "forward replaced on the instance" and "replacement" in opaque.code
    assert classify_forward(block, replacement, "b", (qualified_name(replacement),)) is None
    assert classify_forward(block, replacement, "b", ("test_python_around_cpu.",)) is None
    with pytest.raises(ValueError, match="pure_forwards"):
        bcg.BCGConfig(pure_forwards="mod.fn")


def test_a_processor_class_call_reassigned_runs_eagerly_every_call():
    accelerated, twin = pat.tiny_flux(), pat.tiny_flux()
    original = FluxAttnProcessor.__call__
    calls = {}

    def counting_call(self, attn, *args, **kwargs):  # host state in a diffusers processor class, patched
        calls[id(attn)] = calls.get(id(attn), 0) + 1  # per attention module: the twin counts its own
        out = original(self, attn, *args, **kwargs)
        factor = 0.5 if calls[id(attn)] % 3 == 0 else 1.0
        return tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor

    FluxAttnProcessor.__call__ = counting_call
    try:
        bcg.accelerate_transformer(accelerated, DEBUG)
        pat.compare(accelerated, twin)
        _module_mode(accelerated, "processor __call__ reassigned")
    finally:
        FluxAttnProcessor.__call__ = original
        bcg.remove_acceleration(accelerated)
