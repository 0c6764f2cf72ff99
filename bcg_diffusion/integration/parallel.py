"""The graph runner under diffusers context parallelism: the ranks of one transformer in lockstep.

Under ``enable_parallelism(config=ContextParallelConfig(...))`` every rank runs collectives in each
transformer call: inside attention (an eager break, never captured: the attention policy is forced
to ``"break"`` for captures) and in the output gather (an eager break too, :mod:`.breaks.cp_gather`). A
capture runs no collective at all (breaks only allocate their outputs there; eager modules holding
attention are refused, :mod:`.cp_support`; debug mode runs every break for real, alike on every
rank), so what must be equal on every rank is the sequence of *real* executions of the forward: a
rank that runs a call twice (a replay stopped half-way, then eagerly) or skips one leaves the others
waiting in a collective. :class:`Lockstep`, a watcher of the runner (:mod:`.events`), makes every
decision that changes it together, through :class:`~.lockstep.RankAgreement` (the job's store, no
GPU work):

- before each call, the *plan*: its path (``warmup``, ``capture``, ``replay``, ``fallback``,
  ``eager``, ``module``: :data:`~.slots.PATHS`) and a rank-independent digest of its key. Ranks that differ (other inputs, weights,
  structure, a state that drifted) get :class:`~.lockstep.RankDisagreementError` on every rank,
  before any collective;
- after each capture, its outcome: a capture that failed on one rank falls back to eager on all,
  and the graph memory counted for eviction is the largest rank's, so budget evictions agree;
- captures narrow nothing (``max_narrowing=0``: per-rank narrowing would make per-rank eager
  modules) and never evict for memory mid-capture (an out-of-memory capture falls back on all ranks);
- a replay that stops part-way (a break returned another shape) cannot fall back on one rank: it
  raises;
- a rank that raises inside a call publishes it (:meth:`RankAgreement.abort`): the others raise
  :class:`~.lockstep.RankAbortedError` naming that rank and call at their next round, or at once
  where they wait in code that polls :func:`raise_if_peer_aborted`; one that fails in a collective
  because its peer went away reports the peer's abort instead of its own timeout.

:func:`lockstep_for` makes the lockstep of a transformer under context parallelism (refusals
raise); the runner's structure watch follows the transformer's parallel config with it, so both
orders work: ``enable_parallelism`` before or after acceleration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import weakref
from typing import Any

import torch

from . import cp_support
from .breaks import cp_gather
from .entry_kinds import CapturedGraph, EagerFallback
from .events import RunnerWatcher
from .keys import GraphKey, HostTensor, TensorSpec
from .object_inputs import ObjectLayout, Opaque
from .lockstep import RankAbortedError, RankAgreement, RankAgreementError

logger = logging.getLogger("bcg_diffusion")

AGREEMENT_GROUP = "cp"
_live: "weakref.WeakSet[Lockstep]" = weakref.WeakSet()


class Lockstep(RunnerWatcher):
    """The ranks of one context-parallel transformer (see the module docstring).

    ``agreement`` is ``None`` when the context-parallel group has one rank; ``gather`` is the handle
    of the gather break (:func:`~.breaks.cp_gather.acquire`), removed by :meth:`close`. Contract:
    every rank of the group makes the same calls of the transformer, in the same order (the runner
    then tells its watchers the same events); the object must be created in the same order on every
    rank (agreements are numbered per group).
    """

    def __init__(self, parallel_config: Any, agreement: RankAgreement | None, gather: Any = None) -> None:
        self.parallel_config = parallel_config
        self.agreement = agreement
        self.calls = 0
        self._gather = gather
        self._current: int | None = None
        self._planned = False
        self._phase = "before its plan"
        self._warned: set[str] = set()
        _live.add(self)

    @property
    def rank(self) -> int:
        return self.agreement.rank if self.agreement is not None else 0

    # -- calls ----------------------------------------------------------------------------
    def call_began(self) -> None:
        self._current = self.calls
        self.calls += 1
        self._planned = False
        self._phase = "before its plan"

    def call_ended(self) -> None:
        self._current = None

    def _index(self) -> int:
        if self._current is None:  # created inside this call (parallelism enabled after accelerating)
            self.call_began()
        return self._current

    def where(self) -> str:
        return f"in transformer call {self._index()} ({self._phase})"

    def call_failed(self, exc: BaseException) -> None:
        """``exc`` leaves a call on this rank. A communication error after another rank aborted
        is reported as that rank's abort (it is the cause); any other error is this rank's own: it
        is published to the others (unless one aborted before) and goes on with a note."""
        if self.agreement is None or isinstance(exc, RankAgreementError):
            return
        peer = self.agreement.poll_abort()
        if peer is not None and is_communication_error(exc):
            raise peer from exc
        where = self.where()
        if peer is None:
            self.agreement.abort(f"{type(exc).__name__}: {exc}"[:500], where=where)
            told = "the other ranks were told (RankAbortedError)"
        else:
            told = f"rank {peer.rank} had aborted before ({peer.where}: {peer.reason[:200]})"
        _add_note(exc, f"bcg: rank {self.rank} raised this {where}; {told}")

    # -- decisions ------------------------------------------------------------------------
    def planned(self, path: str, key: GraphKey) -> None:
        """The plan round of this call: its path and key on every rank (see the module docstring)."""
        if not self._planned:
            self._plan(path, f"{key_digest(key)} {key_shapes(key)}")

    def planned_eager(self, reason: str, args: tuple = (), kwargs: dict | None = None) -> None:
        """The plan round of a call that runs eagerly before it has a key (its inputs' layout
        stands for the key); a no-op after this call's plan."""
        if not self._planned:
            self._plan("eager", f"{inputs_digest(args, kwargs or {})} ({reason})")

    def _plan(self, path: str, detail: str) -> None:
        index = self._index()
        self._planned = True
        self._phase = path
        if self.agreement is not None:
            self.agreement.same(f"call {index}: plan", f"{path} {detail}")

    def capturing(self, ctx: Any) -> Any:
        """``ctx`` for a capture under context parallelism: attention breaks, nothing is narrowed,
        nothing evicted mid-capture."""
        config = dataclasses.replace(ctx.config, max_narrowing=0, attention="break")
        return dataclasses.replace(ctx, config=config, evict_all=_no_eviction)

    def captured(self, entry: Any) -> Any:
        """Make ``entry``'s capture outcome the ranks' common one (see the module docstring): the entry
        the runner keeps (this rank's, or a fallback when it failed on some rank)."""
        ok = isinstance(entry, CapturedGraph)
        why = entry.reason if isinstance(entry, EagerFallback) else "" if ok else "module mode"
        if self.agreement is None:
            return entry
        index = self._index()
        mine = json.dumps({"ok": ok, "memory": int(entry.memory_bytes), "why": why})
        values = [json.loads(v) for v in self.agreement.gather(f"call {index}: capture", mine)]
        failed = [r for r, v in enumerate(values) if not v["ok"]]
        if not failed:
            entry.memory_bytes = max(v["memory"] for v in values)
            return entry
        first = values[failed[0]]["why"]
        ranks = ", ".join(map(str, failed))
        reason = f"capture failed on rank{'s' if len(failed) > 1 else ''} {ranks}: {first}"
        self._warn_fallback(reason)
        return entry.fall_back(reason)

    def _warn_fallback(self, reason: str) -> None:
        message = f"bcg: {reason}; under context parallelism this input shape now runs eagerly on every rank"
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s", message)

    def replay_failed(self, exc: BaseException) -> None:
        """A replay stopped part-way: other ranks ran its collectives, so this rank cannot run
        the call again eagerly on its own."""
        from ..errors import AccelerationError

        raise AccelerationError(
            f"a replay stopped part-way under context parallelism ({str(exc).splitlines()[0][:200]}); the other ranks "
            "already ran part of this call's collectives, so it cannot run again eagerly on this rank alone. Report it "
            "with the model and shapes; BCGConfig(debug=True) shows which break changed shape."
        ) from exc

    def close(self) -> None:
        """Undo the gather patch (idempotent)."""
        gather, self._gather = self._gather, None
        if gather is not None:
            gather.remove()
        _live.discard(self)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10 the list that 3.11 shows with the traceback."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


