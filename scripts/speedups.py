"""Speed settings both scripts apply to a transformer: regional torch.compile and the attention backend."""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

__all__ = ["attention_backend_names", "quiet_library_warnings", "regional_compile", "set_attention_backend"]


@contextlib.contextmanager
def quiet_library_warnings():
    """Silence warnings and log records below ERROR (around calls whose warnings were already explained)."""
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def regional_compile(transformer, **compile_kwargs) -> str:
    """Compile the repeated blocks of ``transformer`` in place; return a sentence saying how.

    Uses diffusers' ``compile_repeated_blocks()`` where the class lists ``_repeated_blocks``, else
    ``nn.Module.compile`` on each block of the transformer's top-level ``ModuleList`` children
    (``ValueError`` if it has neither).
    """
    cls = type(transformer).__name__
    kw_text = f" ({', '.join(f'{k}={v!r}' for k, v in compile_kwargs.items())})" if compile_kwargs else ""
    repeated = getattr(transformer, "_repeated_blocks", None)
    if repeated:
        transformer.compile_repeated_blocks(**compile_kwargs)
        return f"regional torch.compile{kw_text} via {cls}.compile_repeated_blocks() on {', '.join(repeated)}"
    lists = []
    for name, child in transformer.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child):
            for block in child:
                block.compile(**compile_kwargs)
            lists.append(f"{name} ({len(child)} x {type(child[0]).__name__})")
    if not lists:
        raise ValueError(f"{cls} has neither _repeated_blocks nor ModuleList children of blocks to compile")
    return f"regional torch.compile{kw_text} of each block in {', '.join(lists)} ({cls} defines no _repeated_blocks)"


def attention_backend_names() -> list[str]:
    """The values of diffusers' ``AttentionBackendName``."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [b.value for b in AttentionBackendName]


def set_attention_backend(transformer, name: str) -> str:
    """``transformer.set_attention_backend(name)``; return a note on how many attention processors it reached."""
    with quiet_library_warnings():  # diffusers warns that backends are experimental on every call
        transformer.set_attention_backend(name)
    processors = [m.processor for m in transformer.modules() if getattr(m, "processor", None) is not None]
    reached = sum(hasattr(proc, "_attention_backend") for proc in processors)
    if processors and not reached:
        return (f"attention backend {name!r} set, but none of the {len(processors)} attention processors of "
                f"{type(transformer).__name__} dispatch through it (they call SDPA directly)")
    return f"attention backend {name!r} set on {reached} of {len(processors)} attention processors"
