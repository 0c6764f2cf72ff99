"""What a model can run, read from its own configs: the largest image side and the fewest denoising steps.

Both are read from plain config mappings (a family's :class:`~bcg_pipelines.SizeSpec`, a loaded transformer's or
scheduler's ``config``), so the commands check them before anything is built, and for a checkpoint once it is
loaded. Imports nothing heavy.

- **Sides.** Some transformers hold a table of positions: SD3's ``pos_embed_max_size`` (learned position
  embeddings cropped per call; diffusers refuses a latent grid above it) and Wan's ``rope_max_seq_len`` (rotary
  frequencies precomputed per axis; a larger grid fails on a shape). A table of N patches, each ``granularity``
  pixels (VAE scale x patch size), bounds each side at N x granularity. Others compute positions per call and
  are bounded by the rule of :data:`~.choices.SIDE_LIMIT_RULE` alone.
- **Steps.** A flow-matching scheduler with ``shift_terminal`` stretches its sigmas so that the last one ends at
  that value; with one step the stretch divides 0 by 0 and every timestep is NaN (LTX-Video then fails on an
  ``IndexError``, Qwen-Image returns NaN images). Such a scheduler needs at least 2 steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .choices import MAX_SIDE_FACTOR, MIN_MAX_SIDE, SIDE_LIMIT_RULE

__all__ = ["POSITION_TABLES", "SideLimit", "StepLimit", "family_side_limit", "largest_square", "max_side",
           "min_steps", "position_limit", "side_limit"]

#: Transformer config keys that size a table of positions, in latent patches per side.
POSITION_TABLES = ("pos_embed_max_size", "rope_max_seq_len")


@dataclass(frozen=True)
class SideLimit:
    """The largest height or width a model runs at (``pixels``) and why, in words (``reason``)."""

    pixels: int
    reason: str


@dataclass(frozen=True)
class StepLimit:
    """The fewest ``num_inference_steps`` a scheduler takes (``steps``) and why (``reason``; ``None`` for 1)."""

    steps: int
    reason: str | None = None


def max_side(spec) -> int:
    """The largest height or width for a family (``None``: a checkpoint of no known family):
    :data:`~.choices.MAX_SIDE_FACTOR` x the largest side of its published size, at least
    :data:`~.choices.MIN_MAX_SIDE`, a multiple of its pixel granularity."""
    if spec is None:
        return MIN_MAX_SIDE
    largest = MAX_SIDE_FACTOR * max(spec.full.height, spec.full.width)
    return max(MIN_MAX_SIDE, largest - largest % spec.spatial_multiple)


def position_limit(transformer_config: Mapping[str, Any], granularity: int) -> SideLimit | None:
    """The side a transformer's position table covers (:data:`POSITION_TABLES` x ``granularity`` px), or ``None``
    where it has no table (positions computed per call)."""
    for key in POSITION_TABLES:
        value = transformer_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return SideLimit(value * granularity, f"its transformer's {key} is {value} patches of {granularity} px")
    return None


def side_limit(spec: Any, transformer_config: Mapping[str, Any], granularity: int) -> SideLimit:
    """The smaller of the rule's limit for ``spec`` (a family spec, ``None`` for a checkpoint of no known family)
    and the transformer's position table, as a multiple of ``granularity``."""
    rule = SideLimit(max_side(spec), SIDE_LIMIT_RULE)
    table = position_limit(transformer_config, granularity)
    return table if table is not None and table.pixels < rule.pixels else rule


def family_side_limit(spec: Any, size: str) -> SideLimit:
    """:func:`side_limit` of a family at model size ``size`` (``tiny``, ``full``), from its registry configs."""
    if spec is None:
        return side_limit(None, {}, 1)
    return side_limit(spec, spec.size(size).transformer, spec.spatial_multiple)


def largest_square(limit: SideLimit, granularity: int, max_pixels: int | None = None) -> int:
    """The side of the largest square size within ``limit`` (and ``max_pixels``, where given) at ``granularity``."""
    side = limit.pixels
    if max_pixels is not None:
        side = min(side, math.isqrt(max_pixels))
    return side - side % granularity


def min_steps(scheduler_config: Mapping[str, Any], scheduler_name: str | None = None) -> StepLimit:
    """The fewest steps a scheduler of this config takes: 2 with ``shift_terminal`` set, else 1."""
    terminal = scheduler_config.get("shift_terminal")
    if not terminal:
        return StepLimit(1)
    name = scheduler_name or scheduler_config.get("_class_name") or "scheduler"
    return StepLimit(2, f"({name}, shift_terminal {terminal:g}) needs at least 2 steps: with 1 its terminal stretch "
                        "divides 0 by 0 and every timestep is NaN")
