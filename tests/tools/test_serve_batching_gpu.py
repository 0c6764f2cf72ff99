"""GPU tests of request batching (issue 35): on CUDA, a BCG server with ``--max-batch`` forms batches from
concurrent requests, every batched call replays graphs the warm-up captured at the batch shape (the replay
counters say so), and every image is bitwise equal to the same request sent alone to that server and to an eager
server with the same batching settings. Tiny Flux and tiny PixArt (binning off); both servers of a family are
subprocesses on the one GPU, stopped at the module's end."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from _replay import assert_served
from _serve_http import pixels, post, stats

pytestmark = pytest.mark.gpu

from bcg_diffusion.serving.load.spawn import spawned_servers  # noqa: E402

START_TIMEOUT_S = 300
STEPS = 3  # Flux (guidance-distilled) and PixArt (batched CFG) make one transformer call per step
ROWS = 4
BATCHING = f"--max-batch {ROWS} --batch-window-ms 500 --batch-work-limit 0"
FAMILY_ARGS = {
    "flux": f"--model flux --device cuda --steps {STEPS} --warmup 64x64 {BATCHING}",
    "pixart": f"--model pixart --device cuda --steps {STEPS} --no-resolution-binning --warmup 64x64 {BATCHING}",
}
BODIES = [  # 1 + 2 + 1 = 4 rows: one full batch when sent together
    {"prompt": "a red fox in the snow", "size": "64x64", "seed": 0},
    {"prompt": "a lighthouse in a storm", "size": "64x64", "seed": 1, "n": 2},
    {"prompt": "a bowl of ramen", "size": "64x64", "seed": 2},
]


@pytest.fixture(scope="module", params=list(FAMILY_ARGS))
def servers(request, tmp_path_factory):
    """``(family, eager URL, BCG URL)``, both batching alike; stopped when the family's tests are done."""
    args = FAMILY_ARGS[request.param]
    log_dir = tmp_path_factory.mktemp(f"serve-batching-{request.param}")
    with spawned_servers([args, f"{args} --bcg"], log_dir, START_TIMEOUT_S) as (eager, bcg):
        yield request.param, eager.url, bcg.url


def together(url: str) -> list[httpx.Response]:
    with ThreadPoolExecutor(len(BODIES)) as pool:
        return list(pool.map(lambda body: post(url, body), BODIES))


@pytest.mark.survives_sabotage(
    "skip_segment", "stale_inputs",
    reason="checks the warm-up's counters (one capture at the batch shape, nothing eager), which a replay that "
           "skips a segment or keeps stale inputs leaves alike; the images' exactness is "
           "test_batched_images_replay_and_equal_alone_and_eager_bitwise's claim")
def test_the_warmup_captured_the_batch_shape(servers):
    _, _, bcg = servers
    s = stats(bcg)
    assert s["batching"]["enabled"] is True and s["batching"]["max_batch"] == ROWS
    warmed = s["bcg"]
    assert warmed["captures"] == 1 and warmed["failed_captures"] == 0 and warmed["eager_calls"] == 0, warmed


def test_batched_images_replay_and_equal_alone_and_eager_bitwise(servers):
    _, eager, bcg = servers
    before = stats(bcg)
    responses = together(bcg)
    after = stats(bcg)
    batched = [pixels(r) for r in responses]
    assert max(int(r.headers["x-batch-requests"]) for r in responses) > 1, [r.headers for r in responses]
    calls = after["batching"]["batches"] - before["batching"]["batches"]
    assert 1 <= calls < len(BODIES)
    assert_served(after["bcg"], before["bcg"], STEPS * calls)  # every batched call replayed the warm-up's graphs
    alone = []
    for body in BODIES:  # one at a time: a batch of its own, the same padded shape
        start = stats(bcg)
        response = post(bcg, body)
        assert response.headers["x-batch-requests"] == "1"
        alone.append(pixels(response))
        assert_served(stats(bcg)["bcg"], start["bcg"], STEPS)
    assert batched == alone
    assert [pixels(r) for r in together(eager)] == batched  # the eager server, batching alike
    assert stats(eager)["bcg"] is None
