"""Space used by the checkpoint directories of a store (`ckptfs du`): logical bytes,
stored bytes referenced, bytes unique to each directory, what deduplication and
compression save, and what gc would free.

One run:

1. Stored sizes: stream the listings of chunks/ and fossils/ into one map of chunk name
   (16 bytes) -> stored size. A fossil whose chunk is also in chunks/ is a duplicate
   that gc deletes whatever happens: it counts as unreferenced.
2. References: read every manifest under files/ once (16 at a time), one checkpoint
   directory (a directory directly under PATH) after another, then the rest of the
   store. Each chunk gets one small number saying who names it: one directory only
   (which), several directories under PATH, only files outside PATH, or both. A
   directory's referenced bytes come from a set of its distinct chunks, dropped once the
   directory is read. Manifests give each chunk's length before compression, so the
   dedup ratio (logical bytes / distinct chunk bytes) and the compression ratio
   (distinct chunk bytes / stored bytes) need no chunk to be read.
3. Sums: a directory's unique bytes are the stored sizes of the chunks that it alone
   names (what deleting it would let gc free); PATH's are those named by nothing
   outside PATH; unreferenced bytes are the chunk objects and fossils that no manifest
   names (what gc frees once they are older than its grace). The trash's manifests
   name chunks as files outside PATH do: gc keeps those until the trash time is up.

The numbers are a snapshot: files published while it runs may or may not be counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ckptfs.common.errors import BadObjectError, FormatError, NoEntry
from ckptfs.format import manifests
from ckptfs.format.manifests import CHUNKS, FILES, FOSSILS, TRASH, Manifest
from ckptfs.store.base import ObjectInfo, Store
from ckptfs.tools import inspection
from ckptfs.tools.gc import Tally, reader_of
from ckptfs.tools.inspection import Tiers

#: who names a chunk, besides a directory's index (>= 0: that directory alone)
SEVERAL = -1   # several groups under PATH, nothing outside it
OUTSIDE = -2   # only files outside PATH
BOTH = -3      # files under PATH and outside it


@dataclass
class DirUsage:
    """The space of one directory (or of PATH as a whole)."""

    path: str
    files: int = 0
    logical_bytes: int = 0                               # sum of the file sizes
    referenced: Tally = field(default_factory=Tally)     # distinct chunks its files name
    referenced_raw: int = 0  # those chunks' bytes before compression
    unique: Tally = field(default_factory=Tally)         # of those, named by nothing else
    fast: Tally = field(default_factory=Tally)  # of those, in the fast tier
    pending: Tally = field(default_factory=Tally)  # of those, in the fast tier alone

    @property
    def dedup_ratio(self) -> float | None:
        """Logical bytes per byte of distinct chunk content: what deduplication saves."""
        return round(self.logical_bytes / self.referenced_raw, 3) if self.referenced_raw else None

    @property
    def compression_ratio(self) -> float | None:
        """Distinct chunk content per stored byte: what compression saves."""
        return (round(self.referenced_raw / self.referenced.bytes, 3)
                if self.referenced.bytes else None)

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "files": self.files, "logical_bytes": self.logical_bytes,
                "referenced_chunks": self.referenced.count,
                "referenced_bytes": self.referenced.bytes,
                "referenced_raw_bytes": self.referenced_raw,
                "unique_chunks": self.unique.count, "unique_bytes": self.unique.bytes,
                "dedup_ratio": self.dedup_ratio, "compression_ratio": self.compression_ratio,
                "fast_chunks": self.fast.count, "fast_bytes": self.fast.bytes,
                "pending_chunks": self.pending.count, "pending_bytes": self.pending.bytes}


@dataclass
class UsageReport:
    """du(): each checkpoint directory under PATH, PATH as a whole, the store's totals."""

    url: str
    path: str
    dirs: list[DirUsage] = field(default_factory=list)
    total: DirUsage = field(default_factory=lambda: DirUsage(""))
    stored: Tally = field(default_factory=Tally)        # every chunk object, fossils included
    fossils: Tally = field(default_factory=Tally)       # of those, under fossils/
    unreferenced: Tally = field(default_factory=Tally)  # named by no manifest: gc frees them
    trash: Tally = field(default_factory=Tally)  # files in the trash, their logical bytes
    missing: int = 0          # chunks a manifest names, found in neither chunks/ nor fossils/
    unreadable: list[str] = field(default_factory=list)  # manifests that cannot be parsed
    # with a fast tier (its URL): its chunk objects, and those the object store lacks
    fast_url: str | None = None
    fast: Tally = field(default_factory=Tally)
    pending: Tally = field(default_factory=Tally)
    records: int = 0  # pending records in the fast tier (its caller counts them)

    def to_dict(self) -> dict[str, object]:
        return {"store": self.url, "path": self.path,
                "dirs": [d.to_dict() for d in self.dirs], "total": self.total.to_dict(),
                "stored_chunks": self.stored.count, "stored_bytes": self.stored.bytes,
                "fossils": self.fossils.count, "fossil_bytes": self.fossils.bytes,
                "unreferenced_chunks": self.unreferenced.count,
                "unreferenced_bytes": self.unreferenced.bytes,
                "trash_files": self.trash.count, "trash_logical_bytes": self.trash.bytes,
                "missing_chunks": self.missing, "unreadable_manifests": self.unreadable,
                "fast_tier": None if self.fast_url is None else {
                    "url": self.fast_url, "chunks": self.fast.count, "bytes": self.fast.bytes,
                    "pending_chunks": self.pending.count,
                    "pending_bytes": self.pending.bytes, "pending_records": self.records}}


