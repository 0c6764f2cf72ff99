"""The opt-in check of the lifetime rule of break arguments (:mod:`.nonowning`).

The rule leaves a break argument non-owning when its storage died during the capture, taking it for
an intermediate in the graph's pool. A tensor that existed before the capture, was passed to a break
and lost its last owner during the capture breaks that assumption: its block went back to the
general allocator, and a replay would read memory someone else may own. With
``BCG_DIFFUSION_CHECK_BREAK_ARGS=1`` every capture verifies, after it ended, that each argument kept
non-owning lies in a segment of the capture's pool, and raises :class:`BreakArgumentOutsidePoolError`
naming the break if not (the capture then fails: the graph runner falls back to eager with one
warning that carries the message).

The check reads an allocator snapshot (``torch.cuda.memory_snapshot``, a walk over every block): it
is off by default, and this module is the only place in the library that calls it.
"""

from __future__ import annotations

import bisect
import os
from typing import Any, Sequence

import torch

from .nonowning import KeptNonOwning

ENV_CHECK = "BCG_DIFFUSION_CHECK_BREAK_ARGS"


class BreakArgumentOutsidePoolError(RuntimeError):
    """A break argument left non-owning lies outside the capture's memory pool (the debug check)."""


def check_enabled() -> bool:
    """Whether ``BCG_DIFFUSION_CHECK_BREAK_ARGS`` is on (``1/true/yes/on``; unset or ``0``: off)."""
    raw = os.environ.get(ENV_CHECK, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"environment variable {ENV_CHECK}={os.environ[ENV_CHECK]!r}: use 1 or 0")


def pool_ranges(pool: Any, device: torch.device) -> list[tuple[int, int]]:
    """Sorted ``(start, end)`` address ranges of the allocator segments of memory pool ``pool`` on
    ``device``, from an allocator snapshot."""
    pool = tuple(pool)
    try:
        segments = torch.cuda.memory_snapshot(mempool_id=pool)
    except TypeError:  # older torch: no mempool_id argument
        segments = torch.cuda.memory_snapshot()
    return sorted(
        (s["address"], s["address"] + s["total_size"])
        for s in segments
        if tuple(s.get("segment_pool_id", ())) == pool and s.get("device", device.index) == device.index
    )


def _inside(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_right([a for a, _ in ranges], start) - 1
    return i >= 0 and end <= ranges[i][1]


def outside_pool(kept: Sequence[KeptNonOwning], ranges: list[tuple[int, int]]) -> list[KeptNonOwning]:
    """The arguments of ``kept`` whose memory (the whole storage they alias) is not inside one of ``ranges``."""
    found = []
    for argument in kept:
        storage = argument.view.untyped_storage()
        start = storage.data_ptr()
        if not _inside(ranges, start, start + max(storage.nbytes(), 1)):
            found.append(argument)
    return found


def check_in_pool(kept: Sequence[KeptNonOwning], pool: Any, device: torch.device) -> None:
    """Raise :class:`BreakArgumentOutsidePoolError` naming the breaks whose non-owning arguments lie
    outside ``pool``; nothing to check, nothing read."""
    if not kept:
        return
    bad = outside_pool(kept, pool_ranges(pool, device))
    if bad:
        names = sorted({argument.name for argument in bad})
        raise BreakArgumentOutsidePoolError(
            f"{len(bad)} argument(s) of the break(s) {', '.join(names)} were freed during the capture but do not lie "
            "in the graph's memory pool: a tensor made before the capture whose last owner dropped it while the "
            "capture ran. A replay would read memory the allocator may hand to anyone. Keep a reference to it "
            "until the capture ends (or pass a copy made inside the captured code); "
            f"found by {ENV_CHECK}=1 (docs/capture-core.md)"
        )
