"""The capture core: breakable CUDA graphs (segments with eager breaks between them).

Depends on torch and cuda-bindings only (imported lazily, so this package imports without it).
The diffusers integration in :mod:`bcg_diffusion` sits on top of it. See docs/capture-core.md.
"""

from ._cudart import CaptureStatus, CudaRuntimeError, check_cuda, stream_capture_status
from ._cudart import cudart as cuda_runtime
from .active_capture import is_recording_segment
from .boxing import _BCGBoxedTupleOutput, box_tuple, unbox_tuple
from .capture import (
    BreakableCUDAGraphCapture,
    break_graph,
    clear_blas_workspaces,
    eager_on_graph,
    is_capturing_breakable,
    reset_generator_capture_state,
    returns_boxed_tuples_under_capture,
)
from .copy_back import BreakOutputMismatchError, copy_into
from .failed_segments import parked_count as failed_segment_count
from .graph import BreakableCUDAGraph, GraphState
from .handles import RemovableHandle, live_handles
from .nonowning import non_owning_view
from .pool_check import BreakArgumentOutsidePoolError
from .replay_token import get_current_replay_token, replay_token_scope
from .tree import walk

__all__ = [
    "BreakArgumentOutsidePoolError",
    "BreakableCUDAGraph",
    "BreakableCUDAGraphCapture",
    "BreakOutputMismatchError",
    "CaptureStatus",
    "CudaRuntimeError",
    "GraphState",
    "RemovableHandle",
    "_BCGBoxedTupleOutput",
    "box_tuple",
    "break_graph",
    "check_cuda",
    "cuda_runtime",
    "clear_blas_workspaces",
    "copy_into",
    "eager_on_graph",
    "failed_segment_count",
    "get_current_replay_token",
    "is_capturing_breakable",
    "is_recording_segment",
    "live_handles",
    "non_owning_view",
    "replay_token_scope",
    "reset_generator_capture_state",
    "returns_boxed_tuples_under_capture",
    "stream_capture_status",
    "unbox_tuple",
    "walk",
]
