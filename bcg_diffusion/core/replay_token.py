"""Replay tokens: a key that changes on every replay, for caches in eager break code.

Under replay, the inputs of an eager break sit in the same static buffers every time, so a
cache keyed on a tensor's address or identity would serve stale data. Eager code that derives
metadata from its inputs (cumulative sequence lengths of a mask, gather indices) should key
that cache on :func:`get_current_replay_token` instead::

    _cache = {}

    def varlen_metadata(mask):
        token = get_current_replay_token()
        if token is None:              # eager call or capture: no reuse is safe
            return build_metadata(mask)
        if _cache.get("token") != token:
            _cache.clear()
            _cache.update(token=token, value=build_metadata(mask))
        return _cache["value"]         # built once per replay, shared by all blocks
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Iterator

_REPLAY_TOKEN: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "bcg_replay_token", default=None
)
_TOKENS = itertools.count(1)


def get_current_replay_token() -> int | None:
    """The token of the replay running in this context, or ``None`` outside a replay.

    ``None`` also during capture: capture runs eager code on placeholder data, which must not
    populate a cache that a replay would then trust.
    """
    return _REPLAY_TOKEN.get()


@contextlib.contextmanager
def replay_token_scope() -> Iterator[int]:
    """Run the enclosed code under a fresh, process-unique replay token; restores the previous one."""
    reset = _REPLAY_TOKEN.set(next(_TOKENS))
    try:
        yield _REPLAY_TOKEN.get()  # type: ignore[misc]
    finally:
        _REPLAY_TOKEN.reset(reset)


@contextlib.contextmanager
def no_replay_token() -> Iterator[None]:
    """Run the enclosed code with no replay token (used while capturing)."""
    reset = _REPLAY_TOKEN.set(None)
    try:
        yield
    finally:
        _REPLAY_TOKEN.reset(reset)
