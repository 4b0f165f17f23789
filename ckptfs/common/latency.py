"""Calls counted by kind, with latency histograms and errors by class: cheap per request."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass

#: seconds: upper bounds of the buckets of a store request's latency
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 30.0, 60.0)
#: seconds: upper bounds of the buckets of a FUSE request's latency
FUSE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
                0.5, 1.0, 10.0)


@dataclass(frozen=True)
class LatencyRow:
    """One kind of call: how many fell in each bucket (the last one: above every bound,
    not cumulative) and their total seconds."""

    kind: str
    counts: tuple[int, ...]
    seconds: float


class LatencyTable:
    """Counts calls by kind, their latencies in fixed buckets, and their errors by kind
    and class. Thread-safe: record() takes a lock for a few dict updates, unless the
    table is made for a single thread (`one_thread`: the FUSE handlers, all in trio's)."""

    def __init__(self, buckets: tuple[float, ...], one_thread: bool = False) -> None:
        self.buckets = buckets
        self._lock = threading.Lock()
        if one_thread:
            self.record = self._record  # type: ignore[method-assign]
        #: kind -> [total seconds, then the calls in each bucket]
        self._rows: dict[str, list[float]] = {}
        self._errors: Counter[tuple[str, str]] = Counter()

    def record(self, kind: str, seconds: float, error: str | None = None) -> None:
        """One call of `kind` that took `seconds`; `error`: the class of what it raised."""
        with self._lock:
            self._record(kind, seconds, error)

    def _record(self, kind: str, seconds: float, error: str | None = None) -> None:
        row = self._rows.get(kind)
        if row is None:
            row = self._rows[kind] = [0.0] * (len(self.buckets) + 2)
        row[0] += seconds
        row[bisect_left(self.buckets, seconds) + 1] += 1
        if error is not None:
            self._errors[kind, error] += 1

    def rows(self) -> list[LatencyRow]:
        """Every kind called so far, by name."""
        with self._lock:
            return [LatencyRow(kind, tuple(int(n) for n in row[1:]), row[0])
                    for kind, row in sorted(self._rows.items())]

    def errors(self) -> dict[tuple[str, str], int]:
        """(kind, error class) -> calls that raised it."""
        with self._lock:
            return dict(self._errors)
