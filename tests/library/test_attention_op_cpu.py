"""CPU tests of the attention custom ops: registration, schema, fake implementations, and compiled
blocks that keep attention inside one graph (fullgraph=True)."""

import torch

from bcg_diffusion.core.handles import live_handles

import bcg_diffusion as bcg
from bcg_diffusion.integration import attention_op
from bcg_diffusion.integration.breaks import attention as attention_breaks

from _pipes import flux_inputs, tiny_flux_transformer


def _qkv(b=2, h=2, s=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g) for _ in range(3)]


def test_ops_are_registered_with_their_schemas():
    sdpa = str(torch.ops.bcg.sdpa.default._schema)
    dispatch = str(torch.ops.bcg.dispatch_attention.default._schema)
    assert sdpa.startswith("bcg::sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, bool enable_gqa) -> Tensor")
    assert "str? backend" in dispatch and dispatch.endswith("-> Tensor")


def test_sdpa_op_passes_opcheck_and_equals_sdpa():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 5) > 0.2
    args = (q, k, v, mask, 0.0, False, None, False)
    torch.library.opcheck(torch.ops.bcg.sdpa.default, args)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(torch.ops.bcg.sdpa(*args), expected)


def test_dispatch_op_fake_matches_the_real_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv())  # diffusers' (B, S, H, D)
    real = torch.ops.bcg.dispatch_attention(q, k, v, None, 0.0, False, None, False, "_native_math")
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fake = torch.ops.bcg.dispatch_attention(fq, fk, fv, None, 0.0, False, None, False, "_native_math")
    assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype


def test_compiled_blocks_keep_attention_in_one_graph(pretend_cuda, monkeypatch):
    model, inputs = tiny_flux_transformer(), flux_inputs()
    with torch.no_grad():
        eager = model(**inputs)[0]
    bcg.accelerate_transformer(model)
    monkeypatch.undo()  # torch.compile must see the real (CPU-only) machine
    seen = []
    eager_call = attention_op._eager_call
    monkeypatch.setattr(attention_op, "_eager_call", lambda kind, fallback: seen.append(kind) or eager_call(kind, fallback))
    torch._dynamo.reset()
    model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")  # a graph break would raise
    with torch.no_grad():
        compiled = model(**inputs)[0]
    assert seen and set(seen) == {"dispatch"}  # attention ran through the custom op
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    bcg.remove_acceleration(model)
    torch._dynamo.reset()


def test_traced_calls_without_a_schema_stay_eager_calls():
    calls = []

    def eager(*args, **kwargs):
        calls.append(kwargs)
        return args[0]

    q = torch.randn(1, 3, 2, 4)

    @torch.compile(backend="eager")
    def f(x):
        return attention_op.traced_call("dispatch", eager, (x, x, x), {"attention_kwargs": {"extra": 1}})

    assert torch.equal(f(q), q) and calls and calls[0]["attention_kwargs"] == {"extra": 1}
    torch._dynamo.reset()


def test_capture_safe_backends_are_the_native_sdpa_ones():
    assert attention_breaks._capture_safe("sdpa", {})
    assert attention_breaks._capture_safe("dispatch", {"backend": "_native_flash"})
    assert not attention_breaks._capture_safe("dispatch", {"backend": "flash_varlen"})
    assert not attention_breaks._capture_safe("dispatch", {"backend": "native", "parallel_config": object()})


def test_a_native_backend_replaced_in_the_registry_is_not_capture_safe(monkeypatch):
    from diffusers.models import attention_dispatch as ad

    registry = ad._AttentionBackendRegistry._backends
    monkeypatch.setitem(registry, ad.AttentionBackendName.NATIVE, lambda *a, **k: None)
    assert not attention_breaks._capture_safe("dispatch", {"backend": ad.AttentionBackendName.NATIVE})
