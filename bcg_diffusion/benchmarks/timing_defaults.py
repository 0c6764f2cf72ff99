"""How many calls the benchmarks time by default, importing nothing (the parsers read these before torch)."""

from __future__ import annotations

__all__ = ["AUTO_ROUND_S", "DEFAULT_ITERS", "DEFAULT_ROUNDS", "DEFAULT_WARMUP", "MIN_AUTO_ITERS"]

DEFAULT_ITERS, DEFAULT_ROUNDS, DEFAULT_WARMUP = 20, 3, 3
# Without --iters, each mode makes enough calls per round to take about AUTO_ROUND_S (at least
# MIN_AUTO_ITERS and at most DEFAULT_ITERS calls), so slow compute-bound steps do not dominate the run time.
AUTO_ROUND_S, MIN_AUTO_ITERS = 0.4, 3
