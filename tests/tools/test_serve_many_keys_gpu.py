"""A BCG server whose warm-up captures more keys than the library keeps by default (8) keeps them all: a request at
the first warmed size and n (the key a default cache would have evicted first) replays without a capture. Found by
the soak of 2026-12-07 21:16 (22 warmed keys, 8 kept: requests at warmed sizes captured while serving)."""

from __future__ import annotations

import pytest

from _replay import assert_served
from _serve_http import pixels, post, stats

pytestmark = pytest.mark.gpu

from bcg_diffusion.serving.load.spawn import spawned_servers  # noqa: E402

# Five sizes of five token counts (16, 20, 24, 25, 36 latent patches): Flux keys a transposed size (80x64, 64x80)
# alike, its image ids being an input of the same shape.
WARMED = ("64x64", "80x64", "96x64", "80x80", "96x96")
MAX_N = 2
STEPS = 2
ARGS = f"--model flux --device cuda --steps {STEPS} --max-n {MAX_N} --warmup {','.join(WARMED)} --bcg"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with spawned_servers([ARGS], tmp_path_factory.mktemp("serve-many-keys"), 300) as (bcg,):
        yield bcg


@pytest.mark.survives_sabotage(
    "skip_segment", "stale_inputs",
    reason="checks the server's counters (every warmed key kept, a request replayed), which a replay that skips a "
           "segment or keeps stale inputs moves alike; the images' exactness is test_serve_gpu's claim",
)
def test_every_warmed_key_is_kept_and_the_first_replays(server):
    warmed = stats(server.url)["bcg"]
    keys = len(WARMED) * MAX_N  # 10: above the library's default of 8
    assert len(warmed["entries"]) == keys and warmed["captures"] == keys, warmed
    for n in (1, 2):
        before = stats(server.url)["bcg"]
        assert len(pixels(post(server.url, {"prompt": "a quiet harbor", "size": WARMED[0], "seed": 5, "n": n}))) == n
        assert_served(stats(server.url)["bcg"], before, STEPS)  # the earliest warmed keys: kept, replayed
    assert "BCG keeps up to 10 graph keys" in server.log_path.read_text()
