"""Agreement between the ranks of a ``torch.distributed`` job on the graph runner's decisions.

Under context parallelism every rank runs collectives inside attention (and in diffusers' gather
hooks). A rank that takes another path than the others (a key miss where they hit, a capture that
failed only here, an eviction only here) runs another sequence of collectives, and NCCL hangs.
:class:`RankAgreement` lets the runner take every such decision together: each rank states its
value for a named *round* and gets every rank's value back, or a clear error.

Communication goes through the job's key-value store (the ``TCPStore`` behind
``init_process_group``), never through NCCL: it works with any backend, enqueues no GPU work
(so it is safe between graph segments and during a capture) and can be tested on CPU with gloo.

Round ``n`` of agreement group ``g``: every rank writes ``bcg/<g>/<n>/<rank>`` (its payload: the
round's name and its value), then reads every other rank's key of round ``n``, waiting at most
``timeout_s``; while it waits it watches ``bcg/<g>/abort``. After round ``n`` a rank deletes its
own key of round ``n - 1`` (every other rank has written round ``n``, so it has read round
``n - 1``): at most two keys per rank are alive at any time.

Contract: **every rank makes the same sequence of agreement calls** (same methods, in the same
order; the names may carry per-call details such as a call index). Keeping that so is the
runner's job; a rank that is out of step is detected where the round names differ
(:class:`RankOutOfStepError`), and otherwise shows as a timeout. Agreement objects must be
created in the same order on every rank too (each creation with a group name gets the next
generation of that name, part of its keys).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from typing import Any

from ..errors import RankAbortedError, RankAgreementError, RankDisagreementError, RankOutOfStepError, RankTimeoutError

logger = logging.getLogger("bcg_diffusion")

KEY_PREFIX = "bcg"
_VALUE = b"V"
_ABORT = b"A"
_SEPARATOR = b"\x00"
_SHOWN_CHARS = 300  # a value longer than this is cut in error messages

_generations: dict[str, int] = {}
_generations_lock = threading.Lock()


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "...")


def _who_has(ranks: list[int], value: str) -> str:
    listed = ", ".join(map(str, ranks))
    return f"rank {listed} has {_shown(value)}" if len(ranks) == 1 else f"ranks {listed} have {_shown(value)}"


def _next_generation(group: str) -> int:
    with _generations_lock:
        generation = _generations.get(group, 0)
        _generations[group] = generation + 1
        return generation


def _private_connection(store: Any) -> tuple[Any, bool]:
    """A store client of our own (own socket, own timeout), where the store can clone itself;
    else ``store`` itself, whose timeout must then be left alone."""
    clone = getattr(store, "clone", None)
    if clone is not None:
        try:
            return clone(), True
        except Exception as exc:  # noqa: BLE001 - not every store type can clone
            logger.debug("bcg: store %s cannot clone (%s); sharing it", type(store).__name__, exc)
    return store, False


class RankAgreement:
    """Agreement rounds between the ``world_size`` ranks of a job (see the module docstring).

    ``timeout_s`` bounds every round. ``first_wait_s`` is how long a round waits blocking in the
    store before it switches to polling (which also watches the abort key); it only matters
    when other ranks are late. ``group`` separates independent agreements (one per transformer):
    it must be the same on every rank. ``generation`` numbers agreements of one group (default:
    how many this process created before); pass it where ranks are not processes (tests). Calls
    are serialised by a lock.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        timeout_s: float,
        *,
        group: str = "runner",
        first_wait_s: float = 1.0,
        generation: int | None = None,
    ) -> None:
        if world_size < 2:
            raise ValueError(f"RankAgreement needs at least 2 ranks, got world_size={world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not first_wait_s > 0:
            raise ValueError(f"first_wait_s must be > 0, got {first_wait_s}")
        if "/" in group:
            raise ValueError(f"group must not contain '/', got {group!r}")
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.first_wait_s = min(float(first_wait_s), self.timeout_s)
        self.group_id = f"{group}.{_next_generation(group) if generation is None else generation}"
        self._store, private = _private_connection(store)
        self._blocking = private and hasattr(self._store, "multi_get")
        if self._blocking:
            self._store.set_timeout(datetime.timedelta(seconds=self.first_wait_s))
        self._peers = [r for r in range(world_size) if r != rank]
        self._round = 0
        self._last_name = ""
        self._failure: RankAgreementError | None = None
        self._lock = threading.Lock()

    # -- the rounds -----------------------------------------------------------------------
    @property
    def rounds(self) -> int:
        """Rounds this rank has entered."""
        return self._round

    def gather(self, name: str, value: str) -> list[str]:
        """Every rank's ``value`` for this round, indexed by rank."""
        if not isinstance(value, str):
            raise TypeError(f"agreement values are strings, got {type(value).__name__} for round {name!r}")
        with self._lock:
            return self._exchange(name, value)[1]

    def same(self, name: str, value: str) -> None:
        """Return when every rank has the same ``value``; raise :class:`RankDisagreementError`
        naming every rank's value otherwise (on every rank)."""
        if not isinstance(value, str):
            raise TypeError(f"agreement values are strings, got {type(value).__name__} for round {name!r}")
        with self._lock:
            index, values = self._exchange(name, value)
        if all(v == values[0] for v in values):
            return
        by_value: dict[str, list[int]] = {}
        for rank, v in enumerate(values):
            by_value.setdefault(v, []).append(rank)
        parts = [_who_has(ranks, v) for v, ranks in by_value.items()]
        raise RankDisagreementError(
            f"ranks disagree at {name!r} (agreement round {index}): {'; '.join(parts)}. Every rank must "
            "get the same inputs (seeds, prompts, shapes), configuration and weights (LoRA loads)",
            name,
            index,
            dict(enumerate(values)),
        )

    def abort(self, reason: str, where: str | None = None) -> None:
        """Tell the other ranks that this rank stops taking part (call it from an exception handler
        before re-raising): their current or next round raises :class:`RankAbortedError` naming
        this rank, ``where`` (default: after its last round) and ``reason``. Never raises; later
        rounds on this rank raise :class:`RankAbortedError` too."""
        if where is None:
            where = (
                f"after {self._last_name!r} (agreement round {self._round - 1})" if self._round
                else "before its first agreement round"
            )
        payload = _ABORT + json.dumps({"rank": self.rank, "where": where, "reason": str(reason)}).encode()
        with self._lock:
            if self._failure is None:
                self._failure = RankAbortedError(
                    f"this rank ({self.rank}) aborted {where}: {reason}", self.rank, where, str(reason)
                )
            for key in (self._key(self._round, self.rank), self._abort_key()):
                try:
                    self._store.set(key, payload)
                except Exception as exc:  # noqa: BLE001 - abort runs in exception handlers: never mask the error
                    logger.warning("bcg: rank %d could not publish its abort (%s): %s", self.rank, key, exc)

    def poll_abort(self) -> "RankAbortedError | None":
        """The abort another rank published, or ``None``; never waits (one store check) and never
        raises. Once one is seen, every later round raises it. For code that waits elsewhere (a
        collective) and wants to stop when a peer gave up."""
        with self._lock:
            if self._failure is not None:
                failure = self._failure
                return failure if isinstance(failure, RankAbortedError) and failure.rank != self.rank else None
            try:
                if not self._store.check([self._abort_key()]):
                    return None
                payload = self._store.get(self._abort_key())
            except Exception as exc:  # noqa: BLE001 - a lost store: nothing to report here
                logger.debug("bcg: rank %d could not read the abort key: %s", self.rank, exc)
                return None
            error = self._aborted(payload)
            if error.rank == self.rank:
                return None
            self._failure = error
            return error

    # -- internals ------------------------------------------------------------------------
    def _key(self, round_index: int, rank: int) -> str:
        return f"{KEY_PREFIX}/{self.group_id}/{round_index}/{rank}"

    def _abort_key(self) -> str:
        return f"{KEY_PREFIX}/{self.group_id}/abort"

    def _exchange(self, name: str, value: str) -> tuple[int, list[str]]:
        if self._failure is not None:
            raise self._failure
        index = self._round
        self._round += 1
        self._last_name = name
        self._store.set(self._key(index, self.rank), _VALUE + name.encode() + _SEPARATOR + value.encode())
        raw = self._collect(index, name)
        names, values = [""] * self.world_size, [""] * self.world_size
        names[self.rank], values[self.rank] = name, value
        for rank, payload in zip(self._peers, raw):
            if payload[:1] == _ABORT:
                self._fail_aborted(payload)
            round_name, _, peer_value = payload[1:].partition(_SEPARATOR)
            names[rank], values[rank] = round_name.decode(), peer_value.decode()
        if index > 0:
            self._store.delete_key(self._key(index - 1, self.rank))
        if any(n != name for n in names):
            listed = "; ".join(f"rank {r} is at {n!r}" for r, n in enumerate(names))
            raise RankOutOfStepError(
                f"ranks are out of step at agreement round {index}: {listed}. Every rank must make the same "
                "sequence of agreement calls",
                name,
                index,
                dict(enumerate(names)),
            )
        return index, values

    def _collect(self, index: int, name: str) -> list[bytes]:
        keys = [self._key(index, r) for r in self._peers]
        deadline = time.monotonic() + self.timeout_s
        if self._blocking:
            try:
                return self._store.multi_get(keys)  # blocks until all are there, or first_wait_s
            except Exception as exc:  # noqa: BLE001 - a timeout (DistStoreError); a lost store fails below too
                logger.debug("bcg: agreement round %d not complete after %.2f s: %s", index, self.first_wait_s, exc)
        pause = 0.0002
        while True:
            if self._store.check(keys):
                return self._read(keys)
            if self._store.check([self._abort_key()]):
                self._fail_aborted(self._store.get(self._abort_key()))
            if time.monotonic() >= deadline:
                self._fail_timeout(index, name, keys)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _read(self, keys: list[str]) -> list[bytes]:
        if hasattr(self._store, "multi_get"):
            return self._store.multi_get(keys)
        return [self._store.get(k) for k in keys]

    def _aborted(self, payload: bytes) -> RankAbortedError:
        info = json.loads(payload[1:].decode())
        return RankAbortedError(
            f"rank {info['rank']} aborted {info['where']}: {info['reason']}. This rank ({self.rank}) stops too",
            int(info["rank"]),
            str(info["where"]),
            str(info["reason"]),
        )

    def _fail_aborted(self, payload: bytes) -> None:
        error = self._aborted(payload)
        self._failure = error
        raise error

    def _fail_timeout(self, index: int, name: str, keys: list[str]) -> None:
        missing = [r for r, k in zip(self._peers, keys) if not self._store.check([k])]
        listed = ", ".join(map(str, missing))
        error = RankTimeoutError(
            f"rank{'s' if len(missing) > 1 else ''} {listed} did not answer {name!r} (agreement round {index}) within "
            f"{self.timeout_s:g} s; this is rank {self.rank}. A rank that crashed, raised without abort(), or makes "
            "other agreement calls leaves the others waiting",
            name,
            index,
            missing,
            self.timeout_s,
        )
        self._failure = error
        raise error
