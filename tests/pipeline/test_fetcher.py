"""Fetcher: chunks made readable on local disk (single flight, verification, the bounded
wait for missing chunks, prefetch) against a LocalStore behind a FaultyStore."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from pipeline_helpers import RecordingStore, put_chunk, run
from support import max_overlap, random_bytes, wait_until_async

from ckptfs.common.errors import CorruptChunkError, MissingChunkError, PermanentStoreError
from ckptfs.format import codec
from ckptfs.format.manifests import chunk_key, fossil_key
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore

KiB = 1024


async def with_fetcher(store: FaultyStore, cache: LocalCache,
                       body: Callable[[Fetcher], Awaitable[None]],
                       missing_timeout: float = 0.5) -> None:
    f = Fetcher(store, cache, workers=8, missing_timeout=missing_timeout)
    async with trio.open_nursery() as n:
        await n.start(f.run)
        await body(f)
        n.cancel_scope.cancel()


async def read_chunk(f: Fetcher, h: str, length: int) -> bytes:
    return bytes(await f.read(h, 0, length))


def test_fetcher_reads_raw_chunks_of_a_local_store_in_place(
        tmp_path: Path, cache: LocalCache) -> None:
    """A raw chunk of a local-directory store is verified once and then read from the
    store's own file: no second copy in the cache. If that file changes afterwards, it
    is fetched and verified again: wrong bytes are never served."""
    (tmp_path / "store").mkdir()
    local = LocalStore(tmp_path / "store", fsync=False)
    raw = random_bytes(64 * KiB)  # does not compress: stored raw
    compressible = b"layer.0.weight " * 4 * KiB  # stored lz4: decoded into the cache
    h_raw, h_lz4 = codec.chunk_hash(raw), codec.chunk_hash(compressible)
    for data in (raw, compressible):
        local.put(chunk_key(codec.chunk_hash(data)), codec.encode_chunk(data)[0])
    obj = Path(local.local_path(chunk_key(h_raw)) or "")

    def cached_files() -> list[str]:
        return [p.name for p in Path(cache.chunks_dir).rglob("*") if p.is_file()]

    async def body(f: Fetcher) -> None:
        assert await read_chunk(f, h_raw, len(raw)) == raw
        assert await read_chunk(f, h_lz4, len(compressible)) == compressible
        assert cached_files() == [h_lz4]  # the raw chunk was not copied
        fd, offset = cache.locate(h_raw)  # type: ignore[misc]
        assert offset == codec.HEADER_SIZE and os.fstat(fd).st_ino == obj.stat().st_ino
        # changed in place (same file, same size): never served; fetched again, and the
        # new bytes fail verification
        with open(obj, "r+b") as w:
            w.seek(codec.HEADER_SIZE + 100)
            w.write(bytes([raw[100] ^ 0xFF]))
        os.utime(obj, ns=(time.time_ns(), time.time_ns() + 10**9))  # mtime moves on
        assert cache.locate(h_raw) is None
        with pytest.raises(CorruptChunkError):
            await read_chunk(f, h_raw, len(raw))
        # repaired (replaced by a new file with the right bytes): fetched and verified
        local.put(chunk_key(h_raw), codec.encode_chunk(raw)[0])
        assert await read_chunk(f, h_raw, len(raw)) == raw
        assert cached_files() == [h_lz4]

    run(lambda: with_fetcher(local, cache, body))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_file_read_in_place_swapped_for_a_fifo_or_a_link_is_never_opened(
        tmp_path: Path, cache: LocalCache, kind: str) -> None:
    """A raw chunk read in place whose store file someone else swaps, after it was
    verified, for a FIFO or a link to a root-only file: the next read neither blocks on
    the FIFO nor follows the link; the chunk is fetched again, and the store refuses
    what is there now (EIO)."""
    (tmp_path / "store").mkdir()
    local = LocalStore(tmp_path / "store", fsync=False)
    raw = random_bytes(64 * KiB)
    h = codec.chunk_hash(raw)
    local.put(chunk_key(h), codec.encode_chunk(raw)[0])
    obj = Path(local.local_path(chunk_key(h)) or "")
    secret = tmp_path / "secret"
    secret.write_bytes(codec.encode_chunk(raw)[0])  # the very bytes: only the link differs
    located: list[object] = []

    async def body(f: Fetcher) -> None:
        assert await read_chunk(f, h, len(raw)) == raw
        for fd in list(cache._fds.values()):  # a reader's later open, not a kept one
            os.close(fd)
        cache._fds.clear()
        obj.unlink()
        os.mkfifo(obj) if kind == "fifo" else os.symlink(secret, obj)
        t = threading.Thread(target=lambda: located.append(cache.locate(h)), daemon=True)
        t.start()
        t.join(5)
        assert located == [None], "the swapped file was opened, or the open blocked"
        with pytest.raises(MissingChunkError, match=f"chunks/{h[:2]}/{h}%o is a"):
            await read_chunk(f, h, len(raw))

    run(lambda: with_fetcher(local, cache, body))  # type: ignore[arg-type]


def test_fetcher_fetches_and_caches(store: RecordingStore, cache: LocalCache) -> None:
    data = b"layer.0.weight " * 4 * KiB
    h = put_chunk(store, data)

    async def body(f: Fetcher) -> None:
        assert not cache.has(h)
        assert await read_chunk(f, h, len(data)) == data
        assert cache.has(h)
        assert await read_chunk(f, h, len(data)) == data
        assert store.counts["get"] == 1
        s = f.statistics()
        assert s.fetched_chunks == 1 and s.fetched_bytes == len(data) and s.inflight == 0

    run(lambda: with_fetcher(store, cache, body))
    # the read cache holds the raw bytes, verified
    assert Path(cache.chunks_dir, h[:2], h).read_bytes() == data


def test_fetcher_single_flight(store: RecordingStore, cache: LocalCache) -> None:
    data = random_bytes(64 * KiB)
    h = put_chunk(store, data)
    store.set_latency("get", 0.2)
    results: list[bytes] = []

    async def body(f: Fetcher) -> None:
        async def reader() -> None:
            results.append(await read_chunk(f, h, len(data)))

        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(reader)
        assert results == [data] * 10
        assert store.counts["get"] == 1

    run(lambda: with_fetcher(store, cache, body))


@pytest.mark.parametrize("how", ["flipped byte", "wrong content"])
def test_fetcher_corrupt_chunk(store: RecordingStore, cache: LocalCache, how: str) -> None:
    data = random_bytes(16 * KiB)
    h = codec.chunk_hash(data)
    if how == "flipped byte":
        put_chunk(store, data)
        store.corrupt_get(chunk_key(h))
    else:
        store.inner.put(chunk_key(h), codec.encode_chunk(random_bytes(16 * KiB))[0])
    got: list[bytes] = []
    raised: list[BaseException] = []

    async def body(f: Fetcher) -> None:
        store.set_latency("get", 0.05)

        async def reader() -> None:
            try:
                got.append(await read_chunk(f, h, len(data)))
            except CorruptChunkError as e:
                raised.append(e)

        start = time.monotonic()
        async with trio.open_nursery() as n:
            for _ in range(3):
                n.start_soon(reader)
        # at once, not after the 60 s missing_timeout (a wide margin for a loaded machine)
        assert time.monotonic() - start < 20
        assert got == [] and len(raised) == 3
        assert store.counts["get"] == 1  # not retried
        assert not cache.has(h) and cache.locate(h) is None
        assert not os.path.exists(os.path.join(cache.chunks_dir, h[:2], h))
        # prefetch of a corrupt chunk does not crash the fetcher
        f.prefetch_nowait([h])
        await wait_until_async(lambda: f.statistics().inflight == 0)
        assert not cache.has(h)
        # once the store is repaired, the chunk can be read: the error is not sticky
        store.heal()
        put_chunk(store, data)
        assert await read_chunk(f, h, len(data)) == data

    run(lambda: with_fetcher(store, cache, body, missing_timeout=60.0))


def test_fetcher_missing_chunk_times_out(store: RecordingStore, cache: LocalCache) -> None:
    h = codec.chunk_hash(b"never written")

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        with pytest.raises(MissingChunkError, match="not in the store"):
            await f.read(h, 0, 1)
        elapsed = time.monotonic() - start
        # the whole missing_timeout, and then gives up (the upper bound is for a loaded
        # machine: what it rules out is a wait without end)
        assert 1.0 <= elapsed < 20, elapsed
        assert store.counts["get"] >= 3  # retried during the wait
        assert f.statistics().inflight == 0

    run(lambda: with_fetcher(store, cache, body, missing_timeout=1.0))


def test_fetcher_chunk_appearing_during_wait(store: RecordingStore, cache: LocalCache) -> None:
    data = random_bytes(4 * KiB)
    h = codec.chunk_hash(data)

    async def body(f: Fetcher) -> None:
        async def writer() -> None:
            await trio.sleep(0.4)  # after a few GETs found nothing
            put_chunk(store, data)

        async with trio.open_nursery() as n:
            n.start_soon(writer)
            start = time.monotonic()
            assert await read_chunk(f, h, len(data)) == data  # within the 60 s wait
            assert time.monotonic() - start > 0.35
            assert store.counts["get"] >= 2  # found by a GET after the first

    run(lambda: with_fetcher(store, cache, body, missing_timeout=60.0))


def test_fetcher_permanent_error_is_missing_at_once(store: RecordingStore,
                                                    cache: LocalCache) -> None:
    h = put_chunk(store, b"abc" * 100)
    store.fail("get", times=1, error=PermanentStoreError("access denied"))

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        with pytest.raises(MissingChunkError, match="access denied"):
            await f.read(h, 0, 1)
        assert time.monotonic() - start < 20  # at once: not after the 60 s wait
        assert store.counts["get"] == 1
        assert await read_chunk(f, h, 300) == b"abc" * 100

    run(lambda: with_fetcher(store, cache, body, missing_timeout=60.0))


def test_fetcher_prefetch_is_parallel(store: RecordingStore, cache: LocalCache) -> None:
    chunks = [random_bytes(8 * KiB) for _ in range(8)]
    hashes = [put_chunk(store, d) for d in chunks]
    latency = 0.3
    store.set_latency("get", latency)

    async def body(f: Fetcher) -> None:
        f.prefetch_nowait(hashes)
        f.prefetch_nowait(hashes)  # already in flight: no second GET
        assert f.statistics().inflight == 8
        for h, d in zip(hashes, chunks, strict=True):
            assert await read_chunk(f, h, len(d)) == d
        assert store.counts["get"] == 8
        # the GETs ran side by side (8 workers), not one after another
        assert max_overlap(store.get_intervals) >= 4, store.get_intervals
        # a chunk is readable as soon as its GET thread cached it; the task then finishes
        await wait_until_async(lambda: f.statistics().inflight == 0)
        assert f.statistics().fetched_chunks == 8
        f.prefetch_nowait(hashes)  # all local now: nothing to do
        assert f.statistics().inflight == 0 and store.counts["get"] == 8

    run(lambda: with_fetcher(store, cache, body))


@pytest.mark.parametrize("damage", ["flip", "truncate", "none"])
@pytest.mark.parametrize("kind", ["raw", "lz4"])
def test_fetcher_verifies_the_read_cache_of_an_earlier_mount(
        store: RecordingStore, tmp_path: Path, kind: str, damage: str) -> None:
    """A chunk cached by an earlier mount and damaged on the cache disk since (a flipped
    byte, a file cut short by a crash) is re-hashed before it is served, dropped, and
    fetched again: the read gets the right bytes. An intact one costs no GET."""
    data = random_bytes(64 * KiB) if kind == "raw" else b"layer.0.weight " * 4 * KiB
    h = put_chunk(store, data)
    stored, codec_id = codec.encode_chunk(data)
    assert codec.CODEC_NAMES[codec_id] == kind
    root = str(tmp_path / "c")
    first = LocalCache(root, limit_bytes=1 << 30)
    run(lambda: with_fetcher(store, first, lambda f: read_chunk(f, h, len(data))))  # type: ignore[arg-type, return-value]
    first.close()
    path = Path(root, "chunks", h[:2], h)
    assert path.read_bytes() == data
    if damage == "flip":
        blob = bytearray(data)
        blob[len(blob) // 3] ^= 0x04
        path.write_bytes(bytes(blob))
    elif damage == "truncate":
        path.write_bytes(data[:len(data) // 2])
    gets = store.counts["get"]
    cache = LocalCache(root, limit_bytes=1 << 30)  # the next mount, same cache directory
    cache.scan(keep_staging=set())
    got: list[bytes] = []
    stats: list[object] = []

    async def body(f: Fetcher) -> None:
        async def reader() -> None:
            got.append(await read_chunk(f, h, len(data) + 1))

        async with trio.open_nursery() as n:  # two readers at once: one check, one GET
            n.start_soon(reader)
            n.start_soon(reader)
        await reader()
        stats.append(f.statistics())

    try:
        run(lambda: with_fetcher(store, cache, body))
        assert got == [data] * 3
        assert store.counts["get"] - gets == (0 if damage == "none" else 1)
        s = stats[0]
        assert (s.verified_chunks, s.damaged_chunks) == (  # type: ignore[attr-defined]
            (1, 0) if damage == "none" else (0, 1))
        assert path.read_bytes() == data
    finally:
        cache.close()


def test_fetcher_survives_failed_prefetch(store: RecordingStore, cache: LocalCache,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefetch that fails with a local error (cache disk full) must not kill the fetcher."""
    data = random_bytes(4 * KiB)
    h = put_chunk(store, data)
    real_put = cache.put_fetched

    def disk_full(chunk_hash: str, blob: bytes) -> None:
        raise OSError(28, "No space left on device")

    async def body(f: Fetcher) -> None:
        monkeypatch.setattr(cache, "put_fetched", disk_full)
        f.prefetch_nowait([h])
        await wait_until_async(lambda: f.statistics().inflight == 0)
        await trio.sleep(0.01)
        with pytest.raises(OSError):  # a read reports the error to its caller
            await f.read(h, 0, 1)
        monkeypatch.setattr(cache, "put_fetched", real_put)
        assert await read_chunk(f, h, len(data)) == data  # and the fetcher still works

    run(lambda: with_fetcher(store, cache, body))


