"""The graph runner under diffusers context parallelism: the ranks of one transformer in lockstep.

Under ``enable_parallelism(config=ContextParallelConfig(...))`` every rank runs collectives in each
transformer call: inside attention (an eager break, never captured: the attention policy is forced
to ``"break"`` for captures) and in the output gather (an eager break too, :mod:`.cp_gather`). A
capture runs no collective at all (breaks only allocate their outputs there; eager modules holding
attention are refused, :mod:`.cp_support`; debug mode runs every break for real, alike on every
rank), so what must be equal on every rank is the sequence of *real* executions of the forward: a
rank that runs a call twice (a replay stopped half-way, then eagerly) or skips one leaves the others
waiting in a collective. :class:`Lockstep` makes every decision that changes it
together, through :class:`~.lockstep.RankAgreement` (the job's store, no GPU work):

- before each call, the *plan*: its path (``warmup``, ``capture``, ``replay``, ``fallback``,
  ``eager``) and a rank-independent digest of its key. Ranks that differ (other inputs, weights,
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

:data:`NO_RANKS` stands in for a transformer without parallelism (every method a no-op), so the
runner's call sites are unconditional. :func:`follow` keeps the runner's object current (both
orders work: ``enable_parallelism`` before or after acceleration).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import weakref
from typing import Any, Iterator

import torch

from . import cp_gather, cp_support
from .keys import GraphKey, HostTensor, ObjectState, TensorSpec
from .lockstep import RankAbortedError, RankAgreement, RankAgreementError

logger = logging.getLogger("bcg_diffusion")

AGREEMENT_GROUP = "cp"
_live: "weakref.WeakSet[Lockstep]" = weakref.WeakSet()


class NoRanks:
    """A transformer without parallelism: nothing to agree on."""

    parallel_config: Any = None
    agreement: RankAgreement | None = None

    def begin_call(self) -> None:
        pass

    def end_call(self) -> None:
        pass

    def failed(self, exc: BaseException) -> None:
        pass

    def agree_key(self, runner: Any, key: GraphKey) -> None:
        pass

    def agree_eager(self, reason: str | None, args: tuple = (), kwargs: dict | None = None) -> None:
        pass

    def capture_context(self, ctx: Any) -> Any:
        return ctx

    def agree_capture(self, entry: Any) -> None:
        pass

    def replay_failed(self, exc: BaseException) -> None:
        pass

    def check_structure(self, root: torch.nn.Module, eager_module_names: list[str]) -> None:
        pass

    def close(self) -> None:
        pass


NO_RANKS = NoRanks()


class Lockstep(NoRanks):
    """The ranks of one context-parallel transformer (see the module docstring).

    ``agreement`` is ``None`` when the context-parallel group has one rank. Contract: every rank
    of the group makes the same calls of the transformer, in the same order (the runner's call
    sites make the same agreement calls then); the object must be created in the same order on
    every rank (agreements are numbered per group).
    """

    def __init__(self, parallel_config: Any, agreement: RankAgreement | None, undo_gather: Any = None) -> None:
        self.parallel_config = parallel_config
        self.agreement = agreement
        self.calls = 0
        self._undo_gather = undo_gather
        self._current: int | None = None
        self._planned = False
        self._phase = "before its plan"
        self._warned: set[str] = set()
        _live.add(self)

    @property
    def rank(self) -> int:
        return self.agreement.rank if self.agreement is not None else 0

    # -- calls ----------------------------------------------------------------------------
    def begin_call(self) -> None:
        self._current = self.calls
        self.calls += 1
        self._planned = False
        self._phase = "before its plan"

    def end_call(self) -> None:
        self._current = None

    def _index(self) -> int:
        if self._current is None:  # created inside this call (parallelism enabled after accelerating)
            self.begin_call()
        return self._current

    def where(self) -> str:
        return f"in transformer call {self._index()} ({self._phase})"

    def failed(self, exc: BaseException) -> None:
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
    def agree_key(self, runner: Any, key: GraphKey) -> None:
        """The plan round of this call: its path and key on every rank (see the module docstring)."""
        if self._planned:
            return
        self._plan(local_plan(runner, key), f"{key_digest(key)} {key_shapes(key)}")

    def agree_eager(self, reason: str | None, args: tuple = (), kwargs: dict | None = None) -> None:
        """The plan round of a call that runs eagerly before it has a key (its inputs' layout
        stands for the key); a no-op after this call's plan."""
        if not self._planned:
            self._plan("eager", f"{inputs_digest(args, kwargs or {})} ({reason or 'fallback'})")

    def _plan(self, path: str, detail: str) -> None:
        index = self._index()
        self._planned = True
        self._phase = path
        if self.agreement is not None:
            self.agreement.same(f"call {index}: plan", f"{path} {detail}")

    def capture_context(self, ctx: Any) -> Any:
        """``ctx`` for a capture under context parallelism: attention breaks, nothing is narrowed,
        nothing evicted mid-capture."""
        config = dataclasses.replace(ctx.config, max_narrowing=0, attention="break")
        return dataclasses.replace(ctx, config=config, evict_all=_no_eviction)

    def agree_capture(self, entry: Any) -> None:
        """Make ``entry``'s capture outcome the ranks' common one (see the module docstring)."""
        ok = entry.fallback is None and not entry.module_mode
        why = entry.fallback or ("module mode" if entry.module_mode else "")
        if self.agreement is None:
            return
        index = self._index()
        mine = json.dumps({"ok": ok, "memory": int(entry.memory_bytes), "why": why})
        values = [json.loads(v) for v in self.agreement.gather(f"call {index}: capture", mine)]
        failed = [r for r, v in enumerate(values) if not v["ok"]]
        if not failed:
            entry.memory_bytes = max(v["memory"] for v in values)
            return
        first = values[failed[0]]["why"]
        ranks = ", ".join(map(str, failed))
        reason = f"capture failed on rank{'s' if len(failed) > 1 else ''} {ranks}: {first}"
        if ok or entry.module_mode:
            entry.release()
            entry.module_mode = False
            entry.children = None
        entry.fallback = reason
        entry.memory_bytes = 0
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

    def check_structure(self, root: torch.nn.Module, eager_module_names: list[str]) -> None:
        cp_support.check_structure(root, eager_module_names)

    def close(self) -> None:
        """Undo the gather patch (idempotent)."""
        undo, self._undo_gather = self._undo_gather, None
        if undo is not None:
            undo()
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
def follow(runner: Any) -> NoRanks:
    """The ranks object for ``runner``'s transformer now: ``runner.ranks`` while its parallel
    config is the same; otherwise the old one is closed, the new one is made (refusals raise
    :class:`~bcg_diffusion.AccelerationError`) and the runner's structure is read again (its
    graphs are recaptured)."""
    module, current = runner.module, runner.ranks
    parallel = getattr(module, "_parallel_config", None)
    if parallel is current.parallel_config:
        return current
    cp = cp_support.context_parallel_config(module)  # refusals first: nothing changed yet
    if cp is not None:
        cp_support.check_config(module, runner.config)
    current.close()
    runner.state.invalidate()
    runner._structure = None  # re-planned at once: hooks, attention breaks, graphs
    if cp is None:
        return NO_RANKS
    logger.info("bcg: %s runs under context parallelism: its ranks agree on every call", type(module).__name__)
    return Lockstep(parallel, _agreement_for(cp, runner.config.rank_timeout_s), cp_gather.acquire())


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


