"""The registry of whole-pipeline rows: full ``pipe(...)`` calls of a case, measured besides the per-step modes.

A row is a :class:`.row_base.Row` defined in its own module; :data:`ROW_REGISTRY` lists them in the
order of the report: ``first_image`` (``--first-image``; :mod:`.first_image`, runs before the per-step
modes), ``e2e`` (eager vs BCG end to end, ``--e2e``; :mod:`.e2e_row`) and ``cache`` (step caches end
to end, ``--cache-rows``; :mod:`.cache_row`). To add a row: write its module with ``run``,
``markdown`` and ``enabled`` and :func:`register` its ``Row`` here.
"""

from __future__ import annotations

from .cache_row import CACHE_ROW
from .e2e_row import E2E_ROW
from .first_image import FIRST_IMAGE_ROW
from .row_base import Row

ROW_REGISTRY: dict[str, Row] = {}


def register(row: Row) -> Row:
    """Add ``row`` to the registry (the order of registration is the order of the report)."""
    ROW_REGISTRY[row.name] = row
    return row


for _row in (FIRST_IMAGE_ROW, E2E_ROW, CACHE_ROW):
    register(_row)
