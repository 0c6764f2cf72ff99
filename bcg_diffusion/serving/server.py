"""Serve one diffusers DiT pipeline over HTTP with the OpenAI images API, eagerly or with BCG: the one-process
start (its options: :mod:`.command_line`).

``POST /v1/images/generations`` (``prompt``, ``n``, ``size`` "WxH", ``response_format`` "b64_json", plus
``num_inference_steps``, ``guidance_scale``, ``seed``, ``negative_prompt``) answers
``{"created": ..., "data": [{"b64_json": <PNG>}]}``; ``GET /stats`` and ``GET /health``. One worker
thread runs the pipeline, one call at a time; bad requests get a 400 before any pipeline work. With
``--api-key`` (or ``BCG_API_KEY``) every route but ``/health`` needs ``Authorization: Bearer <key>``. Needs
the ``serve`` extra (``pip install -e ".[serve]"``). See ``docs/serving.md``.

Examples::

    python scripts/serve.py                                    # tiny Flux on 127.0.0.1:8000, seconds on a CPU
    python scripts/serve.py --model pixart --size full --no-resolution-binning --bcg --warmup 512x512
    python scripts/serve.py --model flux --size full --bcg --compile --warmup 512x512,1024x1024 --port 0
    python scripts/serve.py --model flux --size full --quant fp8 --compile --cache dbcache --bcg --warmup 1024x1024
"""

from __future__ import annotations

from .http.listen import LISTENING_PREFIX  # uvicorn only once serving
from .serve_defaults import prog

__all__ = ["announce", "start"]


def announce(url: str) -> None:
    """The line that says the server accepts connections (what tests and ``bcg-load --spawn`` wait for)."""
    print(f"{LISTENING_PREFIX}{url}", flush=True)


def start(args, parser) -> int:
    """Read the command line into a plan (exit 2 for a bad option), reserve the port, build and warm the server,
    serve until stopped; the exit status."""
    from .http.app import create_app  # torch, diffusers and the serve extra: only once there is something to serve
    from .http.listen import reserve_port, serve
    from .server_build import build_server
    from .server_plan import read_plan

    plan = read_plan(args, parser, warn_open_host=True)
    sock = reserve_port(plan.host, plan.port, prog())
    try:
        state = build_server(plan)
        serve(create_app(state), sock, announce)
        state.stop()
    finally:
        sock.close()
    return 0
