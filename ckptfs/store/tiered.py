"""A fast tier in front of a store: writes go to the fast tier, reads try it first."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from ckptfs.common.errors import NotFoundError
from ckptfs.store.base import Listing, ObjectInfo, Store

log = logging.getLogger(__name__)


def _fast_wins(fast: bytes, slow: bytes) -> bool:
    return True


class TieredStore(Store):
    """One store made of two with the same layout: `fast` (a directory every node shares)
    and `slow` (the object store). Every write (put, copy, rename, delete) goes to the
    fast tier only; something else (the mover, pipeline/fasttier.py) brings it to the
    slow one later. Reads look in the fast tier first, then in the slow one; a listing is
    the union of both. A record the two tiers both hold is read from both, and the
    caller's `newer(fast_bytes, slow_bytes)` picks (for manifests: the higher
    generation); the keys of `compare_prefix` only, every other key is read from the fast
    tier when it has it. Keys under the `fast_only` prefixes are read and listed in the
    fast tier alone (rename intents: a mover's in the object store are its own); a HEAD
    of a key under the `fast_heads` prefixes looks in the fast tier only (the uploader's
    view: it deduplicates chunks against the fast tier alone). The store knows nothing
    of what the keys mean: its caller names the prefixes and the comparison
    (docs/ARCHITECTURE.md, "Layers").
    """

    def __init__(self, fast: Store, slow: Store, compare_prefix: str = "",
                 newer: Callable[[bytes, bytes], bool] = _fast_wins,
                 fast_only: tuple[str, ...] = (), fast_heads: tuple[str, ...] = ()) -> None:
        self.fast = fast
        self.slow = slow
        self.fast_only = fast_only  # key prefixes read and listed in the fast tier only
        self.fast_heads = fast_heads  # key prefixes a HEAD looks for in the fast tier only
        self.compare_prefix = compare_prefix
        self.newer = newer
        self.url = slow.url
        self.atomic_create = fast.atomic_create

    # -- writes: the fast tier

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.fast.put(key, data)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self.fast.put_if_absent(key, data)

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.fast.put_parts(key, parts)

    def delete(self, key: str) -> None:
        self.fast.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.fast.delete_many(keys)

    def copy(self, src: str, dst: str) -> None:
        """Into the fast tier, from whichever tier holds `src` (the fast one first)."""
        try:
            self.fast.copy(src, dst)
        except NotFoundError:
            self.fast.put(dst, self.slow.get(src))

    def rename(self, src: str, dst: str) -> None:
        if self.fast.head(src) is not None:
            self.fast.rename(src, dst)
        else:
            super().rename(src, dst)

    def check_length(self, key: str) -> None:
        self.fast.check_length(key)
        self.slow.check_length(key)

    # -- reads: the fast tier first

    def get(self, key: str, limit: int | None = None) -> bytes:
        try:
            data = self.fast.get(key, limit)
        except NotFoundError:
            if key.startswith(self.fast_only):
                raise
            return self.slow.get(key, limit)
        if self.compare_prefix and key.startswith(self.compare_prefix):
            try:
                other = self.slow.get(key, limit)
            except NotFoundError:
                return data
            return data if self.newer(data, other) else other
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            return self.fast.get_range(key, start, end)
        except NotFoundError:
            return self.slow.get_range(key, start, end)

    def head(self, key: str) -> int | None:
        size = self.fast.head(key)
        if size is not None or (self.fast_heads and key.startswith(self.fast_heads)):
            return size
        return self.slow.head(key)

    def stat(self, key: str) -> ObjectInfo | None:
        info = self.fast.stat(key)
        return info if info is not None else self.slow.stat(key)

    def local_path(self, key: str) -> str | None:
        if self.fast.head(key) is not None:
            return self.fast.local_path(key)
        return self.slow.local_path(key)

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        if prefix.startswith(self.fast_only) and self.fast_only:
            return self.fast.list(prefix, delimiter)
        return _union(self.fast.list(prefix, delimiter), self.slow.list(prefix, delimiter))

    def list_entry(self, prefix: str, name: str) -> Listing:
        return _union(self.fast.list_entry(prefix, name), self.slow.list_entry(prefix, name))

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        seen: set[str] = set()
        for info in self.fast.scan(prefix):
            seen.add(info.key)
            yield info
        for info in self.slow.scan(prefix):
            if info.key not in seen:
                yield info

    def close(self) -> None:
        self.fast.close()
        self.slow.close()


def _union(fast: Listing, slow: Listing) -> Listing:
    """Both listings' objects (a key both hold once, at the fast tier's size) and
    prefixes, each in key order."""
    objects = dict(slow.objects)
    objects.update(fast.objects)
    return Listing(sorted(objects.items()), sorted(set(fast.prefixes) | set(slow.prefixes)))
