"""The version of a file being written on this node: staging file, chunk map, hashes, uploads.

A WriteBuffer holds the bytes written since the file's last publish in a staging file
of the cache directory. Every chunk (as the chunker cuts the file) is either *local*
(its bytes are in the staging file) or *remote* (its bytes are a stored chunk: one of
the version the buffer started from, or one uploaded early and then freed from the
cache). A write to part of a remote chunk first copies the chunk in (copy-on-write).

While a file is written sequentially, each chunk the writes complete is hashed from the
bytes in hand (streaming hash) and handed to the uploader at once (early upload), and
once the cache is over its limit, uploaded chunks are freed from the staging file
(evict_uploaded). seal() turns the buffer into the chunk list of a new version.

Every method runs in the trio thread; the caller holds the file's lock around each
call that awaits (see docs/CONCURRENCY.md). Chunk boundaries come only from the chunker.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from . import codec
from .cache import LocalCache, StagingFile, pread_scratch
from .chunking import FixedChunker
from .crashpoints import crash_point
from .journal import PendingChunk
from .manifests import Manifest
from .uploader import Uploader, UploadJob

#: (fd, offset) where a stored chunk's raw bytes can be read locally, fetching it if needed
Locate = Callable[[str], Awaitable[tuple[int, int]]]


@dataclass(frozen=True)
class SealedVersion:
    """What seal() found: the new version's chunks, and those only in the staging file."""

    size: int
    chunks: tuple[tuple[str, int], ...]
    pending: list[PendingChunk]  # local chunks, to journal and upload