@contextlib.contextmanager
def calling(runner: Any) -> Iterator[None]:
    """One call of ``runner``: numbered, and an exception leaving it is told to the other ranks
    (``runner.ranks`` is read again on the way out: :func:`follow` may replace it meanwhile)."""
    runner.ranks.begin_call()
    try:
        yield
    except BaseException as exc:
        runner.ranks.failed(exc)
        raise
    finally:
        runner.ranks.end_call()


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
def local_plan(runner: Any, key: GraphKey) -> str:
    """The path this rank's runner takes for ``key`` (a function of its state only)."""
    entry = runner.entries.get(key)
    if entry is not None:
        if entry.fallback is not None:
            return "fallback"
        return "module" if entry.module_mode else "replay"
    seen = runner._seen.get(key)
    if seen is not None and seen.mutates:
        return "eager"
    if seen is None or seen.calls < runner.config.warmup_iters:
        return "warmup"
    return "capture"


def _plain(value: Any) -> Any:
    if isinstance(value, TensorSpec):
        return ("tensor", value.shape, value.stride, str(value.dtype), value.device.type, value.requires_grad)
    if isinstance(value, ObjectState):
        return ("object", value.type_name)  # identity and addresses differ per rank
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
    "NO_RANKS",
    "Lockstep",
    "NoRanks",
    "RankAbortedError",
    "calling",
    "follow",
    "key_digest",
    "local_plan",
    "raise_if_peer_aborted",
]
