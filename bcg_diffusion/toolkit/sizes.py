"""Output sizes as the commands take them: ``WxH`` (width first, as the OpenAI images API) and the largest side
a family is run at. Imports nothing heavy.

A size is read once, here, into a :class:`Size`; what a family allows of it (multiples of its pixel
granularity, frame counts) is ``bcg_pipelines.check_call``'s, the one shape rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .choices import MAX_SIDE_FACTOR, MIN_MAX_SIDE

__all__ = ["Size", "max_side", "parse_sizes"]

_SIZE = re.compile(r"\s*(\d+)x(\d+)(?:x(\d+))?\s*")


@dataclass(frozen=True)
class Size:
    """One ``WxH`` or ``WxHxFRAMES`` as written (``frames`` ``None`` where none was given)."""

    width: int
    height: int
    frames: int | None = None
    text: str = ""


def parse_sizes(text: str) -> list[Size]:
    """``"512x512,1344x768x9"`` -> :class:`Size` per comma-separated part; ``ValueError`` naming the part that
    cannot be read and the form to use."""
    sizes = []
    for part in text.split(","):
        m = _SIZE.fullmatch(part)
        if m is None:
            raise ValueError(f"cannot read {part!r}; give sizes as WxH (width x height), e.g. 512x512,1344x768, or "
                             "WxHxFRAMES for a video family")
        sizes.append(Size(int(m[1]), int(m[2]), int(m[3]) if m[3] else None, part.strip()))
    return sizes


def max_side(spec) -> int:
    """The largest height or width for a family (``None``: a checkpoint of no known family):
    :data:`~.choices.MAX_SIDE_FACTOR` x the largest side of its published size, at least
    :data:`~.choices.MIN_MAX_SIDE`, a multiple of its pixel granularity."""
    if spec is None:
        return MIN_MAX_SIDE
    largest = MAX_SIDE_FACTOR * max(spec.full.height, spec.full.width)
    return max(MIN_MAX_SIDE, largest - largest % spec.spatial_multiple)
