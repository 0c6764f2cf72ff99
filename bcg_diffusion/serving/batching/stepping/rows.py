"""One image in flight (:class:`Row`) and the running batch of ``rows`` slots that its steps share
(:class:`RunningBatch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import torch

__all__ = ["Plan", "Row", "RunningBatch"]


@dataclass(frozen=True)
class Plan:
    """A request's call, checked and resolved by its family loop: ``key`` is what its rows must share with the
    other rows of a running batch (the shapes of every transformer input, the guidance mode), ``n`` its images,
    ``args`` the resolved call (the pipeline's defaults filled in, derived sizes added)."""

    key: Hashable
    n: int
    args: dict[str, Any] = field(compare=False)


@dataclass(eq=False)
class Row:
    """One image in flight: its conditioning (``cond``, and ``uncond`` under classifier-free guidance: dicts of
    tensors with one batch row each), its latents (one row), its own scheduler with its timestep schedule, its
    guidance scale, its generator and the keyword arguments of its scheduler's ``step``. A filler row has no
    scheduler: it is never stepped and keeps ``fixed_t``."""

    cond: dict[str, torch.Tensor]
    uncond: dict[str, torch.Tensor] | None
    latents: torch.Tensor
    scheduler: Any = None
    timesteps: torch.Tensor | None = None
    guidance: float = 1.0
    generator: torch.Generator | None = None
    step_kwargs: dict[str, Any] = field(default_factory=dict)
    fixed_t: torch.Tensor | None = None
    index: int = 0

    @property
    def t(self) -> torch.Tensor:
        """The timestep of this row's next step (a 0-dim tensor)."""
        return self.fixed_t if self.scheduler is None else self.timesteps[self.index]

    @property
    def done(self) -> bool:
        return self.scheduler is not None and self.index >= len(self.timesteps)


class RunningBatch:
    """``rows`` slots of one key (and group: an adapter) whose rows share every step. A free slot holds the
    inert ``filler`` row. :meth:`assembled` caches what is built from the members (the conditioning, concatenated)
    until a row joins or leaves."""

    def __init__(self, key: Hashable, group: Hashable, rows: int, filler: Row):
        self.key, self.group, self.filler = key, group, filler
        self.slots: list[Row | None] = [None] * rows
        self.owners: list[Any] = [None] * rows
        self._version = 0
        self._cache: dict[str, tuple[int, Any]] = {}

    def free(self) -> int:
        return self.slots.count(None)

    def active(self) -> list[int]:
        """The slots that hold a request's row, in slot order."""
        return [i for i, row in enumerate(self.slots) if row is not None]

    def members(self) -> list[Row]:
        """Every slot's row: the request's, or the filler."""
        return [self.filler if row is None else row for row in self.slots]

    def join(self, rows: list[Row], owner: Any) -> list[int]:
        """Put ``rows`` in the lowest free slots; their slot numbers."""
        free = [i for i, row in enumerate(self.slots) if row is None]
        if len(rows) > len(free):
            raise ValueError(f"{len(rows)} rows do not fit the {len(free)} free slots")
        for slot, row in zip(free, rows):
            self.slots[slot], self.owners[slot] = row, owner
        self._version += 1
        return free[:len(rows)]

    def leave(self, slots: list[int]) -> None:
        """Free ``slots`` (the filler row takes their place at the next step)."""
        for slot in slots:
            self.slots[slot], self.owners[slot] = None, None
        self._version += 1

    def owners_active(self) -> list[Any]:
        """The distinct owners of the occupied slots, in slot order."""
        seen: dict[int, Any] = {}
        for owner in self.owners:
            if owner is not None:
                seen.setdefault(id(owner), owner)
        return list(seen.values())

    def assembled(self, name: str, build: Callable[[], Any]) -> Any:
        """``build()``, cached under ``name`` until the members change."""
        cached = self._cache.get(name)
        if cached is None or cached[0] != self._version:
            cached = (self._version, build())
            self._cache[name] = cached
        return cached[1]
