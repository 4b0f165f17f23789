"""The trash: the manifests and directory markers that deletes set aside under trash/ for a
while, so that a delete, an `rm -rf` too, can be undone from any node (`ckptfs trash`).

A delete through a mount (unlink, rmdir, a rename over an existing file) and `ckptfs prune`
first copy each manifest or marker to `trash/<batch>/<path>` and then delete it; the
batch names when, on which node and for how long (docs/FORMAT.md, "Trash"). A publish
that replaces a file keeps the replaced manifest there too (keep_version): the versions
of a path, numbered newest first, that `trash restore --version` picks from. Nothing
reads the trash but this module and gc, which counts its manifests as references until
they expire (store time of the trash object + the batch's keep) and then deletes them.
"""

from __future__ import annotations

import calendar
import logging
import math
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ckptfs.common.config import LIMITS
from ckptfs.common.errors import (
    BadObjectError,
    ConfigError,
    FormatError,
    KeyTooLongError,
    NoEntry,
    NotFoundError,
)
from ckptfs.common.units import format_duration, parse_duration
from ckptfs.format import manifests
from ckptfs.format.manifests import FILES, TRASH, DirMarker, Manifest
from ckptfs.store.base import ObjectInfo, Store
from ckptfs.tools import inspection

log = logging.getLogger(__name__)

#: copies to the trash of one batch of deletes at a time
#: keys per delete_many call (S3's DeleteObjects takes at most 1000)
DELETE_BATCH = 1000
#: a batch: <UTC time>-<keep>-<sequence>-<node>, e.g. 20261201T053300Z-24h-41-gpu-node-07
BATCH = re.compile(r"(\d{8}T\d{6}Z)-(\d+(?:\.\d+)?[smhd])-(\d+)-(.+)")


