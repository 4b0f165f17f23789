"""Garbage collection of chunk objects: two-step fossil collection, safe while any number
of mounts keep writing, with no lock and no server (docs/FORMAT.md, "Garbage collection").

One run (`collect`):

0. T = the store's clock: the mtime of a probe object it PUTs (then deletes). Every age is
   a difference of two store times; the clock of the node running gc is never read.
1. References: every chunk named by a manifest under the reference prefixes (files/,
   then trash/, except the trash entries whose time is up at T: their store time + their
   batch's keep), from two
   listings one after the other (pass B re-reads only manifests that are new or were
   replaced since pass A), so that a file renamed during the listing is seen once. A
   damaged manifest stops the run here, before anything is changed. Then the trash
   entries whose time is up are deleted (trash.py), and the clock probes of killed runs.
2. Sweep: each fossil (fossils/<h:2>/<h>) that is referenced is restored to chunks/; one
   that is not, and was set aside at least `grace` before T, is deleted (freed).
3. Mark: each chunk that is not referenced and was written at least `grace` before T is
   set aside as a fossil (renamed), not deleted: a writer may have deduplicated against it
   just before, and readers still find it there.

Only the reference set grows with the store (16 bytes of name per chunk in a set: about
83 MB per million referenced chunks); chunks/ and fossils/ are streamed page by page.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    BadObjectError,
    CkptfsError,
    ConfigError,
    FormatError,
    NotFoundError,
)
from ckptfs.common.retry import retrying
from ckptfs.format import manifests
from ckptfs.format.manifests import CHUNKS, FILES, FOSSILS, GC, TRASH, Manifest
from ckptfs.store.base import RESTAMP_AFTER, ObjectInfo, Store
from ckptfs.tools import inspection, trash

log = logging.getLogger(__name__)

#: the prefixes whose objects (except directory markers) are manifests naming chunks: the
#: files, then the trash (a delete copies a manifest to the trash before it deletes it)
REFERENCE_PREFIXES: tuple[str, ...] = (FILES, TRASH)
#: listings of the reference prefixes, each started after the previous one was read
LISTING_PASSES = 2
#: --grace by default
DEFAULT_GRACE = 24 * 3600.0
#: the shortest grace that is safe beside writers: a writer may publish a manifest naming
#: a chunk up to 2 x CONFIRM_WINDOW after it last saw the chunk (P to journal it at close,
#: P more before its publisher checks the chunks of an op again), plus the lag of an S3
#: move's copy behind its delete (RESTAMP_AFTER), rounded up to leave room for slow
#: publishes (docs/FORMAT.md, "Garbage collection")
MIN_SAFE_GRACE = 3600.0
assert MIN_SAFE_GRACE >= 2 * manifests.CONFIRM_WINDOW + RESTAMP_AFTER
#: no gc run is still at work on an object it touched this long ago (store time): a gc/
#: clock probe older than this was left by a killed run (deleted), and only a fossil
#: older than this beside a copy of its chunk in chunks/ is deleted as a duplicate (a
#: younger one may be the copy of a move whose run has yet to delete the chunk)
SETTLED_AFTER = 3600.0

#: what one object came to (GcReport tallies)
RESTORED, FREED, KEPT, FOSSILIZED, VANISHED, LOST = (
    "restored", "freed", "kept", "fossilized", "vanished", "lost")


class GcError(CkptfsError):
    """gc cannot go on safely (an unreadable manifest, a probe that vanished)."""


@dataclass
class Tally:
    """A number of objects and their bytes (as stored)."""

    count: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size


@dataclass
class GcReport:
    """What one run found and did (with dry_run: would do)."""

    url: str
    grace: float
    dry_run: bool = False
    store_time: float = 0.0   # T, by the store's clock
    cutoff: float = 0.0       # T - grace: objects written at or before it are old enough
    phase: str = "clock"
    trash_expired: Tally = field(default_factory=Tally)  # trash entries whose time was up
    manifests: Tally = field(default_factory=Tally)  # read (bytes: of the manifests)
    manifests_reread: int = 0  # of those, read by pass B: new or replaced since pass A
    trash_manifests: int = 0   # of those, in the trash
    referenced: int = 0       # distinct chunk names the manifests give
    fossils: Tally = field(default_factory=Tally)       # fossils scanned
    restored: Tally = field(default_factory=Tally)      # referenced fossils back in chunks/
    freed: Tally = field(default_factory=Tally)         # old unreferenced fossils deleted
    # unreferenced fossils within grace, and young copies of chunks in chunks/
    kept_fossils: Tally = field(default_factory=Tally)
    chunks: Tally = field(default_factory=Tally)        # chunks scanned
    chunks_referenced: Tally = field(default_factory=Tally)
    fossilized: Tally = field(default_factory=Tally)    # old unreferenced chunks set aside
    kept_chunks: Tally = field(default_factory=Tally)   # unreferenced chunks within grace
    vanished: int = 0         # gone before gc acted on them (another gc run, most likely)
    lost: list[str] = field(default_factory=list)  # referenced, in neither chunks/ nor fossils/
    others: int = 0           # objects under chunks/ or fossils/ outside the layout: ignored
    scratch_deleted: int = 0  # gc/ objects left by killed runs
    seconds: float = 0.0
    # with a fast tier (FastTier): its url, what it referenced and what was done to it
    fast_url: str = ""
    fast_manifests: int = 0   # manifests read in the fast tier (files/, trim/)
    fast_records: int = 0     # pending records read (their put_file manifests)
    fast_chunks: Tally = field(default_factory=Tally)   # chunks scanned in the fast tier
    fast_freed: Tally = field(default_factory=Tally)    # deleted: the store has them
    fast_moved: Tally = field(default_factory=Tally)    # copied into the store, then deleted
    fast_kept: Tally = field(default_factory=Tally)     # unreferenced, within the grace

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        del d["url"], d["phase"]
        return {"store": self.url, **d}


class References:
    """The set of chunk names that manifests give, as 16-byte binary names: 83 MB per
    million chunks instead of 115 MB as 32-character strings."""

    def __init__(self) -> None:
        self._names: set[bytes] = set()

    def add(self, chunk_hash: str) -> None:
        self._names.add(bytes.fromhex(chunk_hash))

    def __contains__(self, chunk_hash: object) -> bool:
        return isinstance(chunk_hash, str) and bytes.fromhex(chunk_hash) in self._names

    def __len__(self) -> int:
        return len(self._names)


#: progress(report): called often (the caller throttles), report.phase says where
Progress = Callable[[GcReport, float | None], None]


class FastTier(Protocol):
    """A fast tier in front of the store (pipeline/fasttools.py): its references count in
    every listing pass, and it is cleaned after the store's mark."""

    def add_references(self, refs: References, report: GcReport) -> None:
        """At the start of each listing pass, before the store's own listings: every
        chunk the fast tier's manifests and pending records name. GcError when one is
        damaged (what it names is unknown)."""

    def clean(self, refs: References, report: GcReport) -> None:
        """After the mark: the fast tier's old chunks that `refs` does not name leave it."""


