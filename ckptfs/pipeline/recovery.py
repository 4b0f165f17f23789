"""The check after the journal lost committed state: this node's recent files against the store.

A journal that lost committed transactions (journal.wal_damage) or that SQLite refused
(moved aside, a new one started) no longer says which chunks of closed files are still
only in the cache. Until this check has run, the mount is not durable (status, sync,
umount) and the cache keeps every staging file (LocalCache.unnamed). The check:

1. lists the manifests under files/ written since `since()`: the oldest staging file
   kept, and at least the last RECENT seconds, less CLOCK_SKEW (store and node clocks);
2. reads them (16 GETs at a time) and keeps those whose writer is this node
   (Manifest.writer);
3. HEADs every chunk of them that the journal does not have queued for upload; a
   missing one is copied back from fossils/, else uploaded again from a staging file
   that holds it at its file offset (those of the file's size first; the hash decides),
   else the file is recorded as lost in the journal (status, the log and umount name it);
4. clears the journal's `damaged` row, and removes the unnamed staging files: those of
   the size of a checked file, or that gave a chunk, are deleted; the others (a file
   still open at the crash, or a closed file whose manifest never reached the store,
   which nothing left names) are moved to <cache>/unclaimed/ for the operator.

A store error makes the whole check start again after a backoff (retry.BACKGROUND).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import trio

from ckptfs.common import private
from ckptfs.common.config import LIMITS
from ckptfs.common.errors import (
    ConfigError,
    FormatError,
    InvalidKeyError,
    JournalError,
    NotFoundError,
    StoreError,
)
from ckptfs.common.retry import BACKGROUND, retried
from ckptfs.format import manifests
from ckptfs.format.manifests import Manifest
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher, RetryingStore
from ckptfs.pipeline.uploader import Uploader
from ckptfs.store.base import Store
from ckptfs.tools.inspection import parallel_map

log = logging.getLogger(__name__)

RECENT = 24 * 3600.0  # seconds: files written at least this long ago are checked
CLOCK_SKEW = 600.0  # seconds: how far the store's clock may be behind this node's
LOST_REASON = ("the journal lost its record before the chunk reached the store, and no "
               "copy is left (no fossil, not in this node's staging files)")


@dataclass
class CheckReport:
    """What one check found and did."""

    since: float = 0.0  # the oldest manifest mtime read (JournalCheck.since)
    manifests: int = 0  # this node's recent manifests checked
    chunks: int = 0  # their chunks HEADed
    restored: int = 0  # copied back from fossils/
    uploaded: int = 0  # uploaded again from a staging file
    lost: list[tuple[str, str]] = field(default_factory=list)  # (path, chunk)
    claimed: set[int] = field(default_factory=set)  # unnamed staging ids that matched


class JournalCheck:
    """Runs the check (module docstring) once, in the mount's nursery."""

    def __init__(self, store: Store, journal: Journal, journal_limiter: trio.CapacityLimiter,
                 cache: LocalCache, uploader: Uploader, publisher: Publisher,
                 writer: str, damage: str) -> None:
        self.store: Store = RetryingStore(store)  # type: ignore[assignment]
        self.journal = journal
        self.journal_limiter = journal_limiter
        self.cache = cache
        self.uploader = uploader
        self.publisher = publisher  # its chunk restore (fossils/, staging) is reused
        self.writer = writer
        self.damage = damage
        self.done = False
        self.limiter = trio.CapacityLimiter(1)
        self.limiter.name = "journal check"  # type: ignore[attr-defined]

    def problem(self) -> str | None:
        """The status line while the check has not run (None once it has)."""
        if self.done:
            return None
        return (f"the journal lost committed state ({self.damage}): checking the files "
                f"this node wrote against the store; not durable until that is done")

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check until it succeeds (retrying store errors), then record what it found."""
        task_status.started()
        delays = BACKGROUND.delays()
        while True:
            journaled = self.uploader.pending_hashes()
            kept = {st.id: st.path for st in self.cache.staging.values()}
            kept.update(self.cache.unnamed)  # read in the trio thread, which changes them
            try:
                report = await trio.to_thread.run_sync(self._check_sync, journaled, kept,
                                                       limiter=self.limiter)
                break
            except StoreError as e:
                log.warning("the journal check failed (retrying): %s", e)
                retried("journal check")
                await trio.sleep(next(delays))
        # a chunk of a file this mount closed during the check is on its way: not lost
        report.lost = [(path, h) for path, h in report.lost
                       if not self.uploader.is_pending(h) and h not in self.uploader.in_store]
        for path, chunk_hash in report.lost:
            await self._record_lost(path, chunk_hash)
        try:
            await trio.to_thread.run_sync(self.journal.checked, limiter=self.journal_limiter)
        except JournalError as e:  # the next mount checks again
            log.warning("could not record the journal check as done: %s", e)
        unnamed = dict(self.cache.unnamed)
        self.cache.unnamed.clear()
        moved = await trio.to_thread.run_sync(self._remove_unnamed, unnamed, report.claimed,
                                              limiter=self.limiter)
        self.done = True
        log.log(logging.ERROR if report.lost else logging.WARNING,
                "journal check done: %d files written here since %s, %d chunks: %d were "
                "missing, %d copied back from fossils/, %d uploaded again from staging, "
                "%d lost%s", report.manifests, time.ctime(report.since), report.chunks,
                report.restored + report.uploaded + len(report.lost), report.restored,
                report.uploaded, len(report.lost),
                f"; {moved} staging files no file names are kept in "
                f"{self.unclaimed_dir}" if moved else "")

    @property
    def unclaimed_dir(self) -> str:
        return os.path.join(self.cache.root, "unclaimed")

    @staticmethod
    def since(kept: dict[int, str]) -> float:
        """The oldest store mtime of a manifest the check reads (module docstring), given
        the staging files kept (id -> path)."""
        oldest = time.time() - RECENT
        for path in kept.values():
            try:
                oldest = min(oldest, os.stat(path).st_mtime)
            except OSError:
                pass
        return oldest - CLOCK_SKEW

    async def _record_lost(self, path: str, chunk_hash: str) -> None:
        try:  # seq 0: followed through every op still journaled (renames, deletes)
            now = await trio.to_thread.run_sync(self.journal.mark_lost_file, 0, path,
                                                chunk_hash, LOST_REASON,
                                                limiter=self.journal_limiter)
        except JournalError as e:
            log.error("DATA LOST: %s: chunk %s is not in the store: %s; and the journal "
                      "cannot record it: %s", path, chunk_hash, LOST_REASON, e)
            return
        log.error("DATA LOST: %s: chunk %s is not in the store: %s",
                  now or f"{path} (since deleted or rewritten)", chunk_hash, LOST_REASON)

    # -- in a thread ---------------------------------------------------------------------
    def _check_sync(self, journaled: set[str], kept: dict[int, str]) -> CheckReport:
        """The check of this node's recent files; `journaled`: the chunks the uploader has
        queued (its business), `kept`: the staging files (id -> path)."""
        report = CheckReport(since=self.since(kept))
        staging = self._open_staging(kept)
        try:
            recent = (info.key for info in self.store.scan(manifests.FILES)
                      if not info.key.endswith("/") and info.mtime >= report.since)
            for key, m in parallel_map(self._own_manifest, recent):  # GETs, 16 at a time
                if m is not None:
                    self._check_file(manifests.path_of_key(key), m, journaled, staging,
                                     report)
        finally:
            for fd, _ in staging.values():
                os.close(fd)
        return report

    @staticmethod
    def _open_staging(kept: dict[int, str]) -> dict[int, tuple[int, int]]:
        """The staging files kept, opened here (an fd of the cache's may be closed by an
        eviction meanwhile; one removed since is skipped): id -> (fd, size)."""
        out = {}
        for sid, path in kept.items():
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("cannot read staging file %s: %s", path, e)
                continue
            out[sid] = (fd, os.fstat(fd).st_size)
        return out

    def _own_manifest(self, key: str) -> Manifest | None:
        """The file manifest at `key` if this node wrote it (None otherwise, or if it is
        gone or unreadable: another node's business, or ckptfs fsck's)."""
        try:
            m = Manifest.from_json(self.store.get_record(key))
        except (NotFoundError, FormatError, InvalidKeyError, ValueError):
            return None
        return m if m.writer == self.writer and not m.is_symlink else None

    def _check_file(self, path: str, m: Manifest, journaled: set[str],
                    staging: dict[int, tuple[int, int]], report: CheckReport) -> None:
        report.manifests += 1
        same_size = [sid for sid, (_, size) in staging.items() if size == m.size]
        report.claimed.update(same_size)
        spans: dict[str, list[tuple[int, int]]] = {}  # chunk -> (file offset, length)s
        for (chunk_hash, length), offset in zip(m.chunks, m.chunk_offsets(), strict=False):
            if chunk_hash not in journaled:  # a journaled one is the uploader's
                spans.setdefault(chunk_hash, []).append((offset, length))
        report.chunks += len(spans)
        with ThreadPoolExecutor(LIMITS.confirm_threads) as pool:
            found = dict(zip(spans, pool.map(self.publisher.present_or_restored, spans),
                             strict=True))
        report.restored += sum(1 for how in found.values() if how == "fossil")
        order = same_size + [sid for sid in staging if sid not in same_size]
        for chunk_hash in (h for h, how in found.items() if how is None):
            for sid in order:
                fd, size = staging[sid]
                fits = [s for s in spans[chunk_hash] if s[0] + s[1] <= size]
                if fits and self.publisher.upload_from_staging(chunk_hash, fd, fits):
                    report.uploaded += 1
                    report.claimed.add(sid)
                    break
            else:
                report.lost.append((path, chunk_hash))

    def _remove_unnamed(self, unnamed: dict[int, str], claimed: set[int]) -> int:
        """Delete the unnamed staging files (id -> path) that matched a checked file;
        move the others to unclaimed/ (as <id>, or <id>.<n> beside an earlier one).
        Returns how many were moved."""
        moved = 0
        for sid, path in sorted(unnamed.items()):
            try:
                if sid in claimed:
                    os.unlink(path)
                    continue
                # made 0700 or checked: this user's, not a link (private.py)
                os.close(private.open_dir(self.unclaimed_dir, "the directory",
                                          private.INSIDE_FIX))
                target, n = os.path.join(self.unclaimed_dir, str(sid)), 0
                while os.path.exists(target):
                    n += 1
                    target = os.path.join(self.unclaimed_dir, f"{sid}.{n}")
                os.rename(path, target)
                moved += 1
            except (OSError, ConfigError) as e:
                log.warning("could not remove staging file %s: %s", path, e)
        return moved