_COMMUNICATION_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "collective", "peer")


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a failed collective or store operation (a peer went away),
    rather than an error of this rank's own."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None), TimeoutError, ConnectionError) if k is not None)
    if isinstance(exc, kinds):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(word in text for word in _COMMUNICATION_WORDS)


def _no_eviction() -> bool:
    return False


# -- following the module ---------------------------------------------------------------------
def lockstep_for(module: torch.nn.Module, config: Any) -> Lockstep | None:
    """The lockstep of ``module`` under its parallel config now, ``None`` without parallelism.
    Refuses (:class:`~bcg_diffusion.AccelerationError`) the parallel set-ups and configs BCG cannot
    replay. Makes the gather an eager break while the lockstep lives."""
    cp = cp_support.context_parallel_config(module)
    if cp is None:
        return None
    cp_support.check_config(module, config)
    logger.info("bcg: %s runs under context parallelism: its ranks agree on every call", type(module).__name__)
    return Lockstep(module._parallel_config, _agreement_for(cp, config.rank_timeout_s), cp_gather.acquire())


def _agreement_for(cp: Any, timeout_s: float) -> RankAgreement | None:
    """The agreement of ``cp``'s group of ranks, over the default group's store."""
    import torch.distributed as dist

    mesh = getattr(cp, "_flattened_mesh", None)
    group = mesh.get_group() if mesh is not None else None
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    if len(ranks) < 2:
        return None
    store = dist.distributed_c10d._get_default_store()
    name = f"{AGREEMENT_GROUP}{'-'.join(map(str, ranks))}"
    return RankAgreement(store, ranks.index(dist.get_rank()), len(ranks), timeout_s, group=name)


