"""Introspection: what an accelerated transformer captured and how often it replayed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GraphEntryStats:
    """One captured key."""

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

    def phase(self, name: str) -> float:
        return dict(self.capture_phases).get(name, 0.0)


@dataclass(frozen=True)
class BCGStats:
    """Counters of one accelerated transformer (or the sum over a pipeline's transformers).

    ``hits``: calls served by a captured graph; ``misses``: calls that met a new key;
    ``warmup_calls``: first calls of new keys, run eagerly (a key is captured at its next call);
    ``eager_calls``: calls run eagerly for another reason (fallback keys, uncacheable or non-CUDA inputs);
    ``structure_changes``: times the processors or hooks changed and the graphs were dropped.
    With a step cache: ``hooked_module_calls`` counts replayed calls of the cached modules (blocks
    or attention modules) and ``hooked_module_computed`` those in which the cache computed the
    module; the difference was reused.
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

    @property
    def hooked_module_reused(self) -> int:
        return self.hooked_module_calls - self.hooked_module_computed

    def __str__(self) -> str:
        mode = " (debug: segments run eagerly)" if self.debug else ""
        lines = [
            f"{self.transformer}{mode}: {len(self.entries)} graph(s), {self.hits} hits, {self.misses} misses, "
            f"{self.warmup_calls} first calls, {self.eager_calls} eager calls, capture {self.capture_time_s:.2f} s, "
            f"graph memory {self.graph_memory_bytes / 2**20:.1f} MiB"
        ]
        if self.hooked_module_calls:
            lines.append(
                f"  step cache: {self.hooked_module_computed} module passes computed, "
                f"{self.hooked_module_reused} reused"
            )
        for e in self.entries:
            state = f"eager fallback ({e.fallback})" if e.fallback else f"{e.segments} segments, {e.breaks} breaks"
            extra = f", eager modules {list(e.eager_modules)}" if e.eager_modules else ""
            phases = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in e.capture_phases if seconds >= 5e-4)
            lines.append(
                f"  [{e.key}] {state}{extra}, {e.hits} hits, capture {e.capture_time_s:.3f} s"
                f"{f' ({phases})' if phases else ''}, {e.memory_bytes / 2**20:.1f} MiB"
            )
        return "\n".join(lines)
