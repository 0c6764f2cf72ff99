"""CPU tests of composition with real diffusers objects: hook order, deepcopy, from_pipe, refusals,
step caches (plumbing), structure changes and the state in the key.

Without a GPU the runner serves CPU inputs eagerly, so these prove where hooks sit, what is
refused and what is re-read; that replays are exact is proven by tests/library/test_composition_gpu.py.
"""

import copy

import pytest
import torch

from bcg_diffusion.core.handles import live_handles
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, ModelHook, apply_group_offloading

import bcg_diffusion as bcg
from bcg_diffusion import accelerate as acc
from bcg_diffusion.integration import keys, model_hooks
from bcg_diffusion.integration.breaks.shared import installed_patches
from bcg_diffusion.integration.runner import GraphRunner

import bcg_pipelines as pipelines

from _pipes import flux_inputs as _inputs
from _pipes import tiny_flux_transformer as _transformer



class CountingHook(ModelHook):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


def _order(module):
    return list(module._diffusers_hook._hook_order)


def test_graph_hook_is_innermost_and_user_hooks_keep_running(pretend_cuda):
    model = _transformer()
    with torch.no_grad():
        reference = model(**_inputs())[0]
    registry = HookRegistry.check_if_exists_or_initialize(model)
    before, after = CountingHook(), CountingHook()
    registry.register_hook(before, "user_before")
    bcg.accelerate_transformer(model)
    registry.register_hook(after, "user_after")
    assert _order(model) == ["bcg_graphs", "user_before", "user_after"]
    with torch.no_grad():
        out = model(**_inputs())[0]
    assert before.calls == 1 and after.calls == 1 and torch.equal(out, reference)
    bcg.remove_acceleration(model)
    assert _order(model) == ["user_before", "user_after"]
    with torch.no_grad():
        out = model(**_inputs())[0]
    assert before.calls == 2 and after.calls == 2 and torch.equal(out, reference)
    registry.remove_hook("user_after")
    registry.remove_hook("user_before")
    assert model.forward.__func__ is FluxTransformer2DModel.forward  # the original forward again


def test_removal_restores_the_plain_module(pretend_cuda):
    model = _transformer()
    bcg.accelerate_transformer(model)
    assert _order(model) == ["bcg_graphs"] and "forward" in model.__dict__
    bcg.remove_acceleration(model)
    assert "forward" not in model.__dict__ and "_diffusers_hook" not in model.__dict__
    assert installed_patches() == []


@pytest.fixture
def flux_pipe():
    return pipelines.build_pipeline("flux", size="tiny", device="cpu", dtype=torch.float32, seed=0)


def _call(pipe, **kw):
    spec = pipelines.get_family("flux")
    args = dict(prompt="a fox", num_inference_steps=2, height=spec.tiny.height, width=spec.tiny.width,
                output_type="latent", generator=torch.Generator().manual_seed(0))
    args.update(kw)
    with torch.no_grad():
        return pipe(**args)[0]


def test_deepcopy_of_an_accelerated_pipeline_raises_and_the_original_keeps_working(pretend_cuda, flux_pipe):
    eager = _call(flux_pipe)
    bcg.accelerate_pipeline(flux_pipe)
    patches = installed_patches()
    with pytest.raises(bcg.AccelerationError, match="remove_acceleration"):
        copy.deepcopy(flux_pipe)
    assert bcg.is_accelerated(flux_pipe) and installed_patches() == patches
    assert torch.equal(_call(flux_pipe), eager)
    bcg.remove_acceleration(flux_pipe)
    copied = copy.deepcopy(flux_pipe)  # fine once removed
    bcg.accelerate_pipeline(copied)
    assert bcg.is_accelerated(copied) and not bcg.is_accelerated(flux_pipe)
    bcg.remove_acceleration(copied)


def test_from_pipe_shares_the_acceleration_and_its_calls_re_read_weights(pretend_cuda, flux_pipe):
    bcg.accelerate_pipeline(flux_pipe)
    other = FluxPipeline.from_pipe(flux_pipe)
    assert bcg.is_accelerated(other) and acc._runners(other) == acc._runners(flux_pipe)
    runner = acc._runners(other)[0]
    assert not runner.state.every_call
    first = runner.state.weights.current()
    with torch.no_grad():
        next(other.transformer.parameters()).add_(1)
    assert runner.state.weights.current() == first  # read once per pipeline call
    _call(other)  # the end of any pipeline call sharing the transformer re-reads
    assert runner.state.weights.current() != first
    bcg.remove_acceleration(other)
    assert not bcg.is_accelerated(flux_pipe)


