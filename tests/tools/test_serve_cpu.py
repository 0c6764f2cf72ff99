"""CPU tests of scripts/serve.py and scripts/load.py: a real server on 127.0.0.1 with the tiny Flux pipeline.

One server subprocess (``--port 0``) serves the whole module and is stopped at teardown; every request has a
timeout. The server is started with fault rules (``spawn.start_server(..., faults=...)``), so that prompts
``__fail__``, ``__oom__`` and ``__slow__`` raise, raise an out-of-memory error, or sleep 2 s inside the pipeline.
"""

from __future__ import annotations

import base64
import importlib
import io
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch
from PIL import Image

import bcg_diffusion
import bcg_pipelines as pipelines

import torch  # noqa: E402
from PIL import Image  # noqa: E402

import bcg_diffusion  # noqa: E402
import bcg_pipelines as pipelines  # noqa: E402

from bcg_diffusion.serving.granularity import derive_granularity  # noqa: E402
from bcg_diffusion.serving.http.png import PNG_MAGIC  # noqa: E402
from bcg_diffusion.serving.catalog import ModelCatalog  # noqa: E402
from bcg_diffusion.toolkit.sizes import Size  # noqa: E402
from bcg_diffusion.serving.requests import RequestLimits, RequestPlanner  # noqa: E402
from bcg_diffusion.serving.load.spawn import start_server, stop_server, wait_ready  # noqa: E402
from bcg_diffusion.serving.runner import CallRunner  # noqa: E402
from bcg_diffusion.serving.startup_warmup import run_warmup  # noqa: E402
from bcg_diffusion.serving.worker import ServerCounters  # noqa: E402

START_TIMEOUT_S = 300  # a bound on a start-up, not a speed claim (a loaded 2-core machine starts slowly)
REQUEST_TIMEOUT_S = 60
MAX_PIXELS = 128 * 128
SERVER_ARGS = f"--model flux --device cpu --steps 2 --warmup 64x64 --bcg --max-steps 8 --max-n 2 --max-pixels {MAX_PIXELS}"
FAULTS = ("error:__fail__", "oom:__oom__", "slow:__slow__")
REQUEST = {"prompt": "a red fox in the snow", "size": "64x64", "seed": 7}


from _scripts import load_script  # noqa: E402


def _load_script(name: str):
    return load_script(name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The URL of a running server (tiny Flux, 2 steps, warmed at 64x64); stopped after the module."""
    spawned = start_server(SERVER_ARGS, tmp_path_factory.mktemp("serve") / "server.log", faults=FAULTS)
    try:
        wait_ready([spawned], START_TIMEOUT_S)
        yield spawned.url
    finally:
        stop_server(spawned)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
        yield client


def post(http, body) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return http.post("/v1/images/generations", content=body, headers={"content-type": "application/json"})
    return http.post("/v1/images/generations", json=body)


def payloads(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [item["b64_json"] for item in response.json()["data"]]


def png(payload: str) -> Image.Image:
    data = base64.b64decode(payload)
    assert data.startswith(PNG_MAGIC)
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def counters(http) -> dict:
    return http.get("/stats").json()["counters"]


@pytest.fixture(scope="module")
def reference(http) -> str:
    """The payload of REQUEST, asked before any other test's request."""
    (payload,) = payloads(post(http, REQUEST))
    return payload


# -------------------------------------------------------------------------------------------------------
# valid requests
# -------------------------------------------------------------------------------------------------------
def test_valid_request_returns_a_png(http, reference):
    image = png(reference)
    assert image.size == (64, 64) and image.mode == "RGB"
    sent = math.floor(time.time())
    response = post(http, {"prompt": "a lighthouse", "size": "80x64", "n": 2, "response_format": "b64_json"})
    answered = math.ceil(time.time())
    body = response.json()
    assert isinstance(body["created"], int) and sent <= body["created"] <= answered  # a UNIX time of the call
    images = [png(p) for p in payloads(response)]
    assert [im.size for im in images] == [(80, 64), (80, 64)]  # "WxH": width first
    assert images[0].tobytes() != images[1].tobytes()  # two images of one call, different noise
    assert float(response.headers["x-pipeline-seconds"]) > 0


def _openai_http_client(openai):
    """The client's own HTTP client class (httpx2 in openai 3, httpx before), ignoring proxy settings."""
    maker = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
    return maker(trust_env=False)


def test_openai_client_gets_the_same_image(server, reference):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=REQUEST_TIMEOUT_S,
                           http_client=_openai_http_client(openai))
    result = client.images.generate(prompt=REQUEST["prompt"], size="64x64", response_format="b64_json", n=1,
                                    extra_body={"seed": REQUEST["seed"]})
    assert len(result.data) == 1
    assert result.data[0].b64_json == reference


