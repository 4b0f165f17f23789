"""Background upload of chunks: read from staging, hash, compress, skip known, PUT, retry.

Work arrives two ways:

- early: a chunk of a file still being written is complete (sequential writes crossed
  its end), so it is uploaded while the save goes on; the result is only used if the
  chunk was not written again meanwhile (the filesystem checks a version number);
- published: at close, every chunk of the file not yet in the store is journaled and
  queued here by hash.

Each job runs in one worker thread behind the ``upload`` CapacityLimiter. Transient store
errors are retried forever with exponential backoff and jitter; permanent ones are
reported (statistics().last_error) and retried slowly, the data staying in the cache.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

from . import codec, manifests
from .cache import LocalCache, StagingFile, pread_scratch
from .crashpoints import crash_point
from .errors import JournalError, StoreError, TransientStoreError
from .journal import Journal, LostFile, PendingChunk
from .store.base import Store

log = logging.getLogger(__name__)

UPLOAD_NICE = 10  # uploads yield the CPU to the training process and the FUSE loop
STREAM_WINDOW = 0.25  # seconds: writes this recent, and this many bytes of them, ...
STREAM_BYTES = 16 << 20  # ... mean a save is streaming in (see WriterActivity)
BACKOFF_START = 0.2
BACKOFF_MAX = 30.0
PERMANENT_RETRY = 30.0


@contextlib.contextmanager
def low_cpu_priority() -> Iterator[None]:
    """Run the calling thread at nice UPLOAD_NICE, restoring its priority afterwards."""
    tid = threading.get_native_id()
    try:
        old = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(old, UPLOAD_NICE))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # non-root cannot lower it again: harmless
            os.setpriority(os.PRIO_PROCESS, tid, old)


@dataclass(eq=False)
class _Put:
    """A PUT in progress in some worker thread, for others holding the same chunk."""

    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


@dataclass(eq=False)
class UploadJob:
    """Upload bytes [offset, offset+length) of a staging file (hash computed if None)."""

    staging: StagingFile
    offset: int
    length: int
    hash: str | None = None
    on_done: Callable[[str], None] | None = None  # early jobs: told the hash when stored


@dataclass(frozen=True)
class UploaderStatistics:
    queued_jobs: int
    uploading_bytes: int
    uploaded_bytes: int  # raw bytes of chunks PUT by this mount
    stored_bytes: int  # encoded bytes PUT (after compression)
    dedup_bytes: int  # raw bytes not uploaded because the store had them
    upload_rate: float  # raw bytes per second, over the last few seconds
    last_error: str | None
    retrying_since: float | None


@dataclass
class _Rate:
    window: float = 5.0
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, nbytes: int) -> None:
        self.samples.append((time.monotonic(), nbytes))

    def value(self) -> float:
        now = time.monotonic()
        while self.samples and self.samples[0][0] < now - self.window:
            self.samples.popleft()
        return sum(n for _, n in self.samples) / self.window


class WriterActivity:
    """Whether a save is streaming into the mount: >= STREAM_BYTES written within the
    last two STREAM_WINDOWs and a write within the last one. A trickle (a log file
    appended every second) is not a stream."""

    def __init__(self) -> None:
        self.last_write = -math.inf
        self._window_start = -math.inf
        self._bytes = self._previous_bytes = 0

    def note(self, nbytes: int) -> None:
        now = time.monotonic()
        if now - self._window_start >= STREAM_WINDOW:
            recent = now - self._window_start < 2 * STREAM_WINDOW
            self._previous_bytes = self._bytes if recent else 0
            self._window_start, self._bytes = now, 0
        self._bytes += nbytes
        self.last_write = now

    def quiet_in(self) -> float:
        """0 if no save is streaming, else how long until it could count as stopped."""
        left = self.last_write + STREAM_WINDOW - time.monotonic()
        if left <= 0 or self._bytes + self._previous_bytes < STREAM_BYTES:
            return 0.0
        return left


class Uploader:
    """Owns which chunks are in the store, pending, or being uploaded.

    Uploads yield to a streaming save: while one streams in, at most `overlap_workers`
    uploads run (default: two, or the cores left after the writer and the FUSE loop if
    more), because on a small node all of them copying, hashing and sending chunks beside
    the save slows it down more than it brings durability forward (docs/PERFORMANCE.md).
    Queued chunks start as soon as the stream pauses, or at once when anybody waits for
    uploads (wait_changed(): a writer at the cache limit, fsync, sync, umount) or dirty
    data reaches half the cache limit.
    """

    def __init__(self, store: Store, cache: LocalCache, journal: Journal,
                 journal_limiter: trio.CapacityLimiter, workers: int = 8,
                 overlap_workers: int | None = None) -> None:
        self.store = store
        self.cache = cache
        self.journal = journal
        self.journal_limiter = journal_limiter
        self.limiter = trio.CapacityLimiter(workers)
        self.limiter.name = "upload"  # type: ignore[attr-defined]
        self.workers = workers
        if overlap_workers is None:
            overlap_workers = max(2, (os.cpu_count() or 1) - 2)
        self.overlap_workers = overlap_workers
        self.writes = WriterActivity()
        self._running = 0  # jobs past the writer gate
        self._held = 0  # jobs waiting at it
        self._waiters = 0  # tasks in wait_changed()
        self.in_store: set[str] = set()
        self._puts: dict[str, _Put] = {}
        self._puts_lock = threading.Lock()
        self._journaled: set[str] = set()
        self._waiting: dict[str, list[tuple[StagingFile, int]]] = {}  # hash -> its copies
        self._queued: set[str] = set()
        # unbounded: what is queued is bounded by the dirty data the cache limit allows
        self._send, self._receive = trio.open_memory_channel[UploadJob](math.inf)
        self._lock = trio.Lock()  # orders journal inserts against upload completions
        self._changed = trio.Condition()
        self._uploading_bytes = 0
        self._uploaded_bytes = 0
        self._stored_bytes = 0
        self._dedup_bytes = 0
        self._rate = _Rate()
        self.last_error: str | None = None
        self.retrying_since: float | None = None

    # -- the public surface ----------------------------------------------------------
    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the worker tasks until cancelled (then in-flight uploads are abandoned)."""
        async with trio.open_nursery() as nursery:
            for _ in range(self.workers):
                nursery.start_soon(self._worker)
            task_status.started()

    def submit_early_nowait(self, job: UploadJob) -> None:
        """Queue a complete chunk of an open file; dropped silently if the queue is full."""
        try:
            self._send.send_nowait(job)
        except trio.WouldBlock:
            pass

    async def persist(self, chunks: list[PendingChunk], ops: list[tuple[str, str, str | None,
                      bytes | None]], path: str | None = None) -> list[int]:
        """Journal the chunks not yet in the store (needed by the file at `path`) plus
        metadata ops; queue the uploads.

        Returns the ops' sequence numbers. When this returns, the chunks survive a crash.
        """
        async with self._lock:
            todo = [c for c in chunks if c.hash not in self.in_store]
            seqs = await trio.to_thread.run_sync(self.journal.add_chunks, todo, ops, path,
                                                 limiter=self.journal_limiter)
            for c in todo:
                self._journaled.add(c.hash)
                self._add_pending(c)
            return seqs

    async def resume(self, chunks: list[PendingChunk]) -> None:
        """After a restart: queue the journaled chunks again.

        Each chunk's staged bytes are re-hashed first: bytes lost to a reboot before the
        kernel wrote them back must never be served or uploaded under the chunk's name.
        """
        intact = await trio.to_thread.run_sync(self._check_staged, chunks,
                                               limiter=self.limiter)
        for c, ok in zip(chunks, intact):
            st = self.cache.staging.get(c.staging_id)
            if st is None or not ok:
                state = "gone" if st is None else "damaged"
                await self._mark_lost(c.hash, f"its staged bytes were {state} before the "
                                      "upload (was the machine reset before they were "
                                      "written back?)")
                continue
            self._journaled.add(c.hash)
            self.cache.add_staged_chunk(c.hash, st, c.offset, c.length)
            self.cache.set_dirty(st, c.offset, c.length)
            self._add_pending(c, st)

    def _check_staged(self, chunks: list[PendingChunk]) -> list[bool]:
        out = []
        for c in chunks:
            st = self.cache.staging.get(c.staging_id)
            try:
                ok = st is not None and codec.chunk_hash(
                    pread_scratch(st.fd, c.length, c.offset)) == c.hash
            except OSError:
                ok = False
            out.append(ok)
        return out

    def is_pending(self, chunk_hash: str) -> bool:
        """Whether the chunk is journaled and not yet in the store."""
        return chunk_hash in self._journaled

    def pending_hashes(self) -> set[str]:
        """The chunks journaled and not yet in the store (a copy)."""
        return set(self._journaled)

    def busy(self) -> bool:
        """Whether uploads are queued or running (so dirty data will shrink)."""
        return (self._uploading_bytes > 0 or self._held > 0
                or self._receive.statistics().current_buffer_used > 0)

    def pending_count(self) -> int:
        """Chunks journaled and not yet in the store."""
        return len(self._journaled)

    async def wait_changed(self) -> None:
        """Return after the next upload finishes or fails (for back-pressure and sync).
        Uploads held back for a streaming save start at once while anybody waits here."""
        self._waiters += 1
        try:
            async with self._changed:
                await self._changed.wait()
        finally:
            self._waiters -= 1

    def statistics(self) -> UploaderStatistics:
        return UploaderStatistics(
            queued_jobs=self._receive.statistics().current_buffer_used,
            uploading_bytes=self._uploading_bytes, uploaded_bytes=self._uploaded_bytes,
            stored_bytes=self._stored_bytes, dedup_bytes=self._dedup_bytes,
            upload_rate=self._rate.value(), last_error=self.last_error,
            retrying_since=self.retrying_since)

    # -- internals -------------------------------------------------------------------
    def _add_pending(self, c: PendingChunk, st: StagingFile | None = None) -> None:
        st = st or self.cache.staging[c.staging_id]
        st.pending += 1
        self._waiting.setdefault(c.hash, []).append((st, c.offset))
        if c.hash not in self._queued:
            self._queued.add(c.hash)
            self._send.send_nowait(UploadJob(st, c.offset, c.length, c.hash))

    async def _worker(self) -> None:
        async for job in self._receive:
            await self._yield_to_writers()
            self._running += 1
            try:
                await self._upload_with_retries(job)
            finally:
                self._running -= 1

    async def _yield_to_writers(self) -> None:
        """Hold this worker while a save streams in (see the class docstring)."""
        self._held += 1
        try:
            while (self._running >= self.overlap_workers and self._waiters == 0
                   and self.cache.dirty_bytes < self.cache.limit_bytes // 2):
                wait = self.writes.quiet_in()
                if wait <= 0:
                    return
                await trio.sleep(min(wait, 0.05))
        finally:
            self._held -= 1

    async def _upload_with_retries(self, job: UploadJob) -> None:
        delay = BACKOFF_START
        while True:
            if job.hash is not None and job.hash in self.in_store:
                await self._finished(job, job.hash, uploaded=False)
                return
            if job.staging.fd < 0:
                return  # staging file dropped (file deleted before its upload)
            self._uploading_bytes += job.length
            try:
                chunk_hash, stored_len = await trio.to_thread.run_sync(
                    self._upload_sync, job, limiter=self.limiter)
            except StoreError as e:
                self.last_error = f"{type(e).__name__}: {e}"
                self.retrying_since = self.retrying_since or time.time()
                log.warning("upload failed (retrying): %s", e)
                wait = PERMANENT_RETRY if e.permanent else delay * random.uniform(0.5, 1.5)
                delay = min(delay * 2, BACKOFF_MAX)
                await self._notify()
                await trio.sleep(wait)
                continue
            except OSError as e:
                await self._abandon(job, f"its staged bytes are unreadable ({e})")
                return
            finally:
                self._uploading_bytes -= job.length
            self.retrying_since = None
            self.last_error = None
            if chunk_hash is None and job.hash is None:
                return  # an early job read a chunk being rewritten: close hashes it again
            if chunk_hash is None:  # published chunk whose staged bytes changed: lost
                await self._abandon(job, "its staged bytes no longer match it (lost before "
                                    "a local fsync?)")
                return
            self._stored_bytes += stored_len
            await self._finished(job, chunk_hash, uploaded=stored_len > 0)
            return

    def _upload_sync(self, job: UploadJob) -> tuple[str | None, int]:
        """In a worker thread: read, hash, skip if present, encode, PUT.

        Returns (hash or None if the bytes are not the expected ones, bytes PUT or 0).
        Runs at a lower CPU priority: on a busy node the save goes first.
        """
        with low_cpu_priority():
            return self._upload_sync_now(job)

    def _upload_sync_now(self, job: UploadJob) -> tuple[str | None, int]:
        data = pread_scratch(job.staging.fd, job.length, job.offset)
        chunk_hash = codec.chunk_hash(data)
        if len(data) != job.length or (job.hash is not None and chunk_hash != job.hash):
            return None, 0
        if chunk_hash in self.in_store:
            return chunk_hash, 0
        with self._puts_lock:  # the same chunk from an early and a published job: one PUT
            other = self._puts.get(chunk_hash)
            if other is None:
                mine = self._puts[chunk_hash] = _Put()
        if other is not None:
            other.done.wait()
            if not other.ok:
                raise TransientStoreError(f"concurrent upload of chunk {chunk_hash} failed")
            return chunk_hash, 0
        try:
            key = manifests.chunk_key(chunk_hash)
            parts, _ = codec.encode_chunk_parts(data)
            size = sum(len(p) for p in parts)
            # an object of another size is not this chunk: a PUT torn by a crash can leave
            # an empty one on some servers (SeaweedFS), so it is written again
            if self.store.head(key) == size:
                stored = 0
            else:
                crash_point("chunk_before_put")
                self.store.put_parts(key, parts)
                crash_point("chunk_after_put")
                stored = size
            mine.ok = True
            return chunk_hash, stored
        finally:
            with self._puts_lock:
                del self._puts[chunk_hash]
            mine.done.set()

    async def _finished(self, job: UploadJob, chunk_hash: str, uploaded: bool) -> None:
        if uploaded:
            self._uploaded_bytes += job.length
            self._rate.add(job.length)
        elif chunk_hash not in self.in_store:
            self._dedup_bytes += job.length
        async with self._lock:
            self.in_store.add(chunk_hash)
            self._queued.discard(chunk_hash)
            if chunk_hash in self._journaled:
                self._journaled.discard(chunk_hash)
                await self._forget_journaled(chunk_hash)
        for st, offset in self._waiting.pop(chunk_hash, []):
            st.pending -= 1
            self.cache.clear_dirty(st, offset)
            self.cache.release_staging(st)
        if job.on_done is not None:
            job.on_done(chunk_hash)
        self.cache.evict()
        await self._notify()

    async def _abandon(self, job: UploadJob, why: str) -> None:
        """A published chunk whose local bytes are unreadable or wrong: it cannot be
        uploaded from here, so stop tracking it and record the files that lost it (status,
        the log and umount report them; `ckptfs verify` on any node finds them
        incomplete)."""
        if job.hash is None:
            return  # an early job: the chunk is hashed and queued again at close
        async with self._lock:
            self._queued.discard(job.hash)
            if job.hash in self._journaled:
                self._journaled.discard(job.hash)
                await self._mark_lost(job.hash, why)
        for st, offset in self._waiting.pop(job.hash, []):
            st.pending -= 1
            self.cache.clear_dirty(st, offset)
            self.cache.release_staging(st)
        self.cache.forget_staged(job.hash)  # never serve bytes that do not match the name
        await self._notify()

    def lost_files(self) -> list[LostFile]:
        """Files that lost a chunk before it reached the store (journal.py)."""
        return self.journal.lost_files()

    async def _mark_lost(self, chunk_hash: str, why: str) -> None:
        """Record (in the journal) and log the files that lost this chunk."""
        try:
            paths = await trio.to_thread.run_sync(self.journal.mark_lost, chunk_hash, why,
                                                  limiter=self.journal_limiter)
        except JournalError as e:
            log.error("chunk %s is lost (%s), and the journal cannot record it: %s",
                      chunk_hash, why, e)
            return
        for path in paths or ["(a file deleted since)"]:
            log.error("DATA LOST: %s: chunk %s never reached the store: %s", path,
                      chunk_hash, why)

    async def _forget_journaled(self, chunk_hash: str) -> None:
        """Drop a chunk's journal row; if the disk is full the row stays, harmlessly (the
        next mount finds the chunk in the store with a HEAD and drops it then)."""
        try:
            await trio.to_thread.run_sync(self.journal.remove_chunk, chunk_hash,
                                          limiter=self.journal_limiter)
        except JournalError as e:
            log.warning("could not update the journal (cache disk full?): %s", e)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
