"""The version of a file being written on this node: staging file, chunk map, hashes, uploads.

A WriteBuffer holds the bytes written since the file's last publish in a staging file
of the cache directory, and where its chunks begin and end (a chunking.Layout). Every
chunk is either *local*
(its bytes are in the staging file) or *remote* (its bytes are a stored chunk: one of
the version the buffer started from, or one uploaded early and then freed from the
cache). A write to part of a remote chunk first copies the chunk in (copy-on-write).

While a new file is written in order from its first byte, the store's cutter
(formats.py) decides where chunks end as the bytes arrive; each chunk the writes
complete is hashed from the bytes in hand (streaming hash) and handed to the uploader at
once (early upload), and once the cache is over its limit, uploaded chunks are freed
from the staging file (evict_uploaded). A version written any other way (out of order,
truncated, or starting from a stored version) is cut again by a fresh cutter when it is
sealed, so the same bytes give the same chunks however they were written. seal() turns
the buffer into the chunk list of a new version, and names apart the remote chunks that
this buffer freed (SealedVersion.freed: unlike the kept ones, no manifest names them
until this one is published, so the filesystem has the stale ones checked).

Every method runs in the trio thread; the caller holds the file's lock around each
call that awaits (see docs/CONCURRENCY.md).
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from ckptfs.common.crashpoints import crash_point
from ckptfs.format import codec
from ckptfs.format.chunking import Layout
from ckptfs.format.formats import Cutter
from ckptfs.format.manifests import Manifest
from ckptfs.pipeline.cache import LocalCache, StagingFile, pread_scratch
from ckptfs.pipeline.journal import PendingChunk
from ckptfs.pipeline.uploader import Uploader, UploadJob

#: read_chunk(hash, offset, length): bytes of a stored chunk (fetched first if need be)
ReadChunk = Callable[[str, int, int], Awaitable[bytes | memoryview]]
#: a new cutter of the store's kind (formats.new_cutter with the store's settings)
NewCutter = Callable[[], Cutter]


class _NotLocal(Exception):
    """The cutter asked for bytes that are only in the store."""


@dataclass(frozen=True)
class SealedVersion:
    """What seal() found: the new version's chunks, and those only in the staging file."""

    size: int
    chunks: tuple[tuple[str, int], ...]
    pending: list[PendingChunk]  # local chunks, to journal and upload
    #: remote chunks that this buffer uploaded early and then freed from the cache (not
    #: those kept from the version it started from: its manifest names them meanwhile)
    freed: frozenset[str] = frozenset()


