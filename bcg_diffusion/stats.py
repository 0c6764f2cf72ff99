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
    it); ``eager_calls``: calls run eagerly (fallback keys, uncacheable or non-CUDA inputs).
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

    def __str__(self) -> str:
        mode = " (debug: segments run eagerly)" if self.debug else ""
        lines = [
            f"{self.transformer}{mode}: {len(self.entries)} graph(s), {self.hits} hits, {self.misses} misses, "
            f"{self.eager_calls} eager calls, capture {self.capture_time_s:.2f} s, "
            f"graph memory {self.graph_memory_bytes / 2**20:.1f} MiB"
        ]
        for e in self.entries:
            state = f"eager fallback ({e.fallback})" if e.fallback else f"{e.segments} segments, {e.breaks} breaks"
            extra = f", eager modules {list(e.eager_modules)}" if e.eager_modules else ""
            lines.append(
                f"  [{e.key}] {state}{extra}, {e.hits} hits, capture {e.capture_time_s:.3f} s, "
                f"{e.memory_bytes / 2**20:.1f} MiB"
            )
        return "\n".join(lines)
