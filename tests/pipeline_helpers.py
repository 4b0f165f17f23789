"""Helpers of the pipeline tier: a store that records what reached it, staged chunks, a
fast tier's records moved, checkpoints published through a fast tier."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable

import trio
from support import random_bytes

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, chunk_key, file_key
from ckptfs.pipeline import fasttier
from ckptfs.pipeline.cache import LocalCache, StagingFile
from ckptfs.pipeline.fasttier import Record, Replayer
from ckptfs.pipeline.journal import Op
from ckptfs.store.base import Store
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


SHARED = random_bytes(3000)  # a chunk every step names (dedup across checkpoints)


def publish(fast: LocalStore, queue: str, seq: int, path: str, chunks: list[bytes],
            gen: int) -> bytes:
    """A closed file as a fast-tier mount leaves it: chunks, manifest, pending record."""
    named = []
    for data in chunks:
        h = codec.chunk_hash(data)
        fast.put_parts(manifests.chunk_key(h), codec.encode_chunk_parts(data, "zstd4")[0])
        named.append((h, len(data)))
    body = manifests.with_generation(Manifest(sum(len(c) for c in chunks), 0o100644, 0,
                                              tuple(named), writer=queue).to_json(), gen)
    fast.put(file_key(path), body)
    fast.put(fasttier.record_key(queue, seq),
             Record(queue, Op(seq, "put_file", path, body=body)).to_json())
    return body


def save_steps(fast: LocalStore, queue: str = "a") -> dict[str, bytes]:
    """step-1 .. step-8, two files each: model.pt (the shared chunk and its own) and
    opt.pt (its own); the files' contents by path."""
    files = {}
    for step in range(1, 9):
        own, opt = random_bytes(2000 + step), random_bytes(1000 + step)
        publish(fast, queue, 2 * step - 1, f"step-{step}/model.pt", [SHARED, own], step)
        publish(fast, queue, 2 * step, f"step-{step}/opt.pt", [opt], step)
        files[f"step-{step}/model.pt"] = SHARED + own
        files[f"step-{step}/opt.pt"] = opt
    return files


def fast_state(fast: LocalStore) -> tuple[set[str], set[str]]:
    """The fast tier's manifests (paths) and chunks (names)."""
    paths = {manifests.path_of_key(i.key) for i in fast.scan(manifests.FILES)}
    chunks = {manifests.chunk_name(i.key) or "" for i in fast.scan(manifests.CHUNKS)}
    return paths, chunks


def named_by(fast: LocalStore, paths: set[str]) -> set[str]:
    return {h for p in paths for h, _ in Manifest.from_json(fast.get(file_key(p))).chunks}


def read(view: Store, path: str) -> bytes:
    m = Manifest.from_json(view.get(file_key(path)))
    out = b""
    for h, _ in m.chunks:
        with codec.decoded(view.get(manifests.chunk_key(h)), h) as data:
            out += bytes(data)
    return out
