"""The layers of the stack benchmark and the modes they make, and one pipeline carried up the stack layer by layer.

Layers, in the order they are added: ``graphs`` (BCG, ``accelerate_pipeline``), ``compile`` (regional
torch.compile with the library's attention op, as ``bcg-serve --compile``), ``quant`` (torchao, ``fp8`` by default)
and ``cache`` (cache-dit's DBCache, set to cache a stated number of steps). Each stack of the non-graph layers runs
twice: eagerly (the *twin*) and with graphs on top, and the graphs mode is compared bitwise with its twin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import bcg_diffusion
from bcg_diffusion.toolkit.stack import compile_layer
from bcg_diffusion.toolkit.quant_option import apply_quant

__all__ = ["LAYERS", "STACK_LAYERS", "CacheSetting", "Mode", "StackedPipeline", "layer_modes"]

LAYERS = ("graphs", "compile", "quant", "cache")
#: The layers that change the model or its calls (graphs is added on top of each stack of them).
STACK_LAYERS = ("compile", "quant", "cache")
#: A residual-difference threshold every step passes: which steps are cached is then set by the step counts alone.
EVERY_STEP_PASSES = 1e9


@dataclass(frozen=True)
class Mode:
    """One timed mode: the stack layers on (``stack``, in order), with or without ``graphs``; ``twin``: the mode of
    the same stack run eagerly, which a graphs mode must equal bitwise (``None`` for eager modes)."""

    stack: tuple[str, ...]
    graphs: bool

    def name(self, quant: str) -> str:
        """``eager``, ``graphs``, ``compile``, ``graphs+compile+fp8``, ..."""
        parts = [quant if layer == "quant" else layer for layer in self.stack]
        return "+".join((["graphs"] if self.graphs else []) + parts) or "eager"

    @property
    def twin(self) -> Mode | None:
        return Mode(self.stack, False) if self.graphs else None


def layer_modes(layers: tuple[str, ...]) -> list[Mode]:
    """The modes of ``layers`` (a subset of :data:`LAYERS`) in the order they run: eager, graphs, then per stack
    layer added its twin and (with ``graphs``) its graphs mode."""
    modes = [Mode((), False)]
    graphs = "graphs" in layers
    if graphs:
        modes.append(Mode((), True))
    stack: tuple[str, ...] = ()
    for layer in STACK_LAYERS:
        if layer in layers:
            stack += (layer,)
            modes.append(Mode(stack, False))
            if graphs:
                modes.append(Mode(stack, True))
    return modes


@dataclass(frozen=True)
class CacheSetting:
    """cache-dit's DBCache as the ``cache`` layer sets it: the first ``warmup_steps`` steps always compute, then at
    most ``cached_steps`` steps reuse cached residuals, at most ``max_continuous`` in a row, with a threshold every
    step passes, so the count is the same on any weights. The ``front_blocks`` first blocks of a cached step still
    compute (cache-dit's ``Fn``; at most the length of the transformer's shortest block list)."""

    warmup_steps: int
    cached_steps: int
    front_blocks: int = 8
    max_continuous: int = 1

    @staticmethod
    def most_cached(steps: int, warmup_steps: int, max_continuous: int = 1) -> int:
        """The most steps of a call of ``steps`` steps that can reuse: after the warm-up, ``max_continuous`` of every
        ``max_continuous + 1`` (at least 1)."""
        return max(1, (steps - warmup_steps) * max_continuous // (max_continuous + 1))

    def config(self, transformer: torch.nn.Module) -> Any:
        import cache_dit

        lists = [len(c) for c in transformer.children() if isinstance(c, torch.nn.ModuleList) and len(c)]
        front = min(self.front_blocks, min(lists)) if lists else self.front_blocks
        return cache_dit.DBCacheConfig(Fn_compute_blocks=front, Bn_compute_blocks=0,
                                       residual_diff_threshold=EVERY_STEP_PASSES, max_warmup_steps=self.warmup_steps,
                                       max_cached_steps=self.cached_steps,
                                       max_continuous_cached_steps=self.max_continuous)

    def describe(self, transformer: torch.nn.Module) -> dict[str, Any]:
        config = self.config(transformer)
        return {"library": "cache-dit", "config": type(config).__name__, "Fn_compute_blocks": config.Fn_compute_blocks,
                "Bn_compute_blocks": config.Bn_compute_blocks, "residual_diff_threshold": EVERY_STEP_PASSES,
                "max_warmup_steps": self.warmup_steps, "max_cached_steps": self.cached_steps,
                "max_continuous_cached_steps": self.max_continuous}


@dataclass
class StackedPipeline:
    """One pipeline carried up the stack: :meth:`reach` adds the layers a mode needs (layers are only added, in
    :data:`STACK_LAYERS` order) and accelerates it for a graphs mode; :meth:`leave` removes the acceleration;
    :meth:`close` undoes the rest (attention op, cache)."""

    pipe: Any
    quant: str
    cache: CacheSetting
    bcg_config: Any
    device: torch.device
    added: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)

    def reach(self, mode: Mode) -> None:
        for layer in mode.stack[len(self.added):]:
            self.notes.append(self._add(layer))
            self.added.append(layer)
        if mode.graphs:
            bcg_diffusion.accelerate_pipeline(self.pipe, self.bcg_config)

    def leave(self) -> None:
        if bcg_diffusion.is_accelerated(self.pipe):
            bcg_diffusion.remove_acceleration(self.pipe)

    def _add(self, layer: str) -> str:
        transformer = self.pipe.transformer
        if layer == "compile":
            note, handle = compile_layer(transformer)
            self._handles.append(handle)
            return note
        if layer == "quant":
            return apply_quant(self.pipe, self.quant)
        import cache_dit

        cache_dit.enable_cache(self.pipe, cache_config=self.cache.config(transformer))
        settings = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in self.cache.describe(transformer).items() if k not in ("library", "config"))
        return f"cache: cache-dit DBCacheConfig({settings}) on the pipeline"

    def close(self) -> None:
        self.leave()
        if "cache" in self.added:
            import cache_dit

            cache_dit.disable_cache(self.pipe)
        while self._handles:
            self._handles.pop().remove()
