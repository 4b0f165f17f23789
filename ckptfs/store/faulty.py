"""A store wrapper for tests: counts calls and injects failures, latency, hangs, corruption."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

from ckptfs.common.errors import TransientStoreError
from ckptfs.store.base import Listing, ObjectInfo, Store

OPS = ("put", "get", "get_range", "head", "delete", "list", "copy", "scan", "stat",
       "rename", "put_if_absent")


class FaultyStore(Store):
    """Wraps `inner`; every fault is armed per operation name (see OPS). Thread-safe."""

    def __init__(self, inner: Store, seed: int = 0, max_hang: float = 60.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.max_hang = max_hang
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._failures: dict[str, list[Exception]] = {}
        self._fail_rates: dict[str, tuple[float, Exception | None]] = {}
        self._latency: dict[str, float] = {}
        self._hanging: set[str] = set()
        self._released = threading.Event()
        self._partial_put: int | None = None
        self._corrupt: set[str] = set()

    # -- arming faults

    def fail(self, op: str, times: int = 1, error: Exception | None = None) -> None:
        """Make the next `times` calls of `op` raise `error` (default TransientStoreError)."""
        failure = error or TransientStoreError(f"injected {op} failure")
        with self._lock:
            self._failures.setdefault(_checked(op), []).extend([failure] * times)

    def fail_rate(self, op: str, p: float, error: Exception | None = None) -> None:
        """Make each call of `op` raise with probability `p` (seeded, so reproducible)."""
        with self._lock:
            self._fail_rates[_checked(op)] = (p, error)

    def set_latency(self, op: str, seconds: float) -> None:
        """Delay every call of `op` by `seconds`."""
        with self._lock:
            self._latency[_checked(op)] = seconds

    def hang(self, op: str) -> None:
        """Block calls of `op` until release() (or `max_hang` seconds)."""
        with self._lock:
            self._hanging.add(_checked(op))
            self._released.clear()

    def release(self) -> None:
        """Let every hanging call proceed; new calls no longer hang."""
        with self._lock:
            self._hanging.clear()
            self._released.set()

    def partial_put_next(self, n_bytes: int) -> None:
        """The next put stores only its first `n_bytes` bytes, then raises."""
        with self._lock:
            self._partial_put = n_bytes

    def corrupt_get(self, key: str) -> None:
        """From now on, get and get_range of `key` return a byte flipped."""
        with self._lock:
            self._corrupt.add(key)

    def heal(self) -> None:
        """Disarm every fault and release hanging calls (counts are kept)."""
        with self._lock:
            self._failures.clear()
            self._fail_rates.clear()
            self._latency.clear()
            self._partial_put = None
            self._corrupt.clear()
        self.release()

    # -- the store

    def _enter(self, op: str) -> None:
        """Count the call, then apply latency, hang and injected failures."""
        with self._lock:
            self.counts[op] += 1
            latency = self._latency.get(op, 0.0)
            hanging = op in self._hanging
            error = self._next_error(op)
        if latency:
            time.sleep(latency)
        if hanging:
            self._released.wait(self.max_hang)
        if error is not None:
            raise error

    def _next_error(self, op: str) -> Exception | None:
        """The failure the current call of `op` raises, if any (called under the lock)."""
        if queued := self._failures.get(op):
            return copy.copy(queued.pop(0))
        p, error = self._fail_rates.get(op, (0.0, None))
        if p and self._random.random() < p:
            return copy.copy(error) if error else TransientStoreError(f"injected {op} failure")
        return None

    def _maybe_corrupt(self, key: str, data: bytes) -> bytes:
        with self._lock:
            if key not in self._corrupt or not data:
                return data
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0xFF
        return bytes(flipped)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._enter("put")
        with self._lock:
            partial, self._partial_put = self._partial_put, None
        if partial is None:
            self.inner.put(key, data)
            return
        self.inner.put(key, memoryview(data)[:partial])
        raise TransientStoreError(f"injected partial put of {key}: {partial} bytes written")

    @property
    def atomic_create(self) -> bool:  # type: ignore[override]
        return bool(self.inner.atomic_create)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        self._enter("put_if_absent")
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, limit: int | None = None) -> bytes:
        self._enter("get")
        return self._maybe_corrupt(key, self.inner.get(key, limit))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._enter("get_range")
        return self._maybe_corrupt(key, self.inner.get_range(key, start, end))

    def head(self, key: str) -> int | None:
        self._enter("head")
        return self.inner.head(key)

    def delete(self, key: str) -> None:
        self._enter("delete")
        self.inner.delete(key)

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        self._enter("list")
        return self.inner.list(prefix, delimiter)

    def list_entry(self, prefix: str, name: str) -> Listing:
        self._enter("list")
        return self.inner.list_entry(prefix, name)

    def copy(self, src: str, dst: str) -> None:
        self._enter("copy")
        self.inner.copy(src, dst)

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        self._enter("scan")
        yield from self.inner.scan(prefix)

    def stat(self, key: str) -> ObjectInfo | None:
        self._enter("stat")
        return self.inner.stat(key)

    def rename(self, src: str, dst: str) -> None:
        self._enter("rename")
        self.inner.rename(src, dst)

    def check_length(self, key: str) -> None:
        self.inner.check_length(key)

    def close(self) -> None:
        self.inner.close()


def _checked(op: str) -> str:
    """`op` if it names an operation FaultyStore counts, else ValueError."""
    if op not in OPS:
        raise ValueError(f"unknown store operation {op!r}; one of {', '.join(OPS)}")
    return op
