"""The small configs of the full-size zoo cases (``pipelines.zoo.full``) on the GPU: their pipeline-faithful call
in bf16 is captured by ``accelerate_transformer`` (every call after the first replays, no eager fallback) and every
replay, on latents that change from call to call, is bitwise equal to eager; ``remove_acceleration`` gives eager back."""

import pytest
import torch

import bcg_diffusion as bcg
from bcg_pipelines.zoo import full

from _replay import assert_replayed
from _tensors import all_equal, calls_on_variants, latent_variants, latents_of

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
CALLS = 4  # eager first call, capture, two replays


@pytest.mark.parametrize("name", list(full.FULL_CASES))
def test_small_config_is_captured_and_bitwise_equal_to_eager(name):
    case = full.FULL_CASES[name]
    model = full.build_model(case, "small", DEVICE, torch.bfloat16, seed=0)
    variants = latent_variants(latents_of(case.inputs("small", DEVICE, torch.bfloat16, seed=0)), CALLS)
    with torch.no_grad():
        eager = calls_on_variants(model, case.inputs("small", DEVICE, torch.bfloat16, seed=0), variants)
        bcg.accelerate_transformer(model)  # not in KNOWN_TRANSFORMERS: diffusers classes are taken by default
        try:
            outs = calls_on_variants(model, case.inputs("small", DEVICE, torch.bfloat16, seed=0), variants)
            assert_replayed(model, CALLS)
        finally:
            bcg.remove_acceleration(model)
        restored = calls_on_variants(model, case.inputs("small", DEVICE, torch.bfloat16, seed=0), variants[-1:])
    assert not all_equal(eager[0], eager[1]), f"{name}: the latents do not change the output"
    for i, (out, expected) in enumerate(zip(outs, eager)):
        assert all_equal(out, expected), f"{name}: call {i}"
    assert all_equal(restored[0], eager[-1]), name