def test_a_pipeline_for_a_thread_shares_the_acceleration_and_its_calls_re_read_weights(pretend_cuda, flux_pipe):
    bcg.accelerate_pipeline(flux_pipe)
    other = bcg.pipeline_for_thread(flux_pipe)
    assert bcg.is_accelerated(other) and acc._runners(other) == acc._runners(flux_pipe)
    assert other.tokenizer is not flux_pipe.tokenizer and other.scheduler is not flux_pipe.scheduler
    runner = acc._runners(other)[0]
    first = runner.state.weights.current()
    with torch.no_grad():
        next(other.transformer.parameters()).add_(1)
    _call(other)  # the end of its pipeline call re-reads, as for the first pipeline's
    assert runner.state.weights.current() != first
    bcg.remove_acceleration(other)
    assert not bcg.is_accelerated(flux_pipe)


def _refusal_setups():
    def casting(model):
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)

    def group_offload(model):
        apply_group_offloading(
            model, onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="leaf_level"
        )

    def cpu_offload(model):
        import accelerate

        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))

    def text_kv(model):
        from diffusers.hooks.hooks import StateManager
        from diffusers.hooks.text_kv_cache import TextKVCacheState, TextKVCacheTransformerHook

        HookRegistry.check_if_exists_or_initialize(model).register_hook(
            TextKVCacheTransformerHook(StateManager(TextKVCacheState)), "text_kv_cache_transformer"
        )

    return [
        (casting, "LayerwiseCastingHook.*enable_layerwise_casting"),
        (group_offload, "GroupOffloadingHook.*Turn it off"),
        (cpu_offload, "accelerate hooks.*Turn offloading off"),
        (text_kv, "TextKVCacheTransformerHook.*data_ptr"),
    ]


@pytest.mark.parametrize("setup, message", _refusal_setups(), ids=["layerwise_casting", "group_offload", "cpu_offload", "text_kv_cache"])
def test_weight_moving_hooks_are_refused_before_and_after_acceleration(pretend_cuda, setup, message):
    model = _transformer()
    setup(model)
    with pytest.raises(bcg.AccelerationError, match=message):
        bcg.accelerate_transformer(model)
    assert not bcg.is_accelerated(model)

    model = _transformer()
    bcg.accelerate_transformer(model)
    setup(model)
    with pytest.raises(bcg.AccelerationError, match=message), torch.no_grad():
        model(**_inputs())


def test_step_cache_blocks_get_interceptors_and_lose_them_with_the_cache(pretend_cuda, flux_pipe):
    twin = pipelines.build_pipeline("flux", size="tiny", device="cpu", dtype=torch.float32, seed=0)
    for pipe in (flux_pipe, twin):
        pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    bcg.accelerate_pipeline(flux_pipe)
    blocks = [flux_pipe.transformer.transformer_blocks[0], flux_pipe.transformer.single_transformer_blocks[0]]
    for block in blocks:
        assert "_call_impl" in block.__dict__ and _order(block)[0] == "bcg_body"
    assert torch.equal(_call(flux_pipe), _call(twin))
    flux_pipe.transformer.disable_cache()
    _call(flux_pipe)  # the next pipeline call sees the new structure
    for block in blocks:
        assert "_call_impl" not in block.__dict__ and "bcg_body" not in block._diffusers_hook.hooks
    flux_pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.2))  # again, after acceleration
    _call(flux_pipe)
    assert all(_order(b)[0] == "bcg_body" for b in blocks)
    runner = acc._runners(flux_pipe)[0]
    assert runner.counts.structure_changes == 2
    bcg.remove_acceleration(flux_pipe)
    for block in blocks:
        assert "_call_impl" not in block.__dict__ and "bcg_body" not in block._diffusers_hook.hooks
        assert _order(block) in (["fbc_leader_block_hook"], ["fbc_block_hook"])


def test_a_cache_enabled_between_acceleration_and_the_first_call_is_seen(pretend_cuda, flux_pipe):
    bcg.accelerate_pipeline(flux_pipe)
    flux_pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.5))
    _call(flux_pipe)
    block = flux_pipe.transformer.transformer_blocks[0]
    assert "_call_impl" in block.__dict__ and _order(block)[0] == "bcg_body"
    bcg.remove_acceleration(flux_pipe)


