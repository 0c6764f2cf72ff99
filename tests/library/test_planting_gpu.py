"""The planting harness on the GPU, a bounded subset: every (site kind, kind) pair once over twelve
classes, with captured graphs. The plants run in child processes (``--jobs``), as the full run does, so a
native crash is reported as a ``crash`` result of the plant it killed instead of taking the test's worker
with it. The full run (600 plants over every class) is ``python -m bcg_diffusion.checks.planting``
(docs/testing.md)."""

import json
import subprocess
import sys

import pytest

from bcg_diffusion.checks.planting import PlantResult
from bcg_diffusion.checks.planting_kinds import KINDS
from bcg_diffusion.checks.planting_processes import result_from_dict
from bcg_diffusion.checks.planting_report import RAN
from bcg_diffusion.checks.planting_sites import SITE_KINDS

pytestmark = pytest.mark.gpu

CLASSES = ",".join([
    "FluxTransformer2DModel", "SD3Transformer2DModel", "PixArtTransformer2DModel", "WanTransformer3DModel",
    "QwenImageTransformer2DModel", "HunyuanVideoTransformer3DModel", "LTXVideoTransformer3DModel",
    "CogView4Transformer2DModel", "OmniGenTransformer2DModel", "Lumina2Transformer2DModel",
    "ChromaTransformer2DModel", "HiDreamImageTransformer2DModel",
])


def _planted(pairs: int, out_dir) -> list[PlantResult]:
    command = [sys.executable, "-m", "bcg_diffusion.checks.planting", "--seed", "0", "--plants", str(pairs),
               "--classes", CLASSES, "--device", "cuda", "--jobs", "2", "--chunk", str(-(-pairs // 2)),
               "--time-budget", "150", "--out", str(out_dir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"the harness exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    plants = json.loads((out_dir / "planting.json").read_text())["plants"]
    return [result_from_dict(PlantResult, p) for p in plants]


def test_planted_work_never_crashes_and_the_rest_replays_bitwise(tmp_path):
    pairs = len(SITE_KINDS) * len(KINDS)
    results = _planted(pairs, tmp_path)
    ran = [r for r in results if r.status in RAN]
    detail = "\n".join(f"{r.index} {r.case} {r.site} {r.kind}: {r.status} replayed {r.replayed_calls} named {r.named} "
                       f"{r.error or r.suspicious}" for r in results if not r.passed)
    assert len(ran) >= 0.8 * pairs, f"only {len(ran)} of {pairs} plants ran:\n{detail}"
    assert not [r for r in ran if r.status == "crash"], detail
    assert not [r for r in ran if r.status == "different" and not r.assumption], detail
    assert sum(r.replayed_calls > 0 for r in ran) >= 0.9 * len(ran), detail
    assert not [r for r in ran if r.named is False], detail
    assert not [r for r in ran if r.suspicious], detail
    assert {r.site_kind for r in ran} == set(SITE_KINDS) and len({r.kind for r in ran}) == len(KINDS)