def batch_id(keep: float, seq: int, node: str, when: float | None = None) -> str:
    """The name of one batch of deletes: `when` (Unix seconds, the deleting node's clock:
    informational), how long its entries are kept, a sequence number, the node."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    return f"{stamp}-{format_duration(keep)}-{seq}-{node.replace('/', '_') or 'node'}"


def trash_key(batch: str, key: str) -> str:
    """Where the manifest or marker `key` (under files/) goes in the trash."""
    assert key.startswith(FILES) and key != FILES, key
    return f"{TRASH}{batch}/{key[len(FILES):]}"


def _copy(store: Store, src: str, dst: str) -> None:
    """Copy a manifest, or a marker (read and written again: SeaweedFS cannot copy the
    marker of a directory that has entries). NotFoundError if `src` is absent,
    BadObjectError if it cannot be a record (a directory store copies no symbolic link,
    FIFO or device; a marker is read only up to LIMITS.record_bytes)."""
    if src.endswith("/"):
        store.put(dst, store.get_record(src))
    else:
        store.copy(src, dst)


def keep(store: Store, key: str, batch: str) -> bool:
    """Copy the manifest or marker `key` to the trash before it is deleted; True if copied.

    A directory without a marker gets an empty one, so that its deletion is on record. A
    key too long for the store once it is under the trash is not kept (logged), nor is
    what cannot be a record (a symbolic link, FIFO or device in a directory store, an
    oversized marker: logged): the delete still goes ahead."""
    dst = trash_key(batch, key)
    try:
        _copy(store, key, dst)
        return True
    except NotFoundError:
        # never published, or deleted already (a replay: then it is kept already)
        if key.endswith("/") and store.head(dst) is None:
            store.put(dst, b"")
        return False
    except KeyTooLongError as e:
        log.warning("not kept in the trash (%s): %s", e, manifests.path_of_key(key))
        return False
    except BadObjectError as e:
        log.warning("not kept in the trash, not a record (%s): %s", e,
                    manifests.path_of_key(key))
        return False


def keep_version(store: Store, path: str, manifest: bytes, batch: str) -> None:
    """Put the manifest of a version of the file `path` that a publish replaced into the
    trash (one PUT): kept like a delete, and restorable with `trash restore --version`.
    A key too long for the store once it is under the trash is not kept (logged)."""
    try:
        store.put(trash_key(batch, manifests.file_key(path)), manifest)
    except KeyTooLongError as e:
        log.warning("previous version not kept in the trash (%s): %s", e, path)


def keep_all(store: Store, keys: Iterable[str], batch: str) -> None:
    """keep() each key: the directories' markers first, parents before children, then the
    files, LIMITS.trash_threads at a time. (On SeaweedFS, a marker PUT at the same moment as a
    child's can be missing from later listings: it was, in the trash, in 2 of 40 copies
    of a directory of 5 files made all at once, and the directory's deletion was then
    off the record.)"""
    keys = list(keys)
    for key in sorted((k for k in keys if k.endswith("/")), key=lambda k: k.count("/")):
        keep(store, key, batch)
    files = [k for k in keys if not k.endswith("/")]
    if len(files) <= 1:
        for key in files:
            keep(store, key, batch)
        return
    with ThreadPoolExecutor(LIMITS.trash_threads, thread_name_prefix="ckptfs-trash") as pool:
        list(pool.map(lambda k: keep(store, k, batch), files))


# ---------------------------------------------------------------------------- reading
@dataclass
class Entry:
    """One manifest or marker in the trash."""

    key: str            # trash/<batch>/<path>, with a trailing '/' for a directory
    batch: str
    path: str           # where it was, relative to the filesystem root
    is_dir: bool
    deleted: float      # store time of the trash object: when it was set aside
    keep: float         # seconds it is kept from then (inf: a batch name not understood)
    node: str
    size: int = 0       # a file's size (read_sizes), 0 for a directory
    symlink: bool = False
    damaged: str | None = None  # why its manifest or marker is damaged (read_sizes)
    version: int = 0    # a file's: 1 for the newest of its path in the trash, 2, ...

    @property
    def expires(self) -> float:
        return self.deleted + self.keep

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "dir": self.is_dir, "key": self.key,
                "deleted": self.deleted, "expires": None if math.isinf(self.keep)
                else self.expires, "node": self.node, "size": self.size,
                "damaged": self.damaged,
                **({"version": self.version} if self.version else {})}


def parse(info: ObjectInfo) -> Entry | None:
    """The entry of a listed trash object; None for a key outside the layout."""
    batch, _, rest = info.key[len(TRASH):].partition("/")
    path = rest.rstrip("/")
    try:
        manifests.check_path(path)
    except ConfigError:
        return None
    if not path:
        return None
    m = BATCH.fullmatch(batch)
    try:
        kept, node = (parse_duration(m.group(2)), m.group(4)) if m else (math.inf, "?")
    except ConfigError:  # a keep beyond what a writer may give: never expires, as unread
        kept, node = math.inf, "?"
    return Entry(info.key, batch, path, rest.endswith("/"), info.mtime, kept, node)


def is_expired(info: ObjectInfo, now: float) -> bool:
    """Whether a trash object's time is up at store time `now` (gc deletes it then)."""
    entry = parse(info)
    return entry is not None and entry.expires <= now


def _under(path: str, root: str) -> bool:
    return not root or path == root or path.startswith(root + "/")


def entries(store: Store, path: str = "") -> list[Entry]:
    """Every trash entry at or under `path` ("" for all), oldest deletion first, each
    file's numbered among the versions of its path (Entry.version)."""
    found = [e for e in (parse(i) for i in store.scan(TRASH))
             if e is not None and _under(e.path, path)]
    found.sort(key=lambda e: (e.deleted, e.key))
    seen: dict[str, int] = {}
    for e in reversed(found):  # newest first
        if not e.is_dir:
            e.version = seen[e.path] = seen.get(e.path, 0) + 1
    return found


def pick_version(found: list[Entry], path: str, version: str) -> Entry:
    """The version of the file `path` that `version` names: N (1 is the newest in the
    trash), or a UTC time as `trash ls` shows it (the newest set aside at or before it).
    NoEntry if there is no such version; ConfigError if `version` is neither."""
    kept = sorted((e for e in found if e.path == path and not e.is_dir),
                  key=lambda e: e.version)
    if version.isdigit():
        chosen = [e for e in kept if e.version == int(version)]
    else:
        when = parse_utc(version)
        chosen = [e for e in kept if math.floor(e.deleted) <= when][:1]
    if not chosen:
        raise NoEntry(f"no version {version} of {path or 'the root'} in the trash (it "
                      f"holds {len(kept)}: ckptfs trash ls lists them)")
    return chosen[0]


#: the UTC times --version takes: as `trash ls` shows them, and ISO 8601
UTC_FORMATS = ("%Y-%m-%d %H:%M:%S UTC", "%Y-%m-%d %H:%M:%SZ", "%Y-%m-%dT%H:%M:%SZ",
               "%Y-%m-%d %H:%M UTC", "%Y%m%dT%H%M%SZ")