def raise_if_peer_aborted() -> None:
    """Raise the :class:`~.lockstep.RankAbortedError` of a rank that gave up, for code that waits
    for other ranks outside an agreement round (a collective inside a transformer call). One store
    check per context-parallel transformer in a call now; a no-op without one."""
    for lockstep in list(_live):
        if lockstep.agreement is not None and lockstep._current is not None:
            peer = lockstep.agreement.poll_abort()
            if peer is not None:
                raise peer


# -- what the ranks compare -------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if isinstance(value, TensorSpec):
        return ("tensor", value.shape, value.stride, str(value.dtype), value.device.type, value.requires_grad)
    if isinstance(value, (ObjectLayout, Opaque)):
        return ("object", value.type_name)  # an opaque value's identity differs per rank
    if isinstance(value, HostTensor):
        return ("host", value.shape, str(value.dtype), value.values)
    if isinstance(value, torch.device):
        return ("device", value.type)
    return repr(value)


def _weights(weights: Any) -> Any:
    """The rank-independent part of the weight fingerprint: tensor count and adapter state
    (addresses and version counters may differ between ranks)."""
    if isinstance(weights, tuple) and len(weights) == 4:
        return (weights[0], repr(weights[3]))
    return type(weights).__name__


def key_digest(key: GraphKey) -> str:
    """A digest of ``key`` equal on every rank for equal calls (no addresses, no device index)."""
    plain = (
        tuple((path, _plain(v)) for path, v in key.inputs),
        tuple((name, _plain(v)) for name, v in key.state),
        _weights(key.weights),
    )
    return hashlib.sha1(repr(plain).encode()).hexdigest()[:16]


def inputs_digest(args: tuple, kwargs: dict) -> str:
    """A digest of the call's inputs without a key: tensor shapes, dtypes and device types, and
    the values of plain leaves (other objects by type)."""
    from ..core.tree import walk

    fields = []
    for path, descriptor, leaf in walk((args, kwargs)):
        if descriptor is not None:
            fields.append((path, repr(descriptor)))
        elif isinstance(leaf, torch.Tensor):
            fields.append((path, tuple(leaf.shape), str(leaf.dtype), leaf.device.type))
        elif isinstance(leaf, (int, float, bool, str, bytes, type(None))):
            fields.append((path, repr(leaf)))
        else:
            fields.append((path, type(leaf).__qualname__))
    return hashlib.sha1(repr(fields).encode()).hexdigest()[:16]


def key_shapes(key: GraphKey) -> str:
    """The tensor inputs' shapes, for people reading a disagreement."""
    return ", ".join(f"{p}{list(v.shape)}" for p, v in key.inputs if isinstance(v, TensorSpec))


__all__ = [
    "Lockstep",
    "RankAbortedError",
    "key_digest",
    "lockstep_for",
    "raise_if_peer_aborted",
]