def _no_progress(report: GcReport, fraction: float | None) -> None:
    return None


def collect(store: Store, grace: float = DEFAULT_GRACE, *, dry_run: bool = False,
            prefixes: tuple[str, ...] = REFERENCE_PREFIXES,
            progress: Progress = _no_progress, fast: FastTier | None = None) -> GcReport:
    """One gc run over `store` (see the module docstring). With `dry_run` nothing is
    changed (only the clock probe is written and deleted). With a `fast` tier, what it
    names is referenced too, and it is cleaned at the end. Raises GcError, StoreError,
    NoEntry (not a ckptfs store) or FormatError when it cannot be done; stopping at any
    point, by an error or a kill, leaves a store that the next run completes."""
    if grace < 0:
        raise ConfigError(f"the grace must not be negative: {grace:g}")
    started = time.monotonic()
    inspection.read_info(store)  # refuses what is not a ckptfs store, or a newer format
    report = GcReport(store.url, grace, dry_run)
    report.store_time = store_time(store)
    report.cutoff = report.store_time - grace
    progress(report, None)
    # every manifest is read (a damaged one stops the run) before anything is changed
    refs = read_references(store, report, prefixes, progress, fast)
    crash_point("gc_references_read")
    if not dry_run:
        _delete_scratch(store, report)
    report.phase = "trash"
    for info in trash.expire(store, report.store_time, dry_run):
        report.trash_expired.add(info.size)
    crash_point("gc_trash_expired")
    sweep(store, refs, report, progress)
    crash_point("gc_swept")
    mark(store, refs, report, progress)
    if fast is not None:
        report.phase = "fast"
        fast.clean(refs, report)
    report.phase = "done"
    report.seconds = time.monotonic() - started
    progress(report, 1.0)
    return report


