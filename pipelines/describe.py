"""Summaries of families for CLIs and docs, computed without building full-size weights."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .registry import FamilySpec, get_family

__all__ = ["FamilyDescription", "describe", "transformer_param_count"]


def _count_on_meta(build) -> int:
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=None)
def _transformer_params(name: str, size: str) -> int:
    spec = get_family(name)
    cfg = spec.size(size).transformer
    return _count_on_meta(lambda: spec.transformer_class(**cfg))


@functools.lru_cache(maxsize=None)
def _text_encoder_params(name: str, size: str) -> tuple[int, ...]:
    from .text_encoders import build_text_encoder, build_tokenizer, preset

    spec = get_family(name)
    out = []
    for te in spec.text_encoders:
        tok = build_tokenizer(te.tokenizer_style, te.max_length)
        out.append(_count_on_meta(lambda: build_text_encoder(te.kind, preset(te.preset(size)), tok)))
    return tuple(out)


def transformer_param_count(family: str | FamilySpec, size: str = "full") -> int:
    """Parameters of the family's transformer at ``size``, counted on the ``meta`` device (no memory)."""
    spec = get_family(family)
    spec.size(size)
    return _transformer_params(spec.name, size)


def _human(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


@dataclass(frozen=True)
class FamilyDescription:
    """A summary of one family at one size; ``str()`` gives a readable block for a CLI."""

    name: str
    title: str
    reference_id: str
    size: str
    pipeline_class: str
    transformer_class: str
    transformer_params: int
    vae_class: str
    vae_note: str
    scheduler_class: str
    height: int
    width: int
    num_frames: int | None
    steps: int
    guidance_kwarg: str
    guidance: float | None
    cfg_mode: str
    call_kwargs: dict
    text_encoders: tuple[tuple[str, str, str, int, str], ...]  # (component, class, real model, params, note)

    def __str__(self) -> str:
        shape = f"{self.height}x{self.width}"
        if self.num_frames is not None:
            shape += f", {self.num_frames} frames"
        guidance = "-" if self.guidance is None else f"{self.guidance_kwarg}={self.guidance:g}"
        extra = "".join(f", {k}={v!r}" for k, v in self.call_kwargs.items())
        lines = [
            f"{self.name} ({self.title}, {self.reference_id}) [{self.size}]",
            f"  pipeline     {self.pipeline_class}",
            f"  transformer  {self.transformer_class}: {_human(self.transformer_params)} parameters "
            f"({self.transformer_params:,})",
            f"  vae          {self.vae_class}" + (f" ({self.vae_note})" if self.vae_note else ""),
            f"  scheduler    {self.scheduler_class}",
            f"  default      {shape}, {self.steps} steps, {guidance}{extra}",
            f"  cfg          {self.cfg_mode}",
        ]
        for comp, cls, real, params, note in self.text_encoders:
            desc = f"  {comp:<12} {cls} ({_human(params)}) for {real}"
            if note:
                desc += f"; {note}"
            lines.append(desc)
        return "\n".join(lines)


def describe(family: str | FamilySpec, size: str = "full") -> FamilyDescription:
    """Summarise a family at ``size``; parameter counts come from ``meta``-device construction."""
    spec = get_family(family)
    sz = spec.size(size)
    te_params = _text_encoder_params(spec.name, size)
    encoders = tuple(
        (te.component, te.model_class_name, te.real_model, n, te.full_note if size == "full" else "")
        for te, n in zip(spec.text_encoders, te_params)
    )
    return FamilyDescription(
        name=spec.name,
        title=spec.title,
        reference_id=spec.reference_id,
        size=size,
        pipeline_class=spec.pipeline_class_name,
        transformer_class=spec.transformer_class_name,
        transformer_params=transformer_param_count(spec, size),
        vae_class=spec.vae_class_name,
        vae_note=spec.vae_note if size == "full" else "tiny, same latent channels and scale factors",
        scheduler_class=spec.scheduler_class_name,
        height=sz.height,
        width=sz.width,
        num_frames=sz.num_frames,
        steps=spec.default_steps,
        guidance_kwarg=spec.guidance_kwarg,
        guidance=spec.default_guidance,
        cfg_mode=spec.cfg_mode,
        call_kwargs=dict(spec.call_kwargs),
        text_encoders=encoders,
    )
