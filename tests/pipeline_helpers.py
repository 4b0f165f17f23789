"""Helpers of the pipeline tier: a store that records what reached it, staged chunks, a
fast tier's records moved."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable

import trio

from ckptfs.format import codec
from ckptfs.format.manifests import chunk_key
from ckptfs.pipeline.cache import LocalCache, StagingFile
from ckptfs.pipeline.fasttier import Replayer
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore


class RecordingStore(FaultyStore):
    """FaultyStore that also logs successful writes in order, every delete_many batch,
    every key HEADed, and when each GET ran (support.max_overlap tells how many ran at once)."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner, max_hang=10.0)
        self.log: list[tuple[str, str]] = []
        self.batches: list[list[str]] = []
        self.get_intervals: list[tuple[float, float]] = []
        self.heads: list[str] = []  # every key HEADed, in order

    def get(self, key: str, limit: int | None = None) -> bytes:
        start = time.monotonic()
        try:
            return super().get(key, limit)
        finally:
            self.get_intervals.append((start, time.monotonic()))

    def head(self, key: str) -> int | None:
        self.heads.append(key)
        return super().head(key)

    def put(self, key: str, data: bytes | memoryview) -> None:
        super().put(key, data)
        self.log.append(("put", key))

    def copy(self, src: str, dst: str) -> None:
        super().copy(src, dst)
        self.log.append(("copy", dst))

    def delete(self, key: str) -> None:
        super().delete(key)
        self.log.append(("delete", key))

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.batches.append(keys)
        super().delete_many(keys)


def run(fn: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body under trio."""
    trio.run(fn)


def staged(cache: LocalCache, data: bytes) -> StagingFile:
    """A sealed staging file holding `data`, as the filesystem leaves it after a close."""
    st = cache.new_staging()
    os.pwrite(st.fd, data, 0)
    st.extent = len(data)
    st.sealed = True
    return st


def put_chunk(store: FaultyStore, data: bytes) -> str:
    """Store `data` as a chunk (bypassing fault injection and counts); returns its name."""
    h = codec.chunk_hash(data)
    store.inner.put(chunk_key(h), codec.encode_chunk(data)[0])
    return h


def stored_chunk(store: FaultyStore, h: str) -> bytes:
    return bytes(codec.decode_chunk(store.inner.get(chunk_key(h)), h))


def move_all(fast: LocalStore, slow: LocalStore, queue: str) -> None:
    """Move every record of `queue` from the fast tier `fast` to the store `slow`."""
    replayer = Replayer(fast, slow)
    for key in replayer.queue_keys(queue):
        record = replayer.read(key)
        assert record is not None
        replayer.move(record)
