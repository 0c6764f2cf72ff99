"""The small configs of the full-size zoo cases (``pipelines.zoo.full``) on the GPU: their pipeline-faithful call
in bf16 is captured by ``accelerate_transformer`` (at least one key, not an eager fallback) and every replay is
bitwise equal to eager; ``remove_acceleration`` gives eager back."""

import pytest
import torch

import bcg_diffusion as bcg
from bcg_pipelines.zoo import full

pytestmark = pytest.mark.gpu


def _tensors(out):
    from bcg_diffusion.core.tree import walk

    return [leaf.clone() for _, _, leaf in walk(out, objects=True) if isinstance(leaf, torch.Tensor)]


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", list(full.FULL_CASES))
def test_small_config_is_captured_and_bitwise_equal_to_eager(name):
    case = full.FULL_CASES[name]
    device = torch.device("cuda")
    model = full.build_model(case, "small", device, torch.bfloat16, seed=0)
    inputs = case.inputs("small", device, torch.bfloat16, seed=0)
    with torch.no_grad():
        eager = _tensors(model(**inputs))
        bcg.accelerate_transformer(model)  # not in KNOWN_TRANSFORMERS: diffusers classes are taken by default
        try:
            outs = [_tensors(model(**inputs)) for _ in range(4)]  # eager first call, capture, two replays
            stats = bcg.get_stats(model)
        finally:
            bcg.remove_acceleration(model)
        restored = _tensors(model(**inputs))
    for out in outs:
        assert _equal(out, eager), name
    assert _equal(restored, eager), name
    captured = [e for e in stats.entries if e.fallback is None]
    assert captured, str(stats)
    assert stats.hits >= 2, str(stats)
