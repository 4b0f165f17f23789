"""Lazy reads: find a chunk locally or GET it (single-flight, verified, cached), and prefetch.

A chunk named by a published manifest may not be in the store yet (its writer is still
uploading): NotFound and transient errors are retried with backoff up to
``missing_timeout``; then MissingChunkError. A chunk that `ckptfs gc` set aside
(fossils/) is read from there. A chunk whose bytes do not match its name
raises CorruptChunkError at once. Neither ever yields wrong bytes. A read-cache file left
by an earlier mount is re-hashed before its first use in this one (in a fetch thread,
single-flight like a GET); if it is damaged it is dropped and the chunk fetched again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import trio

from ckptfs.common.errors import CorruptChunkError, MissingChunkError, NotFoundError, StoreError
from ckptfs.common.retry import CHUNK_WAIT, retried
from ckptfs.format import codec, manifests
from ckptfs.pipeline.cache import DecodeBuffer, LocalCache, file_identity
from ckptfs.store.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetcherStatistics:
    fetched_chunks: int
    fetched_bytes: int  # raw bytes
    inflight: int
    cache_hits: int
    cache_misses: int
    verified_chunks: int  # read-cache files from before this mount, re-hashed and intact
    damaged_chunks: int  # ... found damaged (or gone) and fetched again


class Fetcher:
    """Makes chunks locally readable; runs GETs in threads behind the ``fetch`` limiter."""

    def __init__(self, store: Store, cache: LocalCache, workers: int = 8,
                 missing_timeout: float = 60.0) -> None:
        self.store = store
        self.cache = cache
        self.limiter = trio.CapacityLimiter(workers)
        self.limiter.name = "fetch"  # type: ignore[attr-defined]
        self.missing_timeout = missing_timeout
        self._inflight: dict[str, trio.Event] = {}
        self._errors: dict[str, Exception] = {}
        self._nursery: trio.Nursery | None = None
        self.fetched_chunks = 0
        self.fetched_bytes = 0
        self.verified_chunks = 0
        self.damaged_chunks = 0
        self.fossil_chunks = 0  # fetched from fossils/ (set aside by gc)
        #: with a fast tier (store.tiered): the object store behind it, where a chunk
        #: damaged in the fast tier is read instead
        self.behind: Store | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host prefetch tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def read(self, chunk_hash: str, offset: int, length: int) -> bytes | memoryview:
        """Up to `length` bytes at `offset` of the chunk's raw bytes (short only past its
        end), fetching the chunk first if this node does not hold it."""
        while True:
            data = self.cache.read(chunk_hash, offset, length)
            if data is not None:
                return data
            await self._fetch(chunk_hash)

    async def fetch(self, chunk_hash: str) -> None:
        """Make a chunk locally readable without reading it (`ckptfs warmup`): fetched
        and verified like any read's, single-flight; at once if this node holds it."""
        if not self.cache.has(chunk_hash):
            await self._fetch(chunk_hash)

    def prefetch_nowait(self, chunk_hashes: list[str]) -> None:
        """Start fetching chunks that are not local (bounded by the fetch limiter)."""
        if self._nursery is None:
            return
        for h in chunk_hashes:
            if h not in self._inflight and not self.cache.has(h):
                self._inflight[h] = trio.Event()
                self._nursery.start_soon(self._prefetch, h)

    def statistics(self) -> FetcherStatistics:
        return FetcherStatistics(self.fetched_chunks, self.fetched_bytes, len(self._inflight),
                                 self.cache.hits, self.cache.misses, self.verified_chunks,
                                 self.damaged_chunks)

    # -- internals ---------------------------------------------------------------------
    async def _prefetch(self, chunk_hash: str) -> None:
        try:
            await self._fetch_owned(chunk_hash)
        except (MissingChunkError, CorruptChunkError) as e:
            log.debug("prefetch of %s failed: %s", chunk_hash, e)
        except Exception as e:  # noqa: BLE001 - best effort: must not end the run() nursery
            log.warning("prefetch of %s failed: %r", chunk_hash, e)

    async def _fetch(self, chunk_hash: str) -> None:
        event = self._inflight.get(chunk_hash)
        if event is None:
            self._inflight[chunk_hash] = trio.Event()
            await self._fetch_owned(chunk_hash)
            return
        await event.wait()
        error = self._errors.get(chunk_hash)
        if error is not None and not self.cache.has(chunk_hash):
            raise error

    async def _fetch_owned(self, chunk_hash: str) -> None:
        """Verify the cached copy from an earlier mount, or GET with retries; the caller
        has put this chunk's Event in _inflight."""
        event = self._inflight[chunk_hash]
        self._errors.pop(chunk_hash, None)
        try:
            if self.cache.unverified(chunk_hash):
                if await trio.to_thread.run_sync(self.cache.verify_cached, chunk_hash,
                                                 limiter=self.limiter):
                    self.verified_chunks += 1
                    return
                self.damaged_chunks += 1
                log.warning("the cached copy of chunk %s is damaged (or gone): fetching it "
                            "again", chunk_hash)
            size, fossil = await self._get_with_retries(chunk_hash)
            self.fetched_chunks += 1
            self.fetched_bytes += size
            self.fossil_chunks += fossil
            self.cache.evict(keep={chunk_hash})
        except Exception as e:
            self._errors[chunk_hash] = e
            raise
        finally:
            del self._inflight[chunk_hash]
            event.set()

    async def _get_with_retries(self, chunk_hash: str) -> tuple[int, bool]:
        deadline = time.monotonic() + self.missing_timeout
        delays = CHUNK_WAIT.delays()
        while True:
            try:
                return await trio.to_thread.run_sync(self._get_sync, chunk_hash,
                                                     limiter=self.limiter)
            except (NotFoundError, StoreError) as e:
                if e.permanent and not isinstance(e, NotFoundError):
                    raise MissingChunkError(f"chunk {chunk_hash}: {e}") from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    what = "not in the store" if isinstance(e, NotFoundError) else str(e)
                    raise MissingChunkError(
                        f"chunk {chunk_hash} {what} after {self.missing_timeout:g}s") from None
                retried("fetch")
                await trio.sleep(min(next(delays), remaining))  # last try at the deadline

    def _get_sync(self, chunk_hash: str) -> tuple[int, bool]:
        """(raw size, whether it came from fossils/)."""
        try:
            try:
                return self._get_key(chunk_hash, manifests.chunk_key(chunk_hash)), False
            except CorruptChunkError as e:
                if self.behind is None:
                    raise
                log.warning("%s (in the fast tier): reading it from the store", e)
                return self._get_key(chunk_hash, manifests.chunk_key(chunk_hash),
                                     self.behind), False
        except NotFoundError as e:
            # `ckptfs gc` may have set the chunk aside just before a writer published a
            # manifest naming it; the next gc run restores it (docs/FORMAT.md, "Garbage
            # collection"). A fossil is verified like any chunk.
            try:
                size = self._get_key(chunk_hash, manifests.fossil_key(chunk_hash))
            except NotFoundError:
                raise e from None
            log.info("chunk %s was read from fossils/ (set aside by ckptfs gc; its next run "
                     "restores it)", chunk_hash)
            return size, True

    def _get_key(self, chunk_hash: str, key: str, store: Store | None = None) -> int:
        """GET the object `key` (of `store`, by default the fetcher's), verify it as chunk
        `chunk_hash`, make it readable."""
        store = store or self.store
        path = store.local_path(key)
        before = in_place_identity(path)
        blob = store.get_buffer(key, codec.MAX_OBJECT_SIZE)
        try:
            if self.cache.memory_limit and not (path is not None and codec.is_raw(blob)):
                # served from memory: decoded into a reused buffer (a raw chunk: the GET's)
                taken: list[DecodeBuffer] = []

                def take(size: int) -> codec.WritableBuffer:
                    taken.append(self.cache.memory_buffer(size))
                    return taken[-1].array.data

                try:
                    data = codec.decode_into(blob, chunk_hash, take)
                except BaseException:
                    for buf in taken:
                        self.cache.recycle(buf)
                    raise
                self.cache.put_in_memory(chunk_hash, data, taken[0] if taken else None)
                return len(data)
            with codec.decoded(blob, chunk_hash) as data:
                if (path is not None and before is not None and codec.is_raw(blob)
                        and in_place_identity(path) == before):
                    # a raw chunk of a local-directory store, verified, and the file did
                    # not change meanwhile: read it where it is, not from a second copy
                    self.cache.put_in_place(chunk_hash, path, codec.HEADER_SIZE, before)
                else:
                    self.cache.put_fetched(chunk_hash, data)
                return len(data)
        except CorruptChunkError as e:  # the log line and the EIO must name the chunk
            raise CorruptChunkError(f"chunk {chunk_hash}: {e}") from None


def in_place_identity(path: str | None) -> tuple[int, int, int, int] | None:
    """file_identity of a directory store's object file, or None where it cannot be read
    in place: no such file, or no file reachable there (a FIFO, a device or a file where
    a directory of the store belongs: the GET says what is wrong)."""
    if path is None:
        return None
    try:
        return file_identity(path)
    except OSError:
        return None
