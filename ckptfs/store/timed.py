"""A store wrapper that times each call by kind in its calling thread (the store metrics)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ckptfs.common.latency import STORE_BUCKETS, LatencyTable
from ckptfs.store.base import Listing, ObjectInfo, Store

T = TypeVar("T")


class TimedStore(Store):
    """Wraps `inner`: each call is recorded in `requests` (LatencyTable) under its kind
    (put, get, get_range, head, ...), with the class of any exception it raised.
    Everything else (url, check, check_length, local_path, ...) is the inner store's."""

    def __init__(self, inner: Store, requests: LatencyTable | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.requests = requests or LatencyTable(STORE_BUCKETS)

    def __getattr__(self, name: str) -> Any:  # optional methods: check, check_storage_class
        return getattr(self.inner, name)

    def _timed(self, kind: str, fn: Callable[..., T], *args: Any) -> T:
        start = time.perf_counter()
        try:
            result = fn(*args)
        except BaseException as e:
            self.requests.record(kind, time.perf_counter() - start, type(e).__name__)
            raise
        self.requests.record(kind, time.perf_counter() - start)
        return result

    @property
    def atomic_create(self) -> bool:  # type: ignore[override]
        return bool(self.inner.atomic_create)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._timed("put", self.inner.put, key, data)

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self._timed("put", self.inner.put_parts, key, parts)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self._timed("put_if_absent", self.inner.put_if_absent, key, data)

    def get(self, key: str, limit: int | None = None) -> bytes:
        return self._timed("get", self.inner.get, key, limit)

    def get_buffer(self, key: str, limit: int | None = None) -> bytes | memoryview:
        return self._timed("get", self.inner.get_buffer, key, limit)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._timed("get_range", self.inner.get_range, key, start, end)

    def head(self, key: str) -> int | None:
        return self._timed("head", self.inner.head, key)

    def delete(self, key: str) -> None:
        self._timed("delete", self.inner.delete, key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self._timed("delete_many", self.inner.delete_many, keys)

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        return self._timed("list", self.inner.list, prefix, delimiter)

    def list_entry(self, prefix: str, name: str) -> Listing:
        return self._timed("list", self.inner.list_entry, prefix, name)

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        """Counted as one request, however many pages it reads: from its start to its
        last object (the consumer's time between objects included)."""
        start = time.perf_counter()
        try:
            yield from self.inner.scan(prefix)
        except GeneratorExit:  # the consumer stopped early
            self.requests.record("scan", time.perf_counter() - start)
            raise
        except BaseException as e:
            self.requests.record("scan", time.perf_counter() - start, type(e).__name__)
            raise
        self.requests.record("scan", time.perf_counter() - start)

    def stat(self, key: str) -> ObjectInfo | None:
        return self._timed("stat", self.inner.stat, key)

    def copy(self, src: str, dst: str) -> None:
        self._timed("copy", self.inner.copy, src, dst)

    def rename(self, src: str, dst: str) -> None:
        self._timed("rename", self.inner.rename, src, dst)

    def check_length(self, key: str) -> None:
        self.inner.check_length(key)

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)

    def parent(self) -> Store | None:
        return self.inner.parent()

    def close(self) -> None:
        self.inner.close()
