"""The floor of a Python FUSE write path: a pyfuse3 file system that does nothing but
pass each write to a local file (or, with --discard, drop it), for the benchmarks.

    .venv/bin/python scripts/trivialfs.py MOUNTPOINT BACKING_DIR [--discard] [--background]

One flat directory; every file is a file of the same name in BACKING_DIR. Write-only
opens get direct I/O, as in ckptfs, so the two pay the same transport. It runs in the
foreground until unmounted (fusermount3 -u); with --background it returns once the
mount is ready, as `ckptfs mount` does (its modules imported, then a fork, the child
mounts and says so on a pipe): the floor of a mount's start-up (bench_parts.py mount).
Not part of ckptfs.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable
from typing import NoReturn


def serve(mountpoint: str, backing: str, discard: bool = False,
          ready: Callable[[], None] | None = None) -> None:
    """Run the file system in this process until it is unmounted; `ready` is called once
    it is mounted."""
    import pyfuse3
    import trio

    class Trivial(pyfuse3.Operations):
        def __init__(self) -> None:
            super().__init__()
            self.inodes: dict[bytes, int] = {}  # name -> inode (inode 1 is the root)
            self.names: dict[int, bytes] = {}
            self.fds: dict[int, int] = {}
            self.sizes: dict[int, int] = {}
            self.next_inode = 2

        def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            a.st_ino = inode
            a.st_mode = (stat.S_IFDIR | 0o755) if inode == 1 else (stat.S_IFREG | 0o644)
            a.st_size = self.sizes.get(inode, 0)
            a.st_nlink = 1
            a.attr_timeout = a.entry_timeout = 1
            return a

        def _open_backing(self, inode: int, flags: int) -> None:
            if inode not in self.fds:
                path = os.path.join(backing, os.fsdecode(self.names[inode]))
                self.fds[inode] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if flags & os.O_TRUNC:
                os.ftruncate(self.fds[inode], 0)
                self.sizes[inode] = 0

        async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
            return self._attr(inode)

        async def lookup(self, parent, name, ctx=None):  # type: ignore[no-untyped-def]
            if name not in self.inodes:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(self.inodes[name])

        async def create(self, parent, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
            if name not in self.inodes:
                self.inodes[name], self.next_inode = self.next_inode, self.next_inode + 1
            inode = self.inodes[name]
            self.names[inode] = name
            self._open_backing(inode, flags | os.O_TRUNC)
            return pyfuse3.FileInfo(fh=inode, direct_io=True), self._attr(inode)

        async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
            self._open_backing(inode, flags)
            return pyfuse3.FileInfo(fh=inode, direct_io=flags & os.O_ACCMODE == os.O_WRONLY)

        async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
            if fields.update_size:
                os.ftruncate(self.fds[inode], attr.st_size)
                self.sizes[inode] = attr.st_size
            return self._attr(inode)

        async def read(self, fh, off, size):  # type: ignore[no-untyped-def]
            return os.pread(self.fds[fh], size, off)

        async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
            n = len(buf) if discard else os.pwrite(self.fds[fh], buf, off)
            self.sizes[fh] = max(self.sizes.get(fh, 0), off + n)
            return n

        async def unlink(self, parent, name, ctx):  # type: ignore[no-untyped-def]
            inode = self.inodes.pop(name, None)
            if inode is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if inode in self.fds:
                os.close(self.fds.pop(inode))
            self.sizes.pop(inode, None)
            os.unlink(os.path.join(backing, os.fsdecode(name)))

    pyfuse3.init(Trivial(), mountpoint, {"fsname=trivialfs"})
    if ready is not None:
        ready()
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


def background(mountpoint: str, backing: str, discard: bool) -> NoReturn:
    """Fork the file system and exit once it is mounted: 0, or 1 if the child failed."""
    import pyfuse3  # noqa: F401 - before the fork, as `ckptfs mount` imports its daemon's
    import trio  # noqa: F401

    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)  # the caller's pipes let go, as ckptfs's
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)

        def ready() -> None:
            os.write(write_fd, b"ok\n")

        try:
            serve(mountpoint, backing, discard, ready)
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as answer:
        mounted = answer.readline() == b"ok\n"
    os._exit(0 if mounted else 1)  # without the teardown of pyfuse3, as `ckptfs mount`


if __name__ == "__main__":
    flags = sys.argv[3:]
    if len(sys.argv) < 3 or not set(flags) <= {"--discard", "--background"}:
        sys.exit(__doc__)
    if "--background" in flags:
        background(sys.argv[1], sys.argv[2], "--discard" in flags)
    serve(sys.argv[1], sys.argv[2], discard="--discard" in flags)