def parse_utc(text: str) -> float:
    """Unix seconds of a UTC time in one of UTC_FORMATS; ConfigError otherwise."""
    for fmt in UTC_FORMATS:
        try:
            return float(calendar.timegm(time.strptime(text.strip(), fmt)))
        except ValueError:
            continue
    raise ConfigError(f"--version {text}: give a number (1 is the newest version in the "
                      f"trash) or a UTC time as ckptfs trash ls shows it "
                      f"(2026-12-01 05:33:00 UTC)")


def parse_entry(blob: bytes, is_dir: bool) -> Manifest | None:
    """The manifest of a file's trash entry (None for a directory's marker), checked as
    every reader checks it; FormatError if it is damaged."""
    if is_dir:
        DirMarker.from_json(blob)
        return None
    return Manifest.from_json(blob)


def read_sizes(store: Store, found: list[Entry]) -> None:
    """Fill in the size of each file entry from its manifest, and `damaged` of each entry
    whose manifest or marker is damaged (16 GETs at a time)."""
    def size(e: Entry) -> tuple[int, bool, str | None]:
        try:
            m = parse_entry(store.get_record(e.key), e.is_dir)
        except NotFoundError:
            return 0, False, None
        except FormatError as why:  # a BadObjectError too: not a file, or too large
            return 0, False, str(why)
        if m is None:  # a directory
            return 0, False, None
        return (0 if m.is_symlink else m.size), m.is_symlink, None
    for e, (n, link, damaged) in inspection.parallel_map(size, found):
        e.size, e.symlink, e.damaged = n, link, damaged


# ---------------------------------------------------------------------------- ls
@dataclass
class Item:
    """What `trash ls` shows on one line: a deleted file, or a deleted directory with the
    entries that went with it (deleted before it, as `rm -rf` does, or in its batch)."""

    head: Entry
    members: list[Entry] = field(default_factory=list)  # the head included

    @property
    def files(self) -> int:
        return sum(not e.is_dir for e in self.members)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.members)

    def to_dict(self) -> dict[str, object]:
        return {**self.head.to_dict(), "files": self.files, "bytes": self.bytes}


def items(found: list[Entry]) -> list[Item]:
    """Group entries as `trash ls` shows them, newest deletion first: each entry goes with
    the outermost deleted directory above it that was deleted at or after it (or in the
    same batch), choosing that directory's earliest such deletion."""
    dirs: dict[str, list[Entry]] = {}
    for e in found:  # oldest first
        if e.is_dir:
            dirs.setdefault(e.path, []).append(e)
    groups: dict[str, Item] = {}
    for e in found:
        head = e
        parts = e.path.split("/")
        for i in range(1, len(parts) + 1):
            for d in dirs.get("/".join(parts[:i]), ()):
                if d is e or d.batch == e.batch or d.deleted >= e.deleted:
                    head = d
                    break
            if head is not e:
                break
        groups.setdefault(head.key, Item(head)).members.append(e)
    return sorted(groups.values(), key=lambda it: (it.head.deleted, it.head.key), reverse=True)


# ---------------------------------------------------------------------------- restore
@dataclass
class Restored:
    """restore(): what came back, and what was left in the trash and why."""

    path: str
    to: str
    dry_run: bool = False
    restored: list[Entry] = field(default_factory=list)
    skipped: list[tuple[Entry, str]] = field(default_factory=list)

    def destination(self, e: Entry) -> str:
        """Where the entry `e` (at or under `path`) is restored."""
        rest = e.path[len(self.path):]
        return self.to + rest if self.to else rest.lstrip("/")

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "to": self.to, "dry_run": self.dry_run,
                "restored": [e.to_dict() for e in self.restored],
                "files": sum(not e.is_dir for e in self.restored),
                "bytes": sum(e.size for e in self.restored),
                "skipped": [{**e.to_dict(), "why": why} for e, why in self.skipped]}


def newest(found: list[Entry]) -> list[Entry]:
    """The newest deletion of each path (a file and a directory of one name apart)."""
    latest: dict[tuple[str, bool], Entry] = {}
    for e in found:  # oldest first: the last one wins
        latest[(e.path, e.is_dir)] = e
    return sorted(latest.values(), key=lambda e: e.path)


