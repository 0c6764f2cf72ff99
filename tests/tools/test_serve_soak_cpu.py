"""The server soak (bcg_diffusion/serving/load/soak.py) on the CPU: its mix, the server options and fault rules it adds, and a short soak
of a live tiny Flux server (40 requests: images of two sizes, n 1 and 2, a LoRA adapter, batching, bad requests,
injected faults, clients that disconnect, a client that sends its body slowly) with every check of the full run
(GPU memory: not measured without a GPU). The server listens on 127.0.0.1 and is stopped by the soak."""

import argparse
import json

import pytest

pytest.importorskip("httpx")

from bcg_diffusion.serving.load import soak  # noqa: E402
from bcg_diffusion.serving.load.soak_report import checks_of  # noqa: E402


def test_the_mix_is_seeded_and_holds_every_kind():
    mix = soak.SoakMix(sizes=("32x32", "32x48"), models=("", "soak1"), distinct=4, fault_steps=2)
    requests = soak.build_requests(mix, 40)
    assert requests == soak.build_requests(mix, 40) and {r.kind for r in requests} == set(soak.KINDS)
    images = [r for r in requests if r.kind == "image"]
    assert len({r.identity for r in images}) <= 4 and {r.body["size"] for r in images} == {"32x32", "32x48"}
    assert {r.body.get("model", "") for r in images} == {"", "soak1"} and {r.body["n"] for r in images} == {1, 2}
    faults = [r for r in requests if r.kind in ("fault_error", "fault_oom")]
    assert all(r.body["num_inference_steps"] == 2 and r.body["prompt"] in soak.FAULT_PROMPTS.values() for r in faults)
    # faults share calls with each other only: a batched call answers them all with its first fault (the H100 soak
    # of 2026-12-07 had an error and an out-of-memory request in one call)
    assert all(r.expect == (500, 503) for r in faults)
    assert all(r.raw is not None and r.expect in ((400,), (404,)) for r in requests if r.kind == "bad")
    assert [r.expect for r in requests if r.kind == "disconnect"] == [()] * 2


def test_the_server_gets_what_the_mix_needs_without_losing_its_own_options():
    args = argparse.Namespace(sizes="32x32,32x48", concurrency=8)
    words = soak.server_arguments(["--model", "flux", "--max-batch", "2"], args, {"soak1": "/tmp/a"})
    assert words[:4] == ["--model", "flux", "--max-batch", "2"] and words.count("--max-batch") == 1
    assert "--lora" in words and "soak1=/tmp/a" in words
    assert soak.fault_rules() == [f"{k}:{p}" for k, p in soak.FAULT_PROMPTS.items()]  # the server's, not options
    assert words[words.index("--warmup") + 1] == "32x32,32x48"
    assert soak._dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n") == b"abcde"
    gone = soak.wait_idle("http://127.0.0.1:1", 1.0)  # a server that stopped answering is reported, not raised
    assert gone["idle"] is False and "/stats" in gone["error"]


def test_a_short_soak_of_a_live_server_passes_every_check(tmp_path):
    code = soak.main(["--spawn", "--model flux --device cpu --steps 1 --max-pixels 16384 --batch-window-ms 300",
                      "--sizes", "32x32,32x48", "--requests", "40", "--distinct", "4", "--adapters", "1",
                      "--concurrency", "8", "--phases", "4", "--time-limit", "400", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0 and report["passed"], (report["checks"], report["unexpected"])
    assert all(kind["sent"] >= 1 and kind["as_expected"] == kind["sent"] for kind in report["by_kind"].values())
    counters = report["server_counters"]
    assert counters["errors"]["500"] == 1 and counters["errors"]["503"] == 1 and counters["requests"] == report["sent"]
    assert report["images"]["alone_sent"] >= 2 and report["gpu_memory"] is None
    assert [c["sent"] for c in report["checkpoints"]] == [0, 10, 20, 30, 40]
    assert "result: PASS" in (tmp_path / "soak.md").read_text()
    assert "soak1" in (tmp_path / "server.log").read_text()
    # the checks fail where they must: a lost request, an unbalanced /stats
    failing = {**report, "lost": 1, "server_counters": {**counters, "balanced": False}}
    checks = checks_of(failing, 0.01, 0.05)
    assert checks["0 lost requests: every request answered"] is False
    assert checks["0 lost requests: /stats requests = ok + errors"] is False
    capture = "nothing captured while serving (BCG: 0 new keys, 0 captures)"
    assert checks[capture] is None  # an eager server: nothing to capture
    bcg = {"hits": 9, "captures": 0, "failed_captures": 0, "eager_calls": 0, "misses": 0}
    assert checks_of({**report, "bcg": bcg}, 0.01, 0.05)[capture] is True
    # the soak of 2026-12-07 15:42: two keys the warm-up had not captured, met while serving
    assert checks_of({**report, "bcg": {**bcg, "captures": 4, "misses": 2}}, 0.01, 0.05)[capture] is False


def test_the_report_names_the_graph_keys_met_while_serving():
    from types import SimpleNamespace

    from bcg_diffusion.serving.load import soak_report

    warm = {"key": "(256x256, 8 rows)", "memory_bytes": 2**20}
    met = {"key": "(256x320, n=2)", "memory_bytes": 52 * 2**20}
    counters = {"hits": 10, "captures": 4, "failed_captures": 0, "eager_calls": 0, "misses": 4}
    run = SimpleNamespace(stats_start={"bcg": {**counters, "entries": [warm]}},
                          stats_end={"bcg": {**counters, "hits": 30, "captures": 5, "misses": 5, "entries": [warm, met]}})
    bcg = soak_report._bcg(run)
    assert (bcg["hits"], bcg["captures"], bcg["misses"]) == (20, 1, 1) and soak_report._new_keys(run) == [met]
    summary = {"header": {"date": "d", "concurrency": 1, "time_limit_s": 1.0}, "sent": 1, "wall_s": 1.0, "passed": False,
               "by_kind": {}, "lost": 0, "not_sent": 0, "unexpected_count": 0, "client_5xx_not_injected": 0,
               "server_counters": {"requests": 1, "ok": 1, "errors": {}},
               "images": {"distinct_answered": 1, "alone_equal": 1, "alone_sent": 1, "inconsistent_identities": 0},
               "latency_s": {"p50": 1.0, "p99": 1.0}, "bcg": bcg, "bcg_new_keys": soak_report._new_keys(run),
               "checks": {}, "checkpoints": [], "unexpected": []}
    text = soak_report.markdown(summary)
    assert "## Graph keys met while serving" in text and "- `(256x320, n=2)`: 52.0 MiB of graph memory" in text
    assert "memory_bytes" not in text.split("## Checks")[0]  # the counters line keeps to the counters
