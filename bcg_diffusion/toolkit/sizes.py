"""Output sizes as the commands take them: ``WxH`` (width first, as the OpenAI images API). Imports nothing heavy.

A size is read once, here, into a :class:`Size` (:meth:`Size.read`; the server's requests and options take it written
strictly, :meth:`Size.parse`); what a family allows of it (multiples of its pixel granularity, frame counts) is
``bcg_pipelines.check_call``'s, the one shape rule.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

__all__ = ["MAX_DIGITS", "Size", "parse_sizes", "sizes_argument"]

#: ``WxH`` or ``WxHxFRAMES``: whole numbers joined by a lowercase ``x`` (what :meth:`Size.read` takes).
_SIZE = re.compile(r"(\d{1,18})x(\d{1,18})(?:x(\d{1,18}))?")
#: The most digits a side has in a size written as the OpenAI images API writes it (:meth:`Size.parse`).
MAX_DIGITS = 6


@dataclass(frozen=True)
class Size:
    """An output size: ``width`` and ``height`` in pixels, ``frames`` (``None`` where none was given), and the
    ``text`` it was read from (blanks around it dropped). ``str()`` writes it as ``WxH`` (``WxHxFRAMES``), width first
    as in the OpenAI images API; a model's preset size (``--size tiny|full``) is not a :class:`Size`."""

    width: int
    height: int
    frames: int | None = None
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.width}x{self.height}" + (f"x{self.frames}" if self.frames is not None else "")

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @classmethod
    def read(cls, text: str) -> "Size | None":
        """``text`` (blanks around it allowed) as a size, ``None`` where it is none: the one place a size is read."""
        m = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
        if m is None:
            return None
        return cls(int(m[1]), int(m[2]), int(m[3]) if m[3] else None, text.strip())

    @classmethod
    def parse(cls, text: str, what: str = "size") -> "Size":
        """``text`` as a ``WxH`` written exactly as the OpenAI images API writes one: a lowercase ``x``, no blanks, no
        frames, no leading zeros, at most :data:`MAX_DIGITS` digits a side (``0`` is read: the caller refuses it as
        not positive); ``ValueError`` naming ``what`` otherwise (a size written another way is probably not what was
        meant)."""
        size = cls.read(text) if isinstance(text, str) else None
        written = size is not None and size.frames is None and str(size) == text
        if not written or max(size.width, size.height) >= 10**MAX_DIGITS:
            raise ValueError(f"{what} {text!r} is not WIDTHxHEIGHT in pixels: two whole numbers without leading zeros "
                             "joined by a lowercase x, nothing around them, e.g. '512x512'")
        return size


def parse_sizes(text: str) -> list[Size]:
    """``"512x512,1344x768x9"`` -> :class:`Size` per comma-separated part; ``ValueError`` naming the part that
    cannot be read and the form to use."""
    sizes = []
    for part in text.split(","):
        size = Size.read(part)
        if size is None:
            raise ValueError(f"cannot read {part!r}; give sizes as WxH (width x height), e.g. 512x512,1344x768, or "
                             "WxHxFRAMES for a video family")
        sizes.append(size)
    return sizes


def sizes_argument(text: str) -> str:
    """An argparse ``type``: comma-separated sizes, each written as a request's (:meth:`Size.parse`; blanks around a
    size dropped); the sizes as ``WxH,WxH``. ``argparse.ArgumentTypeError`` saying which one cannot be read."""
    try:
        return ",".join(str(Size.parse(part.strip())) for part in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