def combine(state: int | None, group: int) -> int:
    """Who names a chunk once `group` (a directory's index, or OUTSIDE) names it too."""
    if state is None or state == group:
        return group
    inside = state >= 0 or state in (SEVERAL, BOTH) or group >= 0
    outside = state in (OUTSIDE, BOTH) or group == OUTSIDE
    if outside:
        return BOTH if inside else OUTSIDE
    return SEVERAL


def stored_sizes(store: Store, report: UsageReport, tiers: Tiers | None = None
                 ) -> tuple[dict[bytes, int], set[bytes], set[bytes]]:
    """Chunk name -> stored size, from streamed listings of chunks/ and fossils/; with
    `tiers`, those of the object store, then of the fast tier's chunks/; and the names
    of the chunks in the fast tier, and of those in it alone (pending: the movers copy
    them)."""
    if tiers is not None:
        store = tiers.slow
    sizes: dict[bytes, int] = {}
    for info in store.scan(CHUNKS):
        h = manifests.chunk_name(info.key)
        if h is not None:
            sizes[bytes.fromhex(h)] = info.size
            report.stored.add(info.size)
    for info in store.scan(FOSSILS):
        h = manifests.chunk_name(info.key, FOSSILS)
        if h is None:
            continue
        report.stored.add(info.size)
        report.fossils.add(info.size)
        name = bytes.fromhex(h)
        if name in sizes:  # also in chunks/: gc deletes this copy, referenced or not
            report.unreferenced.add(info.size)
        else:
            sizes[name] = info.size
    fast: set[bytes] = set()
    fast_only: set[bytes] = set()
    if tiers is not None:
        report.fast_url = tiers.fast.url
        for info in tiers.fast.scan(CHUNKS):
            h = manifests.chunk_name(info.key)
            if h is None:
                continue
            report.fast.add(info.size)
            name = bytes.fromhex(h)
            fast.add(name)
            if name not in sizes:
                sizes[name] = info.size
                fast_only.add(name)
                report.pending.add(info.size)
    return sizes, fast, fast_only


def _manifests(store: Store, infos: Iterator[ObjectInfo], report: UsageReport
               ) -> Iterator[tuple[str, Manifest]]:
    """(key, manifest) of the listed keys (markers skipped), read 16 at a time; one that
    vanished since the listing is skipped, one that cannot be parsed is recorded."""
    fetch = reader_of(store)
    keys = (i for i in infos if not i.key.endswith("/"))
    for info, blob in inspection.parallel_map(fetch, keys):
        if blob is None:
            continue
        try:
            if isinstance(blob, BadObjectError):
                raise blob
            yield info.key, Manifest.from_json(blob)
        except FormatError:
            report.unreadable.append(info.key)


