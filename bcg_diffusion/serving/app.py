"""The FastAPI application: ``POST /v1/images/generations``, ``GET /v1/models`` (and ``/v1/models/{id}``),
``GET /stats``, ``GET /health``.

The OpenAI conventions its clients rely on: every ``GET`` route answers ``HEAD`` too; a trailing slash is
the same route (``/health/`` is ``/health``; never a redirect); every error, the HTTP layer's too (404
unknown route, 405 wrong method, 422), is answered in the OpenAI format
``{"error": {"message", "type", "param", "code"}}``: 400 ``invalid_request_error`` for a bad request
(checked before any pipeline work), 404 code ``model_not_found`` for a ``model`` the server does not serve,
413 for a body above the limit, 401 (code ``invalid_api_key``) without the server's API key, 503
``server_busy`` when the queue is full, 503 ``out_of_memory`` when the pipeline ran out of GPU memory, 500
``server_error`` when it failed otherwise. After a 5xx the worker goes on with the next request. (A request
the HTTP parser itself refuses, such as a ``Content-Length`` that is not a number, is answered in the same
format by :mod:`.listen`.)

With an API key (``ServerState.api_key``) every route but ``/health`` needs ``Authorization: Bearer <key>``,
compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import bcg_diffusion

from .batching import RequestBatcher
from .png import encode_png_b64
from .requests import GenerationJob, RequestError, RequestPlanner, body_too_large, model_not_found
from .worker import ImageGenerator, PipelineWorker, ServerCounters, is_out_of_memory

logger = logging.getLogger(__name__)

__all__ = ["GENERATIONS_PATH", "MODELS_PATH", "OPEN_PATHS", "OWNED_BY", "ServerState", "StripTrailingSlash",
           "authorized", "create_app", "gpu_memory", "model_object", "read_body", "route_names"]

GENERATIONS_PATH = "/v1/images/generations"
MODELS_PATH = "/v1/models"
#: Routes that answer without the API key (a load balancer's health check has none).
OPEN_PATHS = ("/health",)
#: ``owned_by`` of every model object in ``/v1/models``.
OWNED_BY = "bcg-diffusion"
GET_METHODS = ["GET", "HEAD"]


@dataclass
class ServerState:
    """Everything the routes use. ``info`` describes the server (model, options, warm-up) for ``/stats``;
    ``max_queue`` bounds the requests waiting or running (more get a 503); ``api_key``, when set, is
    required on every route but :data:`OPEN_PATHS` (a 401 otherwise); ``batcher``, when set, gathers the
    requests it batches (:mod:`.batching`; the others go to ``worker`` one call each)."""

    planner: RequestPlanner
    worker: PipelineWorker
    generator: ImageGenerator
    counters: ServerCounters
    info: dict[str, Any]
    max_queue: int
    started: float = field(default_factory=time.time)
    api_key: str | None = None
    batcher: RequestBatcher | None = None

    def depth(self) -> int:
        """Requests waiting to be batched, waiting for the worker, or running."""
        return self.worker.depth + (self.batcher.pending if self.batcher is not None else 0)

    @property
    def alive(self) -> bool:
        return self.worker.alive and (self.batcher is None or self.batcher.alive)

    def stop(self) -> None:
        """Stop the batcher (if any), then the worker thread."""
        if self.batcher is not None:
            self.batcher.stop()
        self.worker.stop()

    def batching_stats(self) -> dict[str, Any]:
        """``/stats`` ``batching``: the batcher's numbers, or ``{"enabled": false, "max_batch": 1}``."""
        if self.batcher is None:
            return {"enabled": False, "max_batch": 1}
        return self.batcher.stats.snapshot()

    def model_ids(self) -> list[str]:
        """The ids ``GET /v1/models`` lists (the base model first, then the adapters): the planner's, which
        resolves a request's ``model`` field against the same list."""
        return self.planner.model_ids()