def restore(store: Store, path: str, to: str | None = None, dry_run: bool = False,
            version: str | None = None,
            busy: Callable[[str], str | None] | None = None) -> Restored:
    """Put back the newest trashed version of `path` and of everything under it (or, with
    `version`, that version of the file `path`: pick_version), at `to` (default: where it
    was). A name that exists again is left alone (skipped), and so is one for which
    `busy(destination)` gives a reason (a fast tier's pending changes to it). Each
    restored entry is copied back, then deleted from the trash. NoEntry if the trash
    holds nothing at or under `path`."""
    path = manifests.check_path(path.strip("/"))
    to = path if to is None else manifests.check_path(to.strip("/"))
    found = entries(store, path)
    chosen = newest(found) if version is None else [pick_version(found, path, version)]
    if not chosen:
        raise NoEntry(f"nothing at {path or 'the root'} in the trash of {store.url} "
                      f"(ckptfs trash ls lists it)")
    read_sizes(store, chosen)
    result = Restored(path, to, dry_run)

    def one(e: Entry) -> str | None:
        if e.damaged is not None:
            return f"damaged: {e.damaged}"
        dest = result.destination(e)
        if not dest and not e.is_dir:
            return "a file cannot take the place of the root directory"
        key = manifests.dir_key(dest) if e.is_dir else manifests.file_key(dest)
        why_not = busy(dest) if busy is not None else None
        if why_not:
            return why_not
        if dest:
            store.check_length(key)
            if e.is_dir and store.head(manifests.file_key(dest)) is not None:
                return f"a file {dest} is there"
            if not e.is_dir and store.head(key) is not None:
                return f"{dest} exists"
            if not e.is_dir and (store.head(key + "/") is not None
                                 or store.list(key + "/", delimiter="/").objects):
                return f"a directory {dest} is there"
        if dry_run:
            return None
        try:
            # what is checked is what is published: these bytes, read once and parsed,
            # never a second read (or copy) of a key that may have changed meanwhile
            blob = store.get_record(e.key)
            m = parse_entry(blob, e.is_dir)
        except NotFoundError:
            return "gone from the trash meanwhile (emptied, or expired and collected)"
        except FormatError as why:  # damaged since read_sizes looked
            return f"damaged: {why}"
        if m is not None:
            e.size, e.symlink = (0 if m.is_symlink else m.size), m.is_symlink
        # written only where nothing is: a file published there since the checks above
        # is never overwritten (atomic where the store has a conditional write;
        # docs/FORMAT.md, "Trash"); a directory that exists again keeps its own marker
        # (mode and mtime)
        if dest and not store.put_if_absent(key, blob) and not e.is_dir:
            return f"{dest} exists (published while this restore ran)"
        store.delete(e.key)
        return None

    # the directories first: their markers are in place before their entries arrive
    for group in ([e for e in chosen if e.is_dir], [e for e in chosen if not e.is_dir]):
        for e, why in inspection.parallel_map(one, group):
            if why is None:
                result.restored.append(e)
            else:
                result.skipped.append((e, why))
    result.restored.sort(key=lambda e: e.path)
    result.skipped.sort(key=lambda s: s[0].path)
    return result


# ---------------------------------------------------------------------------- empty
def empty(store: Store, path: str = "", dry_run: bool = False) -> list[Entry]:
    """Delete every trash entry at or under `path` now (gc then frees what only they
    kept); returns them."""
    found = entries(store, manifests.check_path(path.strip("/")))
    read_sizes(store, found)
    if not dry_run:
        keys = [e.key for e in found]
        for i in range(0, len(keys), DELETE_BATCH):
            store.delete_many(keys[i:i + DELETE_BATCH])
    return found


def expire(store: Store, now: float, dry_run: bool = False) -> Iterator[ObjectInfo]:
    """Delete (unless `dry_run`) the trash objects whose time is up at store time `now`;
    yields each one."""
    doomed: list[ObjectInfo] = []
    for info in store.scan(TRASH):
        if is_expired(info, now):
            doomed.append(info)
            yield info
        if len(doomed) == DELETE_BATCH:
            if not dry_run:
                store.delete_many([i.key for i in doomed])
            doomed.clear()
    if doomed and not dry_run:
        store.delete_many([i.key for i in doomed])


def this_node() -> str:
    """The node name in the batches of a command run here (prune): `<host>-cli`, in the
    form of a mount's `<node id>-<cache id>` (the host, then what on it deleted)."""
    return f"{socket.gethostname()}-cli"
