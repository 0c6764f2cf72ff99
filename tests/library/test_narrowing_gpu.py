"""A capture failure is never a crash, with captured graphs: a torch function wrapped process-wide by a
function that reads a value on the host (issue 37's crash) is narrowed to the modules that call it and
the rest replays; random numbers drawn in an eager break at capture do not move torch's generators."""

import copy
import warnings

import pytest
import torch

import bcg_diffusion as bcg
from bcg_pipelines import zoo

from _replay import assert_replayed
from _tensors import all_equal, calls_on_variants, cloned, latent_variants, latents_of

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
CALLS = 4  # eager first call, capture, two replays


def test_a_gelu_that_reads_a_value_on_the_host_is_narrowed_to_the_feed_forward(monkeypatch):
    case = next(c for c in zoo.zoo_cases() if c.name == "FluxTransformer2DModel")
    model = zoo.build_tiny(case, DEVICE, torch.bfloat16, 0)
    twin = copy.deepcopy(model)
    original = torch.nn.functional.gelu

    def reading_gelu(x, approximate="none"):  # a debugging tool's wrapper, installed process-wide
        scale = 1.0 + (x.float().abs().mean().item() % 1.0) * 1e-2
        return original(x, approximate=approximate) * scale

    monkeypatch.setattr(torch.nn.functional, "gelu", reading_gelu)
    inputs = zoo.tiny_inputs(case, DEVICE, torch.bfloat16, 0)
    variants = latent_variants(latents_of(inputs), CALLS)
    with torch.no_grad():
        eager = calls_on_variants(twin, inputs, variants)
        bcg.accelerate_transformer(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = calls_on_variants(model, inputs, variants)
    try:
        assert_replayed(model, CALLS)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert not all_equal(eager[0], eager[1]), "the latents do not change the output"
    for i, (out, expected) in enumerate(zip(outs, eager)):
        assert all_equal(out, expected), f"call {i}"
    messages = [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]
    assert len(messages) == 1, messages
    assert "transformer_blocks.0.ff.net.0" in messages[0] and "item" in messages[0], messages[0]
    assert any("ff.net.0" in m for m in stats.entries[0].eager_modules), stats


class DroppingLinear(torch.nn.Linear):
    """Dropout in train mode inside a module that runs as an eager break."""

    def forward(self, x):
        return torch.nn.functional.dropout(super().forward(x), p=0.2, training=True)


class Noisy(torch.nn.Module):
    """Random numbers in a captured segment and in a module that runs as an eager break."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 64), DroppingLinear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        x = self.b(self.a(x))  # self.b runs as an eager break: at capture it runs once on placeholders
        return self.c(x + torch.randn_like(x) * 0.1)


def test_random_numbers_in_an_eager_break_replay_what_eager_draws():
    torch.manual_seed(0)
    model = Noisy().to(DEVICE)
    twin = copy.deepcopy(model)
    xs = [torch.randn(8, 64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(i)) for i in range(CALLS)]

    def run(m):
        outs = []
        with torch.no_grad():
            for i, x in enumerate(xs):
                torch.manual_seed(100 + i)
                outs.append(cloned(m(x)))
        return outs

    eager = run(twin)
    bcg.accelerate_transformer(model, bcg.BCGConfig(allow_unknown=True, eager_modules=("b",)))
    try:
        outs = run(model)
        assert_replayed(model, CALLS)
        assert bcg.get_stats(model).entries[0].breaks >= 1
    finally:
        bcg.remove_acceleration(model)
    for i, (out, expected) in enumerate(zip(outs, eager)):
        assert all_equal(out, expected), f"call {i}"
