"""Directory listings and name look-ups from the store, merged into the local tree.

A negative answer (no such name, a listing without it) is never taken from this node's
past, because another node can make the name at any moment: a listing (readdir) sends a
LIST unless one was sent after it was asked, and a look-up of a name this node does not
know asks the store for that one name (look_up). Positive entries are trusted for
--metadata-ttl: a lookup of a known name lists its directory again at most once per TTL,
which is how an entry removed elsewhere leaves the tree (docs/SEMANTICS.md).

The merge never undoes what this node changed and has not yet seen in the store (recent
changes, pending ops, files being written); an entry that is gone from the store leaves
the tree and the kernel's cache (`on_gone`). After a crash, the first listings wait for
the journal's ops to reach the store, so that no file closed before the crash is
missing. A directory never listed answers EIO during a store outage (StoreUnavailable):
an empty answer would say "no checkpoint here"; after a failed request, negative
answers come from the last view for one TTL without asking again. A file whose manifest
is damaged stays listed, marked damaged (EIO on it), with one log line per damaged key;
a damaged directory marker leaves its directory with the default mode.
"""

from __future__ import annotations

import logging
import math
import stat
import time
from collections.abc import Callable
from typing import TypeVar

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.errors import (
    DamagedRecord,
    FormatError,
    InvalidKeyError,
    NotFoundError,
    PartialListing,
    StoreError,
    StoreUnavailable,
)
from ckptfs.common.retry import retrying_async
from ckptfs.format import manifests
from ckptfs.format.manifests import DirMarker, Manifest
from ckptfs.fs.namespace import DirNode, FileNode, InodeTable, Node
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.base import AsyncStore

log = logging.getLogger(__name__)
T = TypeVar("T")



