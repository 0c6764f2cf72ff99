"""Numbers as the commands read them: the one argparse type of every float option, and the whole-number check of
values that count something. Imports nothing heavy (the parsers use it before torch is imported).

``float("nan")`` and ``float("inf")`` are valid Python floats, so an option typed ``float`` takes them, and every
comparison with a NaN is false: a check such as ``value < 0`` lets it through, and it then breaks far from the
option (a batch window of NaN seconds hung every batched request). :func:`finite_float` refuses them where they
enter, with argparse's usual ``argument --name: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["finite_float", "whole_number"]


def finite_float(text: str) -> float:
    """The argparse ``type`` of a float option: ``text`` read as a finite number; ``argparse.ArgumentTypeError``
    (a usage error naming the option) for ``nan``, ``inf``, an overflow such as ``1e999``, or no number at all."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give one such as 0.5 or 20")
    return value


def whole_number(value: float, what: str) -> int:
    """``value`` as an ``int`` when it is a whole number (``2`` or ``2.0``); ``ValueError`` starting with ``what``
    otherwise (``2.5``, NaN, infinities), so that a count is never rounded silently."""
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{what} must be a whole number (got {value:g})")
    return int(value)
