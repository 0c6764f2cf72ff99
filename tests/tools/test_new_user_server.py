"""What a new user runs into with ``scripts/serve.py`` and ``scripts/load.py`` (issue 30), one test per point.

One server with an API key (from ``BCG_API_KEY``) on 127.0.0.1 serves the module: tiny Flux, 2 steps, warmed at
64x64; it is stopped at teardown and every request has a timeout. Bad requests must get a 400 (413 for a body
above the limit, 401 without the key) in the OpenAI error format and reach no pipeline; the start-up options
that cannot work exit with code 2 before anything is built. The numbers in the section titles are the issue's.
"""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest

from bcg_diffusion.serving import serve_command
from bcg_diffusion.serving.http.listen import API_KEY_VARIABLE
from bcg_diffusion.serving.http.app import authorized
from bcg_diffusion.serving.requests import MAX_BODY_BYTES, MAX_JSON_DEPTH, QUALITIES, STYLES
from bcg_diffusion.serving.load.spawn import start_server, stop_server, wait_ready

START_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 60
KEY = "sk-test-0123456789"
SERVER_ARGS = "--model flux --device cpu --steps 2 --warmup 64x64 --max-steps 8 --max-pixels 16384"
PATH = "/v1/images/generations"
OK = {"prompt": "a red fox in the snow", "size": "64x64", "seed": 1}


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """A running server whose key comes from the environment variable; yields it (url, log path)."""
    log = tmp_path_factory.mktemp("serve_key") / "server.log"
    before = os.environ.get(API_KEY_VARIABLE)
    os.environ[API_KEY_VARIABLE] = KEY
    try:
        server = start_server(SERVER_ARGS, log)
    finally:
        if before is None:
            os.environ.pop(API_KEY_VARIABLE)
        else:
            os.environ[API_KEY_VARIABLE] = before
    try:
        wait_ready([server], START_TIMEOUT_S)
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def http(spawned):
    with httpx.Client(base_url=spawned.url, timeout=REQUEST_TIMEOUT_S, trust_env=False,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def post(http, body, **kwargs) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return http.post(PATH, content=body, headers={"content-type": "application/json"}, **kwargs)
    return http.post(PATH, json=body, **kwargs)


def counters(http) -> dict:
    return http.get("/stats").json()["counters"]


def assert_error(response, status: int, needle: str, param=None, code=None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and needle in error["message"], error
    assert (error["param"], error["code"]) == (param, code), error


# -- 13. an optional API key -------------------------------------------------------------------------------
def test_every_route_but_health_needs_the_key(spawned, http):
    with httpx.Client(base_url=spawned.url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as anonymous:
        assert anonymous.get("/health").json()["status"] == "ok"
        for method, path in (("POST", PATH), ("GET", "/stats"), ("GET", "/no/such/path"), ("GET", "/docs")):
            response = anonymous.request(method, path, json=OK if method == "POST" else None)
            assert_error(response, 401, "requires an API key", code="invalid_api_key")
            assert response.headers["www-authenticate"] == "Bearer"
        for header in (f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer"):
            response = anonymous.get("/stats", headers={"Authorization": header})
            assert_error(response, 401, "not this server's", code="invalid_api_key")
    assert http.get("/stats").json()["server"]["api_key_required"] is True
    assert KEY not in http.get("/stats").text


def test_the_openai_client_sends_the_key_and_quality_and_style(spawned):
    maker = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
    client = openai.OpenAI(base_url=f"{spawned.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S,
                           http_client=maker(trust_env=False))
    result = client.images.generate(prompt="a fox", size="64x64", response_format="b64_json", quality="hd",
                                    style="vivid", extra_body={"seed": 1})
    assert len(result.data) == 1 and result.data[0].b64_json
    wrong = openai.OpenAI(base_url=f"{spawned.url}/v1", api_key="nope", max_retries=0, timeout=REQUEST_TIMEOUT_S,
                          http_client=maker(trust_env=False))
    with pytest.raises(openai.AuthenticationError):
        wrong.images.generate(prompt="a fox", size="64x64", response_format="b64_json")


def test_the_key_is_compared_whole():
    assert authorized(f"Bearer {KEY}", KEY) and authorized(f"bearer  {KEY} ", KEY)
    assert not any(authorized(h, KEY) for h in (None, "", KEY, f"Bearer {KEY[:-1]}", f"Bearer {KEY}0", "Bearer "))


# -- 2 and 10: malformed and oversized requests are 400s (413) that reach no pipeline ------------------------
DEEP = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD = [
    (b'{"prompt": "a\\ud800fox"}', 400, "lone UTF-16 surrogate", "prompt"),
    (b'{"prompt": "a fox", "negative_prompt": "\\udfff"}', 400, "lone UTF-16 surrogate", "negative_prompt"),
    (b'{"prompt": "a fox", "\\ud800": 1}', 400, "a field name in the body holds a lone UTF-16 surrogate", None),
    (DEEP, 400, "nested too deeply", None),
    (b'{"prompt": "a", "user": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", 400,
     f"nested more than {MAX_JSON_DEPTH} levels", None),
    ({"prompt": "a", "negative_prompt": "x" * 4001}, 400, "negative_prompt has 4001 characters; at most 4000",
     "negative_prompt"),
    ({"prompt": "x" * 4001}, 400, "prompt has 4001 characters; at most 4000", "prompt"),
    ({"prompt": "a", "user": "u" * 257}, 400, "user has 257 characters", "user"),
    ({"prompt": "a", "size": "64X64"}, 400, "lowercase x", "size"),
    ({"prompt": "a", "size": " 64x64"}, 400, "nothing around them", "size"),
    ({"prompt": "a", "size": "64x64 "}, 400, "nothing around them", "size"),
    ({"prompt": "a", "size": "064x064"}, 400, "without leading zeros", "size"),
    ({"prompt": "a", "size": "+64x64"}, 400, "WIDTHxHEIGHT", "size"),
    ({"prompt": "a", "quality": "ultra"}, 400, "quality 'ultra' is not one of", "quality"),
    ({"prompt": "a", "style": "cartoon"}, 400, "style 'cartoon' is not one of", "style"),
]


def test_malformed_requests_are_400s_that_reach_no_pipeline(http):
    before = counters(http)
    for body, status, needle, param in BAD:
        assert_error(post(http, body), status, needle, param)
    after = counters(http)
    assert after["pipeline_calls"] == before["pipeline_calls"]
    assert after["pipeline_failures"] == before["pipeline_failures"]
    assert after["errors"].get("400", 0) - before["errors"].get("400", 0) == len(BAD)
    assert http.get("/health").json()["status"] == "ok"


def test_a_body_above_the_limit_is_a_413_before_it_is_read(http):
    before = counters(http)
    big = b'{"prompt": "' + b"a" * MAX_BODY_BYTES + b'"}'
    assert_error(post(http, big), 413, f"larger than {MAX_BODY_BYTES} bytes")

    def chunks():  # no Content-Length: the limit holds while the body streams in
        yield b'{"prompt": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"a" * 65536
        yield b'"}'

    assert_error(http.post(PATH, content=chunks(), headers={"content-type": "application/json"}), 413,
                 f"larger than {MAX_BODY_BYTES} bytes")
    after = counters(http)
    assert after["errors"].get("413", 0) - before["errors"].get("413", 0) == 2
    assert after["pipeline_calls"] == before["pipeline_calls"]


def test_quality_and_style_are_accepted_and_change_nothing(http):
    plain = post(http, OK)
    assert plain.status_code == 200, plain.text
    for quality, style in zip((QUALITIES[0], QUALITIES[-1]), STYLES):  # every value passes the same check
        response = post(http, {**OK, "quality": quality, "style": style})
        assert response.status_code == 200, response.text
        assert response.json()["data"] == plain.json()["data"], (quality, style)


# -- 11 and 5: the warm-up report once, sizes labelled, no torchvision noise ----------------------------------
def test_the_log_has_one_warmup_report_and_no_library_noise(spawned, http):
    log = spawned.log_path.read_text()
    # one report for the one size, warmed once per n (1 .. --max-n 4: each n its own input shape)
    assert [line for line in log.splitlines() if line.startswith("warm-up: ")] == [
        next(line for line in log.splitlines() if line.startswith("warm-up: 4 shape(s)"))], log
    assert sum("num_images_per_prompt=" in line for line in log.splitlines()) == 4, log
    assert "default 64x64 (WxH), 2 steps" in log and "warming up 64x64 (WxH;" in log, log  # 5: sizes labelled
    assert "torchvision" not in log and "is an Enum subclass" not in log, log
    assert "INFO bcg_pipelines" not in log and "INFO bcg_diffusion:" not in log, log


# -- 9: start-up options that cannot work exit 2 before the build -------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--steps", "200"], "--steps 200 is above --max-steps 100"),
    (["--max-steps", "8"], "flux's default of 28 steps is above --max-steps 8"),
    (["--no-resolution-binning"], "FluxPipeline does not bin resolutions"),
    (["--device", "mps"], "not on mps"),
    (["--device", "meta"], "not on meta"),
    (["--warmup", "64X64"], "lowercase x"),
    (["--default-size", "064x64"], "without leading zeros"),
    (["--api-key", "has space"], "visible ASCII characters without spaces"),
    (["--api-key", ""], "visible ASCII characters without spaces"),
    (["--model", "/no/such/folder"], "no such folder"),
])
def test_serve_refuses_before_building(capsys, no_build, monkeypatch, argv, needle):
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    assert serve_command.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("serve.py: error: ") and needle in err[-1], err[-3:]


def test_host_without_a_key_warns_and_with_a_key_does_not(capsys, no_build, monkeypatch):
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    assert serve_command.main(["--host", "0.0.0.0", "--device", "mps"]) == 2  # stops after the warning, before a build
    assert "requires no API key; give it one with --api-key or BCG_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv(API_KEY_VARIABLE, KEY)
    assert serve_command.main(["--host", "0.0.0.0", "--device", "mps"]) == 2
    assert "requires no API key" not in capsys.readouterr().err


def test_load_sends_the_key(http, spawned, capsys):
    from bcg_diffusion.serving.load import command as load_test

    code = load_test.main(["--url", spawned.url, "--api-key", KEY, "--requests", "1", "--concurrency", "1",
                           "--sizes", "64x64", "--steps", "2"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert API_KEY_VARIABLE not in os.environ or os.environ[API_KEY_VARIABLE] != KEY
    assert json.loads(json.dumps(counters(http)))["ok"] >= 1
