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

from .accelerate import (  # noqa: E402  (the integration sits on top of the core)
    AccelerationError,
    accelerate_pipeline,
    accelerate_transformer,
    clear_graphs,
    get_stats,
    is_accelerated,
    remove_acceleration,
)
from .config import BCGConfig  # noqa: E402
from .families import KNOWN_TRANSFORMERS, UnknownTransformerError  # noqa: E402
from .runner import BCGCaptureWarning  # noqa: E402
from .stats import BCGStats, GraphEntryStats  # noqa: E402

__all__ += [
    "AccelerationError",
    "BCGCaptureWarning",
    "BCGConfig",
    "BCGStats",
    "GraphEntryStats",
    "KNOWN_TRANSFORMERS",
    "UnknownTransformerError",
    "accelerate_pipeline",
    "accelerate_transformer",
    "clear_graphs",
    "get_stats",
    "is_accelerated",
    "remove_acceleration",
]
