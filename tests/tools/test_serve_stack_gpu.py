"""GPU test of a stacked server (issue 47): tiny Flux with float8, regional compile and a cache-dit step cache, served
eagerly and with BCG on 127.0.0.1. After the warm-up no request captures or compiles: every transformer call of a
request at a warmed size replays what the warm-up captured (module mode under cache-dit: every unit too), and the
compiled-graph count of both servers stays where the warm-up left it; every image is bitwise equal to the eager
server's with the same stack. Both servers are subprocesses on the one GPU (``TORCHINDUCTOR_DETERMINISTIC=1`` from
``tests/conftest.py``, so their two compilations choose the same kernels), stopped at the module's end."""

from __future__ import annotations

import pytest

from _replay import assert_served
from _serve_http import pixels, post, stats

pytestmark = pytest.mark.gpu

from bcg_diffusion.serving.load.spawn import spawned_servers  # noqa: E402

START_TIMEOUT_S = 300
WARMED = ("64x64", "80x64")
STEPS = 10  # cache-dit's DBCache computes its first 8 steps; a threshold of 100 caches every step after them
STACK = "--quant fp8 --compile --cache dbcache:100"
ARGS = f"--model flux --device cuda --steps {STEPS} --max-n 2 --warmup {','.join(WARMED)} {STACK}"
REQUESTS = [
    {"prompt": "a red fox in the snow", "size": "64x64", "seed": 0},
    {"prompt": "a lighthouse in a storm", "size": "80x64", "seed": 1},
    {"prompt": "a red fox in the snow", "size": "64x64", "seed": 3},  # n stays 1: n=2 is another shape, not warmed
    {"prompt": "an astronaut", "size": "80x64", "seed": 4, "guidance_scale": 2.0},
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """``(eager URL, BCG URL)`` of the same stack."""
    with spawned_servers([ARGS, f"{ARGS} --bcg"], tmp_path_factory.mktemp("serve-stack"), START_TIMEOUT_S) as (eager, bcg):
        yield eager.url, bcg.url


@pytest.mark.survives_sabotage(
    "skip_segment", "stale_inputs",
    reason="checks the stack's names and the warm-up's counters (captured, nothing eager), which a replay that skips a "
           "segment or keeps stale inputs moves alike; the images' exactness is the next test's claim",
)
def test_stacked_servers_name_the_stack_and_the_bcg_server_warmed(servers):
    eager, bcg = servers
    for url, with_bcg in ((eager, False), (bcg, True)):
        server = stats(url)["server"]
        assert server["stack"]["layers"] == ["fp8", "cache dbcache:100", "compile"] and server["stack"]["bcg"] is with_bcg
        assert server["warmup"]["sizes"] == list(WARMED) and server["warmup"]["steps"] == STEPS
        assert server["warmup"]["compiled_graphs"] > 0, server["warmup"]
    warmed = stats(bcg)["bcg"]
    assert warmed["captures"] > 0 and warmed["failed_captures"] == 0 and warmed["eager_calls"] == 0, warmed


def test_after_warmup_requests_replay_without_capturing_or_compiling_and_equal_the_eager_stack(servers):
    eager, bcg = servers
    before = {url: stats(url) for url in servers}
    for body in REQUESTS:
        expected = pixels(post(eager, body))
        assert pixels(post(bcg, body)) == expected, body
        # the warmed sizes replay: no capture, no first call, no unit run eagerly, no unit's first call
        after = stats(bcg)["bcg"]
        assert_served(after, before[bcg]["bcg"], STEPS)
        assert after["child_warmup_calls"] == before[bcg]["bcg"]["child_warmup_calls"], after
        before[bcg]["bcg"] = after
    for url in servers:  # nothing compiled after the warm-up, on either server
        assert stats(url)["compiled_graphs"] == before[url]["compiled_graphs"] == before[url]["server"]["warmup"][
            "compiled_graphs"], url
