"""GPU test of LoRA adapters per request (issue 35): tiny Flux in bf16 with BCG, the base model and four adapters
(ranks 4, 8, 16, 16; two device slots, so adapters are also copied in from the CPU) mixed request by request,
built, warmed and run by the server's own start-up (its plan, build and warm-up) and call path.

Every image is bitwise equal to an eager twin (the same build, the same adapters through the same bank, no BCG);
base images also equal a pipeline with no adapters at all; after the warm-up (every size, the base model and an
adapter) no call captures: every transformer call replays (tests/_replay.py), whatever adapter, scale or base.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("peft")
pytest.importorskip("fastapi")

import bcg_diffusion  # noqa: E402
import bcg_pipelines as pipelines  # noqa: E402
from bcg_diffusion.serving import command_line  # noqa: E402
from bcg_diffusion.serving.server_build import build_server  # noqa: E402
from bcg_diffusion.serving.server_plan import ServerPlan, read_plan  # noqa: E402
from bcg_pipelines.lora_files import write_family_lora  # noqa: E402

from _replay import assert_replayed, counters  # noqa: E402

STEPS = 3  # guidance-distilled Flux: one transformer call per step
SIZES = [(64, 64), (80, 64)]
RANKS = {"lora1": 4, "lora2": 8, "lora3": 16, "lora4": 16}
#: (model, lora_scale, size, seed): the base model between adapters, a scale, a switch back, both sizes.
MIX = [(None, None, "64x64", 0), ("lora1", None, "64x64", 0), ("lora2", None, "80x64", 1), (None, None, "80x64", 1),
       ("lora3", None, "64x64", 2), ("lora4", None, "64x64", 2), ("lora1", 0.5, "80x64", 3), ("lora3", None, "64x64", 0),
       ("flux", None, "64x64", 2), ("lora4", 2.0, "80x64", 0), ("lora2", None, "64x64", 4)]


def _plan(loras, accelerate: bool, adapters: bool) -> ServerPlan:
    parser = command_line.build_parser()
    argv = ["--model", "flux", "--device", "cuda", "--dtype", "bf16", "--steps", str(STEPS), "--max-pixels",
            str(128 * 128), "--max-steps", "8", "--max-n", "2", "--warmup", ",".join(f"{w}x{h}" for w, h in SIZES)]
    if adapters:
        argv += [w for n, p in loras.items() for w in ("--lora", f"{n}={p}")] + ["--lora-gpu-slots", "2"]
    return read_plan(parser.parse_args(argv + (["--bcg"] if accelerate else [])), parser)


def _served(loras, accelerate: bool, adapters: bool = True):
    """The state of a server on the GPU, as bcg-serve builds it: tiny Flux bf16, the adapters (two device slots),
    BCG, warmed at SIZES for the base model and an adapter."""
    return build_server(_plan(loras, accelerate, adapters))


def _images(state, mix) -> list[str]:
    hashes = []
    for model, scale, size, seed in mix:
        body = {"prompt": "a red fox in the snow", "size": size, "seed": seed}
        body.update({} if model is None else {"model": model}, **({} if scale is None else {"lora_scale": scale}))
        job = state.planner.parse(json.dumps(body).encode())
        _started, result = state.submit(job).result()
        (picture,) = result.images
        hashes.append(hashlib.sha256(picture.tobytes()).hexdigest())
    state.stop()
    return hashes


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    out = tmp_path_factory.mktemp("loras")
    return {name: write_family_lora("flux", "tiny", out / name, rank, seed=i)
            for i, (name, rank) in enumerate(RANKS.items())}


def test_base_and_four_adapters_mixed_replay_without_capture_and_equal_eager(loras):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    state = _served(loras, accelerate=True)
    pipe = state.runner.pipe
    before = counters(pipe)
    captures_warm = bcg_diffusion.get_stats(pipe).captures
    assert captures_warm >= 2 * len(SIZES), bcg_diffusion.get_stats(pipe)  # base and adapter keys, every size
    served = _images(state, MIX)
    assert_replayed(pipe, calls=STEPS * len(MIX), before=before)  # no capture, every call a replay
    stats = state.runner.adapter_stats
    assert stats["captures_after_warmup"] == 0 and stats["swaps"] > 0, stats
    assert stats["base_requests"] == 3 and stats["adapters"]["lora1"]["requests"] == 2, stats

    eager = _images(_served(loras, accelerate=False), MIX)
    assert served == eager, [i for i, (a, b) in enumerate(zip(served, eager)) if a != b]
    bare = _images(_served(loras, accelerate=False, adapters=False), [m for m in MIX if m[0] in (None, "flux")])
    assert [h for h, m in zip(served, MIX) if m[0] in (None, "flux")] == bare
    adapted = [h for h, m in zip(served, MIX) if m[0] not in (None, "flux")]
    assert not set(adapted) & set(bare), "an adapter left an image as the base model made it"