def model_object(model_id: str, created: int) -> dict[str, Any]:
    """One entry of ``/v1/models``, as the OpenAI API writes it."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNED_BY}


class StripTrailingSlash:
    """ASGI middleware: ``/path/`` is served as ``/path`` (the root stays ``/``), so a client that adds a slash
    reaches the route instead of getting a 307 redirect (which many clients do not follow for a POST)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope.get("path", "")
            if len(path) > 1 and path.endswith("/"):
                stripped = path.rstrip("/") or "/"
                scope = {**scope, "path": stripped,
                         "raw_path": stripped.encode("latin-1", "replace")}
        await self.app(scope, receive, send)


def gpu_memory(device: torch.device) -> dict[str, int] | None:
    """The CUDA caching allocator's counters for ``device`` (no synchronisation); ``None`` off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return {"allocated_bytes": torch.cuda.memory_allocated(device),
            "reserved_bytes": torch.cuda.memory_reserved(device),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(device)}


class _AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an error message that quotes what a client sent (which may
    hold text UTF-8 cannot encode) always renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def route_names(app: FastAPI) -> list[str]:
    """``METHOD /path`` of every route of ``app`` (``HEAD`` left out: every ``GET`` takes it), for the 404's message."""
    names = []
    for route in app.routes:
        methods = sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"})
        if methods and hasattr(route, "path_format"):
            names.append(f"{'/'.join(methods)} {route.path_format}")
    return names


