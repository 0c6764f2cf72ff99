"""Buffers a forward reassigns during a call are its state, with captured graphs: OmniGen (its rope sets
``self.inv_freq`` on every call) is captured by default and bitwise; a running state read from the
buffer before it is reassigned replays like eager (test_forward_state_cpu.py has the plumbing)."""

import copy

import pytest
import torch

import bcg_diffusion as bcg
from bcg_pipelines import zoo

from _tensors import all_equal, calls_on_variants, cloned, latent_variants, latents_of

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")


def test_omnigen_is_captured_by_default_and_bitwise():
    case = next(c for c in zoo.zoo_cases() if c.name == "OmniGenTransformer2DModel")
    model = zoo.build_tiny(case, DEVICE, torch.bfloat16, 0)
    twin = copy.deepcopy(model)
    inputs = zoo.tiny_inputs(case, DEVICE, torch.bfloat16, 0)
    variants = latent_variants(latents_of(inputs), 6)
    with torch.no_grad():
        eager = calls_on_variants(twin, inputs, variants)
        bcg.accelerate_transformer(model)
        outs = calls_on_variants(model, inputs, variants[:1])
        # the rope's first call replaces the bf16 buffer (model.to(bfloat16) cast it) with a float32 one:
        # a real registration, as in the eager twin; from then on the value is written into that buffer
        buffer = model.rope.inv_freq
        outs += calls_on_variants(model, inputs, variants[1:])
    stats = bcg.get_stats(model)
    bcg.remove_acceleration(model)
    # first calls: the first; the second (the buffer re-registered as float32 changed the key); the third
    # (the second call found the buffer to be forward state: the key no longer counts its version). Then
    # the capture (the rope reads a value on the host: it runs as an eager break, one warning) and replays.
    assert (stats.warmup_calls, stats.hits, stats.eager_calls, stats.failed_captures) == (3, 3, 0, 0), str(stats)
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)
    assert [e.eager_modules for e in stats.entries] == [("rope",)], str(stats)
    assert model.rope.inv_freq is buffer and buffer.dtype == torch.float32
    assert not all_equal(eager[0], eager[1])
    for i, (out, expected) in enumerate(zip(outs, eager)):
        assert all_equal(out, expected), f"call {i}"


class Recurrent(torch.nn.Module):
    """A running state in a buffer, reassigned from its old value on every call, read by captured code."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)
        self.register_buffer("state", torch.zeros(8, 64), persistent=False)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x):
        self.state = 0.5 * self.state + self.proj(x)
        return self.out(self.state)


def test_a_running_state_in_a_buffer_replays_like_eager():
    torch.manual_seed(0)
    model = Recurrent().to(DEVICE)
    twin = copy.deepcopy(model)
    buffer = model.state
    xs = [torch.randn(8, 64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(i)) for i in range(5)]
    with torch.no_grad():
        eager = [cloned(twin(x)) for x in xs]
        bcg.accelerate_transformer(model, bcg.BCGConfig(allow_unknown=True))
        outs = [cloned(model(x)) for x in xs]
    stats = bcg.get_stats(model)
    bcg.remove_acceleration(model)
    assert stats.hits == 3 and stats.captures == 1 and stats.eager_calls == 0, str(stats)
    assert model.state is buffer and torch.equal(model.state, twin.state)
    for i, (out, expected) in enumerate(zip(outs, eager)):
        assert all_equal(out, expected), f"call {i}"