# ---------------------------------------------------------------------------- fossils
def test_a_chunk_set_aside_by_gc_is_read_from_fossils(store: RecordingStore,
                                                      cache: LocalCache) -> None:
    """A manifest published just after gc's mark can name a chunk that is now only under
    fossils/: the read finds it there at once (no wait for --missing-chunk-timeout),
    verified like any chunk; a damaged fossil is never served."""
    raw, packed = random_bytes(64 * KiB), b"optimizer.state " * 4 * KiB
    damaged = random_bytes(10 * KiB)
    inner = store.inner
    for data in (raw, packed, damaged):
        h = put_chunk(store, data)
        inner.rename(chunk_key(h), fossil_key(h))
    h_damaged = codec.chunk_hash(damaged)
    store.corrupt_get(fossil_key(h_damaged))

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        for data in (raw, packed):
            assert await read_chunk(f, codec.chunk_hash(data), len(data)) == data
        assert time.monotonic() - start < 5  # well within the 60 s it would wait for
        assert f.fossil_chunks == 2
        with pytest.raises(CorruptChunkError):
            await read_chunk(f, h_damaged, len(damaged))
        # the next gc run restores one: read from chunks/ again, wherever it is now
        h = codec.chunk_hash(raw)
        inner.rename(fossil_key(h), chunk_key(h))
        cache.limit_bytes = 0
        cache.evict()
        assert await read_chunk(f, h, len(raw)) == raw

    run(lambda: with_fetcher(store, cache, body, missing_timeout=60.0))