def error_response(error: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return _AsciiJSONResponse(error.body(), status_code=error.status, headers=headers)


def authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>``; the key is compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given_digest = hashlib.sha256(given.strip().encode("latin-1", "replace")).digest()
    return hmac.compare_digest(given_digest, hashlib.sha256(key.encode("utf-8")).digest())  # no length leaked either


def _unauthorized(header: str | None) -> JSONResponse:
    if not header:
        message = ("this server requires an API key: send the header 'Authorization: Bearer <key>' (the OpenAI "
                   "client sends its api_key so)")
    else:
        message = "the API key in the Authorization header is not this server's (expected 'Bearer <key>')"
    return error_response(RequestError(message, status=401, code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read up to ``limit`` bytes: a larger one (by its Content-Length, or as it streams in)
    is a 413 before the rest is read."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(f"the Content-Length header {length!r} is not a number of bytes")
        if int(length) > limit:
            raise body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _pipeline_error(exc: BaseException, job: GenerationJob) -> RequestError:
    if is_out_of_memory(exc):
        return RequestError(f"the pipeline ran out of GPU memory at {job.size} with n={job.n}: {exc}. The server "
                            "freed its cache and takes further requests; a smaller size or n may fit.",
                            status=503, type="out_of_memory")
    return RequestError(f"the pipeline failed: {type(exc).__name__}: {exc}", status=500, type="server_error")


def create_app(state: ServerState) -> FastAPI:
    """The application around one pipeline; its pipeline work goes through ``state.worker``."""
    app = FastAPI(title="bcg-diffusion image server", version=bcg_diffusion.__version__,
                  summary="OpenAI images API around one diffusers pipeline (scripts/serve.py)",
                  redirect_slashes=False, docs_url=None, redoc_url=None, openapi_url=None)  # docs/serving.md: the API

    if state.api_key is not None:
        @app.middleware("http")
        async def require_api_key(request: Request, call_next):
            if request.url.path in OPEN_PATHS:
                return await call_next(request)
            header = request.headers.get("authorization")
            if not authorized(header, state.api_key):
                logger.info("401 %s %s: %s", request.method, request.url.path,
                            "no Authorization header" if not header else "wrong API key")
                return _unauthorized(header)
            return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # 404, 405: OpenAI-style too
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"unknown path: {request.method} {request.url.path}; the routes are {', '.join(route_names(app))}"
        elif exc.status_code == 405:
            allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
            message = f"method {request.method} is not allowed on {request.url.path}" + (
                f"; allowed: {allowed}" if allowed else "")
        return error_response(RequestError(message, status=exc.status_code), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):  # 422, should a route declare a body
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()]
        return error_response(RequestError("the request is not valid: " + "; ".join(parts), status=422))

    @app.exception_handler(Exception)
    async def unexpected_error(_request: Request, exc: Exception):  # a bug: still the OpenAI format
        logger.error("unexpected error: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return error_response(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                           type="server_error"))

    @app.api_route(MODELS_PATH, methods=GET_METHODS)
    async def models():
        """The base model and every adapter, in the OpenAI list format (``client.models.list()``)."""
        created = int(state.started)
        return {"object": "list", "data": [model_object(m, created) for m in state.model_ids()]}

    @app.api_route(MODELS_PATH + "/{model_id:path}", methods=GET_METHODS)
    async def model(model_id: str):
        """One model object (``client.models.retrieve(id)``); 404 ``model_not_found`` for an id not served."""
        ids = state.model_ids()
        if model_id not in ids:
            return error_response(model_not_found(model_id, ids))
        return model_object(model_id, int(state.started))

    @app.post(GENERATIONS_PATH)
    async def generations(request: Request):
        """Generate ``n`` images for a prompt; the body is :class:`.requests.ImageRequest`."""
        state.counters.add("requests")
        status = 500
        try:
            response = await _generate(request)
            status = response.status_code
            return response
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer JSON and be counted
            logger.exception("request failed outside the pipeline")
            return error_response(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                               type="server_error"))
        finally:
            state.counters.record_status(status)

    async def _generate(request: Request) -> JSONResponse:
        try:
            job = state.planner.parse(await read_body(request, state.planner.limits.max_body_bytes))
        except RequestError as error:
            logger.info("rejected (%d): %s", error.status, error.message)
            return error_response(error)
        if state.depth() >= state.max_queue:
            error = RequestError(f"the server is busy: {state.max_queue} requests are queued or running "
                                 "(--max-queue); retry later", status=503, type="server_busy")
            return error_response(error, {"Retry-After": "1"})
        submitted = time.perf_counter()

        def run():
            started = time.perf_counter()
            return started, state.generator.generate(job)

        batcher = state.batcher
        future = batcher.submit(job) if batcher is not None and batcher.batches(job) else state.worker.submit(run)
        try:
            started, result = await asyncio.wrap_future(future)
        except Exception as exc:  # noqa: BLE001 - a failed pipeline call is answered, the worker goes on
            error = _pipeline_error(exc, job)
            return error_response(error)
        loop = asyncio.get_running_loop()
        payloads = await asyncio.gather(*(loop.run_in_executor(None, encode_png_b64, im) for im in result.images))
        state.counters.add("images", len(payloads))
        queue_s = started - submitted
        rows = result.batch_rows if result.batch_rows is not None else job.n
        logger.info("200 %s n=%d steps=%d seed=%d: queue %.3f s, pipeline %.3f s (batch of %d, %d rows)", job.size,
                    job.n, job.steps, job.seed, queue_s, result.pipeline_s, result.batch_requests, rows)
        return JSONResponse({"created": int(time.time()), "data": [{"b64_json": p} for p in payloads]},
                            headers={"x-queue-seconds": f"{queue_s:.6f}",
                                     "x-pipeline-seconds": f"{result.pipeline_s:.6f}",
                                     "x-batch-requests": str(result.batch_requests), "x-batch-rows": str(rows)})

    @app.api_route("/health", methods=GET_METHODS)
    async def health():
        """``ok`` while the worker thread lives (also while a call runs), else a 503."""
        body = {"status": "ok" if state.alive else "worker stopped",
                "busy": bool(state.worker.running), "queue_depth": state.depth()}
        return JSONResponse(body, status_code=200 if state.alive else 503)

    @app.api_route("/stats", methods=GET_METHODS)
    async def stats():
        """The server's description and counters, the BCG stats and torch.compile's graph count as of the last
        finished call, GPU memory."""
        counters = state.counters.snapshot()
        counters.update(queue_depth=state.depth(), waiting=state.worker.waiting, running=state.worker.running,
                        batch_pending=state.batcher.pending if state.batcher is not None else 0)
        return {"server": {**state.info, "uptime_s": round(time.time() - state.started, 3)},
                "counters": counters,
                "batching": state.batching_stats(),
                "bcg": state.generator.bcg_stats,
                "adapters": state.generator.adapter_stats,
                "compiled_graphs": state.generator.compiled_graphs,
                "gpu_memory": gpu_memory(state.generator.device)}

    app.add_middleware(StripTrailingSlash)  # added last: the outermost, so the API key check sees the plain path
    return app
