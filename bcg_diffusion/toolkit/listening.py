"""What the library says while a block of code runs, for the tools that report per case (the zoo probe, the
planting harness): its graph runners' events (``bcg_diffusion.RunnerWatcher``, watched on every runner of the
process), the warnings raised, and the problems the library logs (records at WARNING and above of the
``bcg_diffusion`` logger). No log line below that is read: why calls ran eagerly, which captures fell back or
were narrowed and which replays stopped come from the runner events.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import bcg_diffusion

__all__ = ["Heard", "listening"]

_LINE_CHARS = 400  # a longer first line is cut


def first_line(text: str) -> str:
    """The first line of ``text``, stripped and cut at :data:`_LINE_CHARS` ('' for empty text)."""
    text = text.strip()
    return text.splitlines()[0][:_LINE_CHARS] if text else ""


def _add(lines: list[str], text: str) -> None:
    line = first_line(text)
    if line and line not in lines:
        lines.append(line)


@dataclass
class Heard:
    """What the library said in the block; each list holds distinct first lines, in order.

    ``eager_reasons``: why calls ran eagerly (``ran_eagerly``); ``outcomes``: captures that fell back (with
    the reason) or narrowed parts to eager breaks (naming them), and replays that stopped; ``warnings``: every warning raised; ``capture_warnings``: those of ``BCGCaptureWarning``;
    ``problems``: what the library logged at WARNING or above."""

    eager_reasons: list[str] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    capture_warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def said(self) -> list[str]:
        """Everything the library told: its capture warnings, problems, capture outcomes and eager reasons."""
        return [*self.capture_warnings, *self.problems, *self.outcomes, *self.eager_reasons]


class _Watcher(bcg_diffusion.RunnerWatcher):
    """Notes the runner events of :class:`Heard`."""

    def __init__(self, heard: Heard) -> None:
        self.heard = heard

    def ran_eagerly(self, reason: str) -> None:
        _add(self.heard.eager_reasons, reason)

    def captured(self, entry: Any) -> Any:
        reason = getattr(entry, "reason", None)  # an EagerFallback's
        if reason is not None:
            _add(self.heard.outcomes, f"capture fell back to eager: {reason}")
        if entry.eager_modules:
            _add(self.heard.outcomes, f"narrowed to eager breaks: {', '.join(entry.eager_modules)}")
        return entry

    def replay_failed(self, exc: BaseException) -> None:
        _add(self.heard.outcomes, f"replay stopped: {exc}")


class _Problems(logging.Handler):
    def __init__(self, heard: Heard) -> None:
        super().__init__(logging.WARNING)
        self.heard = heard

    def emit(self, record: logging.LogRecord) -> None:
        _add(self.heard.problems, record.getMessage())


@contextlib.contextmanager
def listening() -> Iterator[Heard]:
    """Collect what the library says inside the block (see :class:`Heard`); filled when the block ends
    (the runner events and problems as they come)."""
    heard = Heard()
    logger = logging.getLogger("bcg_diffusion")
    problems, level = _Problems(heard), logger.level
    watching = bcg_diffusion.watch_every_runner(_Watcher(heard))
    logger.addHandler(problems)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield heard
            finally:
                for warning in caught:
                    _add(heard.warnings, str(warning.message))
                    if issubclass(warning.category, bcg_diffusion.BCGCaptureWarning):
                        _add(heard.capture_warnings, str(warning.message))
    finally:
        logger.removeHandler(problems)
        logger.setLevel(level)
        watching.remove()
