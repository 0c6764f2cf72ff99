"""The routes of the application (:func:`.app.create_app`), plain functions of the request: the server they
answer for is ``request.app.state.server`` (a :class:`~..state.ServerState`).

``POST /v1/images/generations`` takes a request's way to the pipeline: body -> job (:class:`~..requests.RequestPlanner`)
-> :meth:`~..state.ServerState.submit` (batch, pipeline call) -> its images as PNGs. ``GET /v1/models`` (and
``/v1/models/{id}``), ``GET /health`` and ``GET /stats`` read the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import torch
from fastapi import Request
from fastapi.responses import JSONResponse

from ..errors import RequestError, body_too_large, model_not_found
from ..requests import GenerationJob
from ..state import ServerState
from .png import encode_png_b64

logger = logging.getLogger(__name__)

__all__ = ["OWNED_BY", "AsciiJSONResponse", "error_response", "gpu_memory", "model_object", "read_body"]

#: ``owned_by`` of every model object in ``/v1/models``.
OWNED_BY = "bcg-diffusion"


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an error message that quotes what a client sent (which may
    hold text UTF-8 cannot encode) always renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(error: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return AsciiJSONResponse(error.body(), status_code=error.status, headers=headers)


def server_of(request: Request) -> ServerState:
    return request.app.state.server


def model_object(model_id: str, created: int) -> dict[str, Any]:
    """One entry of ``/v1/models``, as the OpenAI API writes it."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNED_BY}


def gpu_memory(device: torch.device) -> dict[str, int] | None:
    """The CUDA caching allocator's counters for ``device`` (no synchronisation); ``None`` off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return {"allocated_bytes": torch.cuda.memory_allocated(device),
            "reserved_bytes": torch.cuda.memory_reserved(device),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(device)}


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


def pipeline_error(exc: BaseException, job: GenerationJob) -> RequestError:
    """The answer to a failed pipeline call: a 503 for out of memory (the server goes on), else a 500."""
    if isinstance(exc, torch.OutOfMemoryError):
        return RequestError(f"the pipeline ran out of GPU memory at {job.size} with n={job.n}: {exc}. The server "
                            "freed its cache and takes further requests; a smaller size or n may fit.",
                            status=503, type="out_of_memory")
    return RequestError(f"the pipeline failed: {type(exc).__name__}: {exc}", status=500, type="server_error")


async def generations(request: Request) -> JSONResponse:
    """Generate ``n`` images for a prompt; the body is :class:`..requests.ImageRequest`. Every request is counted by
    its answer's status; a bug here still answers in the OpenAI format."""
    state = server_of(request)
    state.counters.add("requests")
    status = 500
    try:
        response = await generate(request, state)
        status = response.status_code
        return response
    except Exception as exc:  # noqa: BLE001 - a bug here must still answer JSON and be counted
        logger.exception("request failed outside the pipeline")
        return error_response(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                           type="server_error"))
    finally:
        state.counters.record_status(status)


async def generate(request: Request, state: ServerState) -> JSONResponse:
    """Body -> job (a 4xx before any pipeline work) -> the pipeline (a 503 when the queue is full, a 5xx when the call
    fails) -> the answer."""
    try:
        body = await read_body(request, state.planner.limits.max_body_bytes)
        job = state.planner.parse(body)
    except RequestError as error:
        logger.info("rejected (%d): %s", error.status, error.message)
        return error_response(error)
    if state.depth() >= state.max_queue:
        error = RequestError(f"the server is busy: {state.max_queue} requests are queued or running "
                             "(--max-queue); retry later", status=503, type="server_busy")
        return error_response(error, {"Retry-After": "1"})
    submitted = time.perf_counter()
    future = state.submit(job)
    try:
        started, result = await asyncio.wrap_future(future)
    except Exception as exc:  # noqa: BLE001 - a failed pipeline call is answered, the worker goes on
        # The error's traceback now holds this frame, which holds the future, which holds the error: a cycle that
        # would keep the request and its job until the cyclic collector runs. The frame lets go of the future.
        del future
        return error_response(pipeline_error(exc, job))
    return await answer(state, job, result, started - submitted)


async def answer(state: ServerState, job: GenerationJob, result, queue_s: float) -> JSONResponse:
    """The 200 of a job: its images as base64 PNGs (encoded off the event loop), and the call's timing headers."""
    loop = asyncio.get_running_loop()
    payloads = await asyncio.gather(*(loop.run_in_executor(None, encode_png_b64, im) for im in result.images))
    state.counters.add("images", len(payloads))
    rows = result.batch_rows if result.batch_rows is not None else job.n
    logger.info("200 %s n=%d steps=%d seed=%d: queue %.3f s, pipeline %.3f s (batch of %d, %d rows)", job.size,
                job.n, job.steps, job.seed, queue_s, result.pipeline_s, result.batch_requests, rows)
    return JSONResponse({"created": int(time.time()), "data": [{"b64_json": p} for p in payloads]},
                        headers={"x-queue-seconds": f"{queue_s:.6f}", "x-pipeline-seconds": f"{result.pipeline_s:.6f}",
                                 "x-batch-requests": str(result.batch_requests), "x-batch-rows": str(rows)})


async def models(request: Request):
    """The base model and every adapter, in the OpenAI list format (``client.models.list()``)."""
    state = server_of(request)
    created = int(state.started)
    return {"object": "list", "data": [model_object(m, created) for m in state.model_ids()]}


async def model(request: Request, model_id: str):
    """One model object (``client.models.retrieve(id)``); 404 ``model_not_found`` for an id not served."""
    state = server_of(request)
    ids = state.model_ids()
    if model_id not in ids:
        return error_response(model_not_found(model_id, ids))
    return model_object(model_id, int(state.started))


async def health(request: Request):
    """``ok`` while the worker thread lives (also while a call runs), else a 503."""
    state = server_of(request)
    body = {"status": "ok" if state.alive else "worker stopped",
            "busy": bool(state.worker.running), "queue_depth": state.depth()}
    return JSONResponse(body, status_code=200 if state.alive else 503)


async def stats(request: Request):
    """The server's description and counters, the BCG stats and torch.compile's graph count as of the last finished
    call, GPU memory."""
    state = server_of(request)
    counters = state.counters.snapshot()
    counters.update(queue_depth=state.depth(), waiting=state.worker.waiting, running=state.worker.running,
                    batch_pending=state.batcher.pending if state.batcher is not None else 0)
    runner = state.runner
    return {"server": {**state.info, "uptime_s": round(time.time() - state.started, 3)},
            "counters": counters,
            "batching": state.batching_stats(),
            "bcg": runner.bcg_stats,
            "adapters": runner.adapter_stats,
            "compiled_graphs": runner.compiled_graphs,
            "gpu_memory": gpu_memory(runner.device)}
