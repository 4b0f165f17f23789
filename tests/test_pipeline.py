"""Uploader, Fetcher, Publisher and LocalCache against a LocalStore on disk, without FUSE."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

import pytest
import trio

from ckptfs import codec, uploader
from ckptfs.cache import LocalCache, StagingFile
from ckptfs.errors import CorruptChunkError, MissingChunkError, PermanentStoreError
from ckptfs.fetcher import Fetcher
from ckptfs.journal import Journal, Op, PendingChunk
from ckptfs.manifests import DirMarker, chunk_key, dir_key, file_key
from ckptfs.publisher import Publisher
from ckptfs.retry import Backoff
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore
from ckptfs.uploader import Uploader, UploadJob

KiB = 1024


class RecordingStore(FaultyStore):
    """FaultyStore that also logs successful writes in order and every delete_many batch."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner, max_hang=10.0)
        self.log: list[tuple[str, str]] = []
        self.batches: list[list[str]] = []

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


@pytest.fixture
def store(tmp_path: Path) -> RecordingStore:
    (tmp_path / "store").mkdir()
    return RecordingStore(LocalStore(tmp_path / "store", fsync=False))


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[LocalCache]:
    c = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    yield c
    c.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(str(tmp_path / "journal.sqlite"))
    yield j
    j.close()


