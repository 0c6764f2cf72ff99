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
from .step_caches import CachePasses, count_cache_passes
from .warmup import WarmedShape, WarmupReport, warmup

__version__ = "0.1.0"


def install_attention_breaks(transformer):
    """Route ``transformer``'s attention calls through the library's attention wrappers, without
    accelerating it; returns the :class:`~bcg_diffusion.core.RemovableHandle` whose ``remove()`` undoes it.

    The wrappers replace ``dispatch_attention_fn`` in the transformer's module and, where its processors
    call it directly, ``torch.nn.functional.scaled_dot_product_attention``. Outside a capture they call
    the original; traced by ``torch.compile`` each call becomes one custom op (``bcg::dispatch_attention``
    or ``bcg::sdpa``), so a tool can let Inductor split its own CUDA graphs at attention
    (``graph_partition=True, custom_should_partition_ops=[...]``). The patch is process-wide: it is
    shared with accelerated transformers and stays until the last handle of it is removed.
    """
    from .integration import attention_breaks

    return attention_breaks.install(transformer)


__all__ = [
    "AccelerationError",
    "BCGCaptureWarning",
    "BCGConfig",
    "BCGStats",
    "BreakOutputMismatchError",
    "CachePasses",
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
    "count_cache_passes",
    "eager_on_graph",
    "get_current_replay_token",
    "get_stats",
    "install_attention_breaks",
    "is_accelerated",
    "remove_acceleration",
    "use_compile_cache",
    "warmup",
]