def du(store: Store, path: str = "", tiers: Tiers | None = None) -> UsageReport:
    """The space used under directory `path` (see the module docstring). NoEntry when the
    store has no directory at `path` or is not a ckptfs store. With `tiers` (`store` is
    their view), a chunk counts in whichever tier holds it; the fast tier's chunks that
    the object store lacks are `pending` (per directory too); `stored` and unreferenced
    chunks are the object store's alone (gc never looks at the fast tier)."""
    path = manifests.check_path(path.strip("/"))
    inspection.read_info(store)
    prefix = manifests.dir_prefix(path)
    listing = store.list(prefix, delimiter="/")
    if path and not listing.objects and not listing.prefixes:
        raise NoEntry(f"no such directory in the store: {path}")
    report = UsageReport(store.url, path, total=DirUsage(path))
    sizes, fast, fast_only = stored_sizes(store, report, tiers)
    # in step order, as prune and latest order them: checkpoint-2 before checkpoint-10
    names = sorted((p[len(prefix):].rstrip("/") for p in listing.prefixes),
                   key=lambda n: (inspection.checkpoint_order_key(n), n))
    report.dirs = [DirUsage(manifests.join(path, n)) for n in names]
    states: dict[bytes, int] = {}
    raw: dict[bytes, int] = {}  # chunk name -> its length before compression
    missing: set[bytes] = set()

    def account(m: Manifest, group: int, usage: DirUsage | None,
                seen: set[bytes] | None) -> None:
        for d in (usage, report.total) if group != OUTSIDE else ():
            if d is not None and not m.is_symlink:
                d.files += 1
                d.logical_bytes += m.size
        for h, length in m.chunks:
            name = bytes.fromhex(h)
            states[name] = combine(states.get(name), group)
            raw[name] = length
            if name not in sizes:
                missing.add(name)
            elif seen is not None and usage is not None and name not in seen:
                seen.add(name)
                usage.referenced.add(sizes[name])
                usage.referenced_raw += length
                if name in fast:
                    usage.fast.add(sizes[name])
                if name in fast_only:
                    usage.pending.add(sizes[name])

    # the checkpoint directories, one at a time
    for i, d in enumerate(report.dirs):
        seen: set[bytes] = set()
        for _, m in _manifests(store, store.scan(manifests.dir_prefix(d.path)), report):
            account(m, i, d, seen)
    # the rest: files directly in PATH (a group of their own), and the store outside PATH
    top = len(report.dirs)

    def in_a_directory(key: str) -> bool:
        return key.startswith(prefix) and "/" in key[len(prefix):].rstrip("/")

    rest = (i for i in store.scan(FILES) if not in_a_directory(i.key))
    for key, m in _manifests(store, rest, report):
        account(m, top if key.startswith(prefix) else OUTSIDE, None, None)
    # the trash keeps its files' chunks until their time is up, as files outside PATH do
    for _, m in _manifests(store, store.scan(TRASH), report):
        account(m, OUTSIDE, None, None)
        if not m.is_symlink:
            report.trash.add(m.size)

    for name, state in states.items():
        size = sizes.get(name)
        if size is None:
            continue
        if state == OUTSIDE:
            continue
        report.total.referenced.add(size)
        report.total.referenced_raw += raw[name]
        if name in fast:
            report.total.fast.add(size)
        if name in fast_only:
            report.total.pending.add(size)
        if state == BOTH:
            continue
        report.total.unique.add(size)
        if 0 <= state < top:
            report.dirs[state].unique.add(size)
    for name, size in sizes.items():
        if name not in states and name not in fast_only:
            report.unreferenced.add(size)
    report.missing = len(missing)
    report.unreadable.sort()
    return report
