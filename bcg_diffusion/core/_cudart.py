"""Thin access to the CUDA runtime through cuda-bindings.

The capture core reads stream-capture status from the runtime itself
(``cudaStreamGetCaptureInfo``) rather than from ``torch.cuda.is_current_stream_capturing()``,
which has been seen to report false negatives. cuda-bindings is imported lazily so that the
package imports, and eager code paths run, on machines without it.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

_INSTALL_HINT = (
    "bcg-diffusion reads CUDA stream-capture status through cuda-bindings, which is not installed. "
    "Install it with `pip install cuda-bindings` (or reinstall bcg-diffusion, which depends on it on Linux "
    "and Windows)."
)


class CudaRuntimeError(RuntimeError):
    """A CUDA runtime call returned an error code; the message names the call and the code."""


class CaptureStatus(enum.Enum):
    """Capture state of a CUDA stream, as reported by the runtime."""

    NONE = 0
    ACTIVE = 1
    INVALIDATED = 2


@functools.lru_cache(maxsize=1)
def cudart() -> Any:
    """Return ``cuda.bindings.runtime`` (or the older ``cuda.cudart``).

    Raises ``RuntimeError`` with an install hint when cuda-bindings is missing.
    """
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[no-redef]  # older cuda-python
        except ImportError as exc:
            raise RuntimeError(_INSTALL_HINT) from exc
    return runtime


def check_cuda(result: Any, call: str) -> Any:
    """Unpack a cuda-python result tuple ``(err, *values)``.

    Returns ``None`` for no values, the value for one, the tuple for several. Raises
    ``CudaRuntimeError`` naming ``call``, the error name and its description when ``err`` is
    not success.
    """
    rt = cudart()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != int(rt.cudaError_t.cudaSuccess):
        name = _describe(rt.cudaGetErrorName, err)
        text = _describe(rt.cudaGetErrorString, err)
        raise CudaRuntimeError(f"{call} failed: {name} ({int(err)}): {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _describe(fn: Any, err: Any) -> str:
    try:
        out = fn(err)
        value = out[1] if isinstance(out, tuple) else out
        return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:  # pragma: no cover - description is best effort
        return "unknown"


def stream_capture_status(stream: Any) -> CaptureStatus:
    """Capture status of ``stream`` (a ``torch.cuda.Stream`` or a raw handle) from the runtime."""
    rt = cudart()
    handle = getattr(stream, "cuda_stream", stream)
    values = check_cuda(rt.cudaStreamGetCaptureInfo(handle), "cudaStreamGetCaptureInfo")
    status = values[0] if isinstance(values, tuple) else values
    return CaptureStatus(int(status))


def is_stream_capturing(stream: Any) -> bool:
    """True when ``stream`` is capturing (an invalidated capture counts as capturing: it must be ended)."""
    return stream_capture_status(stream) is not CaptureStatus.NONE


def captured_node_count(stream: Any) -> int | None:
    """Number of nodes in the graph ``stream`` is capturing into, or ``None`` when unknown."""
    rt = cudart()
    handle = getattr(stream, "cuda_stream", stream)
    try:
        values = check_cuda(rt.cudaStreamGetCaptureInfo(handle), "cudaStreamGetCaptureInfo")
        if CaptureStatus(int(values[0])) is not CaptureStatus.ACTIVE:
            return None
        graph = values[2]
        values = check_cuda(rt.cudaGraphGetNodes(graph, 0), "cudaGraphGetNodes")
        return int(values[-1]) if isinstance(values, tuple) else None
    except Exception:
        return None


def abandon_capture(stream: Any) -> None:
    """End a capture left open on ``stream`` by a failure and destroy the partial graph.

    A no-op when the stream is not capturing. Never raises for an invalidated capture.
    """
    rt = cudart()
    handle = getattr(stream, "cuda_stream", stream)
    if not is_stream_capturing(handle):
        return
    result = rt.cudaStreamEndCapture(handle)
    graph = result[1] if isinstance(result, tuple) and len(result) > 1 else None
    if graph is not None and int(graph) != 0:
        rt.cudaGraphDestroy(graph)
