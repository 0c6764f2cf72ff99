"""bcg-diffusion: breakable CUDA graphs for diffusers diffusion-transformer pipelines."""

from ._cudart import CaptureStatus, CudaRuntimeError, check_cuda, stream_capture_status
from .boxing import _BCGBoxedTupleOutput, box_tuple, returns_boxed_tuples_under_capture, unbox_tuple
from .capture import BreakableCUDAGraphCapture, break_graph, eager_on_graph, is_capturing_breakable
from .copy_back import BreakOutputMismatchError, copy_into
from .graph import BreakableCUDAGraph
from .replay_token import get_current_replay_token, replay_token_scope

__version__ = "0.1.0"

__all__ = [
    "BreakableCUDAGraph",
    "BreakableCUDAGraphCapture",
    "BreakOutputMismatchError",
    "CaptureStatus",
    "CudaRuntimeError",
    "_BCGBoxedTupleOutput",
    "box_tuple",
    "break_graph",
    "check_cuda",
    "copy_into",
    "eager_on_graph",
    "get_current_replay_token",
    "is_capturing_breakable",
    "replay_token_scope",
    "returns_boxed_tuples_under_capture",
    "stream_capture_status",
    "unbox_tuple",
]
