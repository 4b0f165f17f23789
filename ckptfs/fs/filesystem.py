"""The filesystem core: POSIX operations over the tree, publish on close, reads by chunk.

It speaks in nodes and project exceptions (errors.FsError); fuseops.py adapts it to
pyfuse3 and errnos. Its parts: namespace.py (the tree and the inode table), listing.py
(merging store listings into the tree), writebuffer.py (a version being written). Here:
the orchestration of each call, publishing (close, fsync), and mount-wide status.

Everything here runs in the trio thread: per-request work is dict lookups and one
pread/pwrite into the cache directory; hashing, compression and all store requests run
in threads (uploader, fetcher, publisher).

A file's bytes are either a published Manifest (chunks by hash, readable through the
fetcher) or, while it is being written on this node, a WriteBuffer. Closing (flush) or
fsync publishes the buffer as a new manifest (docs/SEMANTICS.md).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from dataclasses import dataclass, replace

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    CorruptChunkError,
    DamagedRecord,
    Exists,
    InvalidArgument,
    IsADirectory,
    JournalFull,
    MissingChunkError,
    NoEntry,
    NotADirectory,
    NotEmpty,
)
from ckptfs.format import formats, manifests
from ckptfs.format.manifests import DirMarker, Manifest, StoreInfo, kept_mode
from ckptfs.fs import names
from ckptfs.fs.listing import Lister
from ckptfs.fs.namespace import DirNode, FileNode, InodeTable, Node, NodeT
from ckptfs.fs.options import Options
from ckptfs.fs.ownership import Caller, Ownership
from ckptfs.fs.reporting import Reporting
from ckptfs.fs.writebuffer import NewCutter, WriteBuffer
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Op, OpRecord, PendingChunk
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.pipeline.uploader import Uploader
from ckptfs.store.base import AsyncStore

log = logging.getLogger(__name__)


def describe_error(e: BaseException) -> str:
    """One line for a failure of a local operation (no traceback)."""
    if isinstance(e, JournalFull) or (isinstance(e, OSError) and e.errno == errno.ENOSPC):
        return "the cache disk is full"
    return f"{type(e).__name__}: {e}"


def owner_ids(caller: Caller | None) -> tuple[int | None, int | None]:
    """The uid and gid a new entry made by `caller` records (None: none)."""
    return (None, None) if caller is None else (caller.uid, caller.gid)


@dataclass(eq=False)
class Handle:
    """An open file: which node, whether it may write (flush publishes then), and the
    chunks its reads have prefetched: indexes ahead[0] to ahead[1] of manifest ahead_of."""

    node: FileNode
    writable: bool
    ahead: tuple[int, int] = (0, -1)
    ahead_of: Manifest | None = None


class CheckpointFS(Reporting):
    """All filesystem operations, in terms of nodes; raises errors.FsError subclasses."""

    def __init__(self, store: AsyncStore, cache: LocalCache, uploader: Uploader,
                 fetcher: Fetcher, publisher: Publisher, info: StoreInfo,
                 options: Options) -> None:
        self.store = store
        self.cache = cache
        self.uploader = uploader
        self.fetcher = fetcher
        self.publisher = publisher
        self.chunk_size = info.chunk_size
        self.new_cutter: NewCutter = functools.partial(
            formats.new_cutter, info.chunk_size, min(info.min_record, info.chunk_size),
            info.chunking == "records")
        self.opt = options
        self.owners = Ownership(os.getuid(), os.getgid(), options.uid, options.gid,
                                options.file_mode, options.dir_mode)
        self.table = InodeTable(self._dropped)
        self.root = self.table.root
        self.lister = Lister(store, publisher, self.table, options.metadata_ttl,
                             options.publish_timeout, self._pinned)
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._hash_limiter = trio.CapacityLimiter(LIMITS.hash_threads)
        self._hash_limiter.name = "hash"  # type: ignore[attr-defined]
        self.published_bytes = 0  # logical bytes of the file versions closed here
        self.written_bytes = 0  # bytes written through the mount
        #: the check after the journal lost committed state (recovery.py), if one is due
        self.journal_check: JournalCheck | None = None

    # ===================================================================== the tree
    def node(self, inode: int) -> Node:
        node = self.table.get(inode)
        if node is None:
            raise NoEntry(f"inode {inode}")
        return node

    def getattr(self, inode: int) -> Node:
        """The node whose attributes stat reports; DamagedRecord for a damaged file."""
        return self._undamaged(self.node(inode))

    @staticmethod
    def _undamaged(node: NodeT) -> NodeT:
        """`node`, unless it is a file whose manifest in the store is damaged (EIO on stat,
        open and read; unlink and rename still work, as they do not need it)."""
        if isinstance(node, FileNode) and node.damaged is not None:
            raise DamagedRecord(f"{node.path}: {node.damaged}")
        return node

    def file(self, inode: int) -> FileNode:
        node = self.node(inode)
        if not isinstance(node, FileNode):
            raise IsADirectory(node.path)
        return node

    def directory(self, inode: int) -> DirNode:
        node = self.node(inode)
        if not isinstance(node, DirNode):
            raise NotADirectory(node.path)
        return node

    def forget(self, inode: int, count: int) -> None:
        self.table.forget(inode, count)

    def _dropped(self, node: Node, forgotten: bool) -> None:
        """A removed node nobody has open: free its local copy (InodeTable.maybe_drop)."""
        if not isinstance(node, FileNode):
            return
        for st in node.kept:
            self.cache.let_go(st)
        node.kept.clear()
        if node.manifest is not None and node.buffer is None:  # a deleted file's local copy
            self.cache.drop_clean_copies({h for h, _ in node.manifest.chunks})
        if forgotten and node.buffer is not None:
            node.buffer.discard()
            node.buffer = None

    def _pinned(self, node: Node) -> bool:
        """Local state that a listing from the store must not overwrite."""
        return (isinstance(node, FileNode) and (node.buffer is not None or node.opens > 0)
                or self.publisher.is_pending(node.path))

    async def list_root(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_root_marker)
            nursery.start_soon(self.lister.list_root)

    async def _read_root_marker(self) -> None:
        """The root directory's mode and owner, from its marker (a chmod or chown of the
        mount's root is kept there); the defaults if it has none or it cannot be read."""
        if self.publisher.is_pending(""):
            return  # a chmod of the root from before a crash: the marker is older
        marker = await self.lister.read_marker("")
        if marker is not None and not self.publisher.is_pending(""):
            self.root.mode, self.root.uid, self.root.gid = marker.mode, marker.uid, marker.gid

    def local_changes(self, path: str) -> str | None:
        """Why the directory `path` must not be removed from the store behind this mount's
        back (the auto-prune asks), or None: metadata ops on it, an ancestor or anything
        below it are not applied yet, or a file below it is being written here."""
        if self.publisher.pending_under(path):
            return "this mount has changes under it that are not in the store yet"
        below = f"{path}/"
        for node in self.table.open_buffers():
            if node.path.startswith(below):
                return f"{node.path} is being written on this mount"
        return None

    def dir_at(self, path: str) -> DirNode | None:
        """The directory node at `path` if this mount's tree has it (no store request)."""
        node: Node | None = self.root
        for name in path.split("/") if path else ():
            node = node.children.get(name) if isinstance(node, DirNode) else None
        return node if isinstance(node, DirNode) and not node.removed else None

    async def refresh_dir(self, path: str) -> None:
        """List the directory `path` again now, if this mount knows it, whatever the TTL:
        entries removed from the store (by a prune here) leave the tree and the kernel's
        cache at once. StoreError/StoreUnavailable if the store cannot be listed."""
        node = self.dir_at(path)
        if node is not None:
            await self.lister.refresh(node, force=True)

    async def lookup(self, parent_inode: int, name: str) -> Node:
        return self._undamaged(await self._child(parent_inode, name))

    async def _child(self, parent_inode: int, name: str) -> Node:
        """The entry `name` of a directory: a known entry after a listing if the TTL says
        so; a name not known here is asked of the store (never ENOENT from the past)."""
        asked = time.monotonic()
        parent = self.directory(parent_inode)
        if parent.removed:  # a directory deleted or renamed away on another node
            raise NoEntry(manifests.join(parent.path, name))
        await self.lister.refresh(parent)
        child = parent.children.get(name)
        if child is None:
            await self.lister.look_up(parent, name, asked)
            child = parent.children.get(name)
        if child is None:
            raise NoEntry(manifests.join(parent.path, name))
        return child

    async def readdir(self, inode: int) -> list[tuple[str, Node]]:
        """The entries of a directory, from a LIST sent after this call began (or from
        the local view while the store fails: listing.py)."""
        asked = time.monotonic()
        node = self.directory(inode)
        await self.lister.refresh(node, since=asked)
        return sorted(node.children.items())

    @staticmethod
    def _touch(node: Node) -> None:
        node.mtime_ns = time.time_ns()

    def _changing(self, *entries: tuple[DirNode | None, str]) -> list[tuple[DirNode, str]]:
        """Note that directory entries are being changed here (call before awaiting).

        Pass the result to _submit, which records the journal seq of the change.
        """
        out = []
        for dnode, name in entries:
            if dnode is not None:
                dnode.recent.begin(name)
                out.append((dnode, name))
        return out

    async def _submit(self, kind: str, path: str, path2: str | None = None,
                      body: bytes | None = None, chunks: list[PendingChunk] | None = None,
                      wait: bool = True, changing: list[tuple[DirNode, str]] | None = None,
                      staging_id: int | None = None,
                      stale: frozenset[str] = frozenset(),
                      replaced: bytes | None = None) -> int:
        """Journal a metadata op (and chunks), queue it, optionally wait until applied.

        `changing` (from _changing) are the directory entries the op changes;
        `staging_id`, for a put_file of a version written here, its staging file;
        `stale`, chunks it names that the publisher must confirm before its PUT.
        `replaced`, for a put_file, the manifest of the version it replaces: journaled in
        the same transaction as a keep_version op BEFORE it, so that the old version is in
        the trash before the new one replaces it (never named by neither, which a gc
        could take as unreferenced while this node is down).
        """
        seq = 0
        try:
            crash_point(f"before_journal_{kind}")
            journaled_at, since = time.time(), time.monotonic()
            records: list[OpRecord] = [(kind, path, path2, body, staging_id)]
            if replaced is not None:
                records.insert(0, ("keep_version", path, None, replaced))
            seqs = await self.uploader.persist(chunks or [], records, path if chunks else None)
            seq = seqs[-1]
            crash_point(f"journaled_{kind}")
            if replaced is not None:
                await self.publisher.add(Op(seqs[0], "keep_version", path, None, replaced,
                                            journaled_at), since)
            await self.publisher.add(Op(seq, kind, path, path2, body, journaled_at, staging_id),
                                     since, stale)
        finally:
            for dnode, name in changing or ():
                dnode.recent.end(name, seq)
        if wait:
            await self.publisher.wait_applied(seq, self.opt.publish_timeout)
            crash_point(f"applied_{kind}")
        return seq

    # ===================================================================== namespace ops
    async def _writable_dir(self, inode: int) -> DirNode:
        node = self.directory(inode)
        if node.removed:
            raise NoEntry(node.path)
        return node

    async def mkdir(self, parent_inode: int, name: str, mode: int,
                    caller: Caller | None = None) -> DirNode:
        """A new directory, owned by `caller` (None: no owner recorded, see Ownership)."""
        parent = await self._writable_dir(parent_inode)
        await self.lister.refresh(parent)
        names.check_name_free(self.store, parent, name, is_dir=True)
        now = time.time_ns()
        changing = self._changing((parent, name))
        node = self.table.new_dir(parent, name, mode, now, *owner_ids(caller))
        node.listed_at = time.monotonic()
        node.listed = True
        self._touch(parent)
        await self._submit("put_dir", node.path, body=self._marker(node, now).to_json(),
                           changing=changing)
        return node

    @staticmethod
    def _marker(node: DirNode, mtime_ns: int) -> DirMarker:
        return DirMarker(node.mode, mtime_ns, uid=node.uid, gid=node.gid)

    async def rmdir(self, parent_inode: int, name: str) -> None:
        parent = await self._writable_dir(parent_inode)
        child = await self._child(parent_inode, name)
        if not isinstance(child, DirNode):
            raise NotADirectory(child.path)
        await self.lister.refresh(child, force=True)
        if child.children:
            raise NotEmpty(child.path)
        path = child.path
        changing = self._changing((parent, name))
        self.table.detach(child)
        self._touch(parent)
        await self._submit("delete_dir", path, wait=False, changing=changing)

    async def unlink(self, parent_inode: int, name: str) -> None:
        parent = await self._writable_dir(parent_inode)
        child = await self._child(parent_inode, name)
        if not isinstance(child, FileNode):
            raise IsADirectory(child.path)
        path = child.path
        changing = self._changing((parent, name))
        if (child.manifest is not None or child.damaged is not None
                or self.publisher.is_pending(path)):
            # journal first: if that fails (cache disk full), the file is still there
            await self._submit("delete_file", path, wait=False, changing=changing)
        else:  # created here and never published: nothing in the store to delete
            parent.recent.end(name, 0)
        self.table.detach(child)
        self._touch(parent)

    async def symlink(self, parent_inode: int, name: str, target: str,
                      caller: Caller | None = None) -> FileNode:
        parent = await self._writable_dir(parent_inode)
        await self.lister.refresh(parent)
        names.check_name_free(self.store, parent, name)
        now = time.time_ns()
        uid, gid = owner_ids(caller)
        m = Manifest(size=len(target.encode()), mode=stat.S_IFLNK | 0o777, mtime_ns=now,
                     writer=self.opt.writer_id, target=target, uid=uid, gid=gid)
        changing = self._changing((parent, name))
        node = self.table.new_file(parent, name, m.mode, now)
        node.set_manifest(m)
        self._touch(parent)
        await self._submit("put_file", node.path, body=m.to_json(), changing=changing)
        return node

    def readlink(self, inode: int) -> str:
        node = self.node(inode)
        if not isinstance(node, FileNode) or node.manifest is None or (
                node.manifest.target is None):
            raise InvalidArgument(node.path)
        return node.manifest.target

    async def rename(self, old_parent_inode: int, old_name: str, new_parent_inode: int,
                     new_name: str, noreplace: bool = False) -> None:
        old_parent = await self._writable_dir(old_parent_inode)
        new_parent = await self._writable_dir(new_parent_inode)
        src = await self._child(old_parent_inode, old_name)
        await self.lister.refresh(new_parent)
        if "/" in new_name or "\0" in new_name:
            raise InvalidArgument(new_name)
        names.check_name(new_name)
        dst = new_parent.children.get(new_name)
        if dst is src:
            return
        new_path = manifests.join(new_parent.path, new_name)
        if isinstance(src, DirNode):
            await names.check_tree_fits(self.store, src, new_path)
        else:
            names.check_fits(self.store, manifests.file_key(new_path))
        if dst is not None and noreplace:
            raise Exists(dst.path)
        if isinstance(src, DirNode):
            ancestor: DirNode | None = new_parent
            while ancestor is not None:
                if ancestor is src:
                    raise InvalidArgument(f"cannot move {src.path} into itself")
                ancestor = ancestor.parent
            if dst is not None:
                if not isinstance(dst, DirNode):
                    raise NotADirectory(dst.path)
                await self.lister.refresh(dst, force=True)
                if dst.children:
                    raise NotEmpty(dst.path)
        elif isinstance(dst, DirNode):
            raise IsADirectory(dst.path)
        old_path = src.path
        changing = self._changing((old_parent, old_name), (new_parent, new_name))
        if dst is not None:
            self.table.detach(dst)
        self.table.move(src, new_parent, new_name)
        self._touch(old_parent)
        self._touch(new_parent)
        kind = "rename_dir" if src.is_dir else "rename_file"
        await self._submit(kind, old_path, src.path, changing=changing)

    # ===================================================================== attributes
    async def setattr(self, inode: int, size: int | None = None, mode: int | None = None,
                      mtime_ns: int | None = None, uid: int | None = None,
                      gid: int | None = None, caller: Caller | None = None) -> Node:
        """truncate, chmod, utimens and chown by `caller` (None: the mounting user); a
        chown or chmod it may not make (Ownership) is NotPermitted, and changes nothing."""
        node = self.node(inode)
        who = caller or self.owners.mounter
        owner = self.owners.chown(node, uid, gid, who)
        if mode is not None:
            self.owners.check_chmod(node, who)
        if size is not None:
            if not isinstance(node, FileNode):
                raise IsADirectory(node.path)
            async with node.lock:
                await self._truncate(node, size)
        if mode is not None:
            node.mode = kept_mode(stat.S_IFMT(node.mode) | stat.S_IMODE(mode))
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
        if owner is not None:
            node.uid, node.gid = owner
        if isinstance(node, FileNode) and node.buffer is not None and not self._has_writer(
                node):
            # truncate(2) of a file nobody has open for writing: no close will publish it
            async with node.lock:
                if node.buffer is not None:
                    await self._publish(node, fsync=False)
        elif (mode is not None or mtime_ns is not None or owner is not None) and (
                not node.removed):
            await self._publish_attributes(node)
        return node

    def _has_writer(self, node: FileNode) -> bool:
        """Whether a handle that may write (and so publishes at close) is open on the node."""
        return any(h.node is node and h.writable for h in self.handles.values())

    async def _publish_attributes(self, node: Node) -> None:
        """chmod/utimens/chown: a new manifest or marker (files being written publish at
        close; a symlink keeps mode 0777)."""
        changing = self._changing((node.parent, node.name))
        if isinstance(node, DirNode):
            body = self._marker(node, node.mtime_ns).to_json()
            await self._submit("put_dir", node.path, body=body, wait=False, changing=changing)
        elif isinstance(node, FileNode) and node.buffer is None and node.manifest is not None:
            m = replace(node.manifest, mtime_ns=node.mtime_ns, uid=node.uid, gid=node.gid)
            if not node.is_symlink:
                m = replace(m, mode=node.mode)
            node.manifest = m
            await self._submit("put_file", node.path, body=m.to_json(), wait=False,
                               changing=changing)
        else:
            for dnode, name in changing:
                dnode.recent.end(name, 0)

    # ===================================================================== open/close
    async def create(self, parent_inode: int, name: str, mode: int, flags: int,
                     caller: Caller | None = None) -> tuple[int, FileNode]:
        """A new file open for writing, owned by `caller` (None: no owner recorded)."""
        parent = await self._writable_dir(parent_inode)
        await self.lister.refresh(parent)
        names.check_name_free(self.store, parent, name)
        now = time.time_ns()
        node = self.table.new_file(parent, name, stat.S_IFREG | stat.S_IMODE(mode), now,
                                   *owner_ids(caller))
        node.buffer = await self._new_buffer(node, None)
        node.checked_at = time.monotonic()
        self._touch(parent)
        return self._open_handle(node, writable=True), node

    async def open(self, inode: int, flags: int) -> tuple[int, bool]:
        """Returns (fh, keep_cache)."""
        node = self._undamaged(self.file(inode))
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        keep_cache = await self._revalidate(node)
        if writable and flags & os.O_TRUNC:
            async with node.lock:
                await self._truncate(node, 0)
        fh = self._open_handle(node, writable)
        m = node.manifest
        # a read-only open starts fetching the file's first window. (Not again for an open
        # that keeps the kernel's page cache of the version it prefetched: a fetched chunk
        # is dropped from memory once read, and the page cache serves a second reader;
        # what it no longer holds is fetched as reads ask for it.)
        if (not writable and node.buffer is None and m is not None and m.chunks
                and not (keep_cache and node.prefetched is m)):
            node.prefetched = m
            self._prefetch_ahead(self.handles[fh], m, node.offsets, 0, 0)
        return fh, keep_cache

    async def _revalidate(self, node: FileNode) -> bool:
        """Close-to-open: re-read the manifest if older than the TTL. -> unchanged?"""
        if self._pinned(node) or node.manifest is None:
            return True
        checked_at = node.checked_at
        if time.monotonic() - checked_at < self.opt.metadata_ttl:
            return True
        try:
            m = await self.lister.read_manifest(node.path)
        except DamagedRecord as e:
            node.damaged = str(e)
            raise
        if m is None:
            return True  # deleted elsewhere: keep serving the version we know
        if node.checked_at != checked_at or self._pinned(node):
            return True  # published here meanwhile: newer than what the GET returned
        unchanged = m == node.manifest
        node.set_manifest(m)
        return unchanged

    def _open_handle(self, node: FileNode, writable: bool) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(node, writable)
        node.opens += 1
        return fh

    def handle(self, fh: int) -> Handle:
        try:
            return self.handles[fh]
        except KeyError:
            raise NoEntry(f"file handle {fh}") from None

    async def flush(self, fh: int) -> None:
        h = self.handle(fh)
        if h.writable and h.node.buffer is not None:
            async with h.node.lock:
                if h.node.buffer is not None:
                    await self._publish(h.node, fsync=False)

    async def fsync(self, fh: int) -> None:
        node = self.handle(fh).node
        async with node.lock:
            if node.buffer is not None:
                await self._publish(node, fsync=True)
            elif node.manifest is not None:  # closed earlier: make its staged bytes durable
                fds = self.cache.staging_fds([h for h, _ in node.manifest.chunks
                                              if self.uploader.is_pending(h)])
                for fd in fds:
                    await trio.to_thread.run_sync(os.fsync, fd, limiter=self._hash_limiter)
        if self.opt.fsync_to_store:
            await self.wait_durable(node)

    async def wait_durable(self, node: FileNode) -> None:
        """Wait until every chunk of the node's published version is in the store."""
        while node.manifest is not None and self.file_state(node) == "pending":
            await self.uploader.wait_changed()
        await self.publisher.wait_empty()

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if h is None:
            return
        node = h.node
        if h.writable and node.buffer is not None and not self._has_writer(node):
            # written after the last flush (e.g. through a shared mmap), or the flush
            # failed (its error went to close()): publish now
            await self._publish_at_release(node)
        node.opens -= 1
        self.table.maybe_drop(node)

    async def _publish_at_release(self, node: FileNode) -> None:
        """Publish a buffer nobody will close again. Nobody can be told of a failure
        here, so it is logged (one line) and shown by `status` until a later publish of
        the file succeeds (the unmount tries once more) or the file is deleted."""
        async with node.lock:
            if node.buffer is None:
                return
            try:
                await self._publish(node, fsync=False)
            except Exception as e:  # noqa: BLE001 - reported, see the docstring
                why = describe_error(e)
                if node.publish_error != why:
                    log.error("could not publish %s at release; its data is not saved: %s",
                              node.path, why)
                node.publish_error = why

    async def publish_leftovers(self) -> None:
        """At unmount: try once more to publish files whose publish failed at release."""
        for node in self.table.open_buffers():
            if node.publish_error:
                await self._publish_at_release(node)

    # ===================================================================== write path
    async def _new_buffer(self, node: FileNode, base: Manifest | None) -> WriteBuffer:
        async def read_chunk(chunk_hash: str, offset: int, length: int) -> bytes | memoryview:
            return await self._read_chunk(node, chunk_hash, offset, length)

        return await WriteBuffer.create(self.cache, self.new_cutter, self.uploader, read_chunk,
                                        node.lock, self._hash_limiter, base)

    async def _buffer(self, node: FileNode) -> WriteBuffer:
        """The node's write buffer, created on the first modification after a publish."""
        if node.buffer is None:
            node.buffer = await self._new_buffer(node, node.manifest)
        return node.buffer

    async def _wait_for_space(self) -> None:
        """Back-pressure: block while dirty data is at the cache limit and uploads are
        draining it. Dirty data that only a close can drain (random writes into files
        still open) does not block: waiting for it could never end."""
        while self.cache.dirty_bytes >= self.cache.limit_bytes and self.uploader.busy():
            log.debug("writer waits: %d dirty bytes at the cache limit", self.cache.dirty_bytes)
            with trio.move_on_after(1.0):
                await self.uploader.wait_changed()

    async def write(self, fh: int, offset: int, data: bytes) -> int:
        node = self.handle(fh).node
        self.uploader.writes.note(len(data))
        self.written_bytes += len(data)
        if self.cache.dirty_bytes >= self.cache.limit_bytes:
            await self._wait_for_space()
        async with node.lock:
            buf = await self._buffer(node)
            await buf.write(offset, data)
            node.size = buf.size
            node.mtime_ns = time.time_ns()
        return len(data)

    async def _truncate(self, node: FileNode, size: int) -> None:
        if size == 0:  # O_TRUNC: a fresh, empty version
            if node.buffer is not None:
                node.buffer.discard()
            node.buffer = await self._new_buffer(node, None)
        else:
            buf = await self._buffer(node)
            await buf.truncate(size)
        node.size = size
        node.mtime_ns = time.time_ns()

    async def _publish(self, node: FileNode, fsync: bool) -> None:
        """Seal the node's buffer into a manifest, journal it, and PUT it (bounded wait)."""
        buf = node.buffer
        assert buf is not None
        version = await buf.seal(fsync)
        # chunks uploaded early and freed from the cache are named without being journaled:
        # those seen in the store longer than the confirmation window ago (a file kept open
        # that long) are HEADed by the publisher before the PUT (docs/FORMAT.md, W2); a
        # dict lookup each here, and nothing at all for a file open a shorter time
        stale = frozenset(h for h in version.freed if not self.uploader.confirmed(h))
        m = Manifest(size=version.size, mode=node.mode, mtime_ns=node.mtime_ns,
                     chunks=version.chunks, chunk_size=self.chunk_size,
                     writer=self.opt.writer_id, uid=node.uid, gid=node.gid)
        if not node.removed:
            # journal first: if that fails (cache disk full), the buffer stays open and
            # close/fsync report the error; nothing is half published
            # the version it replaces goes to the trash (a symlink's target is not a
            # version of it; a file new here replaces nothing)
            old = node.manifest
            await self._submit("put_file", node.path, body=m.to_json(),
                               chunks=version.pending,
                               changing=self._changing((node.parent, node.name)),
                               staging_id=buf.staging.id, stale=stale,
                               replaced=None if old is None or old.is_symlink
                               else old.to_json())
            self.published_bytes += m.size
        if node.removed:  # unlinked while open: its descriptors' only copy (FileNode.kept)
            self.cache.hold(buf.staging)
            node.kept.append(buf.staging)
        buf.published(version, journaled=not node.removed)
        node.buffer = None
        node.publish_error = None
        node.set_manifest(m)  # unlinked while open: still readable through its fds

    # ===================================================================== read path
    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        node = self.handle(fh).node
        buf = node.buffer
        end = min(offset + size, node.current_size)
        if offset >= end:
            return b""
        if buf is not None:
            return await buf.read(offset, end)
        m = node.manifest
        if m is None:
            return b""
        offsets = node.offsets
        first = m.chunk_at(offsets, offset)
        last = m.chunk_at(offsets, end - 1)
        self._prefetch_ahead(self.handle(fh), m, offsets, last + 1, end)
        parts = []
        for i in range(first, last + 1):
            chunk_hash, _ = m.chunks[i]
            lo = max(offset, offsets[i])
            hi = min(end, offsets[i + 1])
            part = await self._read_chunk(node, chunk_hash, lo - offsets[i], hi - lo)
            if len(part) != hi - lo:  # the chunk is shorter than its manifest says
                raise CorruptChunkError(f"chunk {chunk_hash} of {node.path} is truncated")
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _prefetch_ahead(self, handle: Handle, m: Manifest, offsets: list[int], start: int,
                        end: int) -> None:
        """Prefetch the chunks from index `start` up to the one holding byte end + window:
        a bounded window ahead of this reader, which follows it (and restarts where it
        jumps to), so a restore keeps the fetch threads busy and holds about a window of
        fetched chunks, not the whole file."""
        window = self.opt.prefetch_window
        if not window or start >= len(m.chunks):
            return
        stop = m.chunk_at(offsets, min(end + window, m.size) - 1)
        lo, hi = handle.ahead if handle.ahead_of is m else (0, -1)
        if lo <= start <= hi + 1:  # the reader is inside the run prefetched so far
            first = hi + 1
        else:  # it jumped: a new run from here
            lo, hi, first = start, start - 1, start
        if stop >= first:
            self.fetcher.prefetch_nowait([h for h, _ in m.chunks[first:stop + 1]])
            hi = stop
        handle.ahead, handle.ahead_of = (lo, hi), m

    async def _read_chunk(self, node: FileNode, chunk_hash: str, offset: int,
                          length: int) -> bytes | memoryview:
        """fetcher.read, with the one log line that names the file and its writer."""
        try:
            return await self.fetcher.read(chunk_hash, offset, length)
        except (MissingChunkError, CorruptChunkError) as e:
            writer = node.manifest.writer if node.manifest else ""
            log.error("read of %s failed: %s (written by node %s)", node.path, e,
                      writer or "?")
            raise
