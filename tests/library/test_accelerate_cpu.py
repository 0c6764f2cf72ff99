"""CPU tests of the integration: config, keys, patching and undo, the no-op paths, errors."""

import warnings

import pytest
import torch

from diffusers import ModelMixin

import bcg_diffusion as bcg
from bcg_diffusion import accelerate as acc
from bcg_diffusion.integration import fingerprint
from bcg_diffusion.integration.breaks.shared import installed_patches
from bcg_diffusion.integration.keys import GRAD_MODE_FIELDS, GraphKey, UncacheableInput, flatten_inputs, rebuild_inputs
from bcg_diffusion.families import TransformerInfo
from bcg_diffusion.integration.text_buckets import bucket_for, pad_text_to_bucket


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"max_graphs": 0}, "max_graphs"),
        ({"warmup_iters": 0}, "warmup_iters"),
        ({"memory_budget_bytes": -1}, "memory_budget_bytes"),
        ({"text_buckets": (256, 128)}, "strictly increasing"),
        ({"text_buckets": ()}, "text_buckets"),
        ({"eager_modules": "transformer_blocks.0"}, "write eager_modules=('transformer_blocks.0',)"),
        ({"debug": "yes"}, "debug must be a bool"),
        ({"max_graphs": True}, "max_graphs"),
    ],
)
def test_config_validation(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        bcg.BCGConfig(**kwargs)
    assert fragment in str(err.value)


def test_config_environment_debug(monkeypatch):
    monkeypatch.setenv("BCG_DIFFUSION_DEBUG", "1")
    assert bcg.BCGConfig().with_environment().debug
    monkeypatch.setenv("BCG_DIFFUSION_DEBUG", "maybe")
    with pytest.raises(ValueError, match="BCG_DIFFUSION_DEBUG"):
        bcg.BCGConfig().with_environment()


def test_keys_capture_shapes_values_and_nesting():
    a = torch.zeros(2, 3)
    fields, tensors = flatten_inputs((a,), {"t": torch.ones(2), "joint_attention_kwargs": {"scale": 0.5}, "flag": None})
    assert len(tensors) == 2 and tensors[0] is a
    key1 = GraphKey(fields, (), 0)
    fields2, _ = flatten_inputs((a,), {"t": torch.ones(2), "joint_attention_kwargs": {"scale": 0.7}, "flag": None})
    key2 = GraphKey(fields2, (), 0)
    assert key1 != key2 and hash(key1) != hash(key2)
    assert "joint_attention_kwargs['scale']: 0.5 -> 0.7" in key2.difference(key1)
    fields3, _ = flatten_inputs((torch.zeros(4, 3),), {"t": torch.ones(2), "joint_attention_kwargs": {"scale": 0.5}, "flag": None})
    assert "args[0]: tensor[2, 3] float32 cpu -> tensor[4, 3] float32 cpu" in GraphKey(fields3, (), 0).difference(key1)
    assert GraphKey(fields, (), 1).difference(key1).startswith("weights")
    assert GraphKey(fields, (), 0) == key1


def test_keys_that_differ_only_in_grad_mode_are_recognised():
    fields, _ = flatten_inputs((torch.zeros(2, 3),), {"t": torch.ones(2)})
    state = (("grad_enabled", False), ("inference_mode", False), ("training", False))
    inference = (("grad_enabled", False), ("inference_mode", True), ("training", False))
    training = (("grad_enabled", False), ("inference_mode", True), ("training", True))
    warmed = GraphKey(fields, state, 0)
    assert GraphKey(fields, inference, 0).differs_only_in(warmed, GRAD_MODE_FIELDS) == ("inference_mode",)
    assert GraphKey(fields, training, 0).differs_only_in(warmed, GRAD_MODE_FIELDS) == ()  # training differs too
    assert GraphKey(fields, inference, 1).differs_only_in(warmed, GRAD_MODE_FIELDS) == ()  # other weights
    other, _ = flatten_inputs((torch.zeros(4, 3),), {"t": torch.ones(2)})
    assert GraphKey(other, inference, 0).differs_only_in(warmed, GRAD_MODE_FIELDS) == ()  # another shape
    assert warmed.differs_only_in(warmed, GRAD_MODE_FIELDS) == ()  # the same key


def test_rebuild_replaces_tensors_in_order():
    x, y = torch.zeros(1), torch.ones(1)
    args, kwargs = (x, [y, 3]), {"d": {"k": x}}
    _, tensors = flatten_inputs(args, kwargs)
    new = [torch.full((1,), float(i)) for i in range(len(tensors))]
    a2, k2 = rebuild_inputs(args, kwargs, new)
    assert a2[0] is new[0] and a2[1][0] is new[1] and a2[1][1] == 3 and k2["d"]["k"] is new[2]


def test_uncacheable_input_is_reported():
    with pytest.raises(UncacheableInput, match="kw is a object"):
        flatten_inputs((), {"kw": object()})


def test_weights_fingerprint_sees_in_place_writes_and_new_parameters():
    model = torch.nn.Linear(3, 3)
    with fingerprint.registration_hooks():
        fp = fingerprint.WeightsFingerprint(model)
        first = fp.compute()
        assert fp.compute() == first
        with torch.no_grad():
            model.weight.add_(1)
        second = fp.compute()
        assert second != first
        model.extra = torch.nn.Parameter(torch.zeros(1))
        assert fp.compute() != second


def test_text_buckets_pad_with_masked_tokens():
    info = TransformerInfo(text_kwarg="enc", text_mask_kwarg="mask")
    kwargs = {"enc": torch.ones(2, 5, 4), "mask": torch.ones(2, 5, dtype=torch.long)}
    padded = pad_text_to_bucket(info, (8, 16), kwargs)
    assert padded["enc"].shape == (2, 8, 4) and padded["mask"].shape == (2, 8)
    assert padded["mask"][:, 5:].sum() == 0 and torch.equal(padded["enc"][:, :5], kwargs["enc"])
    assert pad_text_to_bucket(info, None, kwargs) is kwargs
    no_mask = pad_text_to_bucket(info, (8,), {"enc": kwargs["enc"], "mask": None})
    assert no_mask["enc"].shape == (2, 8, 4) and no_mask["mask"].dtype == torch.bool
    assert no_mask["mask"].sum().item() == 10
    other = TransformerInfo()
    assert pad_text_to_bucket(other, (8,), kwargs) is kwargs
    assert bucket_for(17, (8, 16)) is None and bucket_for(9, (8, 16)) == 16


class FluxTransformer2DModel(ModelMixin):
    """A stand-in with the class name of a family's transformer, a diffusers model class (runs on CPU)."""

    def __init__(self):
        super().__init__()
        self.transformer_blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, hidden_states, scale=1.0):
        q = self.transformer_blocks[0](hidden_states)
        att = torch.nn.functional.scaled_dot_product_attention(q[None], q[None], q[None])[0]
        return (self.transformer_blocks[1](att) * scale,)