class Lister:
    """Refreshes directories from the store (one LIST at a time per directory)."""

    def __init__(self, store: AsyncStore, publisher: Publisher, table: InodeTable,
                 metadata_ttl: float, publish_timeout: float,
                 pinned: Callable[[Node], bool]) -> None:
        self.store = store
        self.publisher = publisher
        self.table = table
        self.metadata_ttl = metadata_ttl
        self.publish_timeout = publish_timeout
        self.pinned = pinned  # local state a listing must not overwrite
        # told (parent inode, name) of every entry a listing removed: the kernel's cache
        self.on_gone: Callable[[int, str], None] = lambda inode, name: None
        self._locks: dict[int, trio.Lock] = {}
        self._recovery_waited = False  # listings waited (once) for the journal's ops
        self._damaged: dict[str, str] = {}  # damaged record key -> why, as last logged
        self._failed_at = -math.inf  # monotonic time of the last failed LIST or look-up

    async def list_root(self) -> None:
        """List the root before the mount is ready, so that a store outage just after
        mounting does not leave it without a view (EIO, see refresh). The first access
        lists it again, as on any new mount (the TTL is not started here). Skipped while
        ops from the journal wait to be applied: the store's listing would lack them."""
        if self.publisher.pending_count:
            return
        try:
            await self.refresh(self.table.root)
        except StoreUnavailable as e:
            log.warning("%s", e)
        self.table.root.listed_at = 0.0

    async def refresh(self, dnode: DirNode, force: bool = False,
                      since: float | None = None) -> None:
        """Bring a directory's children up to date with the store: at most once per TTL,
        or, `force`, now; or, with `since` (a time.monotonic() value), unless a LIST sent
        at or after `since` is merged already: the answer to a question asked then."""
        lock = self._locks.setdefault(dnode.inode, trio.Lock())
        async with lock:
            if dnode.removed:
                return
            now = time.monotonic()
            if since is not None:
                if dnode.list_sent >= since or (dnode.listed and self._store_failing(now)):
                    return
            elif not force and now - dnode.listed_at < self.metadata_ttl:
                return
            path = dnode.path
            if not await self._settled(path, wait=since is not None):
                return  # our own unapplied ops: the local view is newer than the store
            prefix = manifests.dir_prefix(path)
            applied_before = self.publisher.applied_seq
            sent = time.monotonic()
            try:
                listing = await retrying_async(self.store.list, prefix)
            except PartialListing as e:  # the object store down, a fast tier's part: add it
                self._failed_at = dnode.listed_at = time.monotonic()
                log.warning("cannot list %s/ in the store (serving the cached view and the "
                            "fast tier's names): %s", path, e)
                await self._merge(dnode, prefix, e.objects, e.prefixes, applied_before,
                                  additions=True)
                return
            except StoreError as e:  # store down: serve what we know, retry after the TTL
                self._failed_at = time.monotonic()
                if not dnode.listed:  # nothing known: an empty answer would say "no files"
                    log.warning("cannot list %s/ (never listed: EIO): %s", path, e)
                    raise StoreUnavailable(f"cannot list {path}/: {e}") from None
                log.warning("cannot list %s/ (serving the cached view): %s", path, e)
                dnode.listed_at = time.monotonic()
                return
            if dnode.removed or dnode.path != path:
                return  # moved or deleted here while listing: the listing is of the old path
            dnode.listed_at = time.monotonic()
            dnode.list_sent = sent
            dnode.listed = True
            await self._merge(dnode, prefix, listing.objects, listing.prefixes, applied_before)

    async def look_up(self, dnode: DirNode, name: str, since: float) -> None:
        """Ask the store whether `name`, which this node does not know, is in the
        directory (a question asked at `since`): one request for that name whatever the
        directory's size (Store.list_entry), merged as a listing of it would be. Nothing
        is asked when a LIST sent after `since` has answered already, or while the store
        is failing (then the local view answers, see the module docstring)."""
        lock = self._locks.setdefault(dnode.inode, trio.Lock())
        async with lock:
            if (dnode.removed or dnode.list_sent >= since or name in dnode.children
                    or self._store_failing(time.monotonic())):
                return
            path = dnode.path
            if not await self._settled(path, wait=True):
                return
            prefix = manifests.dir_prefix(path)
            applied_before = self.publisher.applied_seq
            try:
                found = await retrying_async(self.store.list_entry, prefix, name)
            except StoreError as e:
                self._failed_at = time.monotonic()
                log.warning("cannot look up %s in the store (answering from this node's "
                            "view): %s", manifests.join(path, name), e)
                return
            except InvalidKeyError:
                return  # a name no key can hold is in no store
            if dnode.removed or dnode.path != path or name in dnode.children:
                return
            await self._merge(dnode, prefix, found.objects, found.prefixes, applied_before,
                              only=name)

    def _store_failing(self, now: float) -> bool:
        """Whether a listing or look-up failed less than a TTL ago: negative answers then
        come from the local view, without a request that would wait out the retries."""
        return now - self._failed_at < self.metadata_ttl

    async def _settled(self, path: str, wait: bool) -> bool:
        """Whether no op of this node on the directory `path` or above waits to be
        applied (a LIST would not show it yet); `wait`: wait for them first, up to the
        publish timeout (not while the store is failing). After a crash, the first
        question waits (once) for the ops recovered from the journal: files closed and
        directories made before the crash."""
        if self.publisher.is_pending(path) and not (
                wait and await self.publisher.wait_settled(path, self.publish_timeout)):
            return False
        recovered = self.publisher.recovered_seq
        if not self._recovery_waited and self.publisher.applied_seq < recovered:
            await self.publisher.wait_applied(recovered, self.publish_timeout)
            self._recovery_waited = True
        return True

    async def _merge(self, dnode: DirNode, prefix: str, objects: list[tuple[str, int]],
                     prefixes: list[str], applied_before: int, only: str | None = None,
                     additions: bool = False) -> None:
        """Merge a LIST of the directory into its children (`only`: a look-up's answer
        for that one name, which says nothing of the others; `additions`: a part of the
        directory, the fast tier's while the object store is unreachable, which removes
        nothing).

        `applied_before` is the publisher's applied_seq when the LIST was sent: an entry
        changed here by an op with a later seq (or not journaled yet) may be missing or
        stale in the listing, so the listing is ignored for that name.
        """
        recent = dnode.recent
        recent.forget_applied(applied_before)

        def changed_here(name: str) -> bool:
            return recent.changed_since(name, applied_before)

        remote_dirs = {p[len(prefix):-1] for p in prefixes if len(p) > len(prefix) + 1}
        remote_files = {k[len(prefix):]: size for k, size in objects if k != prefix}
        for name in remote_dirs:
            remote_files.pop(name, None)  # a directory wins over a stray manifest
        for name in [n for n in (*remote_dirs, *remote_files) if changed_here(n) or (
                n not in dnode.children
                and self.publisher.is_pending(manifests.join(dnode.path, n)))]:
            remote_dirs.discard(name)  # deleted or renamed away here, not yet in the store
            remote_files.pop(name, None)
        for name, known in list(dnode.children.items()):
            if (self.pinned(known) or changed_here(name) or only not in (None, name)
                    or additions):
                continue
            if name not in (remote_dirs if known.is_dir else remote_files):
                self._gone(dnode, known)
        to_read: list[tuple[str, int]] = []
        for name, size in remote_files.items():
            have = dnode.children.get(name)
            if have is None or (not self.pinned(have) and (
                    not isinstance(have, FileNode) or have.manifest_key_size != size
                    or have.damaged is not None)):  # read again: repaired meanwhile?
                to_read.append((name, size))
        new_dirs: list[str] = []
        for name in remote_dirs:
            if name not in dnode.children:
                try:
                    manifests.check_path(name)
                except InvalidKeyError:
                    log.warning("skipping unsafe directory name from store: %r", name)
                    continue
                new_dirs.append(name)
        if not to_read and not new_dirs:
            return
        results: dict[str, Manifest] = {}
        damaged: dict[str, str] = {}  # name -> why its manifest is damaged
        markers: dict[str, DirMarker] = {}
        limiter = trio.CapacityLimiter(LIMITS.list_concurrency)

        async def read_one(name: str) -> None:
            async with limiter:
                try:
                    m = await self.read_manifest(manifests.join(dnode.path, name))
                except DamagedRecord as e:
                    damaged[name] = str(e)
                    return
            if m is not None:
                results[name] = m

        async def read_marker(name: str) -> None:
            async with limiter:
                marker = await self.read_marker(manifests.join(dnode.path, name))
            if marker is not None:
                markers[name] = marker

        async with trio.open_nursery() as nursery:
            for name, _ in to_read:
                nursery.start_soon(read_one, name)
            for name in new_dirs:
                nursery.start_soon(read_marker, name)
        now_ns = time.time_ns()
        for name in new_dirs:  # mode and mtime from the directory marker (chmod, utime)
            if name not in dnode.children and not changed_here(name):
                marker = markers.get(name) or DirMarker()
                self.table.new_dir(dnode, name, marker.mode, marker.mtime_ns or now_ns,
                                   marker.uid, marker.gid)
        for name, size in to_read:
            m = results.get(name)
            why = damaged.get(name)
            child = dnode.children.get(name)
            if (m is None and why is None) or (child is not None and self.pinned(child)) or (
                    changed_here(name)):
                continue
            if child is not None and (not isinstance(child, FileNode) or (
                    m is not None and child.is_symlink != m.is_symlink)):
                self._gone(dnode, child)
                child = None
            if child is None:
                child = (self.table.new_file(dnode, name, m.mode, m.mtime_ns) if m is not None
                         else self.table.new_file(dnode, name, stat.S_IFREG, 0))
            assert isinstance(child, FileNode)
            if m is not None:
                child.set_manifest(m)
            else:  # listed, EIO on it; descriptors open on its last version still read it
                child.damaged = why
            child.manifest_key_size = size

    def _gone(self, dnode: DirNode, node: Node) -> None:
        """An entry deleted, renamed or replaced on another node leaves the tree here,
        and its name leaves the kernel's cache: the old name gives ENOENT at once."""
        self.table.detach(node)
        self.on_gone(dnode.inode, node.name)

    async def read_manifest(self, path: str) -> Manifest | None:
        """The file's manifest; None if it is absent or cannot be read now (a store
        error, an unsafe name: logged); DamagedRecord if it is damaged."""
        return await self._read_record(path, manifests.file_key, Manifest.from_json,
                                       "manifest", "EIO on it until it is repaired or deleted")

    async def read_marker(self, path: str) -> DirMarker | None:
        """The directory's marker; None if absent, unreadable now, or damaged (then the
        directory keeps the default mode)."""
        try:
            return await self._read_record(path, manifests.dir_key, DirMarker.from_json,
                                           "directory marker", "the directory shows mode 0755")
        except DamagedRecord:
            return None

    async def _read_record(self, path: str, key_of: Callable[[str], str],
                           parse: Callable[[bytes], T], what: str, then: str) -> T | None:
        """GET and parse a manifest or marker: None if absent or not readable now (logged),
        DamagedRecord if damaged (logged once per key and reason; `then` says what the
        user sees)."""
        try:
            key = key_of(path)
            record = parse(await retrying_async(self.store.get, key))
        except NotFoundError:
            self._damaged.pop(key, None)
            return None
        except FormatError as e:
            if self._damaged.get(key) != str(e):
                self._damaged[key] = str(e)
                log.error("damaged %s %s: %s; %s", what, key, e, then)
            raise DamagedRecord(f"damaged {what} {key}: {e}") from None
        except StoreError as e:
            log.warning("cannot read the %s of %s: %s", what, path, e)
            return None
        except InvalidKeyError as e:
            log.error("skipping an unsafe name in the store: %s", e)
            return None
        self._damaged.pop(key, None)  # sound (again): a later damage is logged again
        return record
