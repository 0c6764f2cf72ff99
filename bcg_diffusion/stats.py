"""Introspection: what an accelerated transformer captured and how each call ran.

:class:`CallCounters` and :class:`UnitCounters` are counted by the graph runner as calls run;
:meth:`BCGStats.of` makes the snapshot that :func:`~bcg_diffusion.get_stats` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class CallCounters:
    """How the calls of one transformer ran, as the runner counts them (see :class:`BCGStats`)."""

    hits: int = 0
    misses: int = 0
    warmup_calls: int = 0
    eager_calls: int = 0
    captures: int = 0
    failed_captures: int = 0
    structure_changes: int = 0


@dataclass
class UnitCounters:
    """How the unit calls of module mode ran (``BCGStats``'s ``child_*`` fields)."""

    hits: int = 0
    warmup_calls: int = 0
    eager_calls: int = 0
    failed_captures: int = 0

    def __add__(self, other: "UnitCounters") -> "UnitCounters":
        return UnitCounters(
            self.hits + other.hits,
            self.warmup_calls + other.warmup_calls,
            self.eager_calls + other.eager_calls,
            self.failed_captures + other.failed_captures,
        )


@dataclass(frozen=True)
class OffloadStats:
    """Weight streaming of one transformer (``BCGStats.offload``; docs/accelerate.md "Weight streaming").

    Bytes: ``resident_bytes`` of weights kept on the device (everything outside the repeated blocks),
    ``slot_bytes`` of the device slots together (``slots`` x the largest block), ``host_bytes`` of the
    blocks' packed host copies (``pinned``: page-locked). Per transformer call: ``bytes_last_call``
    streamed in the last call (every block it ran, once each when the loads went as predicted);
    ``bytes_streamed`` and ``calls`` over all calls since streaming began. Loads: ``prefetched`` were
    started ahead of the block's call, ``sync_loads`` were started by the call itself because the block
    asked for was not the one predicted (a step cache skipping blocks, another block order): correct,
    slower. ``wait_s``: seconds the compute stream waited for copies (CUDA events), ``None`` unless
    ``OffloadConfig(measure_waits=True)``. ``blocks``: streamed blocks.
    """

    slots: int
    blocks: int
    resident_bytes: int
    slot_bytes: int
    host_bytes: int
    pinned: bool
    calls: int = 0
    bytes_last_call: int = 0
    bytes_streamed: int = 0
    prefetched: int = 0
    sync_loads: int = 0
    wait_s: float | None = None

    @staticmethod
    def combine(parts: "list[OffloadStats | None]") -> "OffloadStats | None":
        """The sum over several transformers (``None`` when none streams)."""
        present = [p for p in parts if p is not None]
        if len(present) <= 1:
            return present[0] if present else None
        waits = [p.wait_s for p in present if p.wait_s is not None]
        summed = {f.name: sum(getattr(p, f.name) for p in present) for f in fields(OffloadStats)
                  if f.name not in ("pinned", "wait_s")}
        return OffloadStats(**summed, pinned=all(p.pinned for p in present), wait_s=sum(waits) if waits else None)

    def __str__(self) -> str:
        waited = f", waited {self.wait_s * 1e3:.1f} ms for copies" if self.wait_s is not None else ""
        return (
            f"  weight streaming: {self.blocks} blocks through {self.slots} slots ({_size(self.slot_bytes)}), "
            f"{_size(self.resident_bytes)} resident, {_size(self.host_bytes)} on the host"
            f"{' (pinned)' if self.pinned else ''}; {self.calls} calls, {_size(self.bytes_last_call)} in the last, "
            f"{self.prefetched} loads prefetched, {self.sync_loads} loaded on demand{waited}"
        )


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class GraphEntryStats:
    """One graph key: captured (``fallback is None``) or running eagerly (``fallback`` says why).

    ``hits`` counts the calls this key served by replay. A key in module mode (``module_mode``)
    runs the transformer's own Python eagerly and replays one graph per child call: its
    ``child_*`` counters say how those child calls ran.
    """

    key: str
    segments: int
    breaks: int
    capture_time_s: float
    memory_bytes: int
    hits: int
    fallback: str | None
    eager_modules: tuple[str, ...]
    # Host seconds of the capture by phase (setup with blas_workspace, record, instantiate, accounting,
    # key, static_inputs, first_replay, retries); see docs/accelerate.md "What a capture costs".
    capture_phases: tuple[tuple[str, float], ...] = ()
    module_mode: bool = False
    eager_reason: str | None = None  # module mode: why the transformer's own forward runs eagerly
    child_graphs: int = 0
    child_hits: int = 0
    child_warmup_calls: int = 0
    child_eager_calls: int = 0
    child_failed_captures: int = 0

    def phase(self, name: str) -> float:
        return dict(self.capture_phases).get(name, 0.0)


@dataclass(frozen=True)
class BCGStats:
    """Counters of one accelerated transformer (or the sum over a pipeline's transformers).

    Every call the graph runner received is exactly one of ``hits``, ``warmup_calls`` and
    ``eager_calls`` (``calls`` is their sum):

    - ``hits``: calls served by captured graphs (a whole-call replay, or module mode: the
      transformer's own Python eagerly, its children replayed; see ``child_*``);
    - ``warmup_calls``: first calls of a new key, run eagerly (a key is captured at its next call);
    - ``eager_calls``: calls that ran eagerly after warm-up: keys whose capture failed (fallback),
      uncacheable or non-CUDA inputs, calls that change their own inputs.

    ``active`` is False when the model is not accelerated (no CUDA device, ``BCG_DIFFUSION=0``,
    never accelerated or acceleration removed): every counter is 0 and ``inactive_reason`` says why.
    ``captures`` counts captures that succeeded, ``failed_captures`` captures that failed (or a
    replay abandoned because a break changed shape) and fell back to eager; ``misses`` calls that
    met a new key; ``structure_changes`` times the processors, hooks or forwards changed and the
    graphs were dropped. In module mode ``child_hits`` counts child calls replayed,
    ``child_warmup_calls`` first child calls run eagerly, ``child_eager_calls`` child calls run
    eagerly after warm-up (a failed child capture, inputs that cannot be replayed). With a step
    cache: ``hooked_module_calls`` counts replayed calls of the cached modules and
    ``hooked_module_computed`` those in which the cache computed the module; the difference was
    reused.
    """

    transformer: str
    debug: bool
    hits: int
    misses: int
    captures: int
    eager_calls: int
    capture_time_s: float
    graph_memory_bytes: int
    entries: tuple[GraphEntryStats, ...] = field(default_factory=tuple)
    structure_changes: int = 0
    warmup_calls: int = 0
    hooked_module_calls: int = 0
    hooked_module_computed: int = 0
    failed_captures: int = 0
    child_hits: int = 0
    child_warmup_calls: int = 0
    child_eager_calls: int = 0
    active: bool = True  # False: not accelerated (no CUDA, BCG_DIFFUSION=0, never accelerated); see inactive_reason
    inactive_reason: str | None = None
    offload: OffloadStats | None = None  # weight streaming (OffloadConfig), also where acceleration is off

    @staticmethod
    def of(
        transformer: str, debug: bool, calls: CallCounters, units: UnitCounters,
        entries: "tuple[GraphEntryStats, ...]", hooked: tuple[int, int],
    ) -> "BCGStats":
        """The snapshot of one transformer: its counters, its kept keys and its step-cache passes
        (``hooked``: hooked calls replayed, of which the hooks computed the body)."""
        return BCGStats(
            transformer=transformer,
            debug=debug,
            hits=calls.hits,
            misses=calls.misses,
            captures=calls.captures,
            eager_calls=calls.eager_calls,
            capture_time_s=sum(e.capture_time_s for e in entries),
            graph_memory_bytes=sum(e.memory_bytes for e in entries),
            entries=entries,
            structure_changes=calls.structure_changes,
            warmup_calls=calls.warmup_calls,
            hooked_module_calls=hooked[0],
            hooked_module_computed=hooked[1],
            failed_captures=calls.failed_captures,
            child_hits=units.hits,
            child_warmup_calls=units.warmup_calls,
            child_eager_calls=units.eager_calls,
        )

    @staticmethod
    def inactive(transformer: str, reason: str) -> "BCGStats":
        """The statistics of a model that is not accelerated: nothing captured, and why."""
        return BCGStats(transformer, False, 0, 0, 0, 0, 0.0, 0, active=False, inactive_reason=reason)

    @property
    def calls(self) -> int:
        """Transformer calls the graph runner received."""
        return self.hits + self.warmup_calls + self.eager_calls

    @property
    def hooked_module_reused(self) -> int:
        return self.hooked_module_calls - self.hooked_module_computed

    @staticmethod
    def combine(parts: "list[BCGStats]") -> "BCGStats":
        """The sum over several transformers (a pipeline's ``transformer`` and ``transformer_2``)."""
        if len(parts) == 1:
            return parts[0]
        summed = {}
        for f in fields(BCGStats):
            values = [getattr(p, f.name) for p in parts]
            if f.name == "transformer":
                summed[f.name] = ", ".join(values)
            elif f.name in ("debug", "active"):
                summed[f.name] = any(values)
            elif f.name == "inactive_reason":
                summed[f.name] = next((v for v in values if v), None)
            elif f.name == "entries":
                summed[f.name] = tuple(e for v in values for e in v)
            elif f.name == "offload":
                summed[f.name] = OffloadStats.combine(values)
            else:
                summed[f.name] = sum(values)
        return BCGStats(**summed)

    def __str__(self) -> str:
        if not self.active:
            text = f"{self.transformer}: not accelerated ({self.inactive_reason}); every call runs eagerly"
            return text + (f"\n{self.offload}" if self.offload is not None else "")
        mode = " (debug: segments run eagerly)" if self.debug else ""
        failed = f" ({self.failed_captures} failed)" if self.failed_captures else ""
        lines = [
            f"{self.transformer}{mode}: {len(self.entries)} graph key(s), {self.calls} calls: {self.hits} replayed, "
            f"{self.warmup_calls} first calls, {self.eager_calls} eager; {self.captures} captures{failed}, "
            f"{self.misses} misses, capture {self.capture_time_s:.2f} s, graph memory {self.graph_memory_bytes / 2**20:.1f} MiB"
        ]
        if self.child_hits or self.child_warmup_calls or self.child_eager_calls:
            lines.append(
                f"  module mode: {self.child_hits} child calls replayed, {self.child_warmup_calls} first child calls, "
                f"{self.child_eager_calls} eager"
            )
        if self.hooked_module_calls:
            lines.append(
                f"  step cache: {self.hooked_module_computed} module passes computed, "
                f"{self.hooked_module_reused} reused"
            )
        if self.offload is not None:
            lines.append(str(self.offload))
        for e in self.entries:
            if e.fallback:
                state = f"eager fallback ({e.fallback})"
            elif e.module_mode:
                why = f" ({e.eager_reason})" if e.eager_reason else ""
                state = (
                    f"module mode{why}: {e.child_graphs} child graphs, {e.segments} segments, {e.breaks} breaks, "
                    f"{e.child_hits} child replays, {e.child_eager_calls} eager child calls"
                )
            else:
                state = f"{e.segments} segments, {e.breaks} breaks"
            extra = f", eager modules {list(e.eager_modules)}" if e.eager_modules else ""
            phases = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in e.capture_phases if seconds >= 5e-4)
            lines.append(
                f"  [{e.key}] {state}{extra}, {e.hits} hits, capture {e.capture_time_s:.3f} s"
                f"{f' ({phases})' if phases else ''}, {e.memory_bytes / 2**20:.1f} MiB"
            )
        return "\n".join(lines)
