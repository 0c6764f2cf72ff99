"""``--cache`` and ``--quant`` of the scripts: checks made before anything is built, applying them to a
built pipeline, and counting what a step cache computed and reused.

The cache configs come from :mod:`pipelines.caches`, the quantization from :mod:`pipelines.quant`.
"""

from __future__ import annotations

import contextlib
from importlib import metadata
from typing import Any, Iterator

from bcg_diffusion.step_caches import CachePasses, count_cache_passes

import pipelines
from pipelines import caches, quant

INT8_NOTE = ("torchao's int8 dynamic-activation matmul reads the host on every call (torchao 0.17), so it cannot be "
             "captured: under BCG the transformer runs eagerly, with one warning")

__all__ = ["INT8_NOTE", "apply_cache", "apply_quant", "cache_passes", "check_cache_option", "torchao_problem"]


def check_cache_option(text: str, family: str | None) -> None:
    """``ValueError`` for an unknown cache spec, or one that cannot run on ``family`` (the message says
    why and on which families it runs); ``family=None`` checks the spec only."""
    caches.check_cache(text, family)


def torchao_problem() -> str | None:
    """``None`` where torchao can be imported, else the install hint."""
    try:
        quant.require_torchao()
    except quant.TorchaoMissing as exc:
        return str(exc)
    return None


def torchao_version() -> str:
    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return "unknown"


def apply_quant(pipe: Any, name: str) -> str:
    """Quantize ``pipe.transformer`` with torchao (``pipelines.quant.quantize``); return a note naming the config."""
    config_name = type(quant.torchao_config(name)).__name__
    quant.quantize(pipe.transformer, name)
    note = f"quantized the transformer: torchao quantize_(transformer, {config_name}()) (--quant {name}, torchao {torchao_version()})"
    return note + (f"; {INT8_NOTE}" if name == "int8" else "")


def apply_cache(pipe: Any, text: str, family: str, steps: int) -> str:
    """Enable the step cache ``text`` on ``pipe.transformer`` for calls of ``steps`` steps; return a note."""
    config = caches.cache_config(text, pipe, family, steps, pipelines.get_family(family).cfg_mode)
    caches.enable_cache(pipe.transformer, config)
    return f"step cache {type(config).__name__} on the transformer (--cache {text})"


@contextlib.contextmanager
def cache_passes(transformer: Any, enabled: bool) -> Iterator[CachePasses | None]:
    """``count_cache_passes(transformer)`` when ``enabled``, else ``None``."""
    if not enabled:
        yield None
        return
    with count_cache_passes(transformer) as passes:
        yield passes
