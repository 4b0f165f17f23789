"""The filesystem core: the namespace, write buffers, publish on close, reads through chunks.

It speaks in nodes and project exceptions (errors.FsError); fuseops.py adapts it to
pyfuse3 and errnos. Everything here runs in the trio thread: per-request work is dict
lookups and one pread/pwrite into the cache directory; hashing, compression and all
store requests run in threads (uploader, fetcher, publisher).

A file's bytes are either a published Manifest (chunks by hash, readable through the
fetcher) or, while it is being written on this node, a WriteBuffer: a staging file
plus, for chunks not written since open, the chunks of the version it started from.
Closing (flush) or fsync publishes the buffer as a new manifest (docs/SEMANTICS.md).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import trio

from . import codec, manifests
from .cache import LocalCache, StagingFile, pread_scratch
from .chunking import FixedChunker
from .crashpoints import crash_point
from .errors import (
    CorruptChunkError,
    Exists,
    FormatError,
    InvalidArgument,
    InvalidKeyError,
    IsADirectory,
    MissingChunkError,
    NameTooLong,
    NoAttribute,
    NoEntry,
    NotADirectory,
    NotEmpty,
    NotFoundError,
    NotPermitted,
    NotSupported,
    StoreError,
    StoreUnavailable,
)
from .fetcher import Fetcher
from .journal import Op, PendingChunk
from .manifests import DirMarker, Manifest
from .publisher import Publisher
from .store.base import AsyncStore
from .uploader import Uploader, UploadJob

log = logging.getLogger(__name__)
T = TypeVar("T")

ROOT_INODE = 1
STATE_XATTR = "user.ckptfs.state"
CONTROL_XATTR = "user.ckptfs.control"
LIST_CONCURRENCY = 32
READ_RETRIES = 5  # transient failures of a LIST or manifest GET before giving up (~3 s)
NAME_MAX = 240  # bytes; below 255 so that every store can hold the name plus its suffixes


@dataclass
class Options:
    """The knobs of the filesystem core (config.py builds them from the command line)."""

    metadata_ttl: float = 1.0
    publish_timeout: float = 10.0
    readahead_chunks: int = 4
    prefetch_whole_file_max: int = 2 * 1024**3
    fsync_to_store: bool = False
    writer_id: str = ""
    control_socket: str = ""


@dataclass(eq=False)
class WriteBuffer:
    """The version of a file being written on this node.

    Chunk i's bytes are in the staging file if i >= len(base) or i in `local`; else they
    are still base[i], a chunk of the version the buffer started from.
    """

    staging: StagingFile
    size: int
    base: list[tuple[str, int]]
    local: set[int] = field(default_factory=set)
    versions: dict[int, int] = field(default_factory=dict)  # chunk -> writes so far
    hashes: dict[int, tuple[str, int]] = field(default_factory=dict)  # chunk -> (hash, version)
    seq_end: int = 0  # end of the sequentially written prefix (early upload frontier)
    # the hash of chunk `stream_chunk` so far, fed by sequential writes (see _stream_hash)
    stream: codec.Hasher | None = None
    stream_chunk: int = -1

    def is_local(self, index: int) -> bool:
        return index >= len(self.base) or index in self.local


@dataclass(eq=False)
class Node:
    """A file, directory or symlink; lives as long as the mount knows its inode."""

    inode: int
    name: str
    parent: Node | None
    mode: int
    mtime_ns: int
    size: int = 0
    manifest: Manifest | None = None
    offsets: list[int] = field(default_factory=list)  # chunk start offsets of `manifest`
    manifest_key_size: int = -1  # size of the manifest object when last listed
    buffer: WriteBuffer | None = None
    children: dict[str, Node] | None = None  # directories only
    listed_at: float = 0.0  # directories: monotonic time of the last LIST
    listed: bool = False  # directories: the children came from the store once, or from mkdir
    checked_at: float = 0.0  # files: monotonic time the manifest was last read
    lookups: int = 0
    opens: int = 0
    removed: bool = False
    lock: trio.Lock = field(default_factory=trio.Lock)
    # directories: name -> [local changes not yet journaled, highest journal seq of a change]
    # of entries changed here recently; a listing must not undo them (see _apply_listing)
    recent: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def path(self) -> str:
        parts = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return "/".join(reversed(parts))


@dataclass(eq=False)
class Handle:
    """An open file: which node, and whether it may write (flush publishes then)."""

    node: Node
    writable: bool


class CheckpointFS:
    """All filesystem operations, in terms of nodes; raises errors.FsError subclasses."""

    def __init__(self, store: AsyncStore, cache: LocalCache, uploader: Uploader,
                 fetcher: Fetcher, publisher: Publisher, chunk_size: int,
                 options: Options) -> None:
        self.store = store
        self.cache = cache
        self.uploader = uploader
        self.fetcher = fetcher
        self.publisher = publisher
        self.chunker = FixedChunker(chunk_size)
        self.chunk_size = chunk_size
        self.opt = options
        self.uid = os.getuid()
        self.gid = os.getgid()
        now = time.time_ns()
        self.root = Node(ROOT_INODE, "", None, stat.S_IFDIR | 0o755, now, children={})
        self.nodes: dict[int, Node] = {ROOT_INODE: self.root}
        self.handles: dict[int, Handle] = {}
        self._next_inode = ROOT_INODE + 1
        self._next_fh = 1
        self._dir_locks: dict[int, trio.Lock] = {}
        self._hash_limiter = trio.CapacityLimiter(2)
        self._hash_limiter.name = "hash"  # type: ignore[attr-defined]
        self.published_bytes = 0  # logical bytes of the file versions closed here
        self._recovery_waited = False  # listings waited (once) for the journal's ops

    # ===================================================================== namespace
    def node(self, inode: int) -> Node:
        try:
            return self.nodes[inode]
        except KeyError:
            raise NoEntry(f"inode {inode}") from None

    def _new_node(self, parent: Node, name: str, mode: int, mtime_ns: int, **kw: object) -> Node:
        node = Node(self._next_inode, name, parent, mode, mtime_ns, **kw)  # type: ignore[arg-type]
        if node.is_dir and node.children is None:
            node.children = {}
        self._next_inode += 1
        self.nodes[node.inode] = node
        assert parent.children is not None
        parent.children[name] = node
        return node

    def _detach(self, node: Node) -> None:
        """Take a node out of the tree (deleted here or on another node)."""
        if node.parent is not None and node.parent.children is not None:
            if node.parent.children.get(node.name) is node:
                del node.parent.children[node.name]
        node.removed = True
        self._maybe_drop(node)

    def _maybe_drop(self, node: Node) -> None:
        if not node.removed or node.opens > 0:
            return
        if node.manifest is not None and node.buffer is None:  # a deleted file's local copy
            self.cache.drop_clean_copies({h for h, _ in node.manifest.chunks})
        if node.lookups <= 0:
            self.nodes.pop(node.inode, None)
            if node.buffer is not None:
                node.buffer.staging.writers -= 1
                self.cache.release_staging(node.buffer.staging)
                node.buffer = None
            for child in list((node.children or {}).values()):
                child.removed = True
                self._maybe_drop(child)

    def forget(self, inode: int, count: int) -> None:
        node = self.nodes.get(inode)
        if node is not None and inode != ROOT_INODE:
            node.lookups -= count
            self._maybe_drop(node)

    def _pinned(self, node: Node) -> bool:
        """Local state that a listing from the store must not overwrite."""
        return (node.buffer is not None or node.opens > 0
                or self.publisher.is_pending(node.path))

    async def list_root(self) -> None:
        """List the root before the mount is ready, so that a store outage just after
        mounting does not leave it without a view (EIO, see _refresh). The first access
        lists it again, as on any new mount (the TTL is not started here). Skipped while
        ops from the journal wait to be applied: the store's listing would lack them."""
        if self.publisher.pending_count:
            return
        try:
            await self._refresh(self.root)
        except StoreUnavailable as e:
            log.warning("%s", e)
        self.root.listed_at = 0.0

    async def _refresh(self, dnode: Node, force: bool = False) -> None:
        """Bring a directory's children up to date with the store (at most once per TTL)."""
        lock = self._dir_locks.setdefault(dnode.inode, trio.Lock())
        async with lock:
            fresh = time.monotonic() - dnode.listed_at < self.opt.metadata_ttl
            if (fresh and not force) or dnode.removed:
                return
            path = dnode.path
            if self.publisher.is_pending(path):
                return  # our own unapplied ops: the local view is newer than the store
            recovered = self.publisher.recovered_seq
            if not self._recovery_waited and self.publisher.applied_seq < recovered:
                # after a crash, ops from the journal (files closed, directories made)
                # are on their way to the store: a listing sent now would lack them
                await self.publisher.wait_applied(recovered, self.opt.publish_timeout)
                self._recovery_waited = True
            prefix = manifests.dir_prefix(path)
            applied_before = self.publisher.applied_seq
            try:
                listing = await self._with_retries(self.store.list, prefix)
            except StoreError as e:  # store down: serve what we know, retry after the TTL
                if not dnode.listed:  # nothing known: an empty answer would say "no files"
                    log.warning("cannot list %s/ (never listed: EIO): %s", path, e)
                    raise StoreUnavailable(f"cannot list {path}/: {e}") from None
                log.warning("cannot list %s/ (serving the cached view): %s", path, e)
                dnode.listed_at = time.monotonic()
                return
            if dnode.removed or dnode.path != path:
                return  # moved or deleted here while listing: the listing is of the old path
            dnode.listed_at = time.monotonic()
            dnode.listed = True
            await self._apply_listing(dnode, prefix, listing.objects, listing.prefixes,
                                      applied_before)

    async def _apply_listing(self, dnode: Node, prefix: str, objects: list[tuple[str, int]],
                             prefixes: list[str], applied_before: int) -> None:
        """Merge a LIST of the directory into its children.

        `applied_before` is the publisher's applied_seq when the LIST was sent: an entry
        changed here by an op with a later seq (or not journaled yet) may be missing or
        stale in the listing, so the listing is ignored for that name.
        """
        assert dnode.children is not None
        recent = dnode.recent
        for name, (unjournaled, seq) in list(recent.items()):
            if not unjournaled and seq <= applied_before:
                del recent[name]  # in the store before the LIST: the listing has it

        def changed_here(name: str) -> bool:
            e = recent.get(name)
            return e is not None and (e[0] > 0 or e[1] > applied_before)

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
            if self._pinned(known) or changed_here(name):
                continue
            if name not in (remote_dirs if known.is_dir else remote_files):
                self._detach(known)
        to_read: list[tuple[str, int]] = []
        for name, size in remote_files.items():
            have = dnode.children.get(name)
            if have is None or (not self._pinned(have) and have.manifest_key_size != size):
                to_read.append((name, size))
        new_dirs: list[str] = []
        for name in remote_dirs:
            if name not in dnode.children:
                try:
                    manifests.check_path(name)
                except Exception:
                    log.warning("skipping unsafe directory name from store: %r", name)
                    continue
                new_dirs.append(name)
        if not to_read and not new_dirs:
            return
        results: dict[str, Manifest] = {}
        markers: dict[str, DirMarker] = {}
        limiter = trio.CapacityLimiter(LIST_CONCURRENCY)

        async def read_one(name: str) -> None:
            async with limiter:
                m = await self._read_manifest(manifests.join(dnode.path, name))
            if m is not None:
                results[name] = m

        async def read_marker(name: str) -> None:
            async with limiter:
                marker = await self._read_marker(manifests.join(dnode.path, name))
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
                self._new_node(dnode, name, stat.S_IFDIR | stat.S_IMODE(marker.mode),
                               marker.mtime_ns or now_ns)
        for name, size in to_read:
            m = results.get(name)
            child = dnode.children.get(name)
            if m is None or (child is not None and self._pinned(child)) or changed_here(name):
                continue
            if child is not None and (child.is_dir or child.is_symlink != m.is_symlink):
                self._detach(child)
                child = None
            if child is None:
                child = self._new_node(dnode, name, m.mode, m.mtime_ns)
            self._set_manifest(child, m)
            child.manifest_key_size = size

    async def _read_manifest(self, path: str) -> Manifest | None:
        return await self._read_record(path, manifests.file_key, Manifest.from_json, "manifest")

    async def _read_marker(self, path: str) -> DirMarker | None:
        return await self._read_record(path, manifests.dir_key, DirMarker.from_json,
                                       "directory marker")

    async def _read_record(self, path: str, key_of: Callable[[str], str],
                           parse: Callable[[bytes], T], what: str) -> T | None:
        """GET and parse a manifest or marker; None (and a log line) if absent or bad."""
        try:
            return parse(await self._with_retries(self.store.get, key_of(path)))
        except NotFoundError:
            return None
        except (FormatError, ValueError) as e:
            log.error("unreadable %s for %s: %s", what, path, e)
        except StoreError as e:
            log.warning("cannot read the %s of %s: %s", what, path, e)
        except InvalidKeyError as e:
            log.error("skipping an unsafe name in the store: %s", e)
        return None

    @staticmethod
    async def _with_retries(fn: Callable[[str], Awaitable[T]], arg: str) -> T:
        """A metadata read, retried over transient errors (throttling) for a few seconds."""
        delay = 0.1
        for _ in range(READ_RETRIES):
            try:
                return await fn(arg)
            except StoreError as e:
                if e.permanent:
                    raise
                await trio.sleep(delay)
                delay *= 2
        return await fn(arg)

    def _set_manifest(self, node: Node, m: Manifest) -> None:
        node.manifest = m
        node.offsets = m.chunk_offsets()
        node.size = m.size
        node.mode = (stat.S_IFLNK | 0o777) if m.is_symlink else m.mode
        node.mtime_ns = m.mtime_ns
        node.checked_at = time.monotonic()

    async def lookup(self, parent_inode: int, name: str) -> Node:
        parent = self.node(parent_inode)
        if not parent.is_dir:
            raise NotADirectory(parent.path)
        assert parent.children is not None
        await self._refresh(parent)
        child = parent.children.get(name)
        if child is None:
            raise NoEntry(manifests.join(parent.path, name))
        return child

    async def readdir(self, inode: int) -> list[tuple[str, Node]]:
        node = self.node(inode)
        if not node.is_dir:
            raise NotADirectory(node.path)
        await self._refresh(node)
        assert node.children is not None
        return sorted(node.children.items())

    def _check_name_free(self, parent: Node, name: str) -> None:
        assert parent.children is not None
        if name in parent.children:
            raise Exists(manifests.join(parent.path, name))
        if "/" in name or "\0" in name or name in (".", ".."):
            raise InvalidArgument(name)
        self._check_name(name)

    @staticmethod
    def _check_name(name: str) -> None:
        """Names must be UTF-8 (store keys are) and at most NAME_MAX bytes."""
        try:
            encoded = name.encode()
        except UnicodeEncodeError:
            raise InvalidArgument(f"file name is not UTF-8: {name!r}") from None
        if len(encoded) > NAME_MAX:
            raise NameTooLong(name)

    def _touch(self, node: Node) -> None:
        node.mtime_ns = time.time_ns()

    def _changing(self, *entries: tuple[Node | None, str]) -> list[tuple[Node, str]]:
        """Note that directory entries are being changed here (call before awaiting).

        Pass the result to _submit, which records the journal seq of the change.
        """
        out = []
        for dnode, name in entries:
            if dnode is not None:
                dnode.recent.setdefault(name, [0, 0])[0] += 1
                out.append((dnode, name))
        return out

    async def _submit(self, kind: str, path: str, path2: str | None = None,
                      body: bytes | None = None, chunks: list[PendingChunk] | None = None,
                      wait: bool = True, changing: list[tuple[Node, str]] | None = None
                      ) -> int:
        """Journal a metadata op (and chunks), queue it, optionally wait until applied.

        `changing` (from _changing) are the directory entries the op changes.
        """
        seq = 0
        try:
            crash_point(f"before_journal_{kind}")
            [seq] = await self.uploader.persist(chunks or [], [(kind, path, path2, body)])
            crash_point(f"journaled_{kind}")
            await self.publisher.add(Op(seq, kind, path, path2, body))
        finally:
            for dnode, name in changing or ():
                e = dnode.recent.setdefault(name, [1, 0])
                e[0] -= 1
                e[1] = max(e[1], seq)
        if wait:
            await self.publisher.wait_applied(seq, self.opt.publish_timeout)
            crash_point(f"applied_{kind}")
        return seq

    async def mkdir(self, parent_inode: int, name: str, mode: int) -> Node:
        parent = await self._writable_dir(parent_inode)
        await self._refresh(parent)
        self._check_name_free(parent, name)
        now = time.time_ns()
        changing = self._changing((parent, name))
        node = self._new_node(parent, name, stat.S_IFDIR | (mode & 0o7777), now)
        node.listed_at = time.monotonic()
        node.listed = True
        self._touch(parent)
        await self._submit("put_dir", node.path, body=DirMarker(node.mode, now).to_json(),
                           changing=changing)
        return node

    async def _writable_dir(self, inode: int) -> Node:
        node = self.node(inode)
        if not node.is_dir:
            raise NotADirectory(node.path)
        if node.removed:
            raise NoEntry(node.path)
        return node

    async def rmdir(self, parent_inode: int, name: str) -> None:
        parent = await self._writable_dir(parent_inode)
        child = await self.lookup(parent_inode, name)
        if not child.is_dir:
            raise NotADirectory(child.path)
        await self._refresh(child, force=True)
        assert child.children is not None
        if child.children:
            raise NotEmpty(child.path)
        path = child.path
        changing = self._changing((child.parent, child.name))
        self._detach(child)
        self._touch(parent)
        await self._submit("delete_dir", path, wait=False, changing=changing)

    async def unlink(self, parent_inode: int, name: str) -> None:
        parent = await self._writable_dir(parent_inode)
        child = await self.lookup(parent_inode, name)
        if child.is_dir:
            raise IsADirectory(child.path)
        path = child.path
        changing = self._changing((child.parent, child.name))
        if child.manifest is not None or self.publisher.is_pending(path):
            # journal first: if that fails (cache disk full), the file is still there
            await self._submit("delete_file", path, wait=False, changing=changing)
        else:  # created here and never published: nothing in the store to delete
            for dnode, entry in changing:
                dnode.recent.setdefault(entry, [1, 0])[0] -= 1
        self._detach(child)
        self._touch(parent)

    async def symlink(self, parent_inode: int, name: str, target: str) -> Node:
        parent = await self._writable_dir(parent_inode)
        await self._refresh(parent)
        self._check_name_free(parent, name)
        now = time.time_ns()
        m = Manifest(size=len(target.encode()), mode=stat.S_IFLNK | 0o777, mtime_ns=now,
                     writer=self.opt.writer_id, target=target)
        changing = self._changing((parent, name))
        node = self._new_node(parent, name, m.mode, now)
        self._set_manifest(node, m)
        self._touch(parent)
        await self._submit("put_file", node.path, body=m.to_json(), changing=changing)
        return node

    def readlink(self, inode: int) -> str:
        node = self.node(inode)
        if node.manifest is None or node.manifest.target is None:
            raise InvalidArgument(node.path)
        return node.manifest.target

    async def rename(self, old_parent_inode: int, old_name: str, new_parent_inode: int,
                     new_name: str, noreplace: bool = False) -> None:
        old_parent = await self._writable_dir(old_parent_inode)
        new_parent = await self._writable_dir(new_parent_inode)
        src = await self.lookup(old_parent_inode, old_name)
        await self._refresh(new_parent)
        assert new_parent.children is not None
        if "/" in new_name or "\0" in new_name:
            raise InvalidArgument(new_name)
        self._check_name(new_name)
        dst = new_parent.children.get(new_name)
        if dst is src:
            return
        if dst is not None and noreplace:
            raise Exists(dst.path)
        if src.is_dir:
            ancestor: Node | None = new_parent
            while ancestor is not None:
                if ancestor is src:
                    raise InvalidArgument(f"cannot move {src.path} into itself")
                ancestor = ancestor.parent
            if dst is not None:
                if not dst.is_dir:
                    raise NotADirectory(dst.path)
                await self._refresh(dst, force=True)
                if dst.children:
                    raise NotEmpty(dst.path)
        elif dst is not None and dst.is_dir:
            raise IsADirectory(dst.path)
        old_path = src.path
        changing = self._changing((old_parent, old_name), (new_parent, new_name))
        if dst is not None:
            self._detach(dst)
        assert old_parent.children is not None
        del old_parent.children[old_name]
        src.name = new_name
        src.parent = new_parent
        new_parent.children[new_name] = src
        self._touch(old_parent)
        self._touch(new_parent)
        kind = "rename_dir" if src.is_dir else "rename_file"
        await self._submit(kind, old_path, src.path, changing=changing)

    # ===================================================================== attributes
    async def setattr(self, inode: int, size: int | None = None, mode: int | None = None,
                      mtime_ns: int | None = None, uid: int | None = None,
                      gid: int | None = None) -> Node:
        node = self.node(inode)
        if (uid is not None and uid not in (-1, self.uid)) or (
                gid is not None and gid not in (-1, self.gid)):
            raise NotPermitted("chown to another owner is not supported")
        if size is not None:
            if node.is_dir:
                raise IsADirectory(node.path)
            async with node.lock:
                await self._truncate(node, size)
        if mode is not None:
            node.mode = stat.S_IFMT(node.mode) | (mode & 0o7777)
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
        if node.buffer is not None and not self._has_writer(node):
            # truncate(2) of a file nobody has open for writing: no close will publish it
            async with node.lock:
                if node.buffer is not None:
                    await self._publish(node, fsync=False)
        elif (mode is not None or mtime_ns is not None) and not node.removed:
            await self._publish_attributes(node)
        return node

    def _has_writer(self, node: Node) -> bool:
        """Whether a handle that may write (and so publishes at close) is open on the node."""
        return any(h.node is node and h.writable for h in self.handles.values())

    async def _publish_attributes(self, node: Node) -> None:
        """chmod/utimens: a new manifest or marker (files being written publish at close)."""
        if node.is_dir:
            body = DirMarker(node.mode, node.mtime_ns).to_json()
            await self._submit("put_dir", node.path, body=body, wait=False,
                               changing=self._changing((node.parent, node.name)))
        elif node.buffer is None and node.manifest is not None and not node.is_symlink:
            m = replace(node.manifest, mode=node.mode, mtime_ns=node.mtime_ns)
            node.manifest = m
            await self._submit("put_file", node.path, body=m.to_json(), wait=False,
                               changing=self._changing((node.parent, node.name)))

    def xattr(self, inode: int, name: str) -> bytes:
        node = self.node(inode)
        if name == STATE_XATTR and not node.is_dir:
            return self.file_state(node).encode()
        if name == CONTROL_XATTR and inode == ROOT_INODE:
            return self.opt.control_socket.encode()
        raise NoAttribute(name)

    def file_state(self, node: Node) -> str:
        """'open' (written, not yet closed), 'pending' (closed, chunks uploading),
        'durable' (every chunk in the store), or 'remote' (written by another node)."""
        if node.buffer is not None:
            return "open"
        m = node.manifest
        if not node.removed and self.publisher.is_pending(node.path):
            return "pending"  # its manifest is not in the store yet
        if m is None or m.is_symlink:
            return "durable"
        hashes = [h for h, _ in m.chunks]
        if all(h in self.uploader.in_store for h in hashes):
            return "durable"
        if any(self.uploader.is_pending(h) for h in hashes):
            return "pending"
        return "remote"

    @staticmethod
    def set_xattr(name: str) -> None:
        raise NotSupported(name)

    # ===================================================================== open/close
    async def create(self, parent_inode: int, name: str, mode: int, flags: int
                     ) -> tuple[int, Node]:
        parent = await self._writable_dir(parent_inode)
        await self._refresh(parent)
        self._check_name_free(parent, name)
        now = time.time_ns()
        node = self._new_node(parent, name, stat.S_IFREG | (mode & 0o7777), now)
        node.buffer = self._new_buffer(None)
        node.checked_at = time.monotonic()
        self._touch(parent)
        return self._open_handle(node, writable=True), node

    async def open(self, inode: int, flags: int) -> tuple[int, bool]:
        """Returns (fh, keep_cache)."""
        node = self.node(inode)
        if node.is_dir:
            raise IsADirectory(node.path)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        keep_cache = await self._revalidate(node)
        if writable and flags & os.O_TRUNC:
            async with node.lock:
                await self._truncate(node, 0)
        fh = self._open_handle(node, writable)
        m = node.manifest
        if (not writable and node.buffer is None and m is not None
                and m.size <= self.opt.prefetch_whole_file_max):
            self.fetcher.prefetch_nowait([h for h, _ in m.chunks])
        return fh, keep_cache

    async def _revalidate(self, node: Node) -> bool:
        """Close-to-open: re-read the manifest if older than the TTL. -> unchanged?"""
        if self._pinned(node) or node.manifest is None:
            return True
        checked_at = node.checked_at
        if time.monotonic() - checked_at < self.opt.metadata_ttl:
            return True
        m = await self._read_manifest(node.path)
        if m is None:
            return True  # deleted elsewhere: keep serving the version we know
        if node.checked_at != checked_at or self._pinned(node):
            return True  # published here meanwhile: newer than what the GET returned
        unchanged = m == node.manifest
        self._set_manifest(node, m)
        return unchanged

    def _open_handle(self, node: Node, writable: bool) -> int:
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

    async def wait_durable(self, node: Node) -> None:
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
            # written after the last flush (e.g. through a shared mmap): publish now
            async with node.lock:
                if node.buffer is not None:
                    try:
                        await self._publish(node, fsync=False)
                    except Exception:
                        log.exception("could not publish %s at release", node.path)
        node.opens -= 1
        self._maybe_drop(node)

    # ===================================================================== write path
    def _aligned(self, m: Manifest) -> bool:
        """Whether the manifest's chunks sit at this mount's fixed chunk boundaries."""
        return all(n == self.chunk_size for _, n in m.chunks[:-1]) and (
            not m.chunks or m.chunks[-1][1] <= self.chunk_size)

    def _new_buffer(self, m: Manifest | None) -> WriteBuffer:
        """A buffer over a new staging file, based on version `m` (None: empty file)."""
        st = self.cache.new_staging()
        st.writers += 1
        if m is None or m.is_symlink:
            return WriteBuffer(st, 0, [])
        os.ftruncate(st.fd, m.size)
        st.extent = m.size
        return WriteBuffer(st, m.size, list(m.chunks) if self._aligned(m) else [])

    async def _buffer(self, node: Node) -> WriteBuffer:
        """The node's write buffer, created on the first modification after a publish."""
        if node.buffer is None:
            m = node.manifest
            buf = self._new_buffer(m)
            if m is not None and m.chunks and not buf.base:
                # chunked differently (another chunker): copy every chunk into staging
                for (h, n), offset in zip(m.chunks, node.offsets):
                    await self._copy_chunk_into(buf.staging, node, h, n, offset)
                for i in range(self.chunker.count(buf.size)):
                    self._mark_written(buf, i)
            node.buffer = buf
        return node.buffer

    async def _copy_chunk_into(self, st: StagingFile, node: Node, chunk_hash: str, length: int,
                               offset: int) -> None:
        """Copy-on-write: a base chunk's bytes into the staging file at `offset`."""
        fd, off = await self._locate_for(node, chunk_hash)
        data = os.pread(fd, length, off)
        os.pwrite(st.fd, data, offset)

    def _mark_written(self, buf: WriteBuffer, index: int) -> None:
        """Chunk `index` was (or will now be) modified in the staging file."""
        buf.local.add(index)
        buf.versions[index] = buf.versions.get(index, 0) + 1
        buf.hashes.pop(index, None)
        start, end = self.chunker.span(index, buf.size)
        self.cache.set_dirty(buf.staging, start, max(end - start, 0))

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
        if self.cache.dirty_bytes >= self.cache.limit_bytes:
            await self._wait_for_space()
        async with node.lock:
            buf = await self._buffer(node)
            end = offset + len(data)
            await self._grow(node, buf, end)
            touched = self.chunker.touched(offset, len(data))
            for i in touched:
                if not buf.is_local(i):
                    start, chunk_end = self.chunker.span(i, buf.size)
                    if offset > start or end < chunk_end:  # partial overwrite of a base chunk
                        h, n = buf.base[i]
                        await self._copy_chunk_into(buf.staging, node, h, n, start)
            os.pwrite(buf.staging.fd, data, offset)
            crash_point("write")
            for i in touched:
                self._mark_written(buf, i)
            node.mtime_ns = time.time_ns()
            if offset == buf.seq_end:
                self._stream_hash(buf, offset, data)
            else:
                buf.stream = None
            if offset <= buf.seq_end < end:
                self._upload_early(buf, buf.seq_end, end)
                buf.seq_end = end
        return len(data)

    def _stream_hash(self, buf: WriteBuffer, offset: int, data: bytes) -> None:
        """Hash chunks as a sequential write stream fills them, so that close has nothing
        left to read back and hash but the tail: the bytes are in hand and hot in the CPU
        cache. Valid because only writes at seq_end feed the hash and any other write
        drops it; a chunk is hashed only if the stream covered it from its first byte."""
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            at = offset + pos
            i = at // self.chunk_size
            chunk_start = i * self.chunk_size
            take = min(len(view) - pos, chunk_start + self.chunk_size - at)
            if at == chunk_start:
                buf.stream, buf.stream_chunk = codec.chunk_hasher(), i
            if buf.stream is not None and buf.stream_chunk == i:
                buf.stream.update(view[pos:pos + take])
                if at + take == chunk_start + self.chunk_size:
                    buf.hashes[i] = (buf.stream.hexdigest(), buf.versions.get(i, 0))
                    buf.stream = None
            pos += take

    async def _grow(self, node: Node, buf: WriteBuffer, size: int) -> None:
        """Extend the buffer to `size`: the old partial tail chunk and the gap become local."""
        if size <= buf.size:
            return
        old = buf.size
        tail = old // self.chunk_size
        if old % self.chunk_size and not buf.is_local(tail):
            h, n = buf.base[tail]
            await self._copy_chunk_into(buf.staging, node, h, n, tail * self.chunk_size)
        buf.size = size
        node.size = size
        buf.staging.extent = max(buf.staging.extent, size)
        for i in range(tail, self.chunker.count(size)):
            self._mark_written(buf, i)

    def _upload_early(self, buf: WriteBuffer, old_end: int, new_end: int) -> None:
        """Queue the chunks that sequential writes just completed."""
        first = self.chunker.index(old_end)
        for i in range(first, new_end // self.chunk_size):
            version = buf.versions.get(i, 0)
            start = i * self.chunk_size

            def done(chunk_hash: str, i: int = i, version: int = version) -> None:
                if buf.versions.get(i) == version and buf.staging.fd >= 0:
                    buf.hashes[i] = (chunk_hash, version)
                    self.cache.clear_dirty(buf.staging, i * self.chunk_size)

            self.uploader.submit_early_nowait(
                UploadJob(buf.staging, start, self.chunk_size, on_done=done))

    async def _truncate(self, node: Node, size: int) -> None:
        if node.buffer is not None:
            node.buffer.stream = None
        if size == 0:  # O_TRUNC: a fresh, empty version
            if node.buffer is not None:
                old = node.buffer.staging
                old.writers -= 1
                self.cache.release_staging(old)
            node.buffer = self._new_buffer(None)
        else:
            buf = await self._buffer(node)
            if size > buf.size:
                os.ftruncate(buf.staging.fd, size)
                await self._grow(node, buf, size)
            elif size < buf.size:
                count = self.chunker.count(size)
                last = count - 1
                if size % self.chunk_size and not buf.is_local(last):
                    h, n = buf.base[last]
                    await self._copy_chunk_into(buf.staging, node, h, n,
                                                last * self.chunk_size)
                del buf.base[count:]
                for i in [i for i in buf.local if i >= count]:
                    buf.local.discard(i)
                    buf.hashes.pop(i, None)
                    self.cache.clear_dirty(buf.staging, i * self.chunk_size)
                os.ftruncate(buf.staging.fd, size)
                buf.size = size
                if size % self.chunk_size:
                    self._mark_written(buf, last)
                buf.seq_end = min(buf.seq_end, size)
        node.size = size
        node.mtime_ns = time.time_ns()

    async def _publish(self, node: Node, fsync: bool) -> None:
        """Seal the node's buffer into a manifest, journal it, and PUT it (bounded wait)."""
        buf = node.buffer
        assert buf is not None
        st = buf.staging
        count = self.chunker.count(buf.size)
        if buf.stream is not None and buf.seq_end == buf.size:  # the streamed partial tail
            buf.hashes[buf.stream_chunk] = (buf.stream.hexdigest(),
                                            buf.versions.get(buf.stream_chunk, 0))
        to_hash = [i for i in range(count) if buf.is_local(i) and (
            i not in buf.hashes or buf.hashes[i][1] != buf.versions.get(i, 0))]
        spans = [self.chunker.span(i, buf.size) for i in to_hash]
        hashed = await trio.to_thread.run_sync(self._hash_spans, st.fd, spans,
                                               limiter=self._hash_limiter)
        for i, h in zip(to_hash, hashed):
            buf.hashes[i] = (h, buf.versions.get(i, 0))
        chunks: list[tuple[str, int]] = []
        pending: list[PendingChunk] = []
        for i in range(count):
            start, end = self.chunker.span(i, buf.size)
            if buf.is_local(i):
                h = buf.hashes[i][0]
                pending.append(PendingChunk(h, st.id, start, end - start))
                self.cache.add_staged_chunk(h, st, start, end - start)
            else:
                h = buf.base[i][0]
            chunks.append((h, end - start))
        if fsync:
            await trio.to_thread.run_sync(os.fsync, st.fd, limiter=self._hash_limiter)
        m = Manifest(size=buf.size, mode=node.mode, mtime_ns=node.mtime_ns, chunks=tuple(chunks),
                     chunk_size=self.chunk_size, writer=self.opt.writer_id)
        if not node.removed:
            # journal first: if that fails (cache disk full), the buffer stays open and
            # close/fsync report the error; nothing is half published
            await self._submit("put_file", node.path, body=m.to_json(), chunks=pending,
                               changing=self._changing((node.parent, node.name)))
            self.published_bytes += m.size
        for c in pending:
            if node.removed or c.hash in self.uploader.in_store:
                self.cache.clear_dirty(st, c.offset)  # nothing to upload for these
        st.sealed = True
        st.writers -= 1
        node.buffer = None
        self._set_manifest(node, m)  # unlinked while open: still readable through its fds
        self.cache.release_staging(st)
        self.cache.evict()

    @staticmethod
    def _hash_spans(fd: int, spans: list[tuple[int, int]]) -> list[str]:
        return [codec.chunk_hash(pread_scratch(fd, end - start, start)) for start, end in spans]

    # ===================================================================== read path
    async def read(self, fh: int, offset: int, size: int) -> bytes:
        h = self.handle(fh)
        node = h.node
        buf = node.buffer
        file_size = buf.size if buf is not None else node.size
        end = min(offset + size, file_size)
        if offset >= end:
            return b""
        if buf is not None:
            return await self._read_buffer(node, buf, offset, end)
        m = node.manifest
        if m is None:
            return b""
        offsets = node.offsets
        first = m.chunk_at(offsets, offset)
        last = m.chunk_at(offsets, end - 1)
        if self.opt.readahead_chunks:
            ahead = m.chunks[last + 1:last + 1 + self.opt.readahead_chunks]
            if ahead:
                self.fetcher.prefetch_nowait([c for c, _ in ahead])
        parts = []
        for i in range(first, last + 1):
            chunk_hash, _ = m.chunks[i]
            lo = max(offset, offsets[i])
            hi = min(end, offsets[i + 1])
            fd, base = await self._locate_for(node, chunk_hash)
            part = os.pread(fd, hi - lo, base + lo - offsets[i])
            if len(part) != hi - lo:  # the chunk is shorter than its manifest says
                raise CorruptChunkError(f"chunk {chunk_hash} of {node.path} is truncated")
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _locate_for(self, node: Node, chunk_hash: str) -> tuple[int, int]:
        """fetcher.locate, with the one log line that names the file and its writer."""
        try:
            return await self.fetcher.locate(chunk_hash)
        except (MissingChunkError, CorruptChunkError) as e:
            writer = node.manifest.writer if node.manifest else ""
            log.error("read of %s failed: %s (written by node %s)", node.path, e,
                      writer or "?")
            raise

    async def _read_buffer(self, node: Node, buf: WriteBuffer, offset: int, end: int) -> bytes:
        parts = []
        pos = offset
        while pos < end:
            i = self.chunker.index(pos)
            chunk_end = min((i + 1) * self.chunk_size, end)
            if buf.is_local(i):
                parts.append(os.pread(buf.staging.fd, chunk_end - pos, pos))
            else:
                chunk_hash, _ = buf.base[i]
                fd, base = await self._locate_for(node, chunk_hash)
                parts.append(os.pread(fd, chunk_end - pos, base + pos - i * self.chunk_size))
            pos = chunk_end
        return b"".join(parts)

    # ===================================================================== whole mount
    def statfs(self) -> dict[str, int]:
        """Sizes of the cache directory's disk, where every write lands first: `df` on the
        mount shows how much can still be written locally. Inodes are not limited."""
        disk = os.statvfs(self.cache.root)
        return {"bsize": disk.f_frsize, "blocks": disk.f_blocks, "bfree": disk.f_bfree,
                "bavail": disk.f_bavail, "files": 1 << 32, "ffree": 1 << 32,
                "namemax": NAME_MAX}

    def open_buffers(self) -> int:
        return sum(1 for n in self.nodes.values() if n.buffer is not None)

    def statistics(self) -> dict[str, object]:
        """What `ckptfs status --json` prints (docs/OPERATIONS.md explains each field)."""
        up = self.uploader.statistics()
        fetch = self.fetcher.statistics()
        errors = [e for e in (up.last_error, self.publisher.last_error) if e]
        rate = up.upload_rate
        dirty = self.cache.dirty_bytes
        return {
            "dirty_bytes": dirty,
            "uploading_bytes": up.uploading_bytes,
            "uploaded_bytes": up.uploaded_bytes,
            "stored_bytes": up.stored_bytes,
            "dedup_bytes": up.dedup_bytes,
            "logical_bytes": self.published_bytes,
            "compression_ratio": round(up.uploaded_bytes / up.stored_bytes, 3)
            if up.stored_bytes else None,
            "dedup_ratio": round((up.uploaded_bytes + up.dedup_bytes) / up.uploaded_bytes, 3)
            if up.uploaded_bytes else None,
            "cache_bytes": self.cache.used_bytes,
            "cache_limit": self.cache.limit_bytes,
            "upload_rate": round(rate),
            "eta_seconds": round(dirty / rate, 1) if rate > 0 else None,
            "pending_chunks": self.uploader.pending_count(),
            "pending_ops": self.publisher.pending_count,
            "open_files": self.open_buffers(),
            "fetched_bytes": fetch.fetched_bytes,
            "cache_hits": fetch.cache_hits,
            "cache_misses": fetch.cache_misses,
            "errors": errors,
            "retrying_since": up.retrying_since,
            "durable": self.durable(),
        }

    def durable(self) -> bool:
        return self.uploader.pending_count() == 0 and self.publisher.pending_count == 0

    def sync_target(self) -> tuple[int, frozenset[str]]:
        """What `ckptfs sync` waits for: the ops and chunks journaled so far."""
        return self.publisher.last_seq, frozenset(self.uploader.pending_hashes())

    def reached(self, target: tuple[int, frozenset[str]]) -> bool:
        seq, hashes = target
        return self.publisher.applied_seq >= seq and not any(
            self.uploader.is_pending(h) for h in hashes)

    async def wait_all_durable(self) -> None:
        """Until every closed file and metadata change is in the store."""
        while not self.durable():
            with trio.move_on_after(0.5):
                await self.uploader.wait_changed()
