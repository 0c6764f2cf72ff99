"""A second pipeline for another thread, sharing the first one's models and nothing that keeps per-call state.

Why: a transformer accelerated once can serve pipelines in several threads (its runner serialises their calls),
but diffusers' ``from_pipe`` shares every component, and three of its defaults make the second thread's results
differ from eager without any graph involved:

- the scheduler: ``set_timesteps`` and ``step`` keep per-call state on it, so two threads interleave their steps;
- the tokenizers: a fast tokenizer keeps its padding and truncation settings on its Rust backend, and the
  pipelines call it twice per prompt (``padding="max_length"``, then ``padding="longest"`` to warn about
  truncation); another thread's second call can land between a call's settings and its encoding, so the prompt
  is encoded at the longest length instead of the maximum one. Measured on the CPU with acceleration off (tiny
  Flux, two threads, 2026-12-07): 9 of 520 and 11 of 504 generations different from eager (max 0.39), 0 of 600
  and 0 of 508 with copies; 6 of 1,600 tokenizer calls with the wrong length, 0 of 1,600 text-encoder calls on
  fixed ids and 0 of 600 pipeline calls on precomputed embeddings;
- the dtype: ``from_pipe`` ends with ``.to(dtype=torch_dtype)`` (float32 when none is given) on the new pipeline,
  and so on every module the two share: a bfloat16 pipeline becomes float32, and a pipeline whose VAE is kept in
  float32 beside a bfloat16 transformer loses that with any one dtype.

:func:`pipeline_for_thread` builds the new pipeline with its class's constructor instead: the torch modules
(transformers, text encoders, VAE) passed as they are, shared, in one copy in memory and never cast; a deep copy of
every other component (schedulers, tokenizers, processors); the first pipeline's settings (its config values that
are constructor arguments, its progress-bar settings).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

__all__ = ["pipeline_for_thread"]


def pipeline_for_thread(pipe: Any, **components: Any) -> Any:
    """A pipeline of ``pipe``'s class on the same torch modules, with its own copy of every other component.

    ``components`` replace components by name, as in ``from_pipe``. Nothing is cast: every module keeps its dtype
    and device. An acceleration of ``pipe``'s transformer serves the new pipeline too (one runner, calls
    serialised). Call each pipeline from one thread only. ``ValueError`` for a pipeline with model CPU offload.
    """
    import torch

    if not hasattr(type(pipe), "from_pipe") or not isinstance(getattr(pipe, "components", None), dict):
        raise TypeError(f"pipeline_for_thread takes a diffusers pipeline (with from_pipe), got {type(pipe).__name__}")
    if getattr(pipe, "_all_hooks", None):
        raise ValueError(f"{type(pipe).__name__} has model CPU offload enabled: its hooks move the shared models "
                         "between the CPU and the GPU for each call, and two threads would move them under each "
                         "other. Call pipe.remove_all_hooks() and keep the models on the GPU (pipe.to('cuda')) first")
    unknown = sorted(set(components) - set(pipe.components))
    if unknown:
        raise TypeError(f"{type(pipe).__name__} has no component {', '.join(unknown)}; its components: "
                        f"{', '.join(sorted(pipe.components))}")
    arguments: dict[str, Any] = {}
    for name, parameter in inspect.signature(type(pipe).__init__).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or name == "self":
            continue
        if name in components:
            arguments[name] = components[name]
        elif name in pipe.components:
            value = pipe.components[name]
            arguments[name] = value if value is None or isinstance(value, torch.nn.Module) else copy.deepcopy(value)
        elif name in pipe.config:
            arguments[name] = pipe.config[name]
    other = type(pipe)(**arguments)
    if pipe.config.get("_name_or_path") is not None:
        other.register_to_config(_name_or_path=pipe.config["_name_or_path"])
    other.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    return other
