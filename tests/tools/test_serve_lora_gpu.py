"""GPU test of LoRA adapters per request (issue 35): tiny Flux in bf16 with BCG, the base model and four adapters
(ranks 4, 8, 16, 16; two device slots, so adapters are also copied in from the CPU) mixed request by request,
through the server's own generator and warm-up.

Every image is bitwise equal to an eager twin (the same build, the same adapters through the same bank, no BCG);
base images also equal a pipeline with no adapters at all; after the warm-up (every size, the base model and an
adapter) no call captures: every transformer call replays (tests/_replay.py), whatever adapter, scale or base.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("peft")
pytest.importorskip("fastapi")

import bcg_diffusion  # noqa: E402
import bcg_pipelines as pipelines  # noqa: E402
from bcg_diffusion.serving import server  # noqa: E402
from bcg_diffusion.serving.adapter_options import attach_adapters, warm_adapters  # noqa: E402
from bcg_diffusion.serving.adapters import AdapterSpec  # noqa: E402
from bcg_diffusion.serving.startup_warmup import run_warmup  # noqa: E402
from bcg_diffusion.serving.worker import ImageGenerator, PipelineWorker, ServerCounters  # noqa: E402
from bcg_pipelines.lora_files import write_family_lora  # noqa: E402

from _replay import assert_replayed, counters  # noqa: E402

STEPS = 3  # guidance-distilled Flux: one transformer call per step
SIZES = [(64, 64), (80, 64)]
RANKS = {"lora1": 4, "lora2": 8, "lora3": 16, "lora4": 16}
#: (model, lora_scale, size, seed): the base model between adapters, a scale, a switch back, both sizes.
MIX = [(None, None, "64x64", 0), ("lora1", None, "64x64", 0), ("lora2", None, "80x64", 1), (None, None, "80x64", 1),
       ("lora3", None, "64x64", 2), ("lora4", None, "64x64", 2), ("lora1", 0.5, "80x64", 3), ("lora3", None, "64x64", 0),
       ("flux", None, "64x64", 2), ("lora4", 2.0, "80x64", 0), ("lora2", None, "64x64", 4)]


def _args() -> argparse.Namespace:
    return argparse.Namespace(model="flux", served_model_name=None, size="tiny", steps=STEPS, max_pixels=128 * 128,
                              max_steps=8, max_n=2, no_resolution_binning=False, lora_rank=None, lora_gpu_slots=2)


def _served(loras, accelerate: bool, adapters: bool = True):
    """(planner, generator, worker) of a server on the GPU: tiny Flux bf16, the adapters, BCG, warmed."""
    pipe = pipelines.build_pipeline("flux", "tiny", device="cuda", dtype=torch.bfloat16, seed=0)
    args = _args()
    specs = [AdapterSpec(n, str(p)) for n, p in loras.items()] if adapters else []
    bank = attach_adapters(pipe, specs, args, "flux", "bcg-serve")
    if accelerate:
        bcg_diffusion.accelerate_pipeline(pipe)
    planner = server.make_planner(pipe, pipelines.get_family("flux"), args, None)
    if bank is not None:
        planner.adapter_ids = tuple(bank.names)
    worker = PipelineWorker()
    generator = ImageGenerator(pipe, torch.device("cuda"), ServerCounters())

    def warm():
        worker.submit(lambda: run_warmup(generator, planner, SIZES)).result()

    warm()
    warm_adapters(bank, worker, generator, warm)
    return planner, generator, worker


def _images(planner, generator, worker, mix) -> list[str]:
    hashes = []
    for model, scale, size, seed in mix:
        body = {"prompt": "a red fox in the snow", "size": size, "seed": seed}
        body.update({} if model is None else {"model": model}, **({} if scale is None else {"lora_scale": scale}))
        job = planner.parse(json.dumps(body).encode())
        (picture,) = worker.submit(lambda job=job: generator.generate(job)).result().images
        hashes.append(hashlib.sha256(picture.tobytes()).hexdigest())
    return hashes


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    out = tmp_path_factory.mktemp("loras")
    return {name: write_family_lora("flux", "tiny", out / name, rank, seed=i)
            for i, (name, rank) in enumerate(RANKS.items())}


def test_base_and_four_adapters_mixed_replay_without_capture_and_equal_eager(loras):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    planner, generator, worker = _served(loras, accelerate=True)
    pipe = generator.pipe
    before = counters(pipe)
    captures_warm = bcg_diffusion.get_stats(pipe).captures
    assert captures_warm >= 2 * len(SIZES), bcg_diffusion.get_stats(pipe)  # base and adapter keys, every size
    served = _images(planner, generator, worker, MIX)
    worker.stop()
    assert_replayed(pipe, calls=STEPS * len(MIX), before=before)  # no capture, every call a replay
    stats = generator.adapter_stats
    assert stats["captures_after_warmup"] == 0 and stats["swaps"] > 0, stats
    assert stats["base_requests"] == 3 and stats["adapters"]["lora1"]["requests"] == 2, stats

    eager = _images(*_served(loras, accelerate=False), MIX)
    assert served == eager, [i for i, (a, b) in enumerate(zip(served, eager)) if a != b]
    bare = _images(*_served(loras, accelerate=False, adapters=False), [m for m in MIX if m[0] in (None, "flux")])
    assert [h for h, m in zip(served, MIX) if m[0] in (None, "flux")] == bare
    adapted = [h for h, m in zip(served, MIX) if m[0] not in (None, "flux")]
    assert not set(adapted) & set(bare), "an adapter left an image as the base model made it"
