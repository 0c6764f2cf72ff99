"""The OpenAI API as its clients use it (issue 35): ``/v1/models``, the ``model`` field, ``HEAD``, trailing slashes,
every error in the OpenAI format (the HTTP layer's too), fields the model would ignore, and the official ``openai``
client's ``images.generate``, ``models.list`` and error classes.

One server with an API key serves the module: tiny Flux on the CPU, 2 steps, warmed at 64x64, on 127.0.0.1; it is
stopped at teardown and every request has a timeout. The last tests build the application in-process (no server).
"""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import httpx
import openai
import pytest

from bcg_diffusion.serving.http.app import MODELS_PATH, OWNED_BY, create_app
from bcg_diffusion.serving.catalog import ModelCatalog
from bcg_diffusion.serving.state import ServerState
from bcg_diffusion.serving.http.listen import BAD_HTTP_MESSAGE
from bcg_diffusion.serving.load.spawn import spawned_servers

START_TIMEOUT_S = 120  # a bound on a start-up, not a speed claim
REQUEST_TIMEOUT_S = 60
KEY = "sk-openai-test-42"
MODEL_ID = "tiny-flux"
SERVER_ARGS = (f"--model flux --device cpu --steps 2 --warmup 64x64 --max-steps 8 --max-pixels 16384 "
               f"--served-model-name {MODEL_ID} --api-key {KEY}")
PATH = "/v1/images/generations"
OK = {"prompt": "a red fox in the snow", "size": "64x64", "seed": 5}
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with spawned_servers([SERVER_ARGS], tmp_path_factory.mktemp("serve_openai"), START_TIMEOUT_S) as (spawned,):
        yield spawned.url


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=REQUEST_TIMEOUT_S, trust_env=False,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def client_for(server: str, key: str = KEY) -> openai.OpenAI:
    maker = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
    return openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S,
                         http_client=maker(trust_env=False))


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["message"], error
    return error


@pytest.fixture(scope="module")
def reference(http) -> list:
    response = http.post(PATH, json=OK)
    assert response.status_code == 200, response.text
    return response.json()["data"]


# -- /v1/models and the model field -------------------------------------------------------------------------
def test_models_list_in_the_openai_format(http, server):
    body = http.get(MODELS_PATH).json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL_ID]
    (entry,) = body["data"]
    assert entry["object"] == "model" and entry["owned_by"] == OWNED_BY and isinstance(entry["created"], int)
    client = client_for(server)
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("no-such-model")
    assert raised.value.body["code"] == "model_not_found"


def test_the_model_field_selects_the_base_model_or_is_a_404(http, server, reference):
    client = client_for(server)
    named = client.images.generate(model=MODEL_ID, prompt=OK["prompt"], size="64x64", response_format="b64_json",
                                   extra_body={"seed": OK["seed"]})
    assert [d.b64_json for d in named.data] == [d["b64_json"] for d in reference]  # absent == the base id
    before = http.get("/stats").json()["counters"]
    with pytest.raises(openai.NotFoundError) as raised:
        client.images.generate(model="dall-e-3", prompt="a fox", size="64x64", response_format="b64_json")
    error = raised.value.body
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert "'dall-e-3' does not exist" in error["message"] and MODEL_ID in error["message"]
    after = http.get("/stats").json()["counters"]
    assert after["pipeline_calls"] == before["pipeline_calls"]  # refused before any pipeline work
    assert after["errors"].get("404", 0) - before["errors"].get("404", 0) == 1


def test_openai_client_error_classes(server):
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as raised:
        client.images.generate(prompt="a fox", size="64x64", response_format="b64_json",
                               extra_body={"num_inference_steps": 0})
    assert raised.value.body["param"] == "num_inference_steps"
    with pytest.raises(openai.AuthenticationError) as raised:
        client_for(server, key="wrong").images.generate(prompt="a fox", size="64x64", response_format="b64_json")
    assert raised.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client_for(server, key="wrong").models.list()


# -- a field the model ignores is a 400 that says so ----------------------------------------------------------
def test_negative_prompt_on_flux_is_a_400_that_says_why(http, server):
    error = error_of(http.post(PATH, json={**OK, "negative_prompt": "blurry"}), 400)
    assert error["param"] == "negative_prompt" and "no effect" in error["message"], error
    assert "true_cfg_scale" in error["message"], error  # the reason: FluxPipeline runs CFG only with it
    with pytest.raises(openai.BadRequestError, match="negative_prompt has no effect"):
        client_for(server).images.generate(prompt="a fox", size="64x64", response_format="b64_json",
                                           extra_body={"negative_prompt": "blurry"})