class WriteBuffer:
    """One unpublished version of one file (see the module docstring)."""

    def __init__(self, cache: LocalCache, new_cutter: NewCutter, uploader: Uploader,
                 read_chunk: ReadChunk, lock: trio.Lock,
                 hash_limiter: trio.CapacityLimiter
                 ) -> None:
        """An empty version; see create() for one based on a published version."""
        self.cache = cache
        self.new_cutter = new_cutter
        self.uploader = uploader
        self.read_chunk = read_chunk
        self.lock = lock  # the file's lock: eviction waits while a write holds it
        self.hash_limiter = hash_limiter
        self.staging: StagingFile = cache.new_staging()
        self.staging.writers += 1
        self.size = 0
        self.layout = Layout()
        # decides the cuts while the file is written in order from its first byte; None
        # once written any other way: then the version is cut again when sealed (recut)
        self.cutter: Cutter | None = new_cutter()
        self.recut = False
        # chunk index -> (hash, length) of chunks whose bytes are only in the store
        self.remote: dict[int, tuple[str, int]] = {}
        self._writes = itertools.count(1)
        self.versions: dict[int, int] = {}  # chunk index -> number of its last write
        self.hashes: dict[int, tuple[str, int]] = {}  # chunk index -> (hash, its version)
        self.seq_end = 0  # end of the in-order prefix (early upload frontier)
        # the hash of chunk `stream_chunk` so far, fed by in-order writes (_stream_hash)
        self.stream: codec.Hasher | None = None
        self.stream_chunk = -1
        # complete chunks uploaded early, oldest first, for evict_uploaded
        self.uploaded: deque[int] = deque()
        self.freed: set[str] = set()  # chunks evict_uploaded made remote (SealedVersion)
        self.evict_due = False  # an upload finished while a write held the lock
        self.closed = False  # sealed and published, or discarded

    @classmethod
    async def create(cls, cache: LocalCache, new_cutter: NewCutter, uploader: Uploader,
                     read_chunk: ReadChunk, lock: trio.Lock,
                     hash_limiter: trio.CapacityLimiter,
                     base: Manifest | None) -> WriteBuffer:
        """A version that starts as `base` (None: empty), sharing its chunks."""
        buf = cls(cache, new_cutter, uploader, read_chunk, lock, hash_limiter)
        if base is None or base.is_symlink or base.size == 0:
            return buf
        os.ftruncate(buf.staging.fd, base.size)
        buf.staging.extent = buf.size = base.size
        buf.layout = Layout.of_chunks([n for _, n in base.chunks])
        buf.remote = dict(enumerate(base.chunks))
        buf._out_of_order()
        return buf

    # -- queries --------------------------------------------------------------------------
    def is_local(self, index: int) -> bool:
        return index not in self.remote

    # -- writing --------------------------------------------------------------------------
    async def write(self, offset: int, data: bytes) -> None:
        """Write `data` at `offset` (any offset; the file grows as needed)."""
        if self.cutter is not None and offset == self.seq_end:
            self._append(offset, data)
        else:
            self._out_of_order()
            await self._write_anywhere(offset, data)
        if self.evict_due:  # (also set by uploads that finished during this write)
            self.evict_due = False
            self.evict_uploaded()

    def _append(self, offset: int, data: bytes) -> None:
        """A write at the end of a file written in order so far (the hot path of a save):
        the open chunk is local (only complete chunks are ever freed), so nothing is
        copied in; the cutter ends chunks, which are hashed as they stream and uploaded
        as soon as they are complete."""
        end = offset + len(data)
        os.pwrite(self.staging.fd, data, offset)
        crash_point("write")
        first = self.layout.index(offset)  # the open chunk, before new cuts split it
        self.size = end
        self.staging.extent = max(self.staging.extent, end)
        self._take_cuts(end)
        for i in range(first, self.layout.count(end)):
            self._mark_written(i)
        self._stream_hash(offset, data)
        if self._upload_early(offset, end):
            self.evict_due = True  # the cache grew by a chunk: still within bounds?
        self.seq_end = end

    async def _write_anywhere(self, offset: int, data: bytes) -> None:
        """Any other write: remote chunks it covers only in part are copied in first."""
        end = offset + len(data)
        size = max(self.size, end)
        partial = [i for i in self.layout.touched(offset, len(data)) if not self.is_local(i)
                   and (offset > self.layout.span(i, size)[0]
                        or end < self.layout.span(i, size)[1])]
        await self._copy_in(partial + self._extended(size))
        self._grow(end)
        os.pwrite(self.staging.fd, data, offset)
        crash_point("write")
        for i in self.layout.touched(offset, len(data)):
            self._mark_written(i)

    def _out_of_order(self) -> None:
        """Written other than in order from the first byte: stop cutting, streaming the
        hash and uploading early; seal() cuts the whole version again."""
        self.cutter = None
        self.stream = None
        self.recut = True

    def _take_cuts(self, end: int) -> None:
        """Ask the cutter where chunks end now that bytes [0, end) are written in order."""
        assert self.cutter is not None
        try:
            cuts = self.cutter.feed(self._pread_local, end)
        except _NotLocal:  # it wanted bytes already freed: cut the version at seal
            self._out_of_order()
            return
        for c in cuts:  # (a chunk that ended before this write is hashed at seal)
            self.layout.add(c)

    def _pread_local(self, offset: int, length: int) -> bytes:
        if any(not self.is_local(i) for i in self.layout.touched(offset, length)):
            raise _NotLocal
        return os.pread(self.staging.fd, length, offset)

    async def truncate(self, size: int) -> None:
        """Cut or extend the file to `size` bytes (extension reads as zeros)."""
        self._out_of_order()
        if size > self.size:
            await self._copy_in(self._extended(size))
            os.ftruncate(self.staging.fd, size)
            self._grow(size)
        elif size < self.size:
            count = self.layout.count(size)
            last = count - 1
            cut = count > 0 and self.layout.span(last, size) != self.layout.span(last,
                                                                                  self.size)
            if cut:  # the new last chunk keeps only a part
                await self._copy_in([last])
            for i in range(count, self.layout.count(self.size)):
                start = self.layout.span(i, self.size)[0]
                self.versions.pop(i, None)  # an early upload of it in flight: not ours
                if self.remote.pop(i, None) is None:
                    self.hashes.pop(i, None)
                    self.cache.clear_dirty(self.staging, start)
                self.cache.fill_hole(self.staging, start)
            self.layout.cut_back(size)
            os.ftruncate(self.staging.fd, size)
            self.staging.extent = min(self.staging.extent, size)
            self.size = size
            if cut:
                self._mark_written(last)

    def _extended(self, size: int) -> list[int]:
        """The old partial last chunk if it is remote and growing to `size` extends it:
        its stored bytes must be copied in first."""
        count = self.layout.count(self.size)
        if count and not self.is_local(count - 1) and (
                self.layout.span(count - 1, self.size)[1]
                < self.layout.span(count - 1, size)[1]):
            return [count - 1]
        return []

    def _grow(self, size: int) -> None:
        """Extend to `size` (any remote chunk it extends copied in): the old partial last
        chunk and the new ones become local."""
        if size <= self.size:
            return
        count = self.layout.count(self.size)
        first = count  # the first chunk that changes: a new one, or a partial last one
        if count and self.layout.span(count - 1, self.size)[1] < self.layout.span(
                count - 1, size)[1]:
            first = count - 1
            assert self.is_local(first), "a remote chunk to extend was not copied in"
        self.size = size
        self.staging.extent = max(self.staging.extent, size)
        for i in range(first, self.layout.count(size)):
            self._mark_written(i)

    async def _copy_in(self, indexes: list[int]) -> None:
        """Copy-on-write, before any change: the stored bytes of these remote chunks into
        the staging file, each then local with its content unchanged. A fetch that fails
        fails the write or truncate (EIO) and leaves the file as it was."""
        for i in indexes:
            if not self.is_local(i):
                await self._fetch_into(self.remote[i], self.layout.span(i, self.size)[0])
                self._mark_written(i)

    async def _fetch_into(self, chunk: tuple[str, int], offset: int) -> None:
        """A stored chunk's bytes (hash, length) into the staging file at `offset`."""
        os.pwrite(self.staging.fd, await self.read_chunk(chunk[0], 0, chunk[1]), offset)

    def _mark_written(self, index: int) -> None:
        """Chunk `index` was (or will now be) modified in the staging file."""
        self.remote.pop(index, None)
        self.versions[index] = next(self._writes)
        self.hashes.pop(index, None)
        start, end = self.layout.span(index, self.size)
        self.cache.fill_hole(self.staging, start)
        self.cache.set_dirty(self.staging, start, max(end - start, 0))

    def _stream_hash(self, offset: int, data: bytes) -> None:
        """Hash chunks as in-order writes fill them, so that close has nothing left to
        read back and hash but the tail: the bytes are in hand and hot in the CPU cache.
        Valid because only in-order writes feed the hash and anything else drops it; a
        chunk is hashed only if the stream covered it from its first byte."""
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            at = offset + pos
            i = self.layout.index(at)
            chunk_end = self.layout.end_of(i)
            take = len(view) - pos if chunk_end is None else min(len(view) - pos,
                                                                 chunk_end - at)
            if at == self.layout.span(i, self.size)[0]:
                self.stream, self.stream_chunk = codec.chunk_hasher(), i
            if self.stream is not None and self.stream_chunk == i:
                self.stream.update(view[pos:pos + take])
                if at + take == chunk_end:  # the chunk is full
                    self.hashes[i] = (self.stream.hexdigest(), self.versions[i])
                    self.stream = None
            pos += take

    # -- early upload and eviction ---------------------------------------------------------
    def _upload_early(self, old_end: int, new_end: int) -> int:
        """Queue the chunks that in-order writes just completed; returns how many."""
        completed = self.layout.completed(old_end, new_end)
        for i in completed:
            version = self.versions[i]
            start, end = self.layout.span(i, new_end)

            def streamed(i: int = i, version: int = version) -> str | None:
                h, hashed = self.hashes.get(i, ("", -1))
                unchanged = self.versions.get(i) == version == hashed and not self.closed
                return h if unchanged else None

            def done(chunk_hash: str, i: int = i, version: int = version) -> None:
                if self.versions.get(i) == version and not self.closed:
                    self.hashes[i] = (chunk_hash, version)
                    self.cache.clear_dirty(self.staging, self.layout.span(i, self.size)[0])
                    self.uploaded.append(i)
                    if self.lock.locked():
                        self.evict_due = True  # the write holding the lock evicts
                    else:
                        self.evict_uploaded()

            self.uploader.submit_early_nowait(
                UploadJob(self.staging, start, end - start, on_done=done, streamed=streamed))
        return len(completed)

    def evict_uploaded(self) -> None:
        """Keep the cache within its limit while a large file is written: once clean
        data elsewhere is gone, free the chunks of this file that are already in the
        store, oldest first. They become remote chunks, fetched back if read or partly
        overwritten. Call only while no write of the file is half done (its lock is
        free or held by the caller), so that no write sees a chunk vanish."""
        if self.closed or not self.cache.over_limit():
            return
        self.cache.evict()
        while self.uploaded and self.cache.over_limit():
            i = self.uploaded.popleft()
            known = self.hashes.get(i)
            if (known is None or known[1] != self.versions.get(i, 0) or not self.is_local(i)
                    or known[0] not in self.uploader.in_store):
                continue  # written again since its upload, or already freed
            start, end = self.layout.span(i, self.size)
            if not self.cache.punch_uploaded(self.staging, start, end - start):
                self.uploaded.clear()
                return
            self.remote[i] = (known[0], end - start)
            self.freed.add(known[0])

    # -- reading --------------------------------------------------------------------------
    async def read(self, offset: int, end: int) -> bytes:
        """Bytes [offset, end) of this version (end <= size)."""
        parts: list[bytes | memoryview] = []
        pos = offset
        while pos < end:
            i = self.layout.index(pos)
            start, chunk_end = self.layout.span(i, self.size)
            upto = min(chunk_end, end)
            if self.is_local(i):
                parts.append(os.pread(self.staging.fd, upto - pos, pos))
            else:
                parts.append(await self.read_chunk(self.remote[i][0], pos - start, upto - pos))
            pos = upto
        return b"".join(parts)

    # -- publishing -------------------------------------------------------------------------
    async def seal(self, fsync: bool) -> SealedVersion:
        """The chunk list of this version: local chunks hashed (the streamed ones are
        not read again) and made readable by hash; the staging file fsynced if asked.
        The buffer stays usable until published() or discard()."""
        st = self.staging
        if self.recut:
            await self._recut()
        elif self.stream is not None and self.seq_end == self.size:  # the streamed tail
            self.hashes[self.stream_chunk] = (self.stream.hexdigest(),
                                              self.versions[self.stream_chunk])
        count = self.layout.count(self.size)
        to_hash = [i for i in range(count) if self.is_local(i) and (
            i not in self.hashes or self.hashes[i][1] != self.versions.get(i, 0))]
        spans = [self.layout.span(i, self.size) for i in to_hash]
        hashed = await trio.to_thread.run_sync(_hash_spans, st.fd, spans,
                                               limiter=self.hash_limiter)
        for i, h in zip(to_hash, hashed, strict=True):
            self.hashes[i] = (h, self.versions.get(i, 0))
        chunks: list[tuple[str, int]] = []
        pending: list[PendingChunk] = []
        freed: set[str] = set()
        for i in range(count):
            start, end = self.layout.span(i, self.size)
            if self.is_local(i):
                h = self.hashes[i][0]
                pending.append(PendingChunk(h, st.id, start, end - start))
                self.cache.add_staged_chunk(h, st, start, end - start)
            else:
                h = self.remote[i][0]
                if h in self.freed:
                    freed.add(h)
            chunks.append((h, end - start))
        if fsync:
            await trio.to_thread.run_sync(os.fsync, st.fd, limiter=self.hash_limiter)
        return SealedVersion(self.size, tuple(chunks), pending, frozenset(freed))

    async def _recut(self) -> None:
        """Cut the version again, as a fresh cutter cuts its bytes written in order (so
        a file written out of order is chunked as the same bytes written in order).
        Chunks whose span does not change keep their state (a stored chunk stays in the
        store); the others are made local, copying in what was only in the store."""
        cutter = self.new_cutter()

        def read(offset: int, length: int) -> bytes:
            return trio.from_thread.run(self.read, offset, offset + length)

        cuts = await trio.to_thread.run_sync(cutter.feed, read, self.size,
                                             limiter=self.hash_limiter)
        old, new = self.layout, Layout([c for c in cuts if c <= self.size])
        old_index = {old.span(i, self.size): i for i in range(old.count(self.size))}
        remote: dict[int, tuple[str, int]] = {}
        versions: dict[int, int] = {}
        hashes: dict[int, tuple[str, int]] = {}
        copied: set[int] = set()
        for j in range(new.count(self.size)):
            start, end = new.span(j, self.size)
            i = old_index.get((start, end))
            if i is not None and not self.is_local(i):
                remote[j] = self.remote[i]
                continue
            versions[j] = next(self._writes)
            if i is not None and self.hashes.get(i, ("", -1))[1] == self.versions[i]:
                hashes[j] = (self.hashes[i][0], versions[j])
            for k in old.touched(start, end - start):
                if not self.is_local(k) and k not in copied:
                    copied.add(k)
                    k_start = old.span(k, self.size)[0]
                    await self._fetch_into(self.remote[k], k_start)
                    self.cache.fill_hole(self.staging, k_start)
        for i in range(old.count(self.size)):
            if self.is_local(i):
                self.cache.clear_dirty(self.staging, old.span(i, self.size)[0])
        self.layout, self.remote, self.versions, self.hashes = new, remote, versions, hashes
        self.uploaded.clear()
        for j in versions:
            start, end = new.span(j, self.size)
            self.cache.set_dirty(self.staging, start, end - start)

    def published(self, version: SealedVersion, journaled: bool) -> None:
        """The sealed version is journaled (or the file was deleted meanwhile: not
        journaled): the staging file never changes again and may be evicted once clean."""
        st = self.staging
        for c in version.pending:
            if not journaled or not self.uploader.is_waiting(c.hash, st, c.offset):
                self.cache.clear_dirty(st, c.offset)  # nothing to upload for these
        st.sealed = True
        self._close()
        self.cache.evict()

    def discard(self) -> None:
        """Drop this version (O_TRUNC, or the file is gone): its staging file goes once
        nothing else reads it."""
        self._close()

    def _close(self) -> None:
        self.closed = True
        self.stream = None
        self.staging.writers -= 1
        self.cache.release_staging(self.staging)


def _hash_spans(fd: int, spans: list[tuple[int, int]]) -> list[str]:
    return [codec.chunk_hash(pread_scratch(fd, end - start, start)) for start, end in spans]
