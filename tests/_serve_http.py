"""Requests to a running test server, shared by the server tests: one image request, its images' pixel
hashes, the server's ``/stats``."""

from __future__ import annotations

import httpx

from bcg_diffusion.serving.http.png import pixel_hash

REQUEST_TIMEOUT_S = 120.0
PATH = "/v1/images/generations"


def post(url: str, body) -> httpx.Response:
    """POST ``body`` (a JSON-able value, or raw ``bytes``/``str``) to the images route of the server at ``url``."""
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
        if isinstance(body, (bytes, str)):
            return client.post(PATH, content=body)
        return client.post(PATH, json=body)


def pixels(response: httpx.Response) -> list[str]:
    """The pixel hash of each image of a 200 answer (asserts the 200)."""
    assert response.status_code == 200, response.text
    return [pixel_hash(item["b64_json"]) for item in response.json()["data"]]


def stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=REQUEST_TIMEOUT_S, trust_env=False).json()