def test_stats_and_health(http, reference):
    stats = http.get("/stats").json()
    server = stats["server"]
    assert (server["family"], server["granularity"], server["max_pixels"]) == ("flux", 16, MAX_PIXELS)
    assert server["warmup"]["sizes"] == ["64x64"] and server["warmup"]["total_s"] > 0
    assert stats["counters"]["ok"] >= 1 and stats["counters"]["pipeline_calls"] >= 1
    assert stats["bcg"] is None and stats["gpu_memory"] is None  # no CUDA here: BCG inactive
    assert http.get("/health").json()["status"] == "ok"


# -------------------------------------------------------------------------------------------------------
# bad requests: 400 with a message, no pipeline call, no later image changed
# -------------------------------------------------------------------------------------------------------
BAD_REQUESTS = [
    ({"size": "64x64"}, "'prompt' is required", "prompt"),
    ({"prompt": "   "}, "must not be empty", "prompt"),
    ({"prompt": 5}, "valid string", "prompt"),
    ({"prompt": "a", "n": "2"}, "valid integer", "n"),
    ({"prompt": "a", "num_inference_steps": 2.5}, "valid integer", "num_inference_steps"),
    ({"prompt": "a", "guidance_scale": True}, "valid number", "guidance_scale"),
    ({"prompt": "a", "num_inference_step": 4}, "unknown field 'num_inference_step'", "num_inference_step"),
    (b"prompt=a fox", "not valid JSON", None),
    (b'{"prompt": "a", "guidance_scale": NaN}', "not valid JSON", None),
    (b'["a fox"]', "must be a JSON object", None),
    (b"", "body is empty", None),
    ({"prompt": "a", "size": "64by64"}, "WIDTHxHEIGHT", "size"),
    ({"prompt": "a", "size": "72x64"}, "multiples of 16", "size"),
    ({"prompt": "a", "size": "0x64"}, "multiples of 16", "size"),
    ({"prompt": "a", "size": "256x256"}, "--max-pixels", "size"),
    ({"prompt": "a", "num_inference_steps": 0}, "out of range: 1 .. 8", "num_inference_steps"),
    ({"prompt": "a", "num_inference_steps": -3}, "out of range", "num_inference_steps"),
    ({"prompt": "a", "num_inference_steps": 9}, "out of range: 1 .. 8", "num_inference_steps"),
    ({"prompt": "a", "n": 0}, "out of range: 1 .. 2", "n"),
    ({"prompt": "a", "n": 3}, "out of range: 1 .. 2", "n"),
    ({"prompt": "a", "seed": -1}, "seed", "seed"),
    ({"prompt": "a", "seed": 2**64}, "seed", "seed"),
    ({"prompt": "a", "response_format": "url"}, "'url' is not supported", "response_format"),
    ({"prompt": "a", "output_format": "jpeg"}, "not supported", "output_format"),
]


