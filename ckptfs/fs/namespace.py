"""The in-memory tree: nodes (directories, files, symlinks), the inode table, recent changes.

A node lives as long as the kernel knows its inode (lookup counts, dropped in forget)
or a descriptor holds it open. Directory and file state are separate classes; a symlink
is a FileNode whose manifest has a target. Nothing here does I/O.
"""

from __future__ import annotations

import math
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from ckptfs.format.manifests import Manifest, kept_mode
from ckptfs.fs.writebuffer import WriteBuffer
from ckptfs.pipeline.cache import StagingFile

ROOT_INODE = 1


@dataclass(eq=False)
class Node:
    """What every entry has: identity, place in the tree, attributes, kernel references."""

    inode: int
    name: str
    parent: DirNode | None
    mode: int
    mtime_ns: int
    lookups: int = 0
    removed: bool = False
    uid: int | None = None  # the owner its record names (None: none, see ownership.py)
    gid: int | None = None

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


NodeT = TypeVar("NodeT", bound=Node)


class RecentChanges:
    """The entries of one directory changed here recently, which a listing from the store
    must not undo: a change not yet journaled, or journaled with a seq the listing may
    predate (listing.py compares it with the publisher's applied seq)."""

    def __init__(self) -> None:
        self._entries: dict[str, list[int]] = {}  # name -> [changes in progress, last seq]

    def begin(self, name: str) -> None:
        """A change of `name` starts (before its op is journaled)."""
        self._entries.setdefault(name, [0, 0])[0] += 1

    def end(self, name: str, seq: int) -> None:
        """That change is journaled as op `seq` (0: it was not, e.g. it failed)."""
        entry = self._entries.setdefault(name, [1, 0])
        entry[0] -= 1
        entry[1] = max(entry[1], seq)

    def forget_applied(self, applied_seq: int) -> None:
        """Drop the changes the store had before a listing was sent: it shows them."""
        for name, (in_progress, seq) in list(self._entries.items()):
            if not in_progress and seq <= applied_seq:
                del self._entries[name]

    def changed_since(self, name: str, applied_seq: int) -> bool:
        """Whether `name` changed here after the store's state at `applied_seq`."""
        entry = self._entries.get(name)
        return entry is not None and (entry[0] > 0 or entry[1] > applied_seq)


@dataclass(eq=False)
class DirNode(Node):
    """A directory: its children as this node knows them, and when it last listed them."""

    children: dict[str, Node] = field(default_factory=dict)
    listed_at: float = 0.0  # monotonic time of the last LIST (or of a mkdir here)
    #: monotonic time at which the last LIST merged here was sent: its answer holds for
    #: the questions asked before then (listing.py, negative answers)
    list_sent: float = -math.inf
    listed: bool = False  # the children came from the store once, or from a local mkdir
    recent: RecentChanges = field(default_factory=RecentChanges)


@dataclass(eq=False)
class FileNode(Node):
    """A file or symlink: its published version (manifest) and the one being written."""

    size: int = 0
    manifest: Manifest | None = None
    offsets: list[int] = field(default_factory=list)  # chunk start offsets of `manifest`
    manifest_key_size: int = -1  # size of the manifest object when last listed
    buffer: WriteBuffer | None = None
    checked_at: float = 0.0  # monotonic time the manifest was last read
    opens: int = 0
    publish_error: str | None = None  # why the last publish at release failed
    damaged: str | None = None  # why its manifest in the store is damaged (listing.py)
    prefetched: Manifest | None = None  # the version an open prefetched whole, if any
    #: staging files of versions sealed after the file was unlinked: their bytes are
    #: nowhere else (never uploaded), so they stay until the last descriptor closes
    kept: list[StagingFile] = field(default_factory=list)
    lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def current_size(self) -> int:
        """The size this node shows: of the version being written, if any."""
        return self.buffer.size if self.buffer is not None else self.size

    def set_manifest(self, m: Manifest) -> None:
        self.damaged = None
        self.manifest = m
        self.offsets = m.chunk_offsets()
        self.size = m.size
        self.mode = (stat.S_IFLNK | 0o777) if m.is_symlink else m.mode
        self.mtime_ns = m.mtime_ns
        self.uid, self.gid = m.uid, m.gid
        self.checked_at = time.monotonic()


class InodeTable:
    """Every node the mount knows, by inode; the tree hangs off `root`.

    `on_drop(node, forgotten)` releases what a removed node holds in the cache: called
    once nobody has it open, with forgotten=True once the kernel has no reference either.
    """

    def __init__(self, on_drop: Callable[[Node, bool], None]) -> None:
        self.root = DirNode(ROOT_INODE, "", None, stat.S_IFDIR | 0o755, time.time_ns())
        self.nodes: dict[int, Node] = {ROOT_INODE: self.root}
        self._next_inode = ROOT_INODE + 1
        self._on_drop = on_drop

    def get(self, inode: int) -> Node | None:
        return self.nodes.get(inode)

    def new_dir(self, parent: DirNode, name: str, mode: int, mtime_ns: int,
                uid: int | None = None, gid: int | None = None) -> DirNode:
        mode = stat.S_IFDIR | kept_mode(stat.S_IMODE(mode))
        node = DirNode(self._next_inode, name, parent, mode, mtime_ns, uid=uid, gid=gid)
        return self._add(parent, node)

    def new_file(self, parent: DirNode, name: str, mode: int, mtime_ns: int,
                 uid: int | None = None, gid: int | None = None) -> FileNode:
        return self._add(parent, FileNode(self._next_inode, name, parent, kept_mode(mode),
                                          mtime_ns, uid=uid, gid=gid))

    def _add(self, parent: DirNode, node: NodeT) -> NodeT:
        self._next_inode += 1
        self.nodes[node.inode] = node
        parent.children[node.name] = node
        return node

    def move(self, node: Node, new_parent: DirNode, new_name: str) -> None:
        """Re-hang `node` (the caller has detached whatever was at the new name)."""
        assert node.parent is not None
        del node.parent.children[node.name]
        node.name = new_name
        node.parent = new_parent
        new_parent.children[new_name] = node

    def detach(self, node: Node) -> None:
        """Take a node out of the tree (deleted here or on another node)."""
        parent = node.parent
        if parent is not None and parent.children.get(node.name) is node:
            del parent.children[node.name]
        node.removed = True
        self.maybe_drop(node)

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped `count` references to the inode."""
        node = self.nodes.get(inode)
        if node is not None and inode != ROOT_INODE:
            node.lookups -= count
            self.maybe_drop(node)

    def maybe_drop(self, node: Node) -> None:
        """Forget a removed node once nobody refers to it (recursively for directories)."""
        if not node.removed or (isinstance(node, FileNode) and node.opens > 0):
            return
        forgotten = node.lookups <= 0
        self._on_drop(node, forgotten)
        if forgotten:
            self.nodes.pop(node.inode, None)
            if isinstance(node, DirNode):
                for child in list(node.children.values()):
                    child.removed = True
                    self.maybe_drop(child)

    def open_buffers(self) -> list[FileNode]:
        """Files with written data not yet published (open, or failed to publish)."""
        return [n for n in self.nodes.values()
                if isinstance(n, FileNode) and n.buffer is not None and not n.removed]

