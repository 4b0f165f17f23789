"""A fast tier in front of a store: writes go to the fast tier, reads try it first."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from ckptfs.common.errors import Deferred, NotFoundError, PartialListing, StoreError
from ckptfs.store.base import Listing, ObjectInfo, Store

log = logging.getLogger(__name__)

T = TypeVar("T")


def _usable() -> bool:
    return True


def _not_failed(error: StoreError) -> bool:
    return False


def _ignore(nbytes: int) -> None:
    pass


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

    The fast tier can fail (full, read-only, unmounted): the caller's `fast_failed(e)`
    says whether an error of the fast tier means that it is unusable (the caller then
    knows, and `fast_usable()` says False until it finds it usable again). A read it
    fails so goes to the slow tier. With `writes_follow`, so do the puts: to the slow
    tier while `fast_usable()` is False, and at once when a put into the fast tier fails
    so (the uploader's chunks: its caller publishes their manifest straight to the slow
    tier then). A read of a record the slow tier cannot answer (it is unreachable) is the
    fast tier's copy where it has one.
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
        self.fast_usable: Callable[[], bool] = _usable
        self.fast_failed: Callable[[StoreError], bool] = _not_failed
        self.writes_follow = False  # puts go to the slow tier while the fast one fails
        self.wrote_slow: Callable[[int], object] = _ignore  # told of the bytes put so

    def _write(self, call: Callable[[Store], T], nbytes: int = 0) -> T:
        """`call` on the fast tier; with writes_follow, on the slow one instead while the
        fast one is unusable or when the call finds it so; without, Deferred when it
        finds it so (the caller decides where the write goes then)."""
        if not (self.writes_follow and not self.fast_usable()):
            try:
                return call(self.fast)
            except StoreError as e:
                if not self._unusable(e):
                    raise
                if not self.writes_follow:
                    raise Deferred(f"the fast tier failed: {e}") from e
        result = call(self.slow)
        self.wrote_slow(nbytes)
        return result

    def _read(self, call: Callable[[Store], T]) -> T:
        """`call` on the fast tier, NotFoundError if it has nothing; an error that says the
        fast tier is unusable is NotFoundError too (the slow tier is asked)."""
        try:
            return call(self.fast)
        except StoreError as e:
            if not self._unusable(e):
                raise
        raise NotFoundError("the fast tier is unusable")

    def _unusable(self, error: StoreError) -> bool:
        """Whether a fast tier's error says that it is unusable (a missing key never)."""
        return not isinstance(error, NotFoundError) and self.fast_failed(error)

    # -- writes: the fast tier

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._write(lambda s: s.put(key, data), len(data))

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self._write(lambda s: s.put_if_absent(key, data), len(data))

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self._write(lambda s: s.put_parts(key, parts), sum(len(p) for p in parts))

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
            data = self._read(lambda s: s.get(key, limit))
        except NotFoundError:
            if key.startswith(self.fast_only):
                raise
            return self.slow.get(key, limit)
        if self.compare_prefix and key.startswith(self.compare_prefix):
            try:
                other = self.slow.get(key, limit)
            except NotFoundError:
                return data
            except StoreError as e:
                if e.permanent:
                    raise
                return data  # the slow tier unreachable: the fast tier's copy
            return data if self.newer(data, other) else other
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            return self._read(lambda s: s.get_range(key, start, end))
        except NotFoundError:
            return self.slow.get_range(key, start, end)

    def head(self, key: str) -> int | None:
        if (self.writes_follow and self.fast_heads and key.startswith(self.fast_heads)
                and not self.fast_usable()):
            return self.slow.head(key)  # its puts go there meanwhile
        try:
            size = self._read(lambda s: s.head(key))
        except NotFoundError:
            size = None
        if size is not None or (self.fast_heads and key.startswith(self.fast_heads)):
            return size
        return self.slow.head(key)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            info = self._read(lambda s: s.stat(key))
        except NotFoundError:
            info = None
        return info if info is not None else self.slow.stat(key)

    def local_path(self, key: str) -> str | None:
        if self.fast.head(key) is not None:
            return self.fast.local_path(key)
        return self.slow.local_path(key)

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        if prefix.startswith(self.fast_only) and self.fast_only:
            return self.fast.list(prefix, delimiter)
        fast = self._listed(lambda s: s.list(prefix, delimiter))
        try:
            slow = self.slow.list(prefix, delimiter)
        except StoreError as e:
            if e.permanent:
                raise
            raise PartialListing(str(e), fast.objects, fast.prefixes) from e
        return _union(fast, slow)

    def list_entry(self, prefix: str, name: str) -> Listing:
        fast = self._listed(lambda s: s.list_entry(prefix, name))
        try:
            slow = self.slow.list_entry(prefix, name)
        except StoreError as e:
            if e.permanent or not (fast.objects or fast.prefixes):
                raise
            return fast  # the slow tier unreachable: the entry exists, as the fast tier has it
        return _union(fast, slow)

    def _listed(self, call: Callable[[Store], Listing]) -> Listing:
        """The fast tier's listing; an empty one where it is unusable."""
        try:
            return self._read(call)
        except NotFoundError:
            return Listing([], [])

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