def store_time(store: Store) -> float:
    """The store's clock now: the mtime of a probe object PUT under gc/ (then deleted)."""
    key = f"{GC}clock-{secrets.token_hex(8)}"
    retrying(store.put)(key, b"")
    try:
        crash_point("gc_clock_probe")
        info = retrying(store.stat)(key)
    finally:
        retrying(store.delete)(key)
    if info is None:
        raise GcError(f"the clock probe {key} vanished from {store.url} right after its PUT")
    return info.mtime


def _delete_scratch(store: Store, report: GcReport) -> None:
    """Delete the clock probes that killed runs left (older than SETTLED_AFTER)."""
    for info in store.scan(GC):
        if info.mtime <= report.store_time - SETTLED_AFTER:
            retrying(store.delete)(info.key)
            report.scratch_deleted += 1


# ---------------------------------------------------------------------------- references
def reader_of(store: Store) -> Callable[[ObjectInfo], bytes | BadObjectError | None]:
    """GET of a listed record, retried over transient errors; None if it vanished since
    the listing (deleted, or renamed away); the BadObjectError of one that cannot be a
    record (not a regular file, or larger than one may be), for the caller to report as
    a damaged one."""
    get = retrying(store.get_record)

    def fetch(info: ObjectInfo) -> bytes | BadObjectError | None:
        try:
            return get(info.key)
        except NotFoundError:
            return None
        except BadObjectError as e:
            return e

    return fetch


def read_references(store: Store, report: GcReport, prefixes: tuple[str, ...],
                    progress: Progress = _no_progress,
                    fast: FastTier | None = None) -> References:
    """Every chunk named by a manifest under `prefixes`, from LISTING_PASSES listings
    (and, with a `fast` tier, what it names, read first in each pass: a record moved
    meanwhile has its manifest in the store before the record goes).

    A pass starts listing only after the previous pass has read every manifest it
    listed, and re-reads only the manifests whose token (size and ETag, or size, mtime
    and inode) it has not read yet. A manifest that cannot be parsed stops the run
    (GcError): its chunks are unknown, and taking it for "no references" could free
    them. One that vanished between the listing and the GET is skipped: it was deleted,
    or renamed, and then a later pass, or the earlier one, saw it under its other name.
    """
    refs = References()
    read: dict[str, str] = {}  # manifest key -> token of the version read
    fetch = reader_of(store)
    for n in range(LISTING_PASSES):
        report.phase = "references" if n == 0 else f"references (pass {n + 1})"
        if fast is not None:
            fast.add_references(refs, report)

        def listed() -> Iterator[ObjectInfo]:
            for prefix in prefixes:
                for info in store.scan(prefix):
                    if info.key.endswith("/") or read.get(info.key) == info.token:
                        continue  # a marker (its key ends in '/'), or read as it is
                    if prefix == TRASH and trash.is_expired(info, report.store_time):
                        continue  # its time is up (left by a dry run): not a reference
                    yield info

        for info, blob in inspection.parallel_map(fetch, listed()):
            if blob is None:
                continue
            try:
                if isinstance(blob, BadObjectError):
                    raise blob
                m = Manifest.from_json(blob)
            except FormatError as e:
                raise GcError(f"unreadable manifest {info.key} in {store.url}: {e}; gc "
                              f"stopped, since it cannot tell which chunks that file needs "
                              f"(repair or delete the manifest, then run gc again)") from None
            read[info.key] = info.token
            report.manifests.add(len(blob))
            report.trash_manifests += info.key.startswith(TRASH)
            if n > 0:
                report.manifests_reread += 1
            for h, _ in m.chunks:
                refs.add(h)
            report.referenced = len(refs)
            progress(report, None)
    return refs


# ---------------------------------------------------------------------------- sweep
def sweep(store: Store, refs: References, report: GcReport,
          progress: Progress = _no_progress) -> None:
    """Step 2: restore the referenced fossils, free the old unreferenced ones."""
    report.phase = "sweep"

    def todo() -> Iterator[tuple[ObjectInfo, str, bool]]:
        for info in store.scan(FOSSILS):
            h = manifests.chunk_name(info.key, FOSSILS)
            if h is None:
                report.others += 1
                continue
            report.fossils.add(info.size)
            progress(report, _fraction(h))
            if h in refs:
                yield info, h, True
            elif info.mtime <= report.cutoff:
                yield info, h, False
            else:
                report.kept_fossils.add(info.size)

    def one(item: tuple[ObjectInfo, str, bool]) -> str:
        info, h, referenced = item
        if report.dry_run:
            return RESTORED if referenced else FREED
        if referenced:
            return _restore(store, info, h, report.store_time - SETTLED_AFTER)
        return _free(store, info, report.cutoff)

    for (info, h, _), outcome in inspection.parallel_map(one, todo()):
        _count(report, outcome, info, h)


