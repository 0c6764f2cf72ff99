"""The one check that a pipeline (or transformer) really replayed: shared by every GPU test that
claims capture, recapture or replay.

A comparison with an eager twin passes whether the accelerated calls replayed or ran eagerly
(a capture that fails falls back to eager); only the runner's counters tell them apart.
"""

from __future__ import annotations

import bcg_diffusion as bcg

_COUNTERS = ("hits", "misses", "captures", "failed_captures", "eager_calls", "warmup_calls",
             "child_hits", "child_warmup_calls", "child_eager_calls", "structure_changes")


def counters(obj) -> dict[str, int]:
    """The call counters of ``obj``'s acceleration now (all zero when it is not accelerated)."""
    stats = bcg.get_stats(obj)
    return {name: getattr(stats, name) if stats is not None else 0 for name in _COUNTERS}


def since(obj, before: dict[str, int]) -> dict[str, int]:
    """How the counters moved since ``before`` (from :func:`counters`)."""
    now = counters(obj)
    return {name: now[name] - before[name] for name in _COUNTERS}


def assert_replayed(
    obj, calls: int, before: dict[str, int] | None = None, *, child_warmups: bool = False, eager_units_per_call: int = 0
) -> None:
    """Every one of the ``calls`` transformer calls made since ``before`` (default: since
    acceleration) was served by captured graphs: none ran eagerly or as a first call, no capture
    failed, every kept key replays (no fallback), and in module mode no unit call ran eagerly
    (first unit calls only where ``child_warmups``: a step cache reaching a block at a new layout;
    ``eager_units_per_call``: units that do host work in their own forward and run eagerly by design,
    as many per transformer call)."""
    stats = bcg.get_stats(obj)
    assert stats is not None, "not accelerated: get_stats returned None"
    moved = since(obj, before) if before is not None else counters(obj)
    detail = f"{moved}\n{stats}"
    assert moved["hits"] + moved["warmup_calls"] + moved["eager_calls"] == calls, (
        f"the runner saw {moved['hits'] + moved['warmup_calls'] + moved['eager_calls']} calls, expected {calls}: {detail}"
    )
    assert moved["failed_captures"] == 0, f"a capture failed and fell back to eager: {detail}"
    assert moved["eager_calls"] == 0, f"calls ran eagerly: {detail}"
    if before is not None:
        assert moved["warmup_calls"] == 0, f"first calls of new keys after warm-up: {detail}"
        assert moved["hits"] == calls, f"{moved['hits']} of {calls} calls replayed: {detail}"
    assert stats.entries, f"no graph key kept: {detail}"
    assert all(e.fallback is None for e in stats.entries), f"a key falls back to eager: {detail}"
    assert moved["child_eager_calls"] == eager_units_per_call * calls, f"module mode: unit calls ran eagerly: {detail}"
    if before is not None and not child_warmups:
        assert moved["child_warmup_calls"] == 0, f"module mode: first unit calls after warm-up: {detail}"
    if any(e.module_mode for e in stats.entries):
        assert stats.child_hits > 0, f"module mode, but no unit call replayed: {detail}"



def assert_recaptured(obj, calls: int, before: dict[str, int], *, captures: int, warmups: int = 1,
                      structure_changes: int | None = None) -> None:
    """The ``calls`` transformer calls made since ``before`` recaptured and then replayed: exactly
    ``captures`` captures succeeded (in module mode: one per unit graph) and none failed, the first
    call of each of the ``warmups`` new keys ran eagerly and every other call was served by graphs
    (none eager), every kept key replays; with ``structure_changes``, the graphs were dropped that
    many times (a processor, hook or forward changed)."""
    stats = bcg.get_stats(obj)
    assert stats is not None, "not accelerated: get_stats returned None"
    moved = since(obj, before)
    detail = f"{moved}\n{stats}"
    assert moved["hits"] + moved["warmup_calls"] + moved["eager_calls"] == calls, (
        f"the runner saw {moved['hits'] + moved['warmup_calls'] + moved['eager_calls']} calls, expected {calls}: {detail}"
    )
    assert moved["failed_captures"] == 0, f"a capture failed and fell back to eager: {detail}"
    assert moved["captures"] == captures, f"{moved['captures']} captures, expected {captures}: {detail}"
    assert moved["eager_calls"] == 0, f"calls ran eagerly: {detail}"
    assert moved["warmup_calls"] == warmups, f"{moved['warmup_calls']} first calls, expected {warmups}: {detail}"
    assert moved["hits"] == calls - warmups, f"{moved['hits']} of {calls - warmups} later calls replayed: {detail}"
    if structure_changes is not None:
        assert moved["structure_changes"] == structure_changes, f"structure changes: {detail}"
    assert stats.entries and all(e.fallback is None for e in stats.entries), f"a key falls back to eager: {detail}"
    assert moved["child_eager_calls"] == 0, f"module mode: unit calls ran eagerly: {detail}"
    if any(e.module_mode for e in stats.entries):
        assert moved["child_hits"] > 0, f"module mode, but no unit call replayed: {detail}"


def assert_served(stats: dict, before: dict, calls: int) -> None:
    """The same as :func:`assert_replayed` for two ``get_stats`` snapshots as dictionaries
    (``dataclasses.asdict``, what ``scripts/serve.py``'s ``GET /stats`` answers under ``"bcg"``):
    the ``calls`` transformer calls between them were all replays."""
    moved = {name: stats[name] - before[name] for name in _COUNTERS}
    detail = f"{moved}\n{stats}"
    assert moved["hits"] == calls, f"{moved['hits']} of {calls} calls replayed: {detail}"
    for name in ("warmup_calls", "eager_calls", "failed_captures", "captures", "child_eager_calls"):
        assert moved[name] == 0, f"{name} moved: {detail}"
    assert stats["entries"] and all(e["fallback"] is None for e in stats["entries"]), f"a key falls back: {detail}"
