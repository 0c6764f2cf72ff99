"""GPU tests of scripts/serve.py: an eager server and a BCG server (tiny Flux, then tiny PixArt without
resolution binning) on 127.0.0.1 give bitwise equal images; bad requests capture nothing and change no
later image; failures inside the pipeline are answered and the next image is unchanged; the load test
passes against the pair. Both servers are subprocesses on the one GPU, stopped at the module's end."""

from __future__ import annotations

import httpx
import pytest

from _replay import assert_served
from _scripts import load_script
from _serve_http import pixels, post, stats

pytestmark = pytest.mark.gpu

from bcg_diffusion.serving.load.spawn import spawned_servers  # noqa: E402

START_TIMEOUT_S = 300
WARMED = ("64x64", "80x64")
STEPS = 3  # the servers' --steps; Flux (guidance-distilled) and PixArt (batched CFG) make one call per step
FAULTS = ("oom:__oom__", "error:__fail__")
MAX_N = 2  # the servers' --max-n: the warm-up captures each warmed size at n = 1 and 2
FAMILY_ARGS = {
    "flux": f"--model flux --device cuda --steps {STEPS} --max-n {MAX_N} --warmup {','.join(WARMED)}",
    "pixart": f"--model pixart --device cuda --steps {STEPS} --max-n {MAX_N} --no-resolution-binning --warmup {','.join(WARMED)}",
}
REQUESTS = [
    {"prompt": "a red fox in the snow", "size": "64x64", "seed": 0},
    {"prompt": "a lighthouse in a storm", "size": "80x64", "seed": 1},
    {"prompt": "a bowl of ramen", "size": "64x96", "seed": 2},  # not warmed: captured on first use
    {"prompt": "a red fox in the snow", "size": "64x64", "seed": 3, "n": 2},
    {"prompt": "an astronaut", "size": "80x64", "seed": 4, "guidance_scale": 2.0, "num_inference_steps": 4},
]


@pytest.fixture(scope="module", params=list(FAMILY_ARGS))
def servers(request, tmp_path_factory):
    """``(family, eager URL, BCG URL)``; both servers stopped when the family's tests are done."""
    args = FAMILY_ARGS[request.param]
    log_dir = tmp_path_factory.mktemp(f"serve-{request.param}")
    with spawned_servers([args, f"{args} --bcg"], log_dir, START_TIMEOUT_S, faults=FAULTS) as (eager, bcg):
        yield request.param, eager.url, bcg.url


COUNTERS_ONLY = pytest.mark.survives_sabotage(
    "skip_segment", "stale_inputs",
    reason="checks the server's counters (the warm-up captured, a request replayed), which a replay that skips a "
           "segment or keeps stale inputs moves alike; the images' exactness is test_bcg_images_equal_eager_images_bitwise's claim",
)


@COUNTERS_ONLY
def test_bcg_server_is_active_and_warmed(servers):
    _, eager, bcg = servers
    s = stats(bcg)
    assert s["server"]["bcg"] is True and s["bcg"] is not None
    assert s["server"]["warmup"]["sizes"] == list(WARMED)
    warmed = s["bcg"]
    # one graph key per warmed size and n (1 and 2, --max-n 2: calls run alone, each n an input shape of its own),
    # captured and kept: no failed capture, no eager call, no fallback
    keys = len(WARMED) * MAX_N
    assert warmed["captures"] == keys and warmed["failed_captures"] == 0, warmed
    assert warmed["eager_calls"] == 0 and warmed["hits"] > 0, warmed
    assert len(warmed["entries"]) == keys and all(e["fallback"] is None for e in warmed["entries"]), warmed
    assert s["gpu_memory"]["allocated_bytes"] > 0
    assert stats(eager)["bcg"] is None and stats(eager)["server"]["bcg"] is False


def test_bcg_images_equal_eager_images_bitwise(servers):
    _, eager, bcg = servers
    for body in REQUESTS:
        expected = pixels(post(eager, body))
        assert len(expected) == body.get("n", 1)
        assert pixels(post(bcg, body)) == expected, body
    after = stats(bcg)["bcg"]
    assert after["hits"] > 0 and after["eager_calls"] == 0 and after["failed_captures"] == 0, after
    assert all(e["fallback"] is None for e in after["entries"]), after


@COUNTERS_ONLY
@pytest.mark.parametrize("n", [1, 2])
def test_a_warmed_size_replays_without_a_capture(servers, n):
    _, _, bcg = servers
    before = stats(bcg)["bcg"]
    assert len(pixels(post(bcg, {"prompt": "a quiet harbor", "size": WARMED[1], "seed": 11, "n": n}))) == n
    # every call of the request replayed a graph the warm-up captured (no capture, no first call), n = 2 too
    assert_served(stats(bcg)["bcg"], before, STEPS)


BAD = [
    {"prompt": "a", "size": "72x64"},
    {"prompt": "a", "size": "4096x4096"},
    {"prompt": "a", "num_inference_steps": 0},
    {"prompt": "a", "n": 99},
    {"prompt": "a", "response_format": "url"},
    {"size": "64x64"},
    b"not json",
]


def test_bad_requests_capture_nothing_and_change_no_image(servers):
    _, eager, bcg = servers
    body = REQUESTS[2]
    reference = pixels(post(eager, body))
    assert pixels(post(bcg, body)) == reference
    before = stats(bcg)
    for bad in BAD:
        response = post(bcg, bad)
        assert response.status_code == 400 and response.json()["error"]["message"], bad
    after = stats(bcg)
    for key in ("captures", "misses", "hits", "eager_calls"):
        assert after["bcg"][key] == before["bcg"][key], key
    assert after["counters"]["pipeline_calls"] == before["counters"]["pipeline_calls"]
    assert pixels(post(bcg, body)) == reference
    assert_served(stats(bcg)["bcg"], after["bcg"], STEPS)  # the same image again, from its graph


def test_failures_inside_the_pipeline_then_the_same_image(servers):
    _, eager, bcg = servers
    body = REQUESTS[0]
    reference = pixels(post(eager, body))
    assert post(bcg, {**body, "prompt": "__oom__"}).status_code == 503
    assert post(bcg, {**body, "prompt": "__fail__"}).status_code == 500
    before = stats(bcg)["bcg"]
    assert pixels(post(bcg, body)) == reference
    assert_served(stats(bcg)["bcg"], before, STEPS)  # a warmed size: replayed, the failures left no damage
    assert httpx.get(f"{bcg}/health", timeout=10, trust_env=False).json()["status"] == "ok"


def test_load_compare_eager_and_bcg(servers, tmp_path, capsys):
    import json

    from bcg_diffusion.serving.load import command as load

    _, eager, bcg = servers
    load = load_script("load")
    out = tmp_path / "load.json"
    code = load.main(["--compare", eager, bcg, "--requests", "16", "--concurrency", "4",
                      "--sizes", "64x64,80x64,64x80,64x96", "--seeds", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["cross_check"]["equal"] == 16
    served = stats(bcg)["bcg"]  # the BCG server's images came from graphs, not from eager calls
    assert served["eager_calls"] == 0 and served["failed_captures"] == 0, served
    assert served["entries"] and all(e["fallback"] is None for e in served["entries"]), served
    for summary in result["servers"]:
        assert summary["gpu_memory"]["start"]["allocated_bytes"] > 0
        assert not summary["consistency"]["inconsistent_identities"]