def test_without_the_fallback_a_fossil_is_a_missing_chunk(
        store: RecordingStore, cache: LocalCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the fallback prevents: a reader that looks in chunks/ only waits out its
    timeout and fails (EIO) for a chunk that gc set aside."""
    data = random_bytes(10 * KiB)
    h = put_chunk(store, data)
    store.inner.rename(chunk_key(h), fossil_key(h))
    monkeypatch.setattr("ckptfs.pipeline.fetcher.manifests.fossil_key", chunk_key)

    async def body(f: Fetcher) -> None:
        with pytest.raises(MissingChunkError):
            await read_chunk(f, h, len(data))

    run(lambda: with_fetcher(store, cache, body, missing_timeout=0.3))


def test_fetched_chunks_are_served_from_memory_until_read_once(
        store: RecordingStore, tmp_path: Path) -> None:
    """With a memory bound, a fetched chunk is decoded, verified and served from memory,
    and dropped once all of it has been read, its buffer decoding the next chunk: nothing
    goes to the read cache on disk. Chunks pushed out of memory unread (prefetched ahead
    of a slow reader, least recently used first) go to the read cache and still read
    byte for byte, with no second GET. A chunk whose bytes do not match its name is never
    held."""
    data = [b"layer.%d.weight " % i * 4 * KiB for i in range(4)]  # compressible: decoded
    size = len(data[0])
    hashes = [codec.chunk_hash(d) for d in data]
    for h, d in zip(hashes, data, strict=True):
        store.inner.put(chunk_key(h), codec.encode_chunk(d, "zstd4")[0])
    cache = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30, memory_bytes=2 * size)

    def on_disk() -> set[str]:
        return {p.name for p in Path(cache.chunks_dir).rglob("*") if p.is_file()}

    async def body(f: Fetcher) -> None:
        assert await f.read(hashes[0], 0, 10) == data[0][:10]
        assert cache.memory_bytes == size and cache.has(hashes[0])
        assert await f.read(hashes[0], 10, size) == data[0][10:]  # (short: its end)
        assert cache.memory_bytes == 0 and not cache.has(hashes[0]) and on_disk() == set()
        assert len(cache._buffers) == 1  # its buffer, for the next decode
        f.prefetch_nowait(hashes[1:])  # three unread chunks, room for two
        await wait_until_async(lambda: f.statistics().inflight == 0)
        assert cache.memory_bytes == 2 * size and len(on_disk()) == 1
        # the buffer was reused (taken, and only the spilled chunk's given back)
        assert len(cache._buffers) == 1
        for h, d in zip(hashes[1:], data[1:], strict=True):
            assert cache.has(h) and await read_chunk(f, h, len(d)) == d
        assert cache.memory_bytes == 0 and store.counts["get"] == 4
        bad = codec.chunk_hash(random_bytes(KiB))
        store.inner.put(chunk_key(bad), codec.encode_chunk(b"x" * 4 * KiB)[0])
        with pytest.raises(CorruptChunkError):
            await f.read(bad, 0, 1)
        assert not cache.has(bad) and cache.memory_bytes == 0

    try:
        run(lambda: with_fetcher(store, cache, body, missing_timeout=60.0))
    finally:
        cache.close()


def test_a_chunk_that_cannot_be_spilled_is_fetched_again(
        store: RecordingStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk pushed out of memory unread when the read cache's disk is full is dropped
    (it is clean), not an error: the fetch that needed room succeeds, and the dropped
    chunk is fetched again when it is read."""
    data = [b"rank-%03d" % i * KiB for i in range(2)]  # 8 KiB each, compressible
    hashes = [put_chunk(store, d) for d in data]
    cache = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30, memory_bytes=8 * KiB)

    def disk_full(chunk_hash: str, data: codec.Buffer) -> None:
        raise OSError(28, "No space left on device")

    async def body(f: Fetcher) -> None:
        monkeypatch.setattr(cache, "put_fetched", disk_full)
        for h in hashes:  # unread: the first is pushed out by the second
            f.prefetch_nowait([h])
            await wait_until_async(lambda: f.statistics().inflight == 0)
        assert cache.has(hashes[1]) and not cache.has(hashes[0])
        assert await read_chunk(f, hashes[1], 8 * KiB) == data[1]
        assert await read_chunk(f, hashes[0], 8 * KiB) == data[0]
        assert store.counts["get"] == 3

    try:
        run(lambda: with_fetcher(store, cache, body))
    finally:
        cache.close()
