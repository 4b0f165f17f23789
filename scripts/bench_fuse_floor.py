"""The floor of a Python FUSE write path on this machine: a trivial pyfuse3 file system
whose only file is a pwrite into a local file, against ckptfs and the local disk.

    .venv/bin/python scripts/bench_fuse_floor.py --mib 1024 --runs 3

Prints the seconds `dd bs=1M` takes into each (medians, interleaved). ckptfs cannot beat
the trivial file system; the gap between them is what ckptfs's own work costs. Both open
write-only files with direct I/O, as ckptfs does; every dd starts with an empty file,
after the page cache is dropped (but for the source) and the machine left idle for 2 s
(see bench.py). Run as root.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def serve_trivial(mountpoint: str, backing: str) -> None:
    """Run the trivial file system in this process until unmounted."""
    import pyfuse3
    import trio

    class Trivial(pyfuse3.Operations):
        def __init__(self) -> None:
            super().__init__()
            self.fd = -1
            self.size = 0

        def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
            a = pyfuse3.EntryAttributes()
            a.st_ino = inode
            a.st_mode = (stat.S_IFDIR | 0o755) if inode == 1 else (stat.S_IFREG | 0o644)
            a.st_size = self.size if inode == 2 else 0
            a.st_nlink = 1
            a.attr_timeout = a.entry_timeout = 1
            return a

        async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
            return self._attr(inode)

        async def lookup(self, parent, name, ctx=None):  # type: ignore[no-untyped-def]
            if name != b"f" or self.fd < 0:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(2)

        async def create(self, parent, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
            self.fd = os.open(backing, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            self.size = 0
            return pyfuse3.FileInfo(fh=2, direct_io=True), self._attr(2)

        async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
            if flags & os.O_TRUNC:
                os.ftruncate(self.fd, 0)
                self.size = 0
            return pyfuse3.FileInfo(fh=2, direct_io=flags & os.O_ACCMODE == os.O_WRONLY)

        async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
            if fields.update_size:
                os.ftruncate(self.fd, attr.st_size)
                self.size = attr.st_size
            return self._attr(inode)

        async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
            n = os.pwrite(self.fd, buf, off)
            self.size = max(self.size, off + n)
            return n

        async def unlink(self, parent, name, ctx):  # type: ignore[no-untyped-def]
            pass

    pyfuse3.init(Trivial(), mountpoint, {"fsname=trivial"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


def dd(src: Path, dst: Path) -> float:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    src.read_bytes()  # the source in the page cache again, so dd measures the target
    time.sleep(2)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M"], check=True,
                   capture_output=True)
    return time.perf_counter() - t


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve_trivial(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptfs-floor-"))
    src = work / "src.bin"
    with open(src, "wb") as f:
        for _ in range(a.mib):
            f.write(os.urandom(1 << 20))
    dirs = {n: work / n for n in ("local", "trivial", "ckptfs", "store")}
    for d in dirs.values():
        d.mkdir()
    trivial = subprocess.Popen([sys.executable, __file__, "--serve", str(dirs["trivial"]),
                                str(work / "trivial-backing")])
    subprocess.run([*CKPTFS, "mount", str(dirs["store"]), str(dirs["ckptfs"]), "--cache-dir",
                    str(work / "cache")], check=True)
    times: dict[str, list[float]] = {"local": [], "trivial": [], "ckptfs": []}
    try:
        time.sleep(1)
        for _ in range(a.runs):
            for name in times:
                target = dirs[name] / "f"
                if name != "trivial" and target.exists():
                    target.unlink()
                times[name].append(dd(src, target))
    finally:
        subprocess.run(["fusermount3", "-u", str(dirs["trivial"])], capture_output=True)
        trivial.wait(10)
        subprocess.run([*CKPTFS, "umount", str(dirs["ckptfs"])], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"dd bs=1M of {a.mib} MiB, medians of {a.runs} interleaved runs")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:8s} {m:6.2f} s  {a.mib / m:7.0f} MiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
