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

import hashlib
import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import bcg_diffusion

from ..errors import RequestError
from ..state import ServerState
from . import routes
from .routes import OWNED_BY, error_response

logger = logging.getLogger(__name__)

__all__ = ["GENERATIONS_PATH", "MODELS_PATH", "OPEN_PATHS", "OWNED_BY", "StripTrailingSlash", "authorized",
           "create_app", "route_names"]

GENERATIONS_PATH = "/v1/images/generations"
MODELS_PATH = "/v1/models"
#: Routes that answer without the API key (a load balancer's health check has none).
OPEN_PATHS = ("/health",)
GET_METHODS = ["GET", "HEAD"]


def create_app(state: ServerState) -> FastAPI:
    """The application around one server (its pipeline work goes through ``state``), assembled here once: the
    routes of :mod:`.routes`, the OpenAI-style error handlers, the API key check (with ``state.api_key``)."""
    app = FastAPI(title="bcg-diffusion image server", version=bcg_diffusion.__version__,
                  summary="OpenAI images API around one diffusers pipeline (scripts/serve.py)",
                  redirect_slashes=False, docs_url=None, redoc_url=None, openapi_url=None)  # docs/serving.md: the API
    app.state.server = state
    if state.api_key is not None:
        app.middleware("http")(require_api_key)
    app.add_exception_handler(StarletteHTTPException, http_error)  # 404, 405: OpenAI-style too
    app.add_exception_handler(RequestValidationError, validation_error)  # 422, should a route declare a body
    app.add_exception_handler(Exception, unexpected_error)  # a bug: still the OpenAI format
    app.add_api_route(MODELS_PATH, routes.models, methods=GET_METHODS)
    app.add_api_route(MODELS_PATH + "/{model_id:path}", routes.model, methods=GET_METHODS)
    app.add_api_route(GENERATIONS_PATH, routes.generations, methods=["POST"])
    app.add_api_route("/health", routes.health, methods=GET_METHODS)
    app.add_api_route("/stats", routes.stats, methods=GET_METHODS)
    app.add_middleware(StripTrailingSlash)  # added last: the outermost, so the API key check sees the plain path
    return app


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


def route_names(app: FastAPI) -> list[str]:
    """``METHOD /path`` of every route of ``app`` (``HEAD`` left out: every ``GET`` takes it), for the 404's message."""
    names = []
    for route in app.routes:
        methods = sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"})
        if methods and hasattr(route, "path_format"):
            names.append(f"{'/'.join(methods)} {route.path_format}")
    return names


def authorized(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>``; the key is compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given_digest = hashlib.sha256(given.strip().encode("latin-1", "replace")).digest()
    return hmac.compare_digest(given_digest, hashlib.sha256(key.encode("utf-8")).digest())  # no length leaked either


async def require_api_key(request: Request, call_next):
    """Middleware: every route but :data:`OPEN_PATHS` needs ``Authorization: Bearer <the server's key>``."""
    if request.url.path in OPEN_PATHS:
        return await call_next(request)
    header = request.headers.get("authorization")
    if not authorized(header, request.app.state.server.api_key):
        logger.info("401 %s %s: %s", request.method, request.url.path,
                    "no Authorization header" if not header else "wrong API key")
        if not header:
            message = ("this server requires an API key: send the header 'Authorization: Bearer <key>' (the OpenAI "
                       "client sends its api_key so)")
        else:
            message = "the API key in the Authorization header is not this server's (expected 'Bearer <key>')"
        return error_response(RequestError(message, status=401, code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})
    return await call_next(request)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404 and 405 of the HTTP layer, in the OpenAI format (the 404 names the routes)."""
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = (f"unknown path: {request.method} {request.url.path}; the routes are "
                   f"{', '.join(route_names(request.app))}")
    elif exc.status_code == 405:
        allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {request.url.path}" + (
            f"; allowed: {allowed}" if allowed else "")
    return error_response(RequestError(message, status=exc.status_code), getattr(exc, "headers", None))


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()]
    return error_response(RequestError("the request is not valid: " + "; ".join(parts), status=422))


async def unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
    logger.error("unexpected error: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return error_response(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                       type="server_error"))
