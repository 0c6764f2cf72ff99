"""bcg-diffusion: breakable CUDA graphs for diffusers diffusion-transformer pipelines.

The user API is here; the capture core (breakable graphs, breaks, replay tokens) is
:mod:`bcg_diffusion.core`.
"""

from .accelerate import (
    accelerate_pipeline,
    accelerate_transformer,
    clear_graphs,
    get_stats,
    is_accelerated,
    remove_acceleration,
)
from .compile_cache import CompileCache, use_compile_cache
from .config import BCGConfig
from .core import BreakOutputMismatchError, CudaRuntimeError, eager_on_graph, get_current_replay_token
from .errors import (
    AccelerationError,
    BCGCaptureWarning,
    RankAbortedError,
    RankAgreementError,
    RankDisagreementError,
    RankOutOfStepError,
    RankTimeoutError,
    UnknownTransformerError,
)
from .families import KNOWN_TRANSFORMERS
from .stats import BCGStats, GraphEntryStats
from .warmup import WarmedShape, WarmupReport, warmup

__version__ = "0.1.0"

__all__ = [
    "AccelerationError",
    "BCGCaptureWarning",
    "BCGConfig",
    "BCGStats",
    "BreakOutputMismatchError",
    "CompileCache",
    "CudaRuntimeError",
    "GraphEntryStats",
    "KNOWN_TRANSFORMERS",
    "RankAbortedError",
    "RankAgreementError",
    "RankDisagreementError",
    "RankOutOfStepError",
    "RankTimeoutError",
    "UnknownTransformerError",
    "WarmedShape",
    "WarmupReport",
    "__version__",
    "accelerate_pipeline",
    "accelerate_transformer",
    "clear_graphs",
    "eager_on_graph",
    "get_current_replay_token",
    "get_stats",
    "is_accelerated",
    "remove_acceleration",
    "use_compile_cache",
    "warmup",
]
