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
from .core import eager_on_graph, get_current_replay_token
from .integration.entries import BCGCaptureWarning
from .errors import AccelerationError
from .families import KNOWN_TRANSFORMERS, UnknownTransformerError
from .stats import BCGStats, GraphEntryStats
from .warmup import WarmedShape, WarmupReport, warmup

__version__ = "0.1.0"

__all__ = [
    "AccelerationError",
    "BCGCaptureWarning",
    "BCGConfig",
    "BCGStats",
    "CompileCache",
    "GraphEntryStats",
    "KNOWN_TRANSFORMERS",
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
