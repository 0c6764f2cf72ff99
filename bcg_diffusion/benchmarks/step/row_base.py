"""What a whole-pipeline row is (:class:`Row`) and the small formatting helpers the rows' tables share.

A row module (:mod:`.e2e_row`, :mod:`.cache_row`, :mod:`.first_image`) defines its ``Row``;
:mod:`.rows` collects them into the registry. Imports point one way: rows -> row modules -> here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def rows_setting(case, settings) -> bool:
    """The end-to-end setting: ``--e2e`` / ``--no-e2e``, else the case's own (the default matrix's)."""
    return bool(case.rows if settings.rows is None else settings.rows)


@dataclass(frozen=True)
class Row:
    """A whole-pipeline row of a case.

    ``run(pipe, call, seed, clock, log, *, case, settings) -> dict`` is stored under the case's ``name`` key;
    ``markdown(cases) -> lines`` renders the report's table; ``enabled(case, settings)`` says whether it runs
    for a case; a row with ``before_modes`` runs before the per-step modes (so that its compiles and
    captures are the first of the case), the others after them.
    """

    name: str
    run: Callable[..., dict[str, Any]]
    markdown: Callable[[list[dict[str, Any]]], list[str]]
    enabled: Callable[[Any, Any], bool] = rows_setting
    before_modes: bool = False


def fmt(x, spec: str = "{:.2f}", none: str = "n/a") -> str:
    """``spec.format(x)``, or ``none`` for a missing value."""
    return none if x is None else spec.format(x)


def yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")
