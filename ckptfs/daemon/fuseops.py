"""The pyfuse3 edge: request handlers that call the filesystem core and map errors to errno.

This is the only module that raises FUSEError. Every handler is small: decode names,
call CheckpointFS, build EntryAttributes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import wraps
from typing import Any, TypeVar

import pyfuse3

from ckptfs.common import errors
from ckptfs.common.latency import LatencyTable
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import FileNode, Node
from ckptfs.fs.ownership import Caller

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

ERRNO: list[tuple[type[BaseException], int]] = [
    (errors.NoEntry, errno.ENOENT),
    (errors.Exists, errno.EEXIST),
    (errors.NotEmpty, errno.ENOTEMPTY),
    (errors.IsADirectory, errno.EISDIR),
    (errors.NotADirectory, errno.ENOTDIR),
    (errors.NotPermitted, errno.EPERM),
    (errors.NameTooLong, errno.ENAMETOOLONG),
    (errors.InvalidArgument, errno.EINVAL),
    (errors.NoAttribute, pyfuse3.ENOATTR),
    (errors.NotSupported, errno.ENOTSUP),
    (errors.StoreUnavailable, errno.EIO),
    (errors.DamagedRecord, errno.EIO),
    (errors.MissingChunkError, errno.EIO),
    (errors.CorruptChunkError, errno.EIO),
]


def to_errno(e: BaseException) -> int:
    for cls, code in ERRNO:
        if isinstance(e, cls):
            return code
    if isinstance(e, OSError) and e.errno:
        return e.errno
    return errno.EIO


def direct_io(flags: int) -> bool:
    """Write-only opens bypass the kernel page cache (FOPEN_DIRECT_IO): each write goes
    to the daemon straight from the writer's pages, without a second copy in the FUSE
    inode's page cache and without the security.capability getxattr the kernel sends
    before every cached write. Such a descriptor cannot be mmapped anyway; readers
    (O_RDONLY, O_RDWR) keep the page cache, so mmap works for them."""
    return flags & os.O_ACCMODE == os.O_WRONLY


def caller(ctx: Any, groups: bool = False) -> Caller:
    """Who sent a request (its RequestContext); with `groups`, also the supplementary
    groups of its process, which only a chown of a group needs."""
    return Caller(ctx.uid, ctx.gid, supplementary_groups(ctx.pid) if groups else frozenset())


def supplementary_groups(pid: int) -> frozenset[int]:
    """The supplementary groups of process (or thread) `pid`, from /proc/PID/status;
    none if it cannot be read (the process is gone): then only its own gid counts."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def fuse_error(e: Exception, op: str) -> pyfuse3.FUSEError:
    """The FUSEError(errno) a request `op` that raised `e` answers; unexpected errors
    are logged."""
    if isinstance(e, pyfuse3.FUSEError):
        return e
    if isinstance(e, errors.FsError):
        return pyfuse3.FUSEError(to_errno(e))
    if isinstance(e, (errors.MissingChunkError, errors.CorruptChunkError)):
        return pyfuse3.FUSEError(errno.EIO)
    if isinstance(e, errors.JournalFull):
        log.error("%s: the cache directory is full (%s)", op, e)
        return pyfuse3.FUSEError(errno.ENOSPC)
    if isinstance(e, errors.JournalError):
        log.error("%s: %s", op, e)
        return pyfuse3.FUSEError(errno.EIO)
    if isinstance(e, OSError):
        if e.errno == errno.ENOSPC:
            log.error("%s: the cache directory is full: %s", op, e)
        else:
            log.exception("%s failed", op)
        return pyfuse3.FUSEError(to_errno(e))
    log.exception("%s failed unexpectedly", op)
    return pyfuse3.FUSEError(errno.EIO)


def fuse_errors(fn: F) -> F:
    """Turn the project's exceptions into FUSEError(errno); log unexpected ones. With
    metrics on (FuseOps.requests), each request is timed and counted by its name, and
    its error by errno name."""
    op = fn.__name__

    @wraps(fn)
    async def wrapper(self: FuseOps, *args: Any, **kwargs: Any) -> Any:
        requests = self.requests
        start = time.perf_counter() if requests is not None else 0.0
        try:
            result = await fn(self, *args, **kwargs)
        except Exception as e:
            error = fuse_error(e, op)
            if requests is not None:
                requests.record(op, time.perf_counter() - start,
                                errno.errorcode.get(error.errno, str(error.errno)))
            if error is e:
                raise
            chunk = isinstance(e, (errors.MissingChunkError, errors.CorruptChunkError))
            raise error from (e if chunk else None)
        if requests is not None:
            requests.record(op, time.perf_counter() - start)
        return result

    return wrapper  # type: ignore[return-value]


