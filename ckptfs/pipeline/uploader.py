"""Background upload of chunks: read from staging, hash, compress, skip known, PUT, retry.

Work arrives two ways:

- early: a chunk of a file still being written is complete (sequential writes crossed
  its end), so it is uploaded while the save goes on; the result is only used if the
  chunk was not written again meanwhile (the filesystem checks a version number);
- published: at close, every chunk of the file not yet in the store is journaled and
  queued here by hash.

Each job runs in one worker thread behind the ``upload`` CapacityLimiter. Transient store
errors are retried forever with exponential backoff and jitter; permanent ones are
reported (statistics().last_error) and retried slowly, the data staying in the cache. A
retry stops early once it is moot: the chunk is stored by another job, or (early job) the
file was closed, so that its published job owns the chunk.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import JournalError, StoreError, TransientStoreError
from ckptfs.common.retry import BACKGROUND, PERMANENT_DELAY, retried
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import CONFIRM_WINDOW
from ckptfs.pipeline.cache import LocalCache, StagingFile, pread_scratch
from ckptfs.pipeline.journal import Journal, LostFile, OpRecord, PendingChunk
from ckptfs.store.base import Store

log = logging.getLogger(__name__)

UPLOAD_NICE = 10  # uploads yield the CPU to the training process and the FUSE loop
STREAM_WINDOW = 0.25  # seconds: writes this recent, and this many bytes of them, ...
STREAM_BYTES = 16 << 20  # ... mean a save is streaming in (see WriterActivity)
MOOT_CHECK = 1.0  # seconds: how often a job waiting to retry looks whether it still must
RATE_WINDOW = 5.0  # seconds: upload_rate is the bytes PUT in this window, divided by it

Instance = tuple[int, int]  # one chunk of one file version: (staging file id, offset)


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
    """A chunk being HEADed and PUT in some worker thread, for others holding the same
    chunk (they wait for it instead of sending it again)."""

    length: int  # raw bytes
    origin: Instance  # the chunk instance whose job sends it
    started: float = field(default_factory=time.monotonic)  # before its HEAD
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False  # in the store now
    stored: bool = False  # PUT by this job (not found by the HEAD)


@dataclass(frozen=True)
class _Outcome:
    """What one attempt of an upload job found; returned by its worker thread."""

    chunk_hash: str | None  # None: the bytes read are not the ones expected
    stored: int = 0  # encoded bytes this attempt PUT
    origin: Instance | None = None  # the instance whose PUT by this mount stored the chunk
    error: StoreError | None = None  # the attempt failed: retry
    seen: float = 0.0  # when (monotonic) this mount last saw the chunk in the store


@dataclass(eq=False)
class UploadJob:
    """Upload bytes [offset, offset+length) of a staging file (hash computed if None)."""

    staging: StagingFile
    offset: int
    length: int
    hash: str | None = None
    on_done: Callable[[str], None] | None = None  # early jobs: told the hash when stored
    # early jobs: the hash the writer streamed, if the chunk is unchanged since (asked
    # in the trio thread after the bytes are read, so they need no second hash)
    streamed: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class UploaderStatistics:
    queued_jobs: int
    uploading_bytes: int  # raw bytes of the distinct chunks being sent or waiting to retry
    uploaded_bytes: int  # raw bytes of chunks PUT by this mount
    stored_bytes: int  # encoded bytes PUT (after compression)
    dedup_bytes: int  # raw bytes of published chunks that needed no PUT (docs/OPERATIONS.md)
    upload_rate: float  # raw bytes per second PUT, over the last RATE_WINDOW seconds
    last_error: str | None
    retrying_since: float | None


@dataclass
class _Rate:
    """Bytes per second over a sliding window: 0 once `window` seconds pass without add()."""

    window: float = RATE_WINDOW
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
    uploads run (default: the cores left after the writer and the FUSE loop, but at least
    two, or one when the store's codec is zstd4, whose encode takes a core), because on a
    small node all of them copying, hashing and sending chunks beside the save slows it
    down more than it brings durability forward (docs/PERFORMANCE.md).
    Queued chunks start as soon as the stream pauses, or at once when anybody waits for
    uploads (wait_changed(): a writer at the cache limit, fsync, sync, umount) or dirty
    data reaches half the cache limit.
    """

    def __init__(self, store: Store, cache: LocalCache, journal: Journal,
                 journal_limiter: trio.CapacityLimiter, workers: int = 8,
                 overlap_workers: int | None = None, rate_window: float = RATE_WINDOW,
                 confirm_window: float = CONFIRM_WINDOW, codec_name: str = "lz4",
                 queue_limit: int = LIMITS.upload_queue) -> None:
        self.store = store
        self.codec_name = codec_name  # how new chunks are compressed: the store's codec
        self.cache = cache
        self.journal = journal
        self.journal_limiter = journal_limiter
        self.limiter = trio.CapacityLimiter(workers)
        self.limiter.name = "upload"  # type: ignore[attr-defined]
        self.workers = workers
        if overlap_workers is None:  # zstd4 costs a core per upload: 1 on a small node
            overlap_workers = max(1 if codec_name == "zstd4" else 2, (os.cpu_count() or 1) - 2)
        self.overlap_workers = overlap_workers
        self.writes = WriterActivity()
        self._running = 0  # jobs past the writer gate
        self._held = 0  # jobs waiting at it
        self._waiters = 0  # tasks in wait_changed()
        # chunk -> when (monotonic) this mount last saw it in the store: the start of the
        # PUT or HEAD that did. It counts as in the store for `confirm_window` seconds
        # (confirmed()); then it is HEADed again before a manifest may name it, since
        # `ckptfs gc` may have set it aside meanwhile (docs/FORMAT.md, Garbage collection)
        self.in_store: dict[str, float] = {}
        self.confirm_window = confirm_window
        # chunk -> its HEAD/PUT in a worker thread; chunk -> the instance whose PUT by this
        # mount stored it, and when (set before `_puts` lets go of it, so no thread HEADs
        # it again before _finished has recorded it in `in_store`)
        self._puts: dict[str, _Put] = {}
        self._put_by: dict[str, Instance] = {}
        self._put_at: dict[str, float] = {}
        self._puts_lock = threading.Lock()
        self._retrying: dict[UploadJob, str] = {}  # jobs waiting to retry -> their chunk
        self._journaled: set[str] = set()
        self._waiting: dict[str, list[tuple[StagingFile, int]]] = {}  # hash -> its copies
        self._queued: set[str] = set()
        self._send, self._receive = trio.open_memory_channel[UploadJob](queue_limit)
        # published chunks that found the queue full, oldest first: never dropped (each
        # is journaled); moved into the queue as the workers take jobs (_refill)
        self._overflow: deque[UploadJob] = deque()
        self.dropped_early = 0  # early jobs dropped because the queue was full
        self._lock = trio.Lock()  # orders journal inserts against upload completions
        self._changed = trio.Condition()
        self._uploaded_bytes = 0
        self._stored_bytes = 0
        self._dedup_bytes = 0
        self._rate = _Rate(rate_window)
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
        """Queue a complete chunk of an open file; dropped if the queue is full (or holds
        published chunks waiting for room): the chunk then stays local and dirty, and the
        close journals it and uploads it as a published chunk."""
        if self._overflow:
            self.dropped_early += 1
            return
        try:
            self._send.send_nowait(job)
        except trio.WouldBlock:
            self.dropped_early += 1

    async def persist(self, chunks: list[PendingChunk], ops: list[OpRecord],
                      path: str | None = None) -> list[int]:
        """Journal the chunks not yet in the store (needed by the file at `path`) plus
        metadata ops; queue the uploads.

        Returns the ops' sequence numbers. When this returns, the chunks survive a crash.
        A chunk already in the store counts in dedup_bytes unless this very instance put it
        there (an early upload of the file being closed).
        """
        async with self._lock:
            todo = [c for c in chunks if not self.confirmed(c.hash)]
            known = [c for c in chunks if self.confirmed(c.hash)]
            seqs = await trio.to_thread.run_sync(self.journal.add_chunks, todo, ops, path,
                                                 limiter=self.journal_limiter)
            for c in known:
                if self._origin(c.hash) != (c.staging_id, c.offset):
                    self._dedup_bytes += c.length
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
        for c, ok in zip(chunks, intact, strict=True):
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

    def confirmed(self, chunk_hash: str) -> bool:
        """Whether this mount saw the chunk in the store less than `confirm_window`
        seconds ago (monotonic clock): only then may a manifest name it without a new HEAD
        (or upload). persist() asks it for the chunks a close journals, the seal for the
        chunks of the file freed from the cache (the publisher HEADs the others)."""
        seen = self.in_store.get(chunk_hash)
        return seen is not None and time.monotonic() - seen < self.confirm_window

    def is_waiting(self, chunk_hash: str, st: StagingFile, offset: int) -> bool:
        """Whether the copy of the chunk at `offset` of `st` is journaled and its upload
        has not ended yet (its dirty bytes are then cleared when it ends)."""
        return any(s is st and o == offset for s, o in self._waiting.get(chunk_hash, ()))

    def is_pending(self, chunk_hash: str) -> bool:
        """Whether the chunk is journaled and not yet in the store."""
        return chunk_hash in self._journaled

    def pending_hashes(self) -> set[str]:
        """The chunks journaled and not yet in the store (a copy)."""
        return set(self._journaled)

    def busy(self) -> bool:
        """Whether uploads are queued or running (so dirty data will shrink)."""
        return (self._running > 0 or self._held > 0 or bool(self._overflow)
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
            queued_jobs=self._receive.statistics().current_buffer_used + len(self._overflow),
            uploading_bytes=self._uploading(), uploaded_bytes=self._uploaded_bytes,
            stored_bytes=self._stored_bytes, dedup_bytes=self._dedup_bytes,
            upload_rate=self._rate.value(), last_error=self.last_error,
            retrying_since=self.retrying_since)

    # -- internals -------------------------------------------------------------------
    def _uploading(self) -> int:
        """Raw bytes of the distinct chunks being HEADed or PUT in a worker thread, or
        waiting to retry, and not in the store yet. A job waiting for another's PUT of
        the same chunk, or whose retry became moot, adds nothing."""
        with self._puts_lock:
            sizes = {h: put.length for h, put in self._puts.items()}
        for job, h in self._retrying.items():
            if not self._moot(job, h):
                sizes.setdefault(h, job.length)
        return sum(n for h, n in sizes.items() if not self.confirmed(h))

    def _origin(self, chunk_hash: str) -> Instance | None:
        """The chunk instance whose PUT by this mount stored the chunk, if any."""
        with self._puts_lock:
            return self._put_by.get(chunk_hash)

    def _moot(self, job: UploadJob, chunk_hash: str) -> bool:
        """Whether a failed job need not try again: its chunk is in the store now, its
        staging file is gone, or it is an early job of a file since closed (the close
        journaled the chunk and queued its own job)."""
        return (self.confirmed(chunk_hash) or job.staging.fd < 0
                or (job.hash is None and job.staging.sealed))

    def _add_pending(self, c: PendingChunk, st: StagingFile | None = None) -> None:
        st = st or self.cache.staging[c.staging_id]
        st.pending += 1
        self._waiting.setdefault(c.hash, []).append((st, c.offset))
        if c.hash not in self._queued:
            self._queued.add(c.hash)
            self._overflow.append(UploadJob(st, c.offset, c.length, c.hash))
            self._refill()

    def _refill(self) -> None:
        """Move published jobs waiting for room into the queue, oldest first."""
        while self._overflow:
            try:
                self._send.send_nowait(self._overflow[0])
            except trio.WouldBlock:
                return
            self._overflow.popleft()

    async def _worker(self) -> None:
        async for job in self._receive:
            self._refill()
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
        delays = BACKGROUND.delays()
        expect = job.hash  # an early job's retries send only the bytes it first read
        while True:
            if expect is not None and self.confirmed(expect):
                await self._finished(job, expect, 0, self._origin(expect),
                                     self.in_store[expect])
                return
            if job.staging.fd < 0:
                return  # staging file dropped (file deleted before its upload)
            try:
                out = await trio.to_thread.run_sync(self._upload_sync, job, expect,
                                                    limiter=self.limiter)
            except OSError as e:
                await self._abandon(job, f"its staged bytes are unreadable ({e})")
                return
            if out.error is not None and out.chunk_hash is not None:
                error = out.error
                self.last_error = f"{type(error).__name__}: {error}"
                self.retrying_since = self.retrying_since or time.time()
                log.warning("upload failed (retrying): %s", error)
                await self._notify()
                wait = PERMANENT_DELAY if error.permanent else next(delays)
                expect = out.chunk_hash
                retried("upload")
                await self._backoff(job, expect, wait)
                if job.hash is None and job.staging.sealed:
                    return  # the file was closed: its published job uploads the chunk
                continue
            self.retrying_since = None
            self.last_error = None
            if out.chunk_hash is None and job.hash is None:
                return  # an early job read a chunk being rewritten: close hashes it again
            if out.chunk_hash is None:  # published chunk whose staged bytes changed: lost
                await self._abandon(job, "its staged bytes no longer match it (lost before "
                                    "a local fsync?)")
                return
            await self._finished(job, out.chunk_hash, out.stored, out.origin, out.seen)
            return

    async def _backoff(self, job: UploadJob, chunk_hash: str, seconds: float) -> None:
        """Wait `seconds` before a retry, counted in uploading_bytes; return early when
        the retry becomes moot (each upload wakes the waiters; a closed or deleted file
        does not, so they also look every MOOT_CHECK seconds)."""
        self._retrying[job] = chunk_hash
        try:
            with trio.move_on_after(seconds):
                while not self._moot(job, chunk_hash):
                    with trio.move_on_after(MOOT_CHECK):
                        async with self._changed:
                            await self._changed.wait()
        finally:
            del self._retrying[job]

    def _upload_sync(self, job: UploadJob, expect: str | None) -> _Outcome:
        """In a worker thread: read, hash, skip if present, encode, PUT.

        The bytes must hash to `expect` if it is given. Store errors are returned, not
        raised, so that the retry knows which chunk it waits for. Runs at a lower CPU
        priority: on a busy node the save goes first.
        """
        with low_cpu_priority():
            return self._upload_sync_now(job, expect)

    @staticmethod
    def _streamed_hash(job: UploadJob, data: memoryview) -> str | None:
        """The hash the writer computed as the chunk streamed in, if the bytes just read
        are still the ones it hashed. Asked in the trio thread: a write's pwrite and its
        version bump run there with no await between them, so a write that overlapped
        the read has already changed the version, and the bytes are hashed again."""
        if job.streamed is None or len(data) != job.length:
            return None
        return trio.from_thread.run_sync(job.streamed)

    def _upload_sync_now(self, job: UploadJob, expect: str | None) -> _Outcome:
        data = pread_scratch(job.staging.fd, job.length, job.offset)
        chunk_hash = self._streamed_hash(job, data) or codec.chunk_hash(data)
        if len(data) != job.length or (expect is not None and chunk_hash != expect):
            return _Outcome(None)
        with self._puts_lock:  # the same chunk from an early and a published job: one PUT
            seen = max(self.in_store.get(chunk_hash, -math.inf),
                       self._put_at.get(chunk_hash, -math.inf))
            if time.monotonic() - seen < self.confirm_window:  # confirmed(), or our PUT
                return _Outcome(chunk_hash, origin=self._put_by.get(chunk_hash), seen=seen)
            other = self._puts.get(chunk_hash)
            if other is None:
                mine = self._puts[chunk_hash] = _Put(job.length, (job.staging.id, job.offset))
        if other is not None:
            other.done.wait()
            if not other.ok:
                return _Outcome(chunk_hash, error=TransientStoreError(
                    f"concurrent upload of chunk {chunk_hash} failed"))
            return _Outcome(chunk_hash, origin=other.origin if other.stored else None,
                            seen=other.started)
        try:
            key = manifests.chunk_key(chunk_hash)
            # the parts are joined at most once, by the store (a directory store writes
            # them one after the other); a zstd4 chunk's planes are in reused memory
            with codec.encoded(data, self.codec_name) as (parts, _):
                size = sum(len(p) for p in parts)
                # an object of another size is not this chunk: a PUT torn by a crash can
                # leave an empty one on some servers (SeaweedFS), so it is written again
                if self.store.head(key) != size:
                    crash_point("chunk_before_put")
                    self.store.put_parts(key, parts)
                    crash_point("chunk_after_put")
                    mine.stored = True
            mine.ok = True
        except StoreError as e:
            return _Outcome(chunk_hash, error=e)
        finally:
            with self._puts_lock:
                if mine.stored:
                    self._put_by[chunk_hash] = mine.origin
                if mine.ok:
                    self._put_at[chunk_hash] = mine.started
                del self._puts[chunk_hash]
            mine.done.set()
        if not mine.stored:  # the HEAD found it: stored before, not by us
            return _Outcome(chunk_hash, seen=mine.started)
        return _Outcome(chunk_hash, size, mine.origin, seen=mine.started)

    async def _finished(self, job: UploadJob, chunk_hash: str, stored: int,
                        origin: Instance | None, seen: float) -> None:
        """The chunk is in the store: `stored` encoded bytes PUT by this job (0: none),
        by the PUT of chunk instance `origin` of this mount (None: it was there before),
        as this mount saw at monotonic time `seen` (a job that skipped the chunk passes
        the time of the sighting it relied on, so a skip never extends a confirmation).
        Every journaled copy of it is released; those of other instances than `origin`
        are dedup_bytes."""
        if stored:
            self._uploaded_bytes += job.length
            self._stored_bytes += stored
            self._rate.add(job.length)
        async with self._lock:
            self.in_store[chunk_hash] = max(seen, self.in_store.get(chunk_hash, seen))
            self._queued.discard(chunk_hash)
            if chunk_hash in self._journaled:
                self._journaled.discard(chunk_hash)
                await self._forget_journaled(chunk_hash)
        if any(f.hash == chunk_hash for f in self.journal.lost_files()):  # rare: a list
            await self._found_lost(chunk_hash)
        for st, offset in self._waiting.pop(chunk_hash, []):
            if (st.id, offset) != origin:
                self._dedup_bytes += job.length  # the same bytes, so the same length
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

    async def _found_lost(self, chunk_hash: str) -> None:
        """A chunk recorded as lost reached the store after all (a file rewritten with the
        same bytes, uploaded before its close journaled it): the files are whole again."""
        try:
            await trio.to_thread.run_sync(self.journal.found_lost, chunk_hash,
                                          limiter=self.journal_limiter)
        except JournalError as e:
            log.error("chunk %s is in the store again, and the journal cannot record it: "
                      "%s", chunk_hash, e)
            return
        log.info("chunk %s, recorded as lost, is in the store now", chunk_hash)

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