def run(fn: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body under trio."""
    trio.run(fn)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `cond` until it holds; fail the test after `timeout` seconds."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


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
    return codec.decode_chunk(store.inner.get(chunk_key(h)), h)


# -- Uploader ----------------------------------------------------------------------------

async def settled(up: Uploader, *staging: StagingFile) -> None:
    """Wait until no chunk is pending and the uploader has finished its bookkeeping."""
    # pending_count() drops when the chunk is in the store; the journal row and the
    # staging file's dirty/pending accounting are cleared just after
    await until(lambda: up.pending_count() == 0 and all(st.pending == 0 for st in staging))

async def published(up: Uploader, cache: LocalCache, data: bytes,
                    ops: list[tuple[str, str, str | None, bytes | None]] = ()  # type: ignore[assignment]
                    ) -> tuple[StagingFile, str, list[int]]:
    """Stage `data` as one chunk of a closed file and persist it, as filesystem.py does."""
    st = staged(cache, data)
    h = codec.chunk_hash(data)
    cache.add_staged_chunk(h, st, 0, len(data))
    cache.set_dirty(st, 0, len(data))
    seqs = await up.persist([PendingChunk(h, st.id, 0, len(data))], list(ops))
    return st, h, seqs


def test_uploader_uploads_published_chunk(store: RecordingStore, cache: LocalCache,
                                          journal: Journal) -> None:
    data = b"weights " * 8 * KiB  # compressible

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=4)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, h, seqs = await published(up, cache, data, [("put_file", "a", None, b"{}")])
            assert len(seqs) == 1
            await settled(up, st)
            assert stored_chunk(store, h) == data
            assert journal.counts() == (0, 1)  # the chunk row is gone, the op is not ours
            assert not up.is_pending(h) and h in up.in_store
            assert cache.dirty_bytes == 0 and st.pending == 0 and st.dirty == {}
            s = up.statistics()
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == 0
            assert 0 < s.stored_bytes < len(data)  # compressed
            assert s.stored_bytes == len(codec.encode_chunk(data)[0])
            assert s.uploading_bytes == 0 and s.queued_jobs == 0
            assert s.last_error is None and s.retrying_since is None
            assert s.upload_rate > 0
            assert store.counts["put"] == 1
            # the now clean staging file is evictable
            cache.limit_bytes = 0
            cache.evict()
            assert st.id not in cache.staging and not os.path.exists(st.path)
            n.cancel_scope.cancel()

    run(main)


def test_uploader_journals_before_returning(store: RecordingStore, cache: LocalCache,
                                            journal: Journal) -> None:
    """persist() makes the chunk durable in the journal even before any worker runs."""

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))  # run() not started
        st, h, _ = await published(up, cache, b"x" * 1000)
        assert journal.pending_chunks() == [PendingChunk(h, st.id, 0, 1000)]
        assert up.is_pending(h) and up.pending_count() == 1
        assert up.statistics().queued_jobs == 1
        assert st.pending == 1

    run(main)


def test_uploader_dedup_against_store(store: RecordingStore, cache: LocalCache,
                                      journal: Journal) -> None:
    data = os.urandom(20 * KiB)
    h = put_chunk(store, data)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, _, _ = await published(up, cache, data)
            await settled(up, st)
            assert store.counts["put"] == 0 and store.counts["head"] == 1
            assert journal.counts() == (0, 0)
            s = up.statistics()
            assert s.dedup_bytes == len(data) and s.uploaded_bytes == 0 and s.stored_bytes == 0
            # known to be in the store now: a second file with the chunk is not even journaled
            _, h2, _ = await published(up, cache, data)
            assert h2 == h and not up.is_pending(h) and journal.counts() == (0, 0)
            await trio.sleep(0.05)
            assert store.counts["put"] == 0 and store.counts["head"] == 1
            n.cancel_scope.cancel()

    run(main)


def test_uploader_replaces_a_torn_chunk_object(store: RecordingStore, cache: LocalCache,
                                              journal: Journal) -> None:
    """A PUT cut off by a crash can leave an empty or short object under the chunk's key
    (SeaweedFS does): the HEAD that skips known chunks must not take it for the chunk."""
    data = os.urandom(20 * KiB)
    h = codec.chunk_hash(data)
    store.inner.put(chunk_key(h), b"")

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, _, _ = await published(up, cache, data)
            await settled(up, st)
            assert store.counts["put"] == 1
            assert stored_chunk(store, h) == data
            n.cancel_scope.cancel()

    run(main)


def test_uploader_dedup_within_mount(store: RecordingStore, cache: LocalCache,
                                     journal: Journal) -> None:
    """Two files with the same chunk persisted before the upload: one PUT, both released."""
    data = os.urandom(10 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        store.set_latency("put", 0.1)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st1, h, _ = await published(up, cache, data)
            st2, _, _ = await published(up, cache, data)
            assert st1.pending == st2.pending == 1
            await settled(up, st1, st2)
            assert store.counts["put"] == 1
            assert st1.dirty == st2.dirty == {} and cache.dirty_bytes == 0
            assert stored_chunk(store, h) == data
            n.cancel_scope.cancel()

    run(main)


def test_uploader_retries_transient_failures(store: RecordingStore, cache: LocalCache,
                                             journal: Journal,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploader, "BACKGROUND", Backoff(first=0.01, maximum=30.0))
    data = os.urandom(30 * KiB)
    store.fail("put", times=4)
    errors: list[str | None] = []

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)

            async def watch() -> None:
                while True:
                    await up.wait_changed()
                    errors.append(up.statistics().last_error)

            n.start_soon(watch)
            st, h, _ = await published(up, cache, data)
            await settled(up, st)
            assert store.counts["put"] == 5
            assert stored_chunk(store, h) == data
            assert journal.counts() == (0, 0)
            s = up.statistics()
            assert s.last_error is None and s.retrying_since is None
            assert s.uploaded_bytes == len(data)
            await trio.sleep(0.01)
            n.cancel_scope.cancel()
        assert any(e and "TransientStoreError" in e for e in errors), errors

    run(main)


def test_uploader_permanent_error_keeps_data_journaled(tmp_path: Path, store: RecordingStore,
                                                       journal: Journal) -> None:
    data = os.urandom(12 * KiB)
    cache = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    store.fail("put", times=1, error=PermanentStoreError("access denied to bucket"))

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, h, _ = await published(up, cache, data)
            await until(lambda: up.statistics().last_error is not None)
            s = up.statistics()
            assert "PermanentStoreError" in (s.last_error or "")
            assert "access denied" in (s.last_error or "")
            assert s.retrying_since is not None
            await trio.sleep(0.1)  # a permanent error is not retried quickly
            assert store.counts["put"] == 1
            assert up.is_pending(h) and journal.counts() == (1, 0)
            assert cache.dirty_bytes == len(data) and st.pending == 1
            n.cancel_scope.cancel()
        # "restart": a new cache object and uploader resume from the journal and succeed
        cache.close()
        pending = journal.pending_chunks()
        assert [c.hash for c in pending] == [h]
        cache2 = LocalCache(cache.root, cache.limit_bytes)
        cache2.scan(keep_staging={c.staging_id for c in pending})
        up2 = Uploader(store, cache2, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await up2.resume(pending)
            assert up2.is_pending(h) and cache2.dirty_bytes == len(data)
            await n.start(up2.run)
            await settled(up2, *cache2.staging.values())
            n.cancel_scope.cancel()
        assert stored_chunk(store, h) == data
        assert journal.counts() == (0, 0) and cache2.dirty_bytes == 0
        cache2.close()

    run(main)


def test_uploader_early_job_calls_on_done(store: RecordingStore, cache: LocalCache,
                                          journal: Journal) -> None:
    data = os.urandom(8 * KiB) * 2
    done: list[str] = []

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = cache.new_staging()
            os.pwrite(st.fd, b"\0" * 100 + data, 0)
            up.submit_early_nowait(UploadJob(st, 100, len(data), on_done=done.append))
            await until(lambda: bool(done))
            assert done == [codec.chunk_hash(data)]
            assert stored_chunk(store, done[0]) == data
            assert journal.counts() == (0, 0)
            assert up.statistics().uploaded_bytes == len(data)
            # the same bytes again: already known, no second PUT, still told the hash
            up.submit_early_nowait(UploadJob(st, 100, len(data), on_done=done.append))
            await until(lambda: len(done) == 2)
            assert done[1] == done[0] and store.counts["put"] == 1
            n.cancel_scope.cancel()

    run(main)


def test_uploader_yields_to_a_streaming_save(store: RecordingStore, cache: LocalCache,
                                             journal: Journal) -> None:
    """With no upload allowed beside a save (a 2-core node), a queued chunk waits while
    writes stream in, goes at once when somebody waits for uploads, and otherwise as
    soon as the stream pauses. A trickle of small writes is not a stream."""
    rate = {"bytes": 0}

    async def writer() -> None:
        while True:
            if rate["bytes"]:
                up.writes.note(rate["bytes"])
            await trio.sleep(0.01)

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(up.run)
            n.start_soon(writer)
            rate["bytes"] = 100  # 10 KB/s: a log file, not a save
            await trio.sleep(0.1)
            st, _, _ = await published(up, cache, os.urandom(64 * KiB))
            await settled(up, st)

            rate["bytes"] = 4 << 20  # 400 MB/s: a save
            await trio.sleep(0.1)
            st, _, _ = await published(up, cache, os.urandom(64 * KiB))
            await trio.sleep(0.5)
            assert up.pending_count() == 1 and store.counts["put"] == 1  # held
            assert up.busy()  # so that a writer at the cache limit waits for it
            with trio.fail_after(2):
                await up.wait_changed()  # as sync, fsync and back-pressure do
            await settled(up, st)
            assert store.counts["put"] == 2

            st, _, _ = await published(up, cache, os.urandom(64 * KiB))
            await trio.sleep(0.5)
            assert up.pending_count() == 1
            rate["bytes"] = 0  # the save ends
            with trio.fail_after(1):
                await settled(up, st)
            n.cancel_scope.cancel()

    up = Uploader(store, cache, journal, trio.CapacityLimiter(1), overlap_workers=0)
    run(main)


def open_chunk(cache: LocalCache, data: bytes) -> StagingFile:
    """A staging file of a file still open, whose one chunk sequential writes completed."""
    st = cache.new_staging()
    os.pwrite(st.fd, data, 0)
    st.extent = len(data)
    cache.set_dirty(st, 0, len(data))
    return st


async def close_file(up: Uploader, cache: LocalCache, st: StagingFile) -> str:
    """What close does to `open_chunk`'s file: seal it, journal its chunk, queue it."""
    data = os.pread(st.fd, st.extent, 0)
    h = codec.chunk_hash(data)
    cache.add_staged_chunk(h, st, 0, len(data))
    await up.persist([PendingChunk(h, st.id, 0, len(data))], [])
    st.sealed = True
    return h


class EarlyResultLast(Uploader):
    """An uploader whose early jobs' results reach the trio thread 0.5 s late, after
    those of published jobs that ran at the same time."""

    def _upload_sync(self, job: UploadJob, *args: object) -> object:  # type: ignore[override]
        result = super()._upload_sync(job, *args)  # type: ignore[arg-type]
        if job.hash is None:
            time.sleep(0.5)
        return result


@pytest.mark.parametrize("closed", ["during the early PUT", "after the early PUT"])
def test_uploader_early_and_published_job_of_one_chunk_are_not_dedup(
        store: RecordingStore, cache: LocalCache, journal: Journal, closed: str) -> None:
    """A chunk uploaded early and then journaled by the close of its file is one upload
    (one PUT), not a deduplicated chunk, whichever job learns first that it is stored:
    the published job that waited for the early PUT, or that HEADs after it."""
    data = os.urandom(64 * KiB)
    done: list[str] = []

    async def main() -> None:
        up = EarlyResultLast(store, cache, journal, trio.CapacityLimiter(1), workers=4)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = open_chunk(cache, data)
            if closed == "during the early PUT":
                store.hang("put")
            up.submit_early_nowait(UploadJob(st, 0, len(data), on_done=done.append))
            if closed == "during the early PUT":
                await until(lambda: store.counts["put"] == 1)
            else:  # the object is there, the early job's result not processed yet
                await until(lambda: store.inner.head(chunk_key(codec.chunk_hash(data)))
                            is not None)
            h = await close_file(up, cache, st)
            await trio.sleep(0.1)
            store.release()
            await settled(up, st)
            await until(lambda: bool(done))
            s = up.statistics()
            assert store.counts["put"] == 1 and done == [h]
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == 0, s
            assert cache.dirty_bytes == 0 and journal.counts() == (0, 0)
            n.cancel_scope.cancel()

    run(main)


def test_uploader_dedup_counts_each_other_copy_of_a_chunk(
        store: RecordingStore, cache: LocalCache, journal: Journal) -> None:
    """dedup_bytes counts the copies of a chunk in other file versions (or other places
    of one file) that needed no upload: two files with the same bytes closed before the
    upload, then a copy of them closed after it (as `cp` of a saved checkpoint)."""
    data = os.urandom(16 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            store.set_latency("put", 0.1)
            st1, _, _ = await published(up, cache, data)
            st2, _, _ = await published(up, cache, data)
            await settled(up, st1, st2)
            s = up.statistics()
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == len(data), s
            st3, _, _ = await published(up, cache, data)  # the copy: nothing to upload
            await settled(up, st3)
            s = up.statistics()
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == 2 * len(data), s
            assert store.counts["put"] == 1
            n.cancel_scope.cancel()

    run(main)


def test_uploader_chunk_waiting_for_another_put_is_uploading_once(
        store: RecordingStore, cache: LocalCache, journal: Journal) -> None:
    """While a published job waits for the early job's PUT of the same chunk, the chunk
    is counted once in uploading_bytes, and not at all once that PUT is done."""
    data = os.urandom(64 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=4)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = open_chunk(cache, data)
            store.hang("put")
            up.submit_early_nowait(UploadJob(st, 0, len(data)))
            await until(lambda: store.counts["put"] == 1)
            await close_file(up, cache, st)
            await trio.sleep(0.2)  # the published job is waiting for the early PUT
            assert up.statistics().uploading_bytes == len(data)
            store.release()
            await settled(up, st)
            await until(lambda: not up.busy(), timeout=1.0)
            assert up.statistics().uploading_bytes == 0
            n.cancel_scope.cancel()

    run(main)


def test_uploader_status_settles_after_an_outage(
        store: RecordingStore, cache: LocalCache, journal: Journal,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An early upload fails (the store is down) and backs off; the store comes back and
    the file's close uploads the chunk. At once nothing is uploading any more (the early
    job does not sit out its backoff counted as uploading), and a moment later the rate
    reads 0; no stray PUT comes afterwards."""
    monkeypatch.setattr(uploader, "BACKGROUND", Backoff(first=4.0, maximum=30.0))  # 2-6 s
    data = os.urandom(64 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=4,
                      rate_window=0.5)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = open_chunk(cache, data)
            store.fail("put", times=1)  # the outage
            up.submit_early_nowait(UploadJob(st, 0, len(data)))
            await until(lambda: up.statistics().retrying_since is not None)
            s = up.statistics()
            assert s.uploading_bytes == len(data) and s.last_error  # waiting to retry
            await close_file(up, cache, st)  # the store is back: this upload succeeds
            await settled(up, st)
            s = up.statistics()
            assert s.retrying_since is None and s.upload_rate > 0
            with trio.fail_after(1.0):
                await until(lambda: up.statistics().uploading_bytes == 0 and not up.busy())
            await trio.sleep(0.6)  # past the rate window
            s = up.statistics()
            assert s.upload_rate == 0 and s.uploading_bytes == 0, s
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == 0, s
            assert store.counts["put"] == 2  # the failed one and the close's
            n.cancel_scope.cancel()

    run(main)


def test_upload_rate_reads_zero_after_its_window() -> None:
    rate = uploader._Rate(window=0.2)
    assert rate.value() == 0
    rate.add(1000)
    assert rate.value() == 1000 / 0.2
    time.sleep(0.25)
    assert rate.value() == 0


# -- Fetcher -----------------------------------------------------------------------------

async def with_fetcher(store: FaultyStore, cache: LocalCache,
                       body: Callable[[Fetcher], Awaitable[None]],
                       missing_timeout: float = 0.5) -> None:
    f = Fetcher(store, cache, workers=8, missing_timeout=missing_timeout)
    async with trio.open_nursery() as n:
        await n.start(f.run)
        await body(f)
        n.cancel_scope.cancel()


async def read_chunk(f: Fetcher, h: str, length: int) -> bytes:
    fd, offset = await f.locate(h)
    return os.pread(fd, length, offset)


def test_fetcher_reads_raw_chunks_of_a_local_store_in_place(
        tmp_path: Path, cache: LocalCache) -> None:
    """A raw chunk of a local-directory store is verified once and then read from the
    store's own file: no second copy in the cache. If that file changes afterwards, it
    is fetched and verified again: wrong bytes are never served."""
    (tmp_path / "store").mkdir()
    local = LocalStore(tmp_path / "store", fsync=False)
    raw = os.urandom(64 * KiB)  # does not compress: stored raw
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
        fd, offset = await f.locate(h_raw)
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
    data = os.urandom(64 * KiB)
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
    data = os.urandom(16 * KiB)
    h = codec.chunk_hash(data)
    if how == "flipped byte":
        put_chunk(store, data)
        store.corrupt_get(chunk_key(h))
    else:
        store.inner.put(chunk_key(h), codec.encode_chunk(os.urandom(16 * KiB))[0])
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
        assert time.monotonic() - start < 0.4  # at once, not after missing_timeout
        assert got == [] and len(raised) == 3
        assert store.counts["get"] == 1  # not retried
        assert not cache.has(h) and cache.locate(h) is None
        assert not os.path.exists(os.path.join(cache.chunks_dir, h[:2], h))
        # prefetch of a corrupt chunk does not crash the fetcher
        f.prefetch_nowait([h])
        await until(lambda: f.statistics().inflight == 0)
        assert not cache.has(h)
        # once the store is repaired, the chunk can be read: the error is not sticky
        store.heal()
        put_chunk(store, data)
        assert await read_chunk(f, h, len(data)) == data

    run(lambda: with_fetcher(store, cache, body))


def test_fetcher_missing_chunk_times_out(store: RecordingStore, cache: LocalCache) -> None:
    h = codec.chunk_hash(b"never written")

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        with pytest.raises(MissingChunkError, match="not in the store"):
            await f.locate(h)
        elapsed = time.monotonic() - start
        assert 0.45 <= elapsed < 1.5, elapsed  # waits the whole missing_timeout, not more
        assert store.counts["get"] >= 3  # retried during the wait
        assert f.statistics().inflight == 0

    run(lambda: with_fetcher(store, cache, body, missing_timeout=0.5))


def test_fetcher_chunk_appearing_during_wait(store: RecordingStore, cache: LocalCache) -> None:
    data = os.urandom(4 * KiB)
    h = codec.chunk_hash(data)

    async def body(f: Fetcher) -> None:
        async def writer() -> None:
            await trio.sleep(0.4)  # late in the 0.5 s window
            put_chunk(store, data)

        async with trio.open_nursery() as n:
            n.start_soon(writer)
            start = time.monotonic()
            assert await read_chunk(f, h, len(data)) == data
            assert 0.35 < time.monotonic() - start < 1.0

    run(lambda: with_fetcher(store, cache, body, missing_timeout=0.5))


def test_fetcher_permanent_error_is_missing_at_once(store: RecordingStore,
                                                    cache: LocalCache) -> None:
    h = put_chunk(store, b"abc" * 100)
    store.fail("get", times=1, error=PermanentStoreError("access denied"))

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        with pytest.raises(MissingChunkError, match="access denied"):
            await f.locate(h)
        assert time.monotonic() - start < 0.3
        assert await read_chunk(f, h, 300) == b"abc" * 100

    run(lambda: with_fetcher(store, cache, body, missing_timeout=5.0))


def test_fetcher_prefetch_is_parallel(store: RecordingStore, cache: LocalCache) -> None:
    chunks = [os.urandom(8 * KiB) for _ in range(8)]
    hashes = [put_chunk(store, d) for d in chunks]
    latency = 0.3
    store.set_latency("get", latency)

    async def body(f: Fetcher) -> None:
        start = time.monotonic()
        f.prefetch_nowait(hashes)
        f.prefetch_nowait(hashes)  # already in flight: no second GET
        assert f.statistics().inflight == 8
        for h, d in zip(hashes, chunks):
            assert await read_chunk(f, h, len(d)) == d
        elapsed = time.monotonic() - start
        assert latency <= elapsed < 2.5 * latency, elapsed  # ~1x the latency, not 8x
        assert store.counts["get"] == 8
        # a chunk is readable as soon as its GET thread cached it; the task then finishes
        await until(lambda: f.statistics().inflight == 0)
        assert f.statistics().fetched_chunks == 8
        f.prefetch_nowait(hashes)  # all local now: nothing to do
        assert f.statistics().inflight == 0 and store.counts["get"] == 8

    run(lambda: with_fetcher(store, cache, body))


# -- Publisher ---------------------------------------------------------------------------

def enqueue(pub: Publisher, journal: Journal, kind: str, path: str, path2: str | None = None,
            body: bytes | None = None) -> int:
    seq = journal.add_op(kind, path, path2, body)
    pub.enqueue(Op(seq, kind, path, path2, body))
    return seq


async def with_publisher(store: FaultyStore, journal: Journal,
                         body: Callable[[Publisher], Awaitable[None]],
                         setup: Callable[[Publisher], None] | None = None) -> None:
    pub = Publisher(store, journal, trio.CapacityLimiter(1))
    if setup is not None:
        setup(pub)
    async with trio.open_nursery() as n:
        await n.start(pub.run)
        await body(pub)
        n.cancel_scope.cancel()


def keys(store: FaultyStore, prefix: str = "files/") -> dict[str, bytes]:
    return {k: store.inner.get(k) for k, _ in store.inner.list(prefix, delimiter=None).objects}


def test_publisher_applies_ops_in_order(store: RecordingStore, journal: Journal) -> None:
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "put_dir", "d", body=b'{"mode": 448}'))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v1"))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v2"))
        seqs.append(enqueue(pub, journal, "rename_file", "d/a", "d/b"))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v3"))
        seqs.append(enqueue(pub, journal, "put_file", "gone", body=b"x"))
        seqs.append(enqueue(pub, journal, "delete_file", "gone"))
        assert pub.is_pending("d/a") and pub.is_pending("d/a/deeper") and pub.is_pending("d")
        assert not pub.is_pending("other") and not pub.is_pending("")
        assert pub.pending_count == 7

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == {"files/d/": b'{"mode": 448}', "files/d/a": b"v3",
                               "files/d/b": b"v2"}
        assert store.log == [
            ("put", "files/d/"), ("put", "files/d/a"), ("put", "files/d/a"),
            ("copy", "files/d/b"), ("delete", "files/d/a"), ("put", "files/d/a"),
            ("put", "files/gone"), ("delete", "files/gone")]
        assert journal.counts() == (0, 0)
        assert pub.pending_count == 0 and not pub.is_pending("d/a")
        assert pub.applied_seq == seqs[-1]
        assert pub.statistics() == {"pending_ops": 0, "applied_ops": 7, "last_error": None}
        # ops added while running are applied too
        seq = journal.add_op("put_file", "late", None, b"l")
        await pub.add(Op(seq, "put_file", "late", None, b"l"))
        assert await pub.wait_applied(seq, timeout=5.0)
        assert store.inner.get("files/late") == b"l"
        await pub.wait_empty()

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_batches_deletes(store: RecordingStore, journal: Journal) -> None:
    for name in ("a", "b", "c", "x"):
        store.inner.put(file_key(name), b"m")
    store.inner.put(dir_key("d1"), b"")
    store.inner.put(dir_key("d2"), b"")
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        for name in ("a", "b", "c"):
            seqs.append(enqueue(pub, journal, "delete_file", name))
        seqs.append(enqueue(pub, journal, "delete_dir", "d1"))
        seqs.append(enqueue(pub, journal, "put_file", "y", body=b"m"))
        seqs.append(enqueue(pub, journal, "delete_file", "x"))
        seqs.append(enqueue(pub, journal, "delete_dir", "d2"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert store.batches == [["files/a", "files/b", "files/c", "files/d1/"],
                                 ["files/x", "files/d2/"]]
        assert keys(store) == {"files/y": b"m"}
        assert journal.counts() == (0, 0)

    run(lambda: with_publisher(store, journal, body, setup))


def make_tree(store: FaultyStore) -> dict[str, bytes]:
    """A directory 'src' with a marker, files, a subdirectory; and a sibling 'srcx'."""
    tree = {
        "files/src/": DirMarker(mode=0o40700, mtime_ns=7).to_json(),
        "files/src/a": b"manifest a",
        "files/src/sub/": DirMarker(mode=0o40750, mtime_ns=8).to_json(),
        "files/src/sub/b": b"manifest b",
        "files/src/sub/deep/c": b"manifest c",  # an implicit directory: no marker
        "files/srcx/z": b"not moved",
        "files/other": b"not moved either",
    }
    for k, v in tree.items():
        store.inner.put(k, v)
    return tree


def renamed(tree: dict[str, bytes]) -> dict[str, bytes]:
    return {k.replace("files/src/", "files/dst/"): v for k, v in tree.items()}


def test_publisher_rename_dir(store: RecordingStore, journal: Journal) -> None:
    tree = make_tree(store)
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)
        assert journal.counts() == (0, 0)
        # replaying the op after it was fully applied (crash before the journal row was
        # removed) changes nothing, and keeps the directory marker's mode and mtime
        store.log.clear()
        await pub.add(Op(seqs[0] + 1, "rename_dir", "src", "dst"))
        assert await pub.wait_applied(seqs[0] + 1, timeout=5.0)
        assert keys(store) == renamed(tree)
        assert DirMarker.from_json(store.inner.get("files/dst/")).mode == 0o40700

    run(lambda: with_publisher(store, journal, body, setup))


@pytest.mark.parametrize("copied", ["all", "half"])
def test_publisher_rename_dir_replay_after_partial_copy(store: RecordingStore,
                                                        journal: Journal, copied: str) -> None:
    tree = make_tree(store)
    src_keys = sorted(k for k in tree if k.startswith("files/src/"))
    # a crash after the copy half (or part of it) was applied, before the deletes
    for k in src_keys if copied == "all" else src_keys[::2]:
        store.inner.copy(k, k.replace("files/src/", "files/dst/"))
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_rename_dir_replay_after_partial_delete(store: RecordingStore,
                                                          journal: Journal) -> None:
    tree = make_tree(store)
    src_keys = sorted(k for k in tree if k.startswith("files/src/"))
    for k in src_keys:
        store.inner.copy(k, k.replace("files/src/", "files/dst/"))
    for k in src_keys[:2]:  # the crash came in the middle of the deletes
        store.inner.delete(k)
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_rename_file_replay(store: RecordingStore, journal: Journal) -> None:
    store.inner.put(file_key("a"), b"m")
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_file", "a", "b"))
        seqs.append(enqueue(pub, journal, "rename_file", "a", "b"))  # the replay

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == {"files/b": b"m"}

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_retries_failures(store: RecordingStore, journal: Journal) -> None:
    store.fail("put", times=8)  # more than RetryingStore's 6 attempts: the op itself fails
    seqs: list[int] = []
    seen_unhealthy: list[str | None] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "put_file", "a", body=b"1"))
        seqs.append(enqueue(pub, journal, "put_file", "b", body=b"2"))

    async def body(pub: Publisher) -> None:
        await until(lambda: not pub.healthy)
        seen_unhealthy.append(pub.last_error)
        assert not await pub.wait_applied(seqs[0], timeout=5.0)  # unhealthy: returns at once
        assert journal.counts() == (0, 2)
        await until(lambda: pub.applied_seq >= seqs[-1], timeout=5.0)
        assert pub.healthy and pub.last_error is None
        assert keys(store) == {"files/a": b"1", "files/b": b"2"}
        assert store.counts["put"] == 10 and journal.counts() == (0, 0)

    run(lambda: with_publisher(store, journal, body, setup))
    assert seen_unhealthy and "TransientStoreError" in (seen_unhealthy[0] or "")


def test_publisher_wait_applied_timeout(store: RecordingStore, journal: Journal) -> None:
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        store.hang("put")
        seqs.append(enqueue(pub, journal, "put_file", "a", body=b"1"))

    async def body(pub: Publisher) -> None:
        start = time.monotonic()
        assert await pub.wait_applied(seqs[0], timeout=0.2) is False
        assert 0.19 <= time.monotonic() - start < 1.0
        assert pub.healthy and journal.counts() == (0, 1)
        store.release()
        assert await pub.wait_applied(seqs[0], timeout=5.0) is True
        assert store.inner.get("files/a") == b"1"

    run(lambda: with_publisher(store, journal, body, setup))


# -- LocalCache --------------------------------------------------------------------------

def fake_hash(i: int) -> str:
    return f"{i:032x}"


def test_cache_evicts_least_recently_used_read_cache(cache: LocalCache) -> None:
    a, b, c, d = (fake_hash(i) for i in range(4))
    for h in (a, b, c):
        cache.put_fetched(h, bytes(1000))
    cache.limit_bytes = 3000
    assert cache.used_bytes == 3000
    cache.evict()
    assert cache.evicted_bytes == 0  # not over the limit
    assert cache.locate(a) is not None  # a is now the most recently used
    cache.put_fetched(d, bytes(1000))
    cache.evict()
    assert not cache.has(b) and cache.locate(b) is None
    assert all(cache.has(h) for h in (a, c, d))
    assert not os.path.exists(os.path.join(cache.chunks_dir, b[:2], b))
    assert cache.evicted_bytes == 1000 and cache.used_bytes == 3000
    # `keep` protects a chunk just fetched even if it is the oldest
    cache.put_fetched(fake_hash(9), bytes(1000))
    cache.evict(keep={c})
    assert cache.has(c) and not cache.has(a)
    assert cache.hits >= 1 and cache.misses >= 1


def test_cache_never_evicts_dirty_data(cache: LocalCache) -> None:
    st = cache.new_staging()
    os.pwrite(st.fd, b"d" * 5000, 0)
    st.extent = 5000
    cache.set_dirty(st, 0, 5000)
    h = fake_hash(1)
    cache.add_staged_chunk(h, st, 0, 5000)
    cache.put_fetched(fake_hash(2), bytes(1000))
    cache.limit_bytes = 1000
    cache.evict()
    assert not cache.has(fake_hash(2))  # clean data went first
    assert st.id in cache.staging and os.path.exists(st.path)  # dirty data stays
    assert cache.used_bytes == 5000 > cache.limit_bytes
    # still dirty but sealed and uploaded-pending: release does not make it evictable
    st.sealed = True
    st.pending = 1
    cache.release_staging(st)
    cache.evict()
    assert st.id in cache.staging
    # uploaded: clean, so evictable
    st.pending = 0
    cache.clear_dirty(st, 0)
    cache.release_staging(st)
    assert cache.locate(h) is not None  # still readable until evicted
    cache.evict()
    assert st.id not in cache.staging and not os.path.exists(st.path)
    assert not cache.has(h) and cache.used_bytes == 0


def test_cache_clean_staging_lru(cache: LocalCache) -> None:
    files = []
    for i in range(3):
        st = staged_file(cache, 1000)
        cache.add_staged_chunk(fake_hash(i), st, 0, 1000)
        cache.release_staging(st)
        files.append(st)
    assert cache.locate(fake_hash(0)) == (files[0].fd, 0)  # touch the oldest
    cache.limit_bytes = 2000
    cache.evict()
    assert [st.id in cache.staging for st in files] == [True, False, True]


def staged_file(cache: LocalCache, size: int) -> StagingFile:
    st = cache.new_staging()
    os.pwrite(st.fd, b"s" * size, 0)
    st.extent = size
    st.sealed = True
    return st


def test_cache_dirty_accounting(cache: LocalCache) -> None:
    st = cache.new_staging()
    cs = 64 * KiB
    cache.set_dirty(st, 0, 100)
    assert cache.dirty_bytes == 100
    cache.set_dirty(st, 0, 150)  # the same chunk grew: replaced, not added
    assert cache.dirty_bytes == 150
    cache.set_dirty(st, cs, 10)
    assert cache.dirty_bytes == 160
    cache.clear_dirty(st, 0)
    assert cache.dirty_bytes == 10
    cache.clear_dirty(st, 0)  # idempotent
    assert cache.dirty_bytes == 10
    other = cache.new_staging()
    cache.set_dirty(other, 0, 1000)
    assert cache.dirty_bytes == 1010
    cache.drop_staging(st)  # dropping a file forgets its dirty bytes
    assert cache.dirty_bytes == 1000 and st.dirty == {}
    assert not os.path.exists(st.path) and st.id not in cache.staging


def test_cache_release_and_drop_staging(cache: LocalCache) -> None:
    st = cache.new_staging()
    os.pwrite(st.fd, b"x" * 100, 0)
    st.extent = 100
    h = fake_hash(5)
    cache.add_staged_chunk(h, st, 0, 100)
    st.writers = 1
    cache.release_staging(st)  # still open for writing: nothing happens
    assert st.id in cache.staging and cache.has(h)
    st.writers = 0
    cache.release_staging(st)  # never published (deleted while open): dropped at once
    assert st.id not in cache.staging and not os.path.exists(st.path)
    assert st.fd == -1 and not cache.has(h) and cache.locate(h) is None
    cache.release_staging(st)  # again: harmless

    empty = staged_file(cache, 0)
    cache.release_staging(empty)  # published, but it serves no chunk: dropped
    assert empty.id not in cache.staging and not os.path.exists(empty.path)

    sealed = staged_file(cache, 100)
    cache.add_staged_chunk(h, sealed, 0, 100)
    cache.release_staging(sealed)  # published and clean: kept, evictable
    assert sealed.id in cache.staging and os.path.exists(sealed.path)
    fd, off = cache.locate(h)  # type: ignore[misc]
    assert os.pread(fd, 100, off) == b"s" * 100


def test_cache_scan_at_startup(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "staging").mkdir(parents=True)
    for name in ("1", "2", "7", "junk"):
        (root / "staging" / name).write_bytes(b"z" * 10 * int(name if name.isdigit() else 1))
    h_old, h_new, h_bad = (codec.chunk_hash(c * 300) for c in (b"o", b"n", b"b"))
    for h, data in ((h_old, b"o" * 300), (h_new, b"n" * 300), (h_bad, b"b" * 299 + b"B")):
        (root / "chunks" / h[:2]).mkdir(parents=True, exist_ok=True)
        (root / "chunks" / h[:2] / h).write_bytes(data)
    (root / "chunks" / h_new[:2] / (h_new + ".tmp12345")).write_bytes(b"partial")
    os.utime(root / "chunks" / h_old[:2] / h_old, ns=(1_000_000_000, 1_000_000_000))
    os.utime(root / "chunks" / h_new[:2] / h_new, ns=(2_000_000_000, 2_000_000_000))
    os.utime(root / "chunks" / h_bad[:2] / h_bad, ns=(3_000_000_000, 3_000_000_000))

    def cached_files() -> list[str]:
        return sorted(p.name for p in (root / "chunks").rglob("*") if p.is_file())

    cache = LocalCache(str(root), limit_bytes=1 << 20)
    cache.scan(keep_staging={2, 9})
    try:
        assert sorted(os.listdir(root / "staging")) == ["2"]
        assert list(cache.staging) == [2]
        st = cache.staging[2]
        assert st.sealed and st.extent == 20 and os.pread(st.fd, 20, 0) == b"z" * 20
        assert cached_files() == sorted([h_old, h_new, h_bad])
        assert cache.cached_bytes == 900
        assert cache.new_staging().id == 8  # never reuses the id of a file seen on disk
        # nothing found on disk is served before it is re-hashed in this mount
        for h in (h_old, h_new, h_bad):
            assert cache.unverified(h) and not cache.has(h) and cache.locate(h) is None
        assert cache.verify_cached(h_new)
        assert not cache.unverified(h_new) and cache.has(h_new)
        fd, off = cache.locate(h_new)  # type: ignore[misc]
        assert os.pread(fd, 300, off) == b"n" * 300
        # a file whose bytes do not match its name is removed, never served
        assert not cache.verify_cached(h_bad)
        assert not cache.unverified(h_bad) and not cache.has(h_bad)
        assert cache.locate(h_bad) is None and cached_files() == sorted([h_old, h_new])
        assert cache.cached_bytes == 600
        # the least recently accessed (by atime) read-cache file is evicted first,
        # verified or not
        cache.limit_bytes = cache.used_bytes - 1
        cache.evict()
        assert not cache.unverified(h_old) and cached_files() == [h_new]
        assert cache.has(h_new)
    finally:
        cache.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "none"])
@pytest.mark.parametrize("kind", ["raw", "lz4"])
def test_fetcher_verifies_the_read_cache_of_an_earlier_mount(
        store: RecordingStore, tmp_path: Path, kind: str, damage: str) -> None:
    """A chunk cached by an earlier mount and damaged on the cache disk since (a flipped
    byte, a file cut short by a crash) is re-hashed before it is served, dropped, and
    fetched again: the read gets the right bytes. An intact one costs no GET."""
    data = os.urandom(64 * KiB) if kind == "raw" else b"layer.0.weight " * 4 * KiB
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
    data = os.urandom(4 * KiB)
    h = put_chunk(store, data)
    real_put = cache.put_fetched

    def disk_full(chunk_hash: str, blob: bytes) -> None:
        raise OSError(28, "No space left on device")

    async def body(f: Fetcher) -> None:
        monkeypatch.setattr(cache, "put_fetched", disk_full)
        f.prefetch_nowait([h])
        await until(lambda: f.statistics().inflight == 0)
        await trio.sleep(0.01)
        with pytest.raises(OSError):  # a read reports the error to its caller
            await f.locate(h)
        monkeypatch.setattr(cache, "put_fetched", real_put)
        assert await read_chunk(f, h, len(data)) == data  # and the fetcher still works

    run(lambda: with_fetcher(store, cache, body))
