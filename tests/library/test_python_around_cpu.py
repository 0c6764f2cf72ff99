"""Python the graph key cannot see runs eagerly on every call (CPU, debug mode: the runner's real
path with segments run eagerly). Each pattern decides per call on the host; the accelerated model
must give what its un-accelerated twin, given the same change, gives on every call, and the
runner must say it ran the pattern's Python eagerly (module mode) while the modules it calls
replayed. The GPU twins of these tests (test_python_around_gpu.py) prove the real replays."""

import itertools

import pytest
import torch
from diffusers import FluxTransformer2DModel
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

import bcg_diffusion as bcg
import pipelines
from bcg_diffusion.integration.python_code import classify_forward, qualified_name

DEBUG = bcg.BCGConfig(debug=True)


def _transformer(seed=0):
    torch.manual_seed(seed)
    return FluxTransformer2DModel(**dict(pipelines.get_family("flux").tiny.transformer)).eval()


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(1, 16, 64, generator=g), encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5]), return_dict=False,
    )


def _compare(accelerated, twin, calls=6):
    with torch.no_grad():
        for i in range(calls):
            got, want = accelerated(**_inputs(i))[0], twin(**_inputs(i))[0]
            assert torch.equal(got, want), f"call {i} differs from the eager twin"


def _reuse_every_other_call(model):
    """A TeaCache-style patch on the instance: every other call returns the previous output."""
    original = model.forward
    state = {"calls": 0, "last": None}

    def forward(*args, **kwargs):
        state["calls"] += 1
        if state["calls"] % 2 == 0 and state["last"] is not None:
            return (state["last"],)
        out = original(*args, **kwargs)
        state["last"] = out[0]
        return out

    model.forward = forward


@pytest.mark.parametrize("order", ["patch_first", "bcg_first"])
def test_a_replaced_transformer_forward_runs_eagerly_every_call(order):
    accelerated, twin = _transformer(), _transformer()
    _reuse_every_other_call(twin)
    if order == "patch_first":
        _reuse_every_other_call(accelerated)
        bcg.accelerate_transformer(accelerated, DEBUG)
    else:
        bcg.accelerate_transformer(accelerated, DEBUG)
        _compare(accelerated, _transformer(), calls=2)  # replays before the patch
        _reuse_every_other_call(accelerated)
    _compare(accelerated, twin)
    stats = bcg.get_stats(accelerated)
    entry = stats.entries[-1]
    assert entry.module_mode and "forward replaced" in entry.eager_reason, str(stats)
    assert stats.child_hits > 0 and stats.child_eager_calls == 0 and stats.eager_calls == 0, str(stats)
    bcg.remove_acceleration(accelerated)
    assert accelerated.forward.__qualname__.endswith("forward") and "_call_impl" not in accelerated.__dict__
    _compare(accelerated, twin, calls=2)


def test_a_pre_hook_setting_an_attribute_that_a_replaced_block_forward_reads():
    """The transformer's forward pre-hook flips a flag each call; block 0's replaced forward reads it."""
    models = _transformer(), _transformer()
    for model in models:
        model.register_forward_pre_hook(lambda m, args, kwargs: setattr(m, "skip_block", not getattr(m, "skip_block", True)),
                                        with_kwargs=True)
        block = model.transformer_blocks[0]
        original = block.forward

        def forward(*args, _model=model, _original=original, **kwargs):
            if _model.skip_block:
                return kwargs["encoder_hidden_states"], kwargs["hidden_states"]
            return _original(*args, **kwargs)

        block.forward = forward
    accelerated, twin = models
    bcg.accelerate_transformer(accelerated, DEBUG)
    _compare(accelerated, twin)
    stats = bcg.get_stats(accelerated)
    assert stats.entries[-1].module_mode and "transformer_blocks.0" in stats.entries[-1].eager_reason, str(stats)
    assert stats.child_hits > 0 and stats.child_eager_calls == 0, str(stats)


def test_a_closure_counter_in_a_block_forward():
    models = _transformer(), _transformer()
    for model in models:
        counter = itertools.count()
        block = model.single_transformer_blocks[0]
        original = block.forward

        def forward(*args, _count=counter, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            return out if next(_count) % 3 else (out[0] * 0.5, out[1])

        block.forward = forward
    accelerated, twin = models
    bcg.accelerate_transformer(accelerated, DEBUG)
    _compare(accelerated, twin)
    assert bcg.get_stats(accelerated).entries[-1].module_mode


def test_a_class_forward_reassigned_after_acceleration_is_followed():
    accelerated, twin = _transformer(), _transformer()
    bcg.accelerate_transformer(accelerated, DEBUG)
    _compare(accelerated, twin, calls=2)
    original = FluxTransformer2DModel.forward

    def patched_forward(self, *args, **kwargs):  # a TeaCache script's class-level patch: state on the module
        self.teacache_calls = getattr(self, "teacache_calls", 0) + 1
        out = original(self, *args, **kwargs)
        return (out[0] * (1.0 if self.teacache_calls % 2 else 0.25),)

    FluxTransformer2DModel.forward = patched_forward
    try:
        _compare(accelerated, twin)
        stats = bcg.get_stats(accelerated)
        assert stats.entries[-1].module_mode and "class forward reassigned" in stats.entries[-1].eager_reason
    finally:
        FluxTransformer2DModel.forward = original
    _compare(accelerated, twin, calls=2)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode  # the class code again: one graph


class CountingProcessor(FluxAttnProcessor):
    """A user's processor with host state: scales the output on every third call."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __call__(self, attn, *args, **kwargs):
        self.calls += 1
        out = super().__call__(attn, *args, **kwargs)
        factor = 0.5 if self.calls % 3 == 0 else 1.0
        return tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor


def test_a_custom_attention_processor_with_a_counter_runs_eagerly():
    accelerated, twin = _transformer(), _transformer()
    for model in (accelerated, twin):
        model.transformer_blocks[0].attn.set_processor(CountingProcessor())
    bcg.accelerate_transformer(accelerated, DEBUG)
    _compare(accelerated, twin)
    reason = bcg.get_stats(accelerated).entries[-1].eager_reason
    assert "transformer_blocks" in reason and "spine" in reason


def test_a_declared_pure_forward_is_captured_whole():
    accelerated = _transformer()
    original = accelerated.forward

    def fused_forward(*args, **kwargs):  # pure: decides nothing per call
        return original(*args, **kwargs)

    accelerated.forward = fused_forward
    bcg.accelerate_transformer(accelerated, bcg.BCGConfig(debug=True, pure_forwards=(qualified_name(fused_forward),)))
    _compare(accelerated, _transformer(), calls=3)
    assert not bcg.get_stats(accelerated).entries[-1].module_mode


def test_compile_true_is_refused_with_opaque_python():
    model = _transformer()
    _reuse_every_other_call(model)
    with pytest.raises(bcg.AccelerationError, match="compile_repeated_blocks"):
        bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, compile=True))
    assert "_call_impl" not in model.__dict__ and "_diffusers_hook" not in model.__dict__


def test_classification_of_forwards():
    model = _transformer()
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