def _restore(store: Store, fossil: ObjectInfo, h: str, settled: float) -> str:
    """Put a referenced fossil back in chunks/. If chunks/<h> is there already (uploaded
    again by a writer, restored by another run, or not yet deleted by a run moving it to
    fossils/), the fossil is a duplicate: deleted if its store time is at or before
    `settled`, else kept for a later run (deleting the copy of a move in flight would
    lose the chunk when that move deletes it). Otherwise it is moved back (S3: copy,
    then delete the fossil)."""
    chunk_key = manifests.chunk_key(h)
    chunk = retrying(store.stat)(chunk_key)
    if chunk is not None and chunk.size == fossil.size:
        now = retrying(store.stat)(fossil.key)
        # (a second of slack: a listing and a HEAD may give a time at different precisions)
        if now is None or now.mtime >= fossil.mtime + 1.0:
            return VANISHED  # restored, or set aside again, by another run meanwhile
        if now.mtime > settled:
            return KEPT
        retrying(store.delete)(fossil.key)
    else:
        try:
            retrying(store.rename)(fossil.key, chunk_key)
        except NotFoundError:  # the fossil went meanwhile: another run restored it?
            return VANISHED if retrying(store.stat)(chunk_key) is not None else LOST
    crash_point("gc_fossil_restored")
    return RESTORED


def _free(store: Store, fossil: ObjectInfo, cutoff: float) -> str:
    """Delete an old unreferenced fossil, unless it was set aside again since the scan
    (by another gc run: it then has a new mtime and must wait its own grace)."""
    now = retrying(store.stat)(fossil.key)
    if now is None:
        return VANISHED
    if now.mtime > cutoff:
        return KEPT
    retrying(store.delete)(fossil.key)
    crash_point("gc_fossil_freed")
    return FREED


# ---------------------------------------------------------------------------- mark
def mark(store: Store, refs: References, report: GcReport,
         progress: Progress = _no_progress) -> None:
    """Step 3: set aside (rename to fossils/) every old chunk that is not referenced."""
    report.phase = "mark"

    def todo() -> Iterator[tuple[ObjectInfo, str]]:
        for info in store.scan(CHUNKS):
            h = manifests.chunk_name(info.key)
            if h is None:
                report.others += 1  # fsck reports these
                continue
            report.chunks.add(info.size)
            progress(report, _fraction(h))
            if h in refs:
                report.chunks_referenced.add(info.size)
            elif info.mtime <= report.cutoff:
                yield info, h
            else:
                report.kept_chunks.add(info.size)

    def one(item: tuple[ObjectInfo, str]) -> str:
        info, h = item
        if report.dry_run:
            return FOSSILIZED
        try:
            retrying(store.rename)(info.key, manifests.fossil_key(h))
        except NotFoundError:
            return VANISHED  # set aside by another run meanwhile
        crash_point("gc_chunk_fossilized")
        return FOSSILIZED

    for (info, h), outcome in inspection.parallel_map(one, todo()):
        _count(report, outcome, info, h)


def _count(report: GcReport, outcome: str, info: ObjectInfo, h: str) -> None:
    if outcome == LOST:
        log.error("chunk %s is named by a manifest but is in neither chunks/ nor fossils/ "
                  "of %s", h, report.url)
        report.lost.append(h)
    elif outcome == VANISHED:
        report.vanished += 1
    else:
        tally = {RESTORED: report.restored, FREED: report.freed,
                 KEPT: report.kept_fossils, FOSSILIZED: report.fossilized}[outcome]
        tally.add(info.size)


def _fraction(h: str) -> float:
    """How far a scan in key order has come when it reaches chunk `h`."""
    return int(h[:4], 16) / 0x10000


def check_grace(grace: float, no_writers: bool) -> None:
    """ConfigError for a grace below MIN_SAFE_GRACE unless the caller says that no mount
    writes to the store during the run (then any grace, 0 included, is safe)."""
    if grace < MIN_SAFE_GRACE and not no_writers:
        raise ConfigError(
            f"--grace below {MIN_SAFE_GRACE / 3600:g}h is not safe while mounts write to "
            f"the store (a chunk a writer deduplicated against could be freed before its "
            f"manifest is published); add --no-writers if no mount writes to it from the "
            f"start of this run to the end of the next one")