class WriteBuffer:
    """One unpublished version of one file (see the module docstring)."""

    def __init__(self, cache: LocalCache, chunker: FixedChunker, uploader: Uploader,
                 locate: Locate, lock: trio.Lock, hash_limiter: trio.CapacityLimiter
                 ) -> None:
        """An empty version; see create() for one based on a published version."""
        self.cache = cache
        self.chunker = chunker
        self.uploader = uploader
        self.locate = locate
        self.lock = lock  # the file's lock: eviction waits while a write holds it
        self.hash_limiter = hash_limiter
        self.staging: StagingFile = cache.new_staging()
        self.staging.writers += 1
        self.size = 0
        # chunk index -> (hash, length) of chunks whose bytes are only in the store
        self.remote: dict[int, tuple[str, int]] = {}
        self.versions: dict[int, int] = {}  # chunk index -> writes so far
        self.hashes: dict[int, tuple[str, int]] = {}  # chunk index -> (hash, its version)
        self.seq_end = 0  # end of the sequentially written prefix (early upload frontier)
        # the hash of chunk `stream_chunk` so far, fed by sequential writes (_stream_hash)
        self.stream: codec.Hasher | None = None
        self.stream_chunk = -1
        # complete chunks uploaded early, oldest first, for evict_uploaded
        self.uploaded: deque[int] = deque()
        self.evict_due = False  # an upload finished while a write held the lock
        self.closed = False  # sealed and published, or discarded

    @classmethod
    async def create(cls, cache: LocalCache, chunker: FixedChunker, uploader: Uploader,
                     locate: Locate, lock: trio.Lock, hash_limiter: trio.CapacityLimiter,
                     base: Manifest | None) -> WriteBuffer:
        """A version that starts as `base` (None: empty), sharing its chunks."""
        buf = cls(cache, chunker, uploader, locate, lock, hash_limiter)
        if base is None or base.is_symlink:
            return buf
        os.ftruncate(buf.staging.fd, base.size)
        buf.staging.extent = buf.size = base.size
        if chunker.matches([n for _, n in base.chunks]):
            buf.remote = dict(enumerate(base.chunks))
        else:  # cut by another chunker: copy all of it into the staging file
            for (h, n), offset in zip(base.chunks, base.chunk_offsets(), strict=False):
                await buf._copy_in(h, n, offset)
            for i in range(chunker.count(buf.size)):
                buf._mark_written(i)
        return buf

    # -- queries --------------------------------------------------------------------------
    def is_local(self, index: int) -> bool:
        return index not in self.remote

    # -- writing --------------------------------------------------------------------------
    async def write(self, offset: int, data: bytes) -> None:
        """Write `data` at `offset` (any offset; the file grows as needed)."""
        end = offset + len(data)
        await self._grow(end)
        touched = self.chunker.touched(offset, len(data))
        for i in touched:
            if not self.is_local(i):
                start, chunk_end = self.chunker.span(i, self.size)
                if offset > start or end < chunk_end:  # partial overwrite of a remote chunk
                    h, n = self.remote[i]
                    await self._copy_in(h, n, start)
        os.pwrite(self.staging.fd, data, offset)
        crash_point("write")
        for i in touched:
            self._mark_written(i)
        if offset == self.seq_end:
            self._stream_hash(offset, data)
        else:
            self.stream = None
        if offset <= self.seq_end < end:
            if self._upload_early(self.seq_end, end):
                self.evict_due = True  # the cache grew by a chunk: still within bounds?
            self.seq_end = end
        if self.evict_due:  # (also set by uploads that finished during this write)
            self.evict_due = False
            self.evict_uploaded()

    async def truncate(self, size: int) -> None:
        """Cut or extend the file to `size` bytes (extension reads as zeros)."""
        self.stream = None
        if size > self.size:
            os.ftruncate(self.staging.fd, size)
            await self._grow(size)
        elif size < self.size:
            count = self.chunker.count(size)
            last = count - 1
            cut = count > 0 and self.chunker.span(last, size) != self.chunker.span(last,
                                                                                    self.size)
            if cut and not self.is_local(last):  # the new last chunk keeps only a part
                h, n = self.remote[last]
                await self._copy_in(h, n, self.chunker.span(last, size)[0])
            for i in range(count, self.chunker.count(self.size)):
                start = self.chunker.span(i, self.size)[0]
                if self.remote.pop(i, None) is None:
                    self.hashes.pop(i, None)
                    self.cache.clear_dirty(self.staging, start)
                self.cache.fill_hole(self.staging, start)
            os.ftruncate(self.staging.fd, size)
            self.staging.extent = min(self.staging.extent, size)
            self.size = size
            if cut:
                self._mark_written(last)
            self.seq_end = min(self.seq_end, size)

    async def _grow(self, size: int) -> None:
        """Extend to `size`: the old partial last chunk and the new ones become local."""
        if size <= self.size:
            return
        count = self.chunker.count(self.size)
        first = count  # the first chunk that changes: a new one, or a partial last one
        if count:
            last = count - 1
            start, end = self.chunker.span(last, self.size)
            if end < self.chunker.span(last, size)[1]:
                first = last
                if not self.is_local(last):  # it grows: its stored bytes are copied in
                    h, n = self.remote[last]
                    await self._copy_in(h, n, start)
        self.size = size
        self.staging.extent = max(self.staging.extent, size)
        for i in range(first, self.chunker.count(size)):
            self._mark_written(i)

    async def _copy_in(self, chunk_hash: str, length: int, offset: int) -> None:
        """Copy-on-write: a stored chunk's bytes into the staging file at `offset`."""
        fd, off = await self.locate(chunk_hash)
        os.pwrite(self.staging.fd, os.pread(fd, length, off), offset)

    def _mark_written(self, index: int) -> None:
        """Chunk `index` was (or will now be) modified in the staging file."""
        self.remote.pop(index, None)
        self.versions[index] = self.versions.get(index, 0) + 1
        self.hashes.pop(index, None)
        start, end = self.chunker.span(index, self.size)
        self.cache.fill_hole(self.staging, start)
        self.cache.set_dirty(self.staging, start, max(end - start, 0))

    def _stream_hash(self, offset: int, data: bytes) -> None:
        """Hash chunks as a sequential write stream fills them, so that close has nothing
        left to read back and hash but the tail: the bytes are in hand and hot in the CPU
        cache. Valid because only writes at seq_end feed the hash and any other write
        drops it; a chunk is hashed only if the stream covered it from its first byte."""
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            at = offset + pos
            i = self.chunker.index(at)
            chunk_end = self.chunker.end_of(i)
            take = min(len(view) - pos, chunk_end - at)
            if at == self.chunker.span(i, chunk_end)[0]:
                self.stream, self.stream_chunk = codec.chunk_hasher(), i
            if self.stream is not None and self.stream_chunk == i:
                self.stream.update(view[pos:pos + take])
                if at + take == chunk_end:  # the chunk is full
                    self.hashes[i] = (self.stream.hexdigest(), self.versions.get(i, 0))
                    self.stream = None
            pos += take

    # -- early upload and eviction ---------------------------------------------------------
    def _upload_early(self, old_end: int, new_end: int) -> int:
        """Queue the chunks that sequential writes just completed; returns how many."""
        completed = self.chunker.completed(old_end, new_end)
        for i in completed:
            version = self.versions.get(i, 0)
            start, end = self.chunker.span(i, new_end)

            def done(chunk_hash: str, i: int = i, version: int = version) -> None:
                if self.versions.get(i) == version and not self.closed:
                    self.hashes[i] = (chunk_hash, version)
                    self.cache.clear_dirty(self.staging, self.chunker.span(i, self.size)[0])
                    self.uploaded.append(i)
                    if self.lock.locked():
                        self.evict_due = True  # the write holding the lock evicts
                    else:
                        self.evict_uploaded()

            self.uploader.submit_early_nowait(
                UploadJob(self.staging, start, end - start, on_done=done))
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
            start, end = self.chunker.span(i, self.size)
            if not self.cache.punch_uploaded(self.staging, start, end - start):
                self.uploaded.clear()
                return
            self.remote[i] = (known[0], end - start)

    # -- reading --------------------------------------------------------------------------
    async def read(self, offset: int, end: int) -> bytes:
        """Bytes [offset, end) of this version (end <= size)."""
        parts = []
        pos = offset
        while pos < end:
            i = self.chunker.index(pos)
            start, chunk_end = self.chunker.span(i, self.size)
            upto = min(chunk_end, end)
            if self.is_local(i):
                parts.append(os.pread(self.staging.fd, upto - pos, pos))
            else:
                fd, base = await self.locate(self.remote[i][0])
                parts.append(os.pread(fd, upto - pos, base + pos - start))
            pos = upto
        return b"".join(parts)

    # -- publishing -------------------------------------------------------------------------
    async def seal(self, fsync: bool) -> SealedVersion:
        """The chunk list of this version: local chunks hashed (the streamed ones are
        not read again) and made readable by hash; the staging file fsynced if asked.
        The buffer stays usable until published() or discard()."""
        st = self.staging
        count = self.chunker.count(self.size)
        if self.stream is not None and self.seq_end == self.size:  # the streamed tail
            self.hashes[self.stream_chunk] = (self.stream.hexdigest(),
                                              self.versions.get(self.stream_chunk, 0))
        to_hash = [i for i in range(count) if self.is_local(i) and (
            i not in self.hashes or self.hashes[i][1] != self.versions.get(i, 0))]
        spans = [self.chunker.span(i, self.size) for i in to_hash]
        hashed = await trio.to_thread.run_sync(_hash_spans, st.fd, spans,
                                               limiter=self.hash_limiter)
        for i, h in zip(to_hash, hashed, strict=True):
            self.hashes[i] = (h, self.versions.get(i, 0))
        chunks: list[tuple[str, int]] = []
        pending: list[PendingChunk] = []
        for i in range(count):
            start, end = self.chunker.span(i, self.size)
            if self.is_local(i):
                h = self.hashes[i][0]
                pending.append(PendingChunk(h, st.id, start, end - start))
                self.cache.add_staged_chunk(h, st, start, end - start)
            else:
                h = self.remote[i][0]
            chunks.append((h, end - start))
        if fsync:
            await trio.to_thread.run_sync(os.fsync, st.fd, limiter=self.hash_limiter)
        return SealedVersion(self.size, tuple(chunks), pending)

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