class FakePipe:
    def __init__(self):
        self.transformer = FluxTransformer2DModel()
        self.vae = torch.nn.Identity()

    @property
    def components(self):
        return {"transformer": self.transformer, "vae": self.vae}


def test_no_cuda_is_a_no_op_with_one_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(acc, "_warned", set())
    pipe = FakePipe()
    with pytest.warns(RuntimeWarning, match="needs a CUDA GPU"):
        assert bcg.accelerate_pipeline(pipe) is pipe
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bcg.accelerate_pipeline(pipe)  # warned once only
    assert not bcg.is_accelerated(pipe) and not bcg.get_stats(pipe).active  # a BCGStats on every machine
    assert "forward" not in pipe.transformer.__dict__


def test_env_switch_off_is_a_no_op(monkeypatch):
    monkeypatch.setenv("BCG_DIFFUSION", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(acc, "_warned", set())
    pipe = FakePipe()
    with pytest.warns(RuntimeWarning, match="BCG_DIFFUSION=0"):
        bcg.accelerate_pipeline(pipe)
    assert not bcg.is_accelerated(pipe)


def test_patching_and_exact_undo(pretend_cuda):
    pipe = FakePipe()
    x = torch.randn(3, 4)
    eager = pipe.transformer(x)[0]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    bcg.accelerate_pipeline(pipe)
    assert bcg.is_accelerated(pipe) and "forward" in pipe.transformer.__dict__
    assert torch.nn.functional.scaled_dot_product_attention is not sdpa
    assert ("torch.nn.functional", "scaled_dot_product_attention") in installed_patches()
    with pytest.raises(bcg.AccelerationError, match="already accelerated"):
        bcg.accelerate_pipeline(pipe)
    out = pipe.transformer(x)[0]  # CPU inputs: runs eagerly through the runner
    assert torch.equal(out, eager)
    stats = bcg.get_stats(pipe)
    assert stats.eager_calls == 1 and stats.captures == 0
    bcg.remove_acceleration(pipe)
    assert "forward" not in pipe.transformer.__dict__
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    assert installed_patches() == []
    assert not bcg.is_accelerated(pipe)
    bcg.accelerate_pipeline(pipe)  # can be applied again after removal
    bcg.remove_acceleration(pipe)


def test_patches_are_reference_counted(pretend_cuda):
    a, b = FluxTransformer2DModel(), FluxTransformer2DModel()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    bcg.accelerate_transformer(a)
    bcg.accelerate_transformer(b)
    bcg.remove_acceleration(a)
    assert torch.nn.functional.scaled_dot_product_attention is not sdpa  # b still needs it
    bcg.remove_acceleration(b)
    assert torch.nn.functional.scaled_dot_product_attention is sdpa


def test_eager_modules_patch_and_restore(pretend_cuda):
    model = FluxTransformer2DModel()
    bcg.accelerate_transformer(model, bcg.BCGConfig(eager_modules=("transformer_blocks.1",)))
    assert "forward" in model.transformer_blocks[1].__dict__
    bcg.remove_acceleration(model)
    assert "forward" not in model.transformer_blocks[1].__dict__
    with pytest.raises(ValueError, match="no submodule .* \\['nope'\\]"):
        bcg.accelerate_transformer(model, bcg.BCGConfig(eager_modules=("nope",)))
    assert not bcg.is_accelerated(model) and "forward" not in model.__dict__


def test_unknown_transformer_needs_opt_in(pretend_cuda):
    class MyDiT(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(bcg.UnknownTransformerError, match="MyDiT.*allow_unknown=True"):
        bcg.accelerate_transformer(MyDiT())
    model = bcg.accelerate_transformer(MyDiT(), bcg.BCGConfig(allow_unknown=True))
    assert bcg.is_accelerated(model)
    bcg.remove_acceleration(model)


def test_families_take_the_generic_path_and_allow_unknown_false_takes_only_classes_with_knowledge():
    from bcg_diffusion.families import KNOWN_TRANSFORMERS, transformer_info

    flux = type("FluxTransformer2DModel", (ModelMixin,), {})()  # a family's class: no per-class entry
    qwen = type("QwenImageTransformer2DModel", (ModelMixin,), {})()
    assert transformer_info(flux, None) == TransformerInfo()
    assert transformer_info(qwen, None) is KNOWN_TRANSFORMERS["QwenImageTransformer2DModel"]
    assert transformer_info(qwen, False).text_mask_kwarg == "encoder_hidden_states_mask"
    with pytest.raises(bcg.UnknownTransformerError, match="FluxTransformer2DModel.*allow_unknown=False limits it to"):
        transformer_info(flux, False)


def test_offloaded_pipeline_is_refused(pretend_cuda):
    pipe = FakePipe()
    pipe._offload_gpu_id = 0
    pipe._all_hooks = [object()]
    with pytest.raises(bcg.AccelerationError, match="model CPU offload"):
        bcg.accelerate_pipeline(pipe)
    pipe = FakePipe()
    pipe.transformer._hf_hook = object()
    with pytest.raises(bcg.AccelerationError, match="Turn offloading off"):
        bcg.accelerate_pipeline(pipe)
    assert "forward" not in pipe.transformer.__dict__


def test_not_a_pipeline():
    with pytest.raises(TypeError, match="use accelerate_transformer"):
        acc._transformers_of(object())


def test_every_denoising_transformer_component_is_taken():
    """Wan 2.2's transformer_2 and Ideogram's unconditional_transformer are transformers too (the pipeline zoo found
    the latter left eager); text encoders and the VAE are not."""
    class Pipe:
        components = {name: torch.nn.Linear(1, 1) for name in
                      ("transformer", "transformer_2", "unconditional_transformer", "text_encoder", "vae")}
        components["scheduler"] = object()

    assert [name for name, _ in acc._transformers_of(Pipe())] == ["transformer", "transformer_2", "unconditional_transformer"]


def test_bare_transformer_checks_weights_every_call(pretend_cuda):
    model = bcg.accelerate_transformer(FluxTransformer2DModel())
    runner = acc._runners(model)[0]
    first = runner.state.weights.current()
    with torch.no_grad():
        model.transformer_blocks[0].weight.add_(1)
    assert runner.state.weights.current() != first
    bcg.remove_acceleration(model)


def test_family_eager_functions_are_patched_and_restored(pretend_cuda):
    import sys
    import types

    module = types.ModuleType("fake_qwen_module")
    module.compute_text_seq_len_from_mask = lambda x: x
    sys.modules["fake_qwen_module"] = module
    try:
        cls = type("QwenImageTransformer2DModel", (FluxTransformer2DModel,), {"__module__": "fake_qwen_module"})
        model = bcg.accelerate_transformer(cls())
        assert module.compute_text_seq_len_from_mask(3) == 3  # a plain call outside capture
        assert hasattr(module.compute_text_seq_len_from_mask, "__bcg_original__")
        bcg.remove_acceleration(model)
        assert not hasattr(module.compute_text_seq_len_from_mask, "__bcg_original__")
    finally:
        del sys.modules["fake_qwen_module"]


def test_config_must_be_a_bcgconfig():
    with pytest.raises(TypeError, match="must be a bcg_diffusion.BCGConfig, got dict"):
        bcg.accelerate_pipeline(FakePipe(), {"debug": True})
    with pytest.raises(TypeError, match="must be a bcg_diffusion.BCGConfig, got dict"):
        bcg.accelerate_transformer(FluxTransformer2DModel(), {"debug": True})


def test_fingerprint_looks_through_wrapper_tensor_subclasses():
    class Wrapped(torch.Tensor):
        """A minimal wrapper subclass like torchao's: data in inner tensors, data_ptr() of the wrapper is 0."""

        @staticmethod
        def __new__(cls, qdata, scale):
            return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.float32)

        def __init__(self, qdata, scale):
            self.qdata, self.scale = qdata, scale

        def __tensor_flatten__(self):
            return ["qdata", "scale"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(func)

    qdata, scale = torch.zeros(4, 4, dtype=torch.int8), torch.ones(1)
    weight = Wrapped(qdata, scale)
    assert fingerprint.storage_tensors(weight) == [qdata, scale]
    model = torch.nn.Module()
    model.register_buffer("weight", weight)
    fp = fingerprint.WeightsFingerprint(model)
    first = fp.compute()
    qdata.add_(1)  # an in-place write to the inner data
    assert fp.compute() != first
    requantized = fp.compute()
    model.weight.scale = torch.full((1,), 2.0)  # a new inner tensor (re-quantized)
    assert fp.compute() != requantized


def test_tensor_parallel_transformers_are_refused_in_either_order(pretend_cuda):
    """Context parallelism is accepted (tests/integrations/test_parallel_cpu.py); tensor parallelism is not."""
    import types

    class ParallelDiT(torch.nn.Module):
        def forward(self, x):
            return x

    tensor_parallel = types.SimpleNamespace(tensor_parallel_config=object(), context_parallel_config=None)
    model = ParallelDiT()
    model._parallel_config = tensor_parallel  # what diffusers' enable_parallelism sets
    with pytest.raises(bcg.AccelerationError, match="tensor parallelism.*docs/multi-gpu.md"):
        bcg.accelerate_transformer(model, bcg.BCGConfig(allow_unknown=True))
    assert not bcg.is_accelerated(model)
    model._parallel_config = None
    bcg.accelerate_transformer(model, bcg.BCGConfig(allow_unknown=True))
    model._parallel_config = tensor_parallel  # enabled after accelerating: refused at the next call
    with pytest.raises(bcg.AccelerationError, match="does not replay tensor-parallel transformers"):
        model(torch.ones(1))
    bcg.remove_acceleration(model)
