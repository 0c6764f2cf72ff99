"""The planting harness on the GPU, a bounded subset: every (site kind, kind) pair once over twelve
classes, with captured graphs. The full run (600 plants over every class) is
``python -m bcg_diffusion.checks.planting`` (docs/testing.md)."""

import pytest
import torch

from bcg_diffusion.checks import planting
from bcg_diffusion.checks.planting_kinds import KINDS
from bcg_diffusion.checks.planting_sites import SITE_KINDS

pytestmark = pytest.mark.gpu

CLASSES = ",".join([
    "FluxTransformer2DModel", "SD3Transformer2DModel", "PixArtTransformer2DModel", "WanTransformer3DModel",
    "QwenImageTransformer2DModel", "HunyuanVideoTransformer3DModel", "LTXVideoTransformer3DModel",
    "CogView4Transformer2DModel", "OmniGenTransformer2DModel", "Lumina2Transformer2DModel",
    "ChromaTransformer2DModel", "HiDreamImageTransformer2DModel",
])


def test_planted_work_never_crashes_and_the_rest_replays_bitwise():
    pairs = len(SITE_KINDS) * len(KINDS)
    results = planting.run(0, pairs, torch.device("cuda"), torch.bfloat16, time_budget=150.0, classes=CLASSES)
    ran = [r for r in results if r.status in ("ok", "different", "crash")]
    detail = "\n".join(f"{r.index} {r.case} {r.site} {r.kind}: {r.status} replayed {r.replayed_calls} named {r.named} "
                       f"{r.error or r.suspicious}" for r in results if not r.passed)
    assert len(ran) >= 0.8 * pairs, f"only {len(ran)} of {pairs} plants ran:\n{detail}"
    assert not [r for r in ran if r.status == "crash"], detail
    assert not [r for r in ran if r.status == "different" and not r.assumption], detail
    assert sum(r.replayed_calls > 0 for r in ran) >= 0.9 * len(ran), detail
    assert not [r for r in ran if r.named is False], detail
    assert not [r for r in ran if r.suspicious], detail
    assert {r.site_kind for r in ran} == set(SITE_KINDS) and len({r.kind for r in ran}) == len(KINDS)