# -- HEAD, trailing slashes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/health", "/stats", MODELS_PATH, f"{MODELS_PATH}/{MODEL_ID}"])
def test_head_answers_wherever_get_does(http, path):
    get, head = http.get(path), http.head(path)
    assert get.status_code == head.status_code == 200, (get.text, head.status_code)
    assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]


def test_trailing_slashes_reach_the_route_without_a_redirect(http, reference):
    response = http.post(PATH + "/", json=OK)
    assert response.status_code == 200, response.text  # not a 307
    assert response.json()["data"] == reference
    for path in ("/health/", MODELS_PATH + "/", "/stats/"):
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.text)
    assert http.head("/health/").status_code == 200


# -- every error in the OpenAI format, the HTTP layer's too --------------------------------------------------
def test_wrong_method_and_unknown_route(http):
    error = error_of(http.get(PATH), 405)
    assert "GET is not allowed" in error["message"] and "POST" in error["message"], error
    assert http.get(PATH).headers["allow"] == "POST"
    error_of(http.delete("/health"), 405)
    error = error_of(http.get("/v2/nothing"), 404)
    assert "unknown path: GET /v2/nothing" in error["message"] and error["type"] == "invalid_request_error"


def test_bad_json_and_oversized_body(http):
    error = error_of(http.post(PATH, content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert "not valid JSON" in error["message"]
    error_of(http.post(PATH, content=b'{"prompt": "' + b"a" * (1 << 20) + b'"}',
                       headers={"content-type": "application/json"}), 413)


def _raw_request(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):  # the server closes the connection after a parser-level 400
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("header", [b"Content-Length: abc", b"Content-Length: -5", b"Content-Length: 1, 2"])
def test_a_bad_content_length_is_a_400_in_the_openai_format(server, header):
    request = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header
               + b"\r\nAuthorization: Bearer " + KEY.encode() + b"\r\ncontent-type: application/json\r\n\r\n{}")
    answer = _raw_request(server, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert b"content-type: application/json" in head.lower(), head
    error = json.loads(body)["error"]
    assert set(error) == ERROR_KEYS and error["message"] == BAD_HTTP_MESSAGE


# -- in-process: the 422 of a route with typed parameters, the models hook ------------------------------------
def _stub_state(ids):
    planner = SimpleNamespace(catalog=ModelCatalog(ids[0], tuple(ids[1:])))
    return ServerState(planner=planner, worker=None, runner=None, counters=None, info={}, max_queue=1)


def test_validation_errors_and_unexpected_errors_use_the_openai_format():
    from fastapi.testclient import TestClient

    app = create_app(_stub_state(["base"]))

    @app.get("/typed/{number}")
    async def typed(number: int):
        return {"number": number}

    @app.get("/broken")
    async def broken():
        raise KeyError("boom")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/typed/abc")
        assert response.status_code == 422 and set(response.json()["error"]) == ERROR_KEYS
        assert "number" in response.json()["error"]["message"]
        response = client.get("/broken")
        assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"


def test_the_models_list_follows_the_catalog():
    ids = ["base", "lora-a", "lora-b"]
    from fastapi.testclient import TestClient

    with TestClient(create_app(_stub_state(ids))) as client:
        assert [m["id"] for m in client.get(MODELS_PATH).json()["data"]] == ids
        assert client.get(f"{MODELS_PATH}/lora-b").json()["id"] == "lora-b"
        assert client.get(f"{MODELS_PATH}/lora-c").json()["error"]["code"] == "model_not_found"


def test_the_catalog_resolves_the_model_field_and_refuses_ambiguous_names():
    from bcg_diffusion.serving.errors import RequestError

    catalog = ModelCatalog("base", ("a",))
    assert catalog.ids() == ["base", "a"]
    assert catalog.resolve(None) is None and catalog.resolve("base") is None and catalog.resolve("a") == "a"
    with pytest.raises(RequestError) as raised:
        catalog.resolve("b")
    assert (raised.value.status, raised.value.code, raised.value.param) == (404, "model_not_found", "model")
    with pytest.raises(ValueError, match="--lora a: the name is given twice"):
        ModelCatalog("base", ("a", "a"))
    with pytest.raises(ValueError, match="--lora base: the name is the base model's"):
        ModelCatalog("base", ("base",))