def test_processor_and_backend_changes_are_structure_changes(pretend_cuda):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    previous_global = _AttentionBackendRegistry._active_backend
    model = _transformer()
    bcg.accelerate_transformer(model)
    runner: GraphRunner = acc._runners(model)[0]
    with torch.no_grad():
        model(**_inputs())
        model.set_attn_processor(FluxAttnProcessor())
        model(**_inputs())
        assert runner.counts.structure_changes == 1
        model.set_attention_backend("_native_math")
        model(**_inputs())
        assert runner.counts.structure_changes == 2
        model(**_inputs())
    assert runner.counts.structure_changes == 2
    bcg.remove_acceleration(model)
    _AttentionBackendRegistry.set_active_backend(previous_global)  # set_attention_backend set it globally


def test_torch_forward_hooks_make_a_module_hooked_with_an_eager_body(pretend_cuda):
    model = _transformer()
    bcg.accelerate_transformer(model)
    seen = []
    handle = model.transformer_blocks[0].register_forward_hook(lambda m, a, o: seen.append(1))
    runner = acc._runners(model)[0]
    with torch.no_grad():
        model(**_inputs())
    (hooked,) = runner.state.structure().hooked
    assert hooked.path == "transformer_blocks.0" and not hooked.rule.replay_body and seen == [1]
    handle.remove()
    bcg.remove_acceleration(model)
    assert "_call_impl" not in model.transformer_blocks[0].__dict__


def test_global_module_hooks_are_refused(pretend_cuda):
    model = _transformer()
    bcg.accelerate_transformer(model)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        with pytest.raises(bcg.AccelerationError, match="global torch module hooks"), torch.no_grad():
            model(**_inputs())
    finally:
        handle.remove()
    bcg.remove_acceleration(model)


def test_key_state_holds_math_modes_default_dtype_and_the_attention_backend():
    from diffusers.models.attention_dispatch import attention_backend

    from bcg_diffusion.integration.keys import active_attention_backend as _active_attention_backend

    model = torch.nn.Linear(2, 2)
    base = keys.execution_state(model, (("attention_backend", _active_attention_backend()),))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not tf32
        assert keys.execution_state(model, base[-1:]) != base
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_default_dtype(torch.float64)
    try:
        assert keys.execution_state(model, base[-1:]) != base
    finally:
        torch.set_default_dtype(torch.float32)
    other = "_native_efficient" if str(_active_attention_backend().value) == "_native_math" else "_native_math"
    with attention_backend(other):
        assert keys.execution_state(model, (("attention_backend", _active_attention_backend()),)) != base
    with torch.inference_mode():
        assert keys.execution_state(model, base[-1:]) != base
    assert keys.execution_state(model, base[-1:]) == base


def test_bad_input_is_a_type_error_on_every_machine(monkeypatch, flux_pipe):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TypeError, match="needs a diffusers pipeline .* got NoneType"):
        bcg.accelerate_pipeline(None)
    with pytest.raises(TypeError, match="needs a torch.nn.Module .* got NoneType"):
        bcg.accelerate_transformer(None)
    with pytest.raises(TypeError, match="remove_acceleration needs a diffusers pipeline or a torch.nn.Module, got NoneType"):
        bcg.remove_acceleration(None)
    assert bcg.remove_acceleration(flux_pipe) is flux_pipe  # not accelerated: a no-op
    assert bcg.remove_acceleration(flux_pipe.transformer) is flux_pipe.transformer


def test_innermost_insertion_below_a_new_forward_hook_and_exact_removal():
    model = torch.nn.Linear(2, 2)

    class Doubling(ModelHook):
        def new_forward(self, module, *args, **kwargs):
            return self.fn_ref.original_forward(*args, **kwargs) * 2

    registry = HookRegistry.check_if_exists_or_initialize(model)
    registry.register_hook(Doubling(), "double")
    calls = []

    def make(below):
        def run(*args, **kwargs):
            calls.append(1)
            return below(*args, **kwargs)

        return run

    model_hooks.insert_innermost(model, model_hooks.ForwardHook(make), "bcg_test")
    x = torch.ones(1, 2)
    expected = torch.nn.functional.linear(x, model.weight, model.bias) * 2
    assert torch.equal(model(x), expected) and calls == [1]
    registry.register_hook(Doubling(), "double_again")
    model_hooks.remove_exactly(model, "bcg_test")
    assert torch.equal(model(x), expected * 2) and calls == [1]


def test_whole_forward_compile_refuses_hooked_submodules(pretend_cuda):
    model = _transformer()
    model.transformer_blocks[0].register_forward_hook(lambda m, a, o: None)
    with pytest.raises(bcg.AccelerationError, match="compile=True.*transformer_blocks.0"):
        bcg.accelerate_transformer(model, bcg.BCGConfig(compile=True))
    assert not bcg.is_accelerated(model)