def test_bad_requests_get_400_and_reach_no_pipeline(http, reference):
    before = counters(http)
    for body, needle, param in BAD_REQUESTS:
        response = post(http, body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert needle in error["message"], (body, error["message"])
        assert error["param"] == param, (body, error)
    after = counters(http)
    assert after["pipeline_calls"] == before["pipeline_calls"]
    assert after["errors"].get("400", 0) - before["errors"].get("400", 0) == len(BAD_REQUESTS)
    assert after["requests"] - before["requests"] == len(BAD_REQUESTS)
    assert payloads(post(http, REQUEST)) == [reference]


def test_wrong_method_and_path_answer_in_the_error_format(http):
    assert http.get("/v1/images/generations").status_code == 405
    response = http.get("/no/such/path")
    assert response.status_code == 404 and "message" in response.json()["error"]


# -------------------------------------------------------------------------------------------------------
# failures inside the pipeline
# -------------------------------------------------------------------------------------------------------
def test_pipeline_failures_get_5xx_and_the_next_request_is_unchanged(http, reference):
    before = counters(http)
    failed = post(http, {**REQUEST, "prompt": "__fail__"})
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "server_error"
    assert "InjectedFailure" in failed.json()["error"]["message"]
    oom = post(http, {**REQUEST, "prompt": "__oom__"})
    assert oom.status_code == 503
    assert oom.json()["error"]["type"] == "out_of_memory" and "out of memory" in oom.json()["error"]["message"]
    assert payloads(post(http, REQUEST)) == [reference]
    after = counters(http)
    assert after["pipeline_failures"] - before["pipeline_failures"] == 2
    assert after["errors"].get("500", 0) - before["errors"].get("500", 0) == 1
    assert after["errors"].get("503", 0) - before["errors"].get("503", 0) == 1
    assert http.get("/health").json()["status"] == "ok"


# -------------------------------------------------------------------------------------------------------
# concurrency and responsiveness
# -------------------------------------------------------------------------------------------------------
def test_concurrent_requests_are_all_answered_and_equal_requests_equal(server, reference):
    other = {"prompt": "a bowl of ramen", "size": "64x80", "seed": 3}
    bodies = [REQUEST, other, REQUEST, other, REQUEST, other]

    def send(body):
        with httpx.Client(base_url=server, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            return post(client, body)

    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(send, bodies))
    results = [payloads(r) for r in responses]
    assert results[0] == results[2] == results[4] == [reference]
    assert results[1] == results[3] == results[5] != [reference]


def test_health_and_stats_answer_while_a_slow_call_runs(http, server):
    slow: dict = {}

    def send_slow():
        with httpx.Client(base_url=server, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            slow["response"] = post(client, {**REQUEST, "prompt": "__slow__"})

    thread = threading.Thread(target=send_slow)
    thread.start()
    try:
        while counters(http)["running"] != 1:  # bounded: the slow request ends (or times out) and the thread with it
            assert thread.is_alive(), "the slow call ended before it was seen running"
            time.sleep(0.05)
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["busy"] is True
        # /health answered while the call was still running: the pipeline does not block the server
        assert counters(http)["running"] == 1 and thread.is_alive()
    finally:
        thread.join(REQUEST_TIMEOUT_S)
    assert slow["response"].status_code == 200


# -------------------------------------------------------------------------------------------------------
# the load test
# -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def load():
    return load_script("load")


def test_load_reports_one_server(load, server, tmp_path, capsys):
    out = tmp_path / "load.json"
    code = load.main(["--url", server, "--requests", "4", "--concurrency", "2",
                      "--sizes", "64x64,64x80", "--prompts", "a fox", "--seeds", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["passed"] is True and result["cross_check"] is None  # one server: nothing to cross-check
    (a,) = result["servers"]
    assert (a["requests"], a["ok"]) == (4, 4)
    assert a["latency_s"]["p50"] > 0 and a["latency_s"]["p99"] >= a["latency_s"]["p50"]
    assert a["consistency"]["repeated_identities"] >= 1 and not a["consistency"]["inconsistent_identities"]
    assert a["per_size"]["64x64"]["warmed"] is True and a["per_size"]["64x80"]["warmed"] is False
    assert "latency p99 s" in text and "result: PASS" in text


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://localhost:8000", "https://127.0.0.1:8000",
                                 "http://127.0.0.1"])
def test_load_refuses_servers_not_on_127_0_0_1(load, url, capsys):
    assert load.main(["--url", url, "--requests", "1"]) == 2
    assert "127.0.0.1" in capsys.readouterr().err


def test_load_spawns_two_servers_cross_checks_them_and_stops_them(load, tmp_path, capsys):
    """Two server processes (eager, and --bcg: inactive without CUDA) answer the same mix; the cross-check
    compares their images request by request (the in-process report test shows that it flags a mismatch)."""
    common = "--model flux --device cpu --steps 2 --warmup 64x64"
    out = tmp_path / "load.json"
    code = load.main(["--spawn", common, "--spawn", f"{common} --bcg", "--requests", "4", "--concurrency", "2",
                      "--sizes", "64x64,64x80", "--prompts", "a fox", "--seeds", "2", "--out", str(out),
                      "--spawn-timeout", str(START_TIMEOUT_S), "--spawn-log-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["passed"] is True
    assert result["cross_check"]["equal"] == result["cross_check"]["compared"] == 4, result["cross_check"]
    assert "cross-check" in text and "result: PASS" in text
    for i in range(2):
        log = (tmp_path / f"server{i}.log").read_text()
        url = next(line.split()[-1] for line in log.splitlines() if line.startswith("listening on "))
        with pytest.raises(httpx.TransportError):  # stopped: nothing listens there any more
            httpx.get(f"{url}/health", timeout=5, trust_env=False)


def test_load_spawn_refuses_host_and_port(load, capsys):
    assert load.main(["--spawn", "--model flux --port 9000", "--requests", "1"]) == 2
    assert "leave --host and --port out" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------------------
# in-process: granularity, the pipeline call, warm-up, start-up errors
# -------------------------------------------------------------------------------------------------------
def test_granularity_from_the_pipeline_matches_every_family():
    for name in pipelines.list_families():
        pipe = pipelines.build_pipeline(name, size="tiny", device="cpu")
        assert derive_granularity(pipe) == pipelines.get_family(name).spatial_multiple, name


@pytest.fixture(scope="module")
def tiny_pipes():
    """Tiny pipelines built once for the in-process tests (on the CPU)."""
    return {family: pipelines.build_pipeline(family, size="tiny", device="cpu") for family in ("flux", "pixart")}


def _planner(pipes, family: str, binning: bool = True) -> RequestPlanner:
    spec = pipelines.get_family(family)
    limits = RequestLimits(granularity=spec.spatial_multiple, max_pixels=2**20, max_steps=50, max_n=4)
    return RequestPlanner(pipes[family], spec, "tiny", limits, ModelCatalog(spec.name), Size(64, 64), 2,
                          resolution_binning=binning)


def test_no_resolution_binning_reaches_the_pixart_call(tiny_pipes):
    assert _planner(tiny_pipes, "pixart", binning=False).default_job(Size(64, 80)).call["use_resolution_binning"] is False
    assert "use_resolution_binning" not in _planner(tiny_pipes, "pixart", binning=True).default_job(Size(64, 80)).call
    call = _planner(tiny_pipes, "flux", binning=False).default_job(Size(64, 80)).call
    assert "use_resolution_binning" not in call and (call["height"], call["width"]) == (80, 64)


def _runner(planner):
    return CallRunner(planner.pipe, torch.device("cpu"), ServerCounters())


def test_warmup_calls_the_library_with_the_request_settings(monkeypatch, tiny_pipes):
    planner = _planner(tiny_pipes, "flux")
    seen = []
    monkeypatch.setattr(bcg_diffusion, "warmup", lambda pipe, shapes, **call: seen.append((pipe, shapes, call))
                        or SimpleNamespace(total_s=0.0, captures=0), raising=False)
    run_warmup(_runner(planner), planner, [Size(64, 64), Size(80, 64)])
    # without batching every call runs alone: one warm-up call per n a request may ask for (each n its own shape)
    assert [call["num_images_per_prompt"] for _, _, call in seen] == list(range(1, planner.max_n + 1))
    assert planner.max_n == 4  # --max-n's default
    for pipe, shapes, call in seen:
        assert pipe is planner.pipe and shapes == [dict(height=64, width=64), dict(height=64, width=80)]
        assert call["guidance_scale"] == 3.5 and call["prompt"]
        assert not {"height", "width", "num_inference_steps", "generator"} & set(call)


def test_a_compiled_warmup_raises_the_recompile_limit_to_its_shapes(tiny_pipes):
    import torch._dynamo

    from bcg_diffusion.serving.startup_warmup import make_room_to_compile, warm_shapes

    planner = _planner(tiny_pipes, "flux")
    assert warm_shapes(planner, [Size(64, 64), Size(80, 64), Size(96, 64)]) == 12  # calls alone: n = 1 .. 4 each
    # torch's own patch puts the limit back (monkeypatch's undo breaks the config module's attribute)
    before = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=8):
        note = make_room_to_compile(12)  # torch would compile 8 of them and run 4 uncompiled
        assert torch._dynamo.config.recompile_limit == 12 and "raised from 8 to 12" in note
        assert make_room_to_compile(10) is None and torch._dynamo.config.recompile_limit == 12
    assert torch._dynamo.config.recompile_limit == before


@pytest.fixture(scope="module")
def serve_script():
    return load_script("serve")


@pytest.mark.parametrize("argv, needle", [
    (["--warmup", "64"], "WIDTHxHEIGHT"),
    (["--model", "wan"], "makes videos"),
    (["--model", "no-such-model"], "unknown family"),
    (["--inject", "error:x"], "unrecognized arguments: --inject"),  # fault rules are the tests' (fault_server.py)
    (["--max-steps", "0"], "--max-steps must be >= 1"),
    (["--port", "70000"], "--port"),
    (["--size", "full"], "--yes"),  # the no-CUDA refusal: CUDA is hidden (with CUDA it would build the full model)
])
def test_serve_bad_options_exit_2_before_building(serve_script, capsys, hide_cuda, argv, needle):
    assert serve_script.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_the_fault_server_refuses_a_malformed_rule_and_replicas(capsys):
    from bcg_diffusion.serving.load import fault_server

    assert fault_server.main(["--fault", "boom", "--", "--model", "flux"]) == 2
    assert "KIND:PROMPT" in capsys.readouterr().err
    assert fault_server.main(["--fault", "error:x", "--", "--replicas", "2"]) == 2
    assert "Ray's replicas" in capsys.readouterr().err


def test_serve_refuses_a_warmup_size_the_model_cannot_make(serve_script, capsys):
    assert serve_script.main(["--warmup", "72x64", "--port", "0"]) == 2
    assert "multiples of 16" in capsys.readouterr().err


def test_a_checkpoint_of_a_known_family_takes_the_published_defaults(tmp_path):
    from bcg_diffusion.serving import command_line
    from bcg_diffusion.serving.assembly.model import build_model
    from bcg_diffusion.serving.assembly.planner import make_planner
    from bcg_diffusion.serving.server_plan import read_plan

    pipelines.build_pipeline("flux", size="tiny", device="cpu").save_pretrained(tmp_path)
    parser = command_line.build_parser()
    plan = read_plan(parser.parse_args(["--model", str(tmp_path), "--device", "cpu", "--dtype", "fp32"]), parser)
    built = build_model(plan)
    planner = make_planner(built, plan)
    assert built.spec.name == "flux" and planner.model_size == "full" and built.preset == "full"
    assert (planner.default_size, planner.default_steps) == (Size(1024, 1024), 28)
    assert planner.limits.granularity == 16


def test_load_report_flags_errors_memory_growth_and_mismatches():
    from bcg_diffusion.serving.load.report import cross_check, format_report, latency_ratios, summarize
    from bcg_diffusion.serving.load.run import Outcome, ServerRun

    def stats(allocated, captures):
        return {"server": {"warmup": {"sizes": ["64x64"]}}, "bcg": {"captures": captures},
                "gpu_memory": {"allocated_bytes": allocated, "reserved_bytes": 2 * allocated,
                               "max_allocated_bytes": allocated}}

    def run(label, latencies, pixels, statuses, end_allocated):
        outcomes = [Outcome(i, f"id{i % 2}", "64x64", status, lat, payload_hashes=(p,), pixel_hashes=(p,))
                    for i, (lat, p, status) in enumerate(zip(latencies, pixels, statuses))]
        return ServerRun(label, "http://127.0.0.1:1", outcomes, 2.0, stats(1000, 1), stats(end_allocated, 2))

    eager = run("eager", [1.0, 2.0, 3.0, 4.0], ["a", "b", "a", "b"], [200] * 4, 1000)
    bcg = run("bcg", [0.5, 1.0, 1.5, 9.0], ["a", "b", "a", "x"], [200, 200, 200, 503], 1100)
    bcg.outcomes[3].error = "out of memory"
    s_eager, s_bcg = summarize(eager), summarize(bcg)
    assert s_eager["latency_s"]["p50"] == 2.5 and s_eager["throughput_rps"] == 2.0
    assert s_eager["gpu_memory"]["within_tolerance"] is True and s_eager["captures_during_load"] == 1
    assert s_bcg["errors"] == {"503": 1} and s_bcg["ok"] == 3
    assert s_bcg["gpu_memory"]["change_pct"] == pytest.approx(10.0) and s_bcg["gpu_memory"]["within_tolerance"] is False
    cross = cross_check(eager, bcg)
    assert (cross["compared"], cross["equal"], cross["not_compared"]) == (3, 3, [3])
    assert latency_ratios(s_eager, s_bcg, 0.5)["passed"] is True  # p50 1.0 / 2.5, p99 1.49 / 3.97
    ratios = latency_ratios(s_eager, s_bcg, 0.3)
    assert ratios["ratios"]["p50"] == pytest.approx(1.0 / 2.5) and ratios["passed"] is False
    text = format_report([s_eager, s_bcg], cross, ratios)
    assert "(OVER)" in text and "503: 1" in text and "NOT all equal" in text and "FAIL" in text


def test_a_server_that_exits_at_start_is_reported_with_its_exit_code(tmp_path):
    """A server that dies before listening (here: bad arguments) is said to have exited, with the
    code and its log's tail (not as one that "did not listen" in time)."""
    from bcg_diffusion.serving.load.spawn import SpawnError

    spawned = start_server("--model no-such-family", tmp_path / "server.log")
    try:
        with pytest.raises(SpawnError, match=r"exited with code 2(.|\n)*no-such-family"):
            wait_ready([spawned], START_TIMEOUT_S)
    finally:
        stop_server(spawned)


def test_one_size_reads_every_wxh_strictly_where_the_api_asks_and_as_written_for_generate():
    import argparse

    from bcg_diffusion.toolkit.sizes import parse_sizes, sizes_argument

    assert Size.parse("80x64") == Size(80, 64) and str(Size.parse("80x64")) == "80x64" and Size(80, 64).pixels == 5120
    for text in ("064x64", " 64x64", "64X64", "64x64x9", "1000000x64", "+64x64", "64"):
        with pytest.raises(ValueError, match="is not WIDTHxHEIGHT"):
            Size.parse(text)
    assert parse_sizes(" 512x512,064x64x9") == [Size(512, 512), Size(64, 64, 9)]  # bcg-generate's --warmup
    assert sizes_argument("64x64, 64x80") == "64x64,64x80"  # the soak's and the benchmarks' size options
    with pytest.raises(argparse.ArgumentTypeError, match="'64by64'"):
        sizes_argument("64x64,64by64")
