"""The seeds CI runs: a fixed range, and every seed that once failed (docs/SOAK.md)."""

from __future__ import annotations

#: operations per CI schedule
CI_OPS = 200
#: the fixed set: 100 schedules
CI_SEEDS = list(range(1000, 1100))
#: (seed, ops, what it found): kept forever
REGRESSION_SEEDS: list[tuple[int, int, str]] = [
]
