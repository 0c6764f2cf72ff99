"""A second pipeline for another thread, sharing the first one's models and nothing that keeps per-call state.

Why: a transformer accelerated once can serve pipelines in several threads (its runner serialises their calls),
but diffusers' ``from_pipe`` shares every component, and three of its defaults make the second thread's results
differ from eager without any graph involved:

- the scheduler: ``set_timesteps`` and ``step`` keep per-call state on it, so two threads interleave their steps;
- the tokenizers: a fast tokenizer keeps its padding and truncation settings on its Rust backend, and the
  pipelines call it twice per prompt (``padding="max_length"``, then ``padding="longest"`` to warn about
  truncation); another thread's second call can land between a call's settings and its encoding, so the prompt
  is encoded at the longest length instead of the maximum one. Measured on the CPU with acceleration off (tiny
  Flux, two threads, 2026-12-07): 9 of 520 generations different from eager (max 0.39), 6 of 1,600 tokenizer
  calls with the wrong length, 0 of 1,600 text-encoder calls on fixed ids and 0 of 600 pipeline calls on
  precomputed embeddings;
- the dtype: ``from_pipe`` casts the new pipeline, and so every component the two share, to its
  ``torch_dtype``, float32 when none is given.

:func:`pipeline_for_thread` gives the new pipeline a deep copy of every component that is not a torch module
(schedulers, tokenizers, processors) and the first pipeline's dtype; the torch modules (transformers, text
encoders, VAE) stay shared, in one copy in memory.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["pipeline_for_thread"]


def pipeline_for_thread(pipe: Any, **components: Any) -> Any:
    """A pipeline of ``pipe``'s class on the same torch modules, with its own copy of every other component.

    ``components`` replace components by name, as in ``from_pipe``. The result has ``pipe``'s dtype and its
    progress-bar settings; an acceleration of ``pipe``'s transformer serves it too (one runner, calls
    serialised). Call each pipeline from one thread only.
    """
    import torch

    if not hasattr(type(pipe), "from_pipe") or not hasattr(pipe, "components"):
        raise TypeError(f"pipeline_for_thread takes a diffusers pipeline (with from_pipe), got {type(pipe).__name__}")
    own = {name: copy.deepcopy(value) for name, value in pipe.components.items()
           if value is not None and not isinstance(value, torch.nn.Module) and name not in components}
    other = type(pipe).from_pipe(pipe, torch_dtype=pipe.dtype, **own, **components)
    other.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    return other