class FuseOps(pyfuse3.Operations):
    """pyfuse3 request handlers over a CheckpointFS."""

    supports_dot_lookup = False

    def __init__(self, fs: CheckpointFS, requests: LatencyTable | None = None) -> None:
        super().__init__()
        self.fs = fs
        self.requests = requests  # with metrics on: every request timed (fuse_errors)
        fs.lister.on_gone = self._invalidate_entry
        # open directories: fh -> (inode, snapshot of the entries being read)
        self._dir_handles: dict[int, tuple[int, list[tuple[str, Node]] | None]] = {}
        self._next_dir_fh = 1

    def attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.inode
        a.generation = 0
        a.st_mode = self.fs.owners.mode(node)
        a.st_nlink = 2 if node.is_dir else 1
        a.st_uid, a.st_gid = self.fs.owners.owner(node)
        a.st_rdev = 0
        size = node.current_size if isinstance(node, FileNode) else 0
        a.st_size = size
        a.st_blksize = 1 << 20
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = node.mtime_ns
        # a damaged file is listed, but the kernel must ask again (lookup: EIO) each time
        ttl = 0 if isinstance(node, FileNode) and node.damaged else self.fs.opt.metadata_ttl
        a.attr_timeout = ttl
        a.entry_timeout = ttl
        return a

    @staticmethod
    def _invalidate_entry(parent_inode: int, name: str) -> None:
        """Drop a name from the kernel's cache: removed on another node, so the old name
        must give ENOENT at once, not after the entry timeout."""
        try:
            pyfuse3.invalidate_entry_async(parent_inode, os.fsencode(name),
                                           ignore_enoent=True)
        except Exception as e:  # noqa: BLE001 - only a cache: the entry times out anyway
            log.debug("cannot invalidate %s in inode %d: %s", name, parent_inode, e)

    def _looked_up(self, node: Node) -> pyfuse3.EntryAttributes:
        node.lookups += 1
        return self.attributes(node)

    @fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        return self._looked_up(await self.fs.lookup(parent_inode, os.fsdecode(name)))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.fs.forget(inode, count)

    @fuse_errors
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        return self.attributes(self.fs.getattr(inode))

    @fuse_errors
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
        node = await self.fs.setattr(
            inode,
            size=attr.st_size if fields.update_size else None,
            mode=attr.st_mode if fields.update_mode else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            caller=caller(ctx, groups=fields.update_gid))
        return self.attributes(node)

    @fuse_errors
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.fsencode(self.fs.readlink(inode))

    @fuse_errors
    async def opendir(self, inode: int, ctx: Any) -> int:
        if not self.fs.node(inode).is_dir:
            raise errors.NotADirectory(str(inode))
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dir_handles[fh] = (inode, None)
        return fh

    @fuse_errors
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        # Offsets index a snapshot taken when reading starts (offset 0): entries created
        # or removed meanwhile must not shift the others (skipped or repeated entries).
        inode, entries = self._dir_handles[fh]
        if entries is None or start_id == 0:
            entries = await self.fs.readdir(inode)
            if fh in self._dir_handles:  # not released while listing
                self._dir_handles[fh] = (inode, entries)
        for index, (name, node) in enumerate(entries[start_id:], start_id + 1):
            if node.removed:
                continue  # removed since the snapshot: may be left out (POSIX)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self.attributes(node), index):
                break
            node.lookups += 1

    async def releasedir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)

    @fuse_errors
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        if self.fs.opt.fsync_to_store:
            await self.fs.publisher.wait_empty()

    @fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        return self._looked_up(await self.fs.mkdir(parent_inode, os.fsdecode(name), mode,
                                                   caller(ctx)))

    @fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, os.fsdecode(name))

    @fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, os.fsdecode(name))

    @fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        node = await self.fs.symlink(parent_inode, os.fsdecode(name), os.fsdecode(target),
                                     caller(ctx))
        return self._looked_up(node)

    @fuse_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise errors.InvalidArgument("RENAME_EXCHANGE is not supported")
        await self.fs.rename(parent_inode_old, os.fsdecode(name_old), parent_inode_new,
                             os.fsdecode(name_new),
                             noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE))

    @fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise errors.NotPermitted("hard links are not supported")

    @fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: Any) -> Any:
        if not stat.S_ISREG(mode):
            raise errors.NotPermitted("only regular files, directories and symlinks")
        fh, node = await self.fs.create(parent_inode, os.fsdecode(name), mode, os.O_WRONLY,
                                        caller(ctx))
        await self.fs.flush(fh)
        await self.fs.release(fh)
        return self._looked_up(node)

    @fuse_errors
    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        fh, keep_cache = await self.fs.open(inode, flags)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache, direct_io=direct_io(flags))

    @fuse_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> Any:
        fh, node = await self.fs.create(parent_inode, os.fsdecode(name), mode, flags,
                                        caller(ctx))
        return pyfuse3.FileInfo(fh=fh, direct_io=direct_io(flags)), self._looked_up(node)

    @fuse_errors
    async def read(self, fh: int, off: int, size: int  # type: ignore[override]
                   ) -> bytes | memoryview:
        return await self.fs.read(fh, off, size)  # a view: pyfuse3 takes any buffer

    @fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @fuse_errors
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    @fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    async def release(self, fh: int) -> None:
        await self.fs.release(fh)

    @fuse_errors
    async def statfs(self, ctx: Any) -> Any:
        s = pyfuse3.StatvfsData()
        d = self.fs.statfs()
        s.f_bsize = s.f_frsize = d["bsize"]
        s.f_blocks = d["blocks"]
        s.f_bfree = d["bfree"]
        s.f_bavail = d["bavail"]
        s.f_files = d["files"]
        s.f_ffree = s.f_favail = d["ffree"]
        s.f_namemax = d["namemax"]
        return s

    @fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        return self.fs.xattr(inode, os.fsdecode(name))

    @fuse_errors
    async def listxattr(self, inode: int, ctx: Any) -> Sequence[bytes]:
        return [] if self.fs.node(inode).is_dir else [b"user.ckptfs.state"]

    @fuse_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        self.fs.set_xattr(os.fsdecode(name))

    @fuse_errors
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        self.fs.set_xattr(os.fsdecode(name))
