"""The model zoo on the GPU: the nine classes that used to run every call eagerly are captured now
(narrowing to a method or class, host values in the key, module mode) and bitwise equal to eager;
a call that changes its own input object runs eagerly."""

import pytest
import torch

import bcg_diffusion as bcg
from bcg_pipelines import zoo

pytestmark = pytest.mark.gpu

NINE = [
    "LTX2VideoTransformer3DModel",
    "HunyuanVideo15Transformer3DModel",
    "HiDreamImageTransformer2DModel",
    "HunyuanVideoFramepackTransformer3DModel",
    "GlmImageTransformer2DModel",
    "JoyImageEditPlusTransformer3DModel",
    "NucleusMoEImageTransformer2DModel",
    "HunyuanDiT2DModel",
    "WanAnimate2Transformer3DModel",
]
CASES = {case.name: case for case in zoo.zoo_cases()}


def _tensors(out):
    from bcg_diffusion.core.tree import walk

    return [leaf.clone() for _, _, leaf in walk(out, objects=True) if isinstance(leaf, torch.Tensor)]


def _probe(name):
    """Eager, then three accelerated calls on the same inputs (a pipeline reuses its input objects,
    such as a KV cache, across the steps of one image)."""
    case = CASES[name]
    model = zoo.build_tiny(case, torch.device("cuda"), torch.bfloat16, 0)
    inputs = zoo.tiny_inputs(case, torch.device("cuda"), torch.bfloat16, 0)
    with torch.no_grad():
        eager = _tensors(model(**inputs))
        bcg.accelerate_transformer(model)  # not in KNOWN_TRANSFORMERS: diffusers classes are taken by default
        outs = [_tensors(model(**inputs)) for _ in range(3)]
    stats = bcg.get_stats(model)
    bcg.remove_acceleration(model)
    return eager, outs, stats


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", NINE)
def test_formerly_eager_classes_are_captured_and_bitwise(name):
    eager, outs, stats = _probe(name)
    for out in outs:
        assert _equal(out, eager), name
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)
    assert stats.hits >= 2 and stats.eager_calls == 0, str(stats)


def test_a_call_that_writes_its_input_object_runs_eagerly():
    eager, outs, stats = _probe("WanAnimate2Transformer3DModel[extract]")
    for out in outs:
        assert _equal(out, eager)
    # its state changes every call, so every call is a new key's first (eager) call: nothing replays
    assert stats.captures == 0 and stats.hits == 0 and stats.warmup_calls + stats.eager_calls >= 3, str(stats)
