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


@dataclass(frozen=True)
class BCGStats:
    """Counters of one accelerated transformer (or the sum over a pipeline's transformers).

    ``hits``: calls served by a captured graph; ``misses``: calls that met a new key (and captured
    it); ``eager_calls``: calls run eagerly (fallback keys, uncacheable or non-CUDA inputs);
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
    hooked_module_calls: int = 0
    hooked_module_computed: int = 0

    @property
    def hooked_module_reused(self) -> int:
        return self.hooked_module_calls - self.hooked_module_computed

    def __str__(self) -> str:
        mode = " (debug: segments run eagerly)" if self.debug else ""
        lines = [
            f"{self.transformer}{mode}: {len(self.entries)} graph(s), {self.hits} hits, {self.misses} misses, "
            f"{self.eager_calls} eager calls, capture {self.capture_time_s:.2f} s, "
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
            lines.append(
                f"  [{e.key}] {state}{extra}, {e.hits} hits, capture {e.capture_time_s:.3f} s, "
                f"{e.memory_bytes / 2**20:.1f} MiB"
            )
        return "\n".join(lines)
