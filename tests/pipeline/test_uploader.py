"""Uploader: the background chunk pipeline (journal, dedup, retries, early uploads,
status) against a LocalStore behind a FaultyStore, without FUSE."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import trio
from pipeline_helpers import RecordingStore, put_chunk, run, staged, stored_chunk
from support import random_bytes, wait_until_async

from ckptfs.common.config import LIMITS
from ckptfs.common.errors import PermanentStoreError
from ckptfs.common.retry import Backoff
from ckptfs.format import codec
from ckptfs.format.manifests import chunk_key, fossil_key
from ckptfs.pipeline import uploader
from ckptfs.pipeline.cache import LocalCache, StagingFile
from ckptfs.pipeline.journal import Journal, PendingChunk
from ckptfs.pipeline.uploader import Uploader, UploadJob

KiB = 1024


async def settled(up: Uploader, *staging: StagingFile) -> None:
    """Wait until no chunk is pending and the uploader has finished its bookkeeping."""
    # pending_count() drops when the chunk is in the store; the journal row and the
    # staging file's dirty/pending accounting are cleared just after
    await wait_until_async(
        lambda: up.pending_count() == 0 and all(st.pending == 0 for st in staging))

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
    data = random_bytes(20 * KiB)
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
    data = random_bytes(20 * KiB)
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
    data = random_bytes(10 * KiB)

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
    data = random_bytes(30 * KiB)
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
    data = random_bytes(12 * KiB)
    cache = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    store.fail("put", times=1, error=PermanentStoreError("access denied to bucket"))

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, h, _ = await published(up, cache, data)
            await wait_until_async(lambda: up.statistics().last_error is not None)
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
    data = random_bytes(8 * KiB) * 2
    done: list[str] = []

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = cache.new_staging()
            os.pwrite(st.fd, b"\0" * 100 + data, 0)
            up.submit_early_nowait(UploadJob(st, 100, len(data), on_done=done.append))
            await wait_until_async(lambda: bool(done))
            assert done == [codec.chunk_hash(data)]
            assert stored_chunk(store, done[0]) == data
            assert journal.counts() == (0, 0)
            assert up.statistics().uploaded_bytes == len(data)
            # the same bytes again: already known, no second PUT, still told the hash
            up.submit_early_nowait(UploadJob(st, 100, len(data), on_done=done.append))
            await wait_until_async(lambda: len(done) == 2)
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
            st, _, _ = await published(up, cache, random_bytes(64 * KiB))
            await settled(up, st)

            rate["bytes"] = 4 << 20  # 400 MB/s: a save
            await trio.sleep(0.1)
            st, _, _ = await published(up, cache, random_bytes(64 * KiB))
            await trio.sleep(0.5)
            assert up.pending_count() == 1 and store.counts["put"] == 1  # held
            assert up.busy()  # so that a writer at the cache limit waits for it
            with trio.fail_after(10):
                await up.wait_changed()  # as sync, fsync and back-pressure do
            await settled(up, st)
            assert store.counts["put"] == 2

            st, _, _ = await published(up, cache, random_bytes(64 * KiB))
            await trio.sleep(0.5)
            assert up.pending_count() == 1
            rate["bytes"] = 0  # the save ends
            with trio.fail_after(10):  # (settled() alone would wait 30 s)
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
    data = random_bytes(64 * KiB)
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
                await wait_until_async(lambda: store.counts["put"] == 1)
            else:  # the object is there, the early job's result not processed yet
                await wait_until_async(lambda: store.inner.head(chunk_key(codec.chunk_hash(data)))
                            is not None)
            h = await close_file(up, cache, st)
            await trio.sleep(0.1)
            store.release()
            await settled(up, st)
            await wait_until_async(lambda: bool(done))
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
    data = random_bytes(16 * KiB)

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
    data = random_bytes(64 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=4)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = open_chunk(cache, data)
            store.hang("put")
            up.submit_early_nowait(UploadJob(st, 0, len(data)))
            await wait_until_async(lambda: store.counts["put"] == 1)
            await close_file(up, cache, st)
            await trio.sleep(0.2)  # the published job is waiting for the early PUT
            assert up.statistics().uploading_bytes == len(data)
            store.release()
            await settled(up, st)
            await wait_until_async(lambda: not up.busy(), timeout=10)
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
    # the early job's retry waits 20-60 s: "at once" below is far shorter than that
    monkeypatch.setattr(uploader, "BACKGROUND", Backoff(first=40.0, maximum=60.0))
    data = random_bytes(64 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=4,
                      rate_window=3.0)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = open_chunk(cache, data)
            store.fail("put", times=1)  # the outage
            up.submit_early_nowait(UploadJob(st, 0, len(data)))
            await wait_until_async(lambda: up.statistics().retrying_since is not None)
            s = up.statistics()
            assert s.uploading_bytes == len(data) and s.last_error  # waiting to retry
            await close_file(up, cache, st)  # the store is back: this upload succeeds
            await settled(up, st)
            s = up.statistics()
            assert s.retrying_since is None and s.upload_rate > 0
            await wait_until_async(
                lambda: up.statistics().uploading_bytes == 0 and not up.busy(), 10)
            await wait_until_async(lambda: up.statistics().upload_rate == 0, 30)
            s = up.statistics()
            assert s.upload_rate == 0 and s.uploading_bytes == 0, s
            assert s.uploaded_bytes == len(data) and s.dedup_bytes == 0, s
            assert store.counts["put"] == 2  # the failed one and the close's
            n.cancel_scope.cancel()

    run(main)


class FakeTime:
    """The `time` module of uploader.py, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_upload_rate_reads_zero_after_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(uploader, "time", clock)
    rate = uploader._Rate(window=0.2)
    assert rate.value() == 0
    rate.add(1000)
    assert rate.value() == 1000 / 0.2
    clock.now += 0.15
    rate.add(500)
    assert rate.value() == 1500 / 0.2  # both within the window
    clock.now += 0.1
    assert rate.value() == 500 / 0.2  # the first one left it
    clock.now += 0.25
    assert rate.value() == 0


