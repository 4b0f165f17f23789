"""Warm-up: fetch the chunks of named files into this node's cache before anyone reads them.

`ckptfs warmup` (through the control socket) hands a Warmer the files of a checkpoint, in
path order; their chunks are fetched in that order, through the Fetcher (single-flight,
verified against their names, behind its limiter), in a job of the mount's nursery that
outlives the request. Chunks this node already holds are skipped. The cache size is
respected: a job warms at most the cache's limit minus its staging files (written on
this node; dirty data is never evicted, see cache.py), and stops with a warning at the
first chunk that would not fit, so that it never evicts what it warmed itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import trio

from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher

log = logging.getLogger(__name__)

#: chunks one job fetches at once (the fetch limiter bounds the threads of all reads)
JOB_PARALLEL = 8


@dataclass
class WarmupProgress:
    """What a warm-up job has done, as the control socket answers it."""

    path: str  # relative to the filesystem root
    files: int
    total_bytes: int  # raw bytes of the distinct chunks of the files
    done_bytes: int = 0  # of those, held by this node now (skipped + fetched)
    skipped_bytes: int = 0  # held already when the job came to them
    fetched_bytes: int = 0
    state: str = "running"  # running, done, stopped (did not fit), failed
    warning: str | None = None  # why it stopped (the cache is too small)
    error: str | None = None  # why it failed (a chunk missing or corrupt in the store)
    _errors: list[str] = field(default_factory=list, repr=False)

    def answer(self) -> dict[str, object]:
        d = asdict(self)
        del d["_errors"]
        return d


class Warmer:
    """Runs warm-up jobs in its own nursery (run), one task each."""

    def __init__(self, fetcher: Fetcher, cache: LocalCache) -> None:
        self.fetcher = fetcher
        self.cache = cache
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host warm-up jobs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def start(self, path: str, files: Sequence[Sequence[tuple[str, int]]]) -> WarmupProgress:
        """Start warming `files` (each its chunks as (hash, raw size), in order) of `path`;
        the job's progress, updated as it goes."""
        assert self._nursery is not None, "Warmer.run is not running"
        chunks: dict[str, int] = {}
        for chunk_list in files:
            for h, size in chunk_list:
                chunks.setdefault(h, size)
        job = WarmupProgress(path, len(files), sum(chunks.values()))
        self._nursery.start_soon(self._warm, job, list(chunks.items()))
        return job

    async def _warm(self, job: WarmupProgress, chunks: list[tuple[str, int]]) -> None:
        room = self.cache.limit_bytes - self.cache.staging_bytes
        taken = 0
        fits = True
        async with trio.open_nursery() as nursery:  # _fetch_one raises nothing
            slots = trio.Semaphore(JOB_PARALLEL)
            for h, size in chunks:
                if self.cache.has(h):
                    job.skipped_bytes += size
                    job.done_bytes += size
                    continue
                if taken + size > room:
                    fits = False
                    break
                taken += size
                await slots.acquire()
                nursery.start_soon(self._fetch_one, job, h, size, slots)
        if not fits:  # said once the fetches in flight have ended
            job.warning = (f"the cache has room for {room} bytes (--cache-size less this "
                           f"node's staging files): warmed {job.done_bytes} of "
                           f"{job.total_bytes} bytes, in path order; the rest is fetched "
                           f"when read")
        if job._errors:
            job.state, job.error = "failed", job._errors[0]
            log.warning("warm-up of %s failed: %s", job.path or "/", job.error)
        elif job.warning is not None:
            job.state = "stopped"
            log.warning("warm-up of %s: %s", job.path or "/", job.warning)
        else:
            job.state = "done"
            log.info("warm-up of %s done: %d bytes fetched, %d held already", job.path or "/",
                     job.fetched_bytes, job.skipped_bytes)

    async def _fetch_one(self, job: WarmupProgress, chunk_hash: str, size: int,
                         slots: trio.Semaphore) -> None:
        try:
            await self.fetcher.fetch(chunk_hash)
            job.fetched_bytes += size
            job.done_bytes += size
        except Exception as e:  # noqa: BLE001 - recorded: the job ends failed
            job._errors.append(" ".join(str(e).split()) or type(e).__name__)
        finally:
            slots.release()
