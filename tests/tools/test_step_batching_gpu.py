"""GPU tests of step batching (issue 46), tiny pipelines in bfloat16 on CUDA:

- per family, a request alone through the step scheduler equals the stock pipeline called at the same batch shape
  (the request's prompt and ROWS - 1 filler prompts, one generator per row), bitwise, eagerly and under BCG, and
  under BCG every transformer call of a second run replays (the runner's counters);
- per family under BCG, a request's image does not depend on what joined or left its batch at any step (and
  equals the eager scheduler's), with every transformer call replayed: no capture after the first request;
- a BCG step server (tiny PixArt) answers concurrent requests with the image each gets alone and the image of an
  eager step server, and captures nothing after its warm-up (``/stats``).

The schedulers run with their preparing and finishing threads (``StepConfig.host_threads``, the default), as the
server's: the text encoder and the VAE run on those threads, on the same stream as the steps; the inline scheduler is
compared with them in the first test.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from bcg_diffusion.serving.load.spawn import spawned_servers
from bcg_diffusion.serving.batching.stepping import (
    FILLER_PROMPT,
    FILLER_SEED,
    StepConfig,
    StepRequest,
    StepScheduler,
)

from _replay import assert_replayed, counters
from _serve_http import pixels, post, stats

pytestmark = pytest.mark.gpu

ROWS = 4
STEPS = 3
FAMILIES = ("pixart", "sana", "sd3", "flux", "wan")
SIZES = {"pixart": (64, 64), "sana": (64, 64), "sd3": (64, 64), "flux": (64, 64), "wan": (32, 32)}
#: Transformer calls per step of these requests (CFG as two calls: Wan; Flux with true CFG: two).
CALLS_PER_STEP = {"pixart": 1, "sana": 1, "sd3": 1, "flux": 2, "wan": 2}
START_TIMEOUT_S = 300


def build(family: str):
    pipe = pipelines.build_pipeline(family, size="tiny", device="cuda", dtype=torch.bfloat16, seed=0)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(pipe, family: str, prompt: str, steps: int = STEPS, **extra) -> dict:
    height, width = SIZES[family]
    planned = pipelines.plan_call(family, "tiny", prompt=prompt, height=height, width=width, steps=steps,
                                  num_frames=5 if family == "wan" else None, guidance=extra.pop("guidance", None),
                                  negative_prompt=extra.pop("negative", "low quality"))
    planned, _ = pipelines.fit_call(pipe, planned, batch=1, exact_shape=True)
    if family == "flux":
        planned["true_cfg_scale"] = 2.0
    return {**planned, "output_type": "np", **extra}


def run_alone(scheduler: StepScheduler, request: StepRequest) -> np.ndarray:
    ticket = scheduler.submit(request)
    scheduler.run_until_idle()
    return np.asarray(ticket.future.result(timeout=0).images[0])


def stock(pipe, request_call: dict, seed: int) -> np.ndarray:
    stock_call = {**request_call, "prompt": [request_call["prompt"]] + [FILLER_PROMPT] * (ROWS - 1),
                  "negative_prompt": [request_call["negative_prompt"]] + [FILLER_PROMPT] * (ROWS - 1)}
    generators = [torch.Generator("cuda").manual_seed(seed)] + [torch.Generator("cuda").manual_seed(FILLER_SEED)
                                                                for _ in range(ROWS - 1)]
    with torch.inference_mode():
        return np.asarray(pipelines.generated(pipe(**stock_call, generator=generators))[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_request_alone_equals_the_stock_pipeline_eagerly_and_under_bcg(family):
    pipe = build(family)
    request = StepRequest(call(pipe, family, "a red fox in the snow"), seed=7)
    reference = stock(pipe, request.call, 7)
    config = StepConfig(rows=ROWS, encode_rows=ROWS, decode_rows=ROWS)
    inline = StepConfig(rows=ROWS, encode_rows=ROWS, decode_rows=ROWS, host_threads=False)
    with torch.inference_mode():
        assert np.array_equal(run_alone(StepScheduler(pipe, config), request), reference), "eager step scheduler"
        assert np.array_equal(run_alone(StepScheduler(pipe, inline), request), reference), "eager, inline"
        bcg.accelerate_pipeline(pipe)
        scheduler = StepScheduler(pipe, config)
        first = run_alone(scheduler, request)
        assert_replayed(pipe, STEPS * CALLS_PER_STEP[family])
        before = counters(pipe)
        second = run_alone(scheduler, request)
        assert_replayed(pipe, STEPS * CALLS_PER_STEP[family], before)
    assert np.array_equal(first, reference) and np.array_equal(second, reference)


def test_the_host_threads_streams_run_before_the_steps_stream_unless_told_otherwise():
    """``StepConfig.host_stream_priority``: -1 (the default) above the steps' stream, 0 level with it; the images
    of the default are those of the inline scheduler (the test above)."""
    pipe = build("pixart")
    steps_stream = torch.cuda.current_stream().priority
    urgent, level = StepScheduler(pipe, StepConfig(rows=ROWS)), StepScheduler(pipe, StepConfig(rows=ROWS,
                                                                                                 host_stream_priority=0))
    try:
        high = [s.priority for s in urgent._host._streams]
        assert high[0] == high[1] < steps_stream, (high, steps_stream)  # lower numbers run first
        assert [s.priority for s in level._host._streams] == [steps_stream] * 2
    finally:
        urgent.close()
        level.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_joins_and_leaves_change_no_image_under_bcg_and_nothing_is_captured_after_the_first_request(family):
    pipe = build(family)
    fox = StepRequest(call(pipe, family, "a red fox", guidance=3.0), seed=7)
    with torch.inference_mode():
        eager = run_alone(StepScheduler(pipe, StepConfig(rows=ROWS)), fox)
        bcg.accelerate_pipeline(pipe)
        scheduler = StepScheduler(pipe, StepConfig(rows=ROWS))
        assert np.array_equal(run_alone(scheduler, fox), eager)
        before, steps_before = counters(pipe), scheduler.stats.steps
        boat = scheduler.submit(StepRequest(call(pipe, family, "a boat", steps=5), seed=3))
        scheduler.run_once()
        again = scheduler.submit(fox)
        scheduler.run_once()
        ramen = scheduler.submit(StepRequest(call(pipe, family, "ramen", steps=2, guidance=6.0), seed=1))
        late = [scheduler.submit(StepRequest(call(pipe, family, f"tree {i}", steps=2), seed=i)) for i in range(2)]
        scheduler.run_until_idle()
        steps = scheduler.stats.steps - steps_before  # with the host threads a boundary may admit without stepping
        assert_replayed(pipe, steps * CALLS_PER_STEP[family], before)
    assert np.array_equal(np.asarray(again.future.result(timeout=0).images[0]), eager)
    assert all(t.future.result(timeout=0).steps in (2, 5) for t in (boat, ramen, *late))


SERVER = (f"--model pixart --device cuda --steps {STEPS} --no-resolution-binning --warmup 64x64,64x128 "
          f"--max-batch {ROWS} --batching step --batch-work-limit 0")
BODIES = [{"prompt": "a red fox in the snow", "size": "64x64", "seed": 0},
          {"prompt": "a lighthouse in a storm", "size": "64x128", "seed": 1, "num_inference_steps": 5},
          {"prompt": "a bowl of ramen", "size": "64x64", "seed": 2, "n": 2},
          {"prompt": "a boat", "size": "64x64", "seed": 3, "num_inference_steps": 2},
          {"prompt": "a tree", "size": "64x128", "seed": 4}]


def test_a_bcg_step_server_equals_alone_and_eager_and_captures_nothing_after_warmup(tmp_path):
    with spawned_servers([SERVER, f"{SERVER} --bcg"], tmp_path, START_TIMEOUT_S) as (eager, server):
        warmed = stats(server.url)
        assert warmed["batching"]["mode"] == "step" and warmed["bcg"]["captures"] >= 2  # both sizes
        with ThreadPoolExecutor(len(BODIES)) as pool:
            together = [pixels(r) for r in pool.map(lambda body: post(server.url, body), BODIES)]
        loaded = stats(server.url)
        alone = [pixels(post(server.url, body)) for body in BODIES]
        with ThreadPoolExecutor(len(BODIES)) as pool:
            from_eager = [pixels(r) for r in pool.map(lambda body: post(eager.url, body), BODIES)]
        after = stats(server.url)
    assert together == alone == from_eager
    for moved in (loaded, after):
        assert moved["bcg"]["captures"] == warmed["bcg"]["captures"], moved["bcg"]
        assert moved["bcg"]["eager_calls"] == warmed["bcg"]["eager_calls"] == 0
    steps = after["batching"]["steps"] - warmed["batching"]["steps"]
    assert after["bcg"]["hits"] - warmed["bcg"]["hits"] == steps  # one transformer call per step, all replayed
    assert max(int(k) for k in loaded["batching"]["active_rows_per_step"]) > 1  # requests shared steps
    # where the steps' time went: the device's spans of every step but the last one or two (read once passed)
    device = after["batching"]["predict_device_s"]
    assert after["batching"]["steps"] - 2 <= device["count"] <= after["batching"]["steps"], after["batching"]
    assert device["mean"] > 0 and after["batching"]["advance_device_s"]["mean"] > 0
    assert after["batching"]["step_launch_s"]["count"] == after["batching"]["steps"]