# ---------------------------------------------------------------------------- gc
@pytest.mark.parametrize("window", [0.5, math.inf], ids=["expiring", "never-expiring"])
def test_a_chunk_seen_long_ago_is_headed_again_before_a_manifest_names_it(
        store: RecordingStore, cache: LocalCache, journal: Journal, window: float) -> None:
    """in_store entries count for the confirmation window only: a chunk this mount stored
    longer ago may have been set aside by `ckptfs gc` since, so a new file naming it
    journals it, and the upload's HEAD finds it gone and PUTs it again. With an entry
    that never expires (what ckptfs did before gc existed), the new file names a chunk
    that is in chunks/ no more: it survives only as a fossil, which the next sweep may
    free."""
    data = random_bytes(20 * KiB)

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), confirm_window=window)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, h, _ = await published(up, cache, data)
            await settled(up, st)
            assert up.confirmed(h) and store.counts["put"] == 1
            store.inner.rename(chunk_key(h), fossil_key(h))  # gc's mark
            heads = store.counts["head"]
            st2, _, _ = await published(up, cache, data)  # within the window: trusted
            assert not up.is_pending(h) and store.counts["head"] == heads
            assert not up.is_waiting(h, st2, 0)
            cache.clear_dirty(st2, 0)  # as WriteBuffer.published does for such a chunk
            await trio.sleep(0.6)
            st3, _, _ = await published(up, cache, data)
            await settled(up, st2, st3)
            if window == math.inf:
                assert up.confirmed(h) and store.counts["head"] == heads
                assert store.inner.head(chunk_key(h)) is None  # named, but only a fossil
            else:
                assert store.counts["head"] == heads + 1 and store.counts["put"] == 2
                assert stored_chunk(store, h) == data and up.confirmed(h)
                assert cache.dirty_bytes == 0 and journal.counts() == (0, 0)
            n.cancel_scope.cancel()

    run(main)


def test_a_skipped_upload_does_not_extend_the_confirmation(
        store: RecordingStore, cache: LocalCache, journal: Journal) -> None:
    """A job that finds its chunk confirmed skips it without a HEAD, and keeps the time
    of the sighting it relied on: confirmations never extend themselves."""
    data = random_bytes(8 * KiB)
    done: list[str] = []

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), confirm_window=60)
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st = cache.new_staging()
            os.pwrite(st.fd, data, 0)
            up.submit_early_nowait(UploadJob(st, 0, len(data), on_done=done.append))
            await wait_until_async(lambda: bool(done))
            seen = up.in_store[done[0]]
            await trio.sleep(0.05)
            up.submit_early_nowait(UploadJob(st, 0, len(data), on_done=done.append))
            await wait_until_async(lambda: len(done) == 2)
            assert up.in_store[done[0]] == seen and store.counts["head"] == 1
            n.cancel_scope.cancel()

    run(main)


def test_a_writer_never_deduplicates_against_a_fossil(
        store: RecordingStore, cache: LocalCache, journal: Journal) -> None:
    """A chunk that gc set aside is only under fossils/: the HEAD of chunks/<h> does not
    see it, so a writer uploads the chunk again instead of naming a fossil that the next
    sweep may free."""
    data = random_bytes(20 * KiB)
    h = put_chunk(store, data)
    store.inner.rename(chunk_key(h), fossil_key(h))

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))
        async with trio.open_nursery() as n:
            await n.start(up.run)
            st, _, _ = await published(up, cache, data)
            await settled(up, st)
            n.cancel_scope.cancel()

    run(main)
    assert store.counts["put"] == 1 and stored_chunk(store, h) == data
    assert store.inner.head(fossil_key(h)) is not None  # untouched: the next sweep's


# ---------------------------------------------------------------------------- queue bound
def test_the_upload_queue_holds_at_most_10000_jobs(store: RecordingStore, cache: LocalCache,
                                                   journal: Journal) -> None:
    """Early jobs beyond the bound are dropped, not queued (the queue's memory is
    bounded: docs/CONCURRENCY.md); their chunks are journaled at close instead."""

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1))  # run() not started
        st = cache.new_staging()
        for i in range(10_005):
            up.submit_early_nowait(UploadJob(st, i * KiB, KiB))
        assert up.statistics().queued_jobs == 10_000 and up.dropped_early == 5
        assert LIMITS.upload_queue == 10_000  # the number the docs give

    run(main)


def test_published_chunks_that_find_the_queue_full_are_all_uploaded(
        store: RecordingStore, cache: LocalCache, journal: Journal) -> None:
    """A full queue (of early jobs here) never loses a published chunk: it waits for
    room, in order, and is uploaded; an early job submitted meanwhile is dropped, as it
    would be behind a full queue."""
    chunks = [random_bytes(4 * KiB, seed) for seed in range(5)]

    async def main() -> None:
        up = Uploader(store, cache, journal, trio.CapacityLimiter(1), workers=1,
                      queue_limit=2)
        early = staged(cache, random_bytes(2 * KiB, 99))
        early.sealed = False  # a file still being written
        for offset in (0, KiB):
            up.submit_early_nowait(UploadJob(early, offset, KiB))
        published_ = [await published(up, cache, data) for data in chunks]
        assert up.statistics().queued_jobs == 2 + 5 and up.busy()
        up.submit_early_nowait(UploadJob(early, 0, KiB))
        assert up.dropped_early == 1
        async with trio.open_nursery() as n:
            await n.start(up.run)
            await settled(up, *(st for st, _, _ in published_))
            assert up.statistics().queued_jobs == 0 and not up.busy()
            n.cancel_scope.cancel()
        for data, (_, h, _) in zip(chunks, published_, strict=True):
            assert stored_chunk(store, h) == data
        assert journal.pending_chunks() == []

    run(main)
