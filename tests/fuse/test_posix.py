"""POSIX behaviour of a real ckptfs FUSE mount (LocalStore under tmp_path; SeaweedFS S3
too where a test takes `any_cluster`).

Every test runs the real `ckptfs mount` command. Where persistence matters, the mount is
unmounted with `ckptfs umount` (which must exit 0) and the store is mounted again by
"another node": a second Mount with an EMPTY cache directory, which can only see what
reached the store.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import itertools
import json
import mmap
import os
import random
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import xxhash
from mounting import Mount, Nodes, run_cli
from support import random_bytes, wait_until

from ckptfs.format.manifests import Manifest, file_key
from ckptfs.store.local import LocalStore

MiB = 1 << 20
CHUNK = MiB  # most tests use a new store with --chunk-size 1M: multi-chunk files are cheap

ENOTSUP = {errno.ENOTSUP, errno.EOPNOTSUPP}


# ------------------------------------------------------------------------------ fixtures
class Cluster:
    """Mounts of one store (a LocalStore, or `url` reached with the options `extra`), made
    by `nodes.mount` (cleaned up in teardown)."""

    def __init__(self, root: Path, nodes: Nodes, chunk_size: str = "1M", url: str = "",
                 extra: tuple[str, ...] = ()) -> None:
        self.root = root
        self.store = root / "store"
        self.store.mkdir()
        self.url = url or str(self.store)
        self.extra = extra  # options that reach the store (the S3 endpoint)
        self.chunk_size = chunk_size
        self.nodes = nodes
        self._names = itertools.count()

    def node(self) -> Mount:
        """Mount the store on a new mount point with a new, empty cache directory."""
        return self.nodes.mount(self.url, self.root, f"n{next(self._names)}",
                                "--chunk-size", self.chunk_size, *self.extra)

    def remount(self, m: Mount) -> Mount:
        """`ckptfs umount m` (must exit 0), then the store as seen by a fresh node."""
        r = m.umount()
        assert r.returncode == 0
        return self.node()

    def cleanup(self) -> None:
        self.nodes.cleanup()

    def chunk_files(self) -> dict[str, tuple[int, int]]:
        """Every chunk object in the store: path -> (mtime_ns, inode)."""
        out = {}
        for dirpath, _, files in os.walk(self.store / "chunks"):
            for f in files:
                st = os.stat(os.path.join(dirpath, f))
                out[os.path.join(dirpath, f)] = (st.st_mtime_ns, st.st_ino)
        return out

    def file_keys(self) -> set[str]:
        """Every object under files/ as a store-relative path (LocalStore layout)."""
        base = self.store / "files"
        return {os.path.relpath(os.path.join(d, f), base)
                for d, _, files in os.walk(base) for f in files}


@pytest.fixture
def cluster(tmp_path: Path, nodes: Nodes) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nodes)
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture(params=["local", "s3"])
def any_cluster(request: pytest.FixtureRequest, tmp_path: Path,
                nodes: Nodes) -> Iterator[Cluster]:
    """A Cluster on the local store, then on a SeaweedFS bucket."""
    if request.param == "local":
        c = Cluster(tmp_path, nodes)
    else:
        seaweed = request.getfixturevalue("seaweed")
        c = Cluster(tmp_path, nodes, url=f"s3://{seaweed.new_bucket()}/run",
                    extra=("--endpoint-url", seaweed.endpoint))
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def mnt(cluster: Cluster) -> Iterator[Mount]:
    m = cluster.node()
    try:
        yield m
    finally:
        m.cleanup()


# ------------------------------------------------------------------------------ helpers
def data(n: int, seed: int = 0) -> bytes:
    return random_bytes(n, seed)


def same(got: bytes, want: bytes) -> None:
    """Equal bytes, with a short message (offset of the first difference) otherwise."""
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                 min(len(got), len(want)))
    raise AssertionError(f"bytes differ: len {len(got)} vs {len(want)}, first difference at "
                         f"{first} (chunk {first // CHUNK}); sha256 "
                         f"{hashlib.sha256(got).hexdigest()[:12]} vs "
                         f"{hashlib.sha256(want).hexdigest()[:12]}")


def errno_of(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError) as e:
        fn()
    return int(e.value.errno or 0)


def write(path: Path, blob: bytes) -> None:
    with open(path, "wb") as f:
        f.write(blob)


def sync(m: Mount) -> None:
    run_cli("sync", str(m.path))


# ------------------------------------------------------------------------------ attributes
def test_lookup_and_getattr(mnt: Mount) -> None:
    p = mnt / "f"
    write(p, b"hello")
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
    assert st.st_uid == os.getuid()
    assert stat.S_ISDIR(os.stat(mnt.path).st_mode)
    assert os.path.exists(p) and not os.path.exists(mnt / "nope")
    assert errno_of(lambda: os.stat(mnt / "nope")) == errno.ENOENT
    assert errno_of(lambda: os.stat(mnt / "f" / "x")) == errno.ENOTDIR
    with open(p, "rb") as f:
        assert os.fstat(f.fileno()).st_size == 5
        assert f.read() == b"hello"


def test_truncate_grow_and_shrink(cluster: Cluster, mnt: Mount, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    blob = data(2 * CHUNK + 12345)
    steps: list[int] = [4 * CHUNK + 7, CHUNK + 100, 3 * CHUNK, 10, 2 * CHUNK + 1]
    for target in (mnt / "t", ref):
        write(target, blob)
        for size in steps:
            os.truncate(target, size)
            assert os.stat(target).st_size == size
        with open(target, "r+b") as f:  # ftruncate through an open fd, and write after it
            f.truncate(CHUNK // 2)
            f.seek(CHUNK)
            f.write(b"end")
    want = ref.read_bytes()
    assert want[10:CHUNK // 2] == bytes(CHUNK // 2 - 10)  # shrink then grow gives zeros
    same((mnt / "t").read_bytes(), want)
    # zeros after a plain grow of a closed, published file
    write(mnt / "g", b"abc")
    os.truncate(mnt / "g", CHUNK + 5)
    same((mnt / "g").read_bytes(), b"abc" + bytes(CHUNK + 2))
    other = cluster.remount(mnt)
    same((other / "t").read_bytes(), want)
    same((other / "g").read_bytes(), b"abc" + bytes(CHUNK + 2))
    # truncating a file whose chunks are only in the store (another node wrote it)
    os.truncate(other / "t", CHUNK // 4)
    os.truncate(other / "t", CHUNK + 3)
    same((other / "t").read_bytes(), want[:CHUNK // 4] + bytes(CHUNK + 3 - CHUNK // 4))


def test_chmod_persists(cluster: Cluster, mnt: Mount) -> None:
    write(mnt / "f", b"x" * 10)
    os.mkdir(mnt / "d")
    os.chmod(mnt / "f", 0o640)
    os.chmod(mnt / "d", 0o700)
    assert stat.S_IMODE(os.stat(mnt / "f").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(mnt / "d").st_mode) == 0o700
    with open(mnt / "open", "wb") as f:  # chmod while being written: kept at close
        f.write(b"y")
        os.fchmod(f.fileno(), 0o604)
    assert stat.S_IMODE(os.stat(mnt / "open").st_mode) == 0o604
    with open(mnt / "exec", "wb", opener=lambda p, fl: os.open(p, fl, 0o751)) as f:
        f.write(b"#!")
    other = cluster.remount(mnt)
    assert stat.S_IMODE(os.stat(other / "f").st_mode) == 0o640
    assert stat.S_ISDIR(os.stat(other / "d").st_mode)
    assert stat.S_IMODE(os.stat(other / "d").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(other / "open").st_mode) == 0o604
    assert stat.S_IMODE(os.stat(other / "exec").st_mode) == 0o751
    assert (other / "f").read_bytes() == b"x" * 10


def test_utimens_persists(cluster: Cluster, mnt: Mount) -> None:
    write(mnt / "f", b"abc")
    os.mkdir(mnt / "d")
    t_file = 1_600_000_000_123_456_789
    t_dir = 1_500_000_000_987_654_321
    os.utime(mnt / "f", ns=(t_file, t_file))
    os.utime(mnt / "d", ns=(t_dir, t_dir))
    assert os.stat(mnt / "f").st_mtime_ns == t_file
    assert os.stat(mnt / "d").st_mtime_ns == t_dir
    t_open = 1_650_000_000_000_000_001
    with open(mnt / "copied", "wb") as f:  # utime while still open for writing (cp -p)
        f.write(b"data")
        f.flush()
        os.utime(f.fileno(), ns=(t_open, t_open))
    assert os.stat(mnt / "copied").st_mtime_ns == t_open
    before = time.time_ns()
    write(mnt / "new", b"1")
    m_new = os.stat(mnt / "new").st_mtime_ns
    assert m_new >= before - 10**9
    other = cluster.remount(mnt)
    assert os.stat(other / "f").st_mtime_ns == t_file
    assert os.stat(other / "d").st_mtime_ns == t_dir
    assert os.stat(other / "new").st_mtime_ns == m_new
    assert os.stat(other / "copied").st_mtime_ns == t_open
    assert (other / "f").read_bytes() == b"abc"


# ------------------------------------------------------------------------------ directories
def test_readdir_thousands(cluster: Cluster, mnt: Mount) -> None:
    """3000 entries in one directory: 400 created through the mount by 16 threads (some
    then unlinked or renamed) while another thread lists the directory, and 2600 empty
    files written meanwhile by "another node" (manifests put straight into the store:
    much faster than 2600 closes, each of which waits for its manifest PUT).

    A listing must show every file whose close() (or rename) returned before it started,
    and no name whose unlink (or rename away) returned before it started.
    """
    d = mnt / "many"
    os.mkdir(d)
    store = LocalStore(cluster.store, fsync=False)
    body = Manifest(size=0, mode=stat.S_IFREG | 0o644, mtime_ns=1_700_000_000 * 10**9,
                    chunk_size=CHUNK, writer="other").to_json()
    remote = [f"file-{i:05d}" for i in range(500, 3100)]
    for n in remote:
        store.put(f"files/many/{n}", body)
    present: set[str] = set()
    gone: set[str] = set()
    lock = threading.Lock()
    problems: list[str] = []
    lister_errors: list[BaseException] = []
    listings = 0
    stop = threading.Event()

    def lister() -> None:
        nonlocal listings
        try:
            while not stop.is_set():
                with lock:
                    must, must_not = set(present), set(gone)
                listed = set(os.listdir(d))
                listings += 1
                if must - listed:
                    problems.append(f"closed but not listed: {sorted(must - listed)[:5]}")
                if must_not & listed:
                    problems.append(f"removed but listed: {sorted(must_not & listed)[:5]}")
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - raised again by the test
            lister_errors.append(e)

    def create(i: int) -> None:
        n = f"file-{i:05d}"
        with open(d / n, "wb") as f:
            if i % 100 == 0:
                f.write(n.encode())
        if i % 5 == 4:
            os.unlink(d / n)
            with lock:
                gone.add(n)
        elif i % 7 == 6:
            os.rename(d / n, d / f"{n}.r")
            with lock:
                gone.add(n)
                present.add(f"{n}.r")
        else:
            with lock:
                present.add(n)

    t = threading.Thread(target=lister)
    t.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, range(500)))
    finally:
        stop.set()
        t.join()
    if lister_errors:
        raise lister_errors[0]
    assert listings > 0 and not problems, problems[:3]
    names = sorted(present | set(remote))
    assert len(names) == 3000
    wait_until(lambda: sorted(os.listdir(d)) == names, 30, "all 3000 names listed")
    with os.scandir(d) as it:
        entries = {e.name: e for e in it}
    assert len(entries) == 3000 and all(e.is_file() for e in entries.values())
    assert (d / "file-00200").read_bytes() == b"file-00200"
    assert os.stat(d / "file-03099").st_mtime_ns == 1_700_000_000 * 10**9
    other = cluster.remount(mnt)
    assert sorted(os.listdir(other / "many")) == names
    assert (other / "many" / "file-00100").read_bytes() == b"file-00100"
    assert os.path.getsize(other / "many" / "file-00101") == 0


def getdents(fd: int, size: int = 1024) -> list[str]:
    """One getdents64(2) call with a small buffer: the names it returned."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(size)
    n = libc.getdents64(fd, buf, size)
    if n < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    names, pos = [], 0
    while pos < n:
        reclen = int.from_bytes(buf.raw[pos + 16:pos + 18], "little")
        names.append(buf.raw[pos + 19:pos + reclen].split(b"\0", 1)[0].decode())
        pos += reclen
    return names


def test_readdir_while_entries_change(mnt: Mount) -> None:
    """Entries removed or added while a directory is being read must not make readdir
    skip or repeat the entries that did not change (as `find -delete`, `rm -r` do)."""
    d = mnt / "d"
    os.mkdir(d)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: write(d / n, b""),
                      [f"a-{i:03d}" for i in range(60)] + [f"b-{i:03d}" for i in range(200)]))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen = getdents(fd)
        assert 0 < len(seen) < 100  # a partial read: the rest comes in later calls
        for i in range(60):  # remove entries sorted before the read position
            os.unlink(d / f"a-{i:03d}")
        write(d / "0-new", b"")  # and add one there
        while batch := getdents(fd):
            seen += batch
    finally:
        os.close(fd)
    b_seen = [n for n in seen if n.startswith("b-")]
    assert sorted(b_seen) == [f"b-{i:03d}" for i in range(200)]  # each exactly once
    assert sorted(os.listdir(d)) == ["0-new"] + [f"b-{i:03d}" for i in range(200)]


def test_mkdir_rmdir(cluster: Cluster, mnt: Mount) -> None:
    os.mkdir(mnt / "a")
    os.makedirs(mnt / "a" / "b" / "c")
    os.mkdir(mnt / "empty")
    assert errno_of(lambda: os.mkdir(mnt / "a")) == errno.EEXIST
    write(mnt / "a" / "file", b"1")
    assert errno_of(lambda: os.mkdir(mnt / "a" / "file")) == errno.EEXIST
    assert errno_of(lambda: os.mkdir(mnt / "a" / "file" / "sub")) == errno.ENOTDIR
    assert errno_of(lambda: os.mkdir(mnt / "nope" / "sub")) == errno.ENOENT
    assert errno_of(lambda: os.rmdir(mnt / "a")) == errno.ENOTEMPTY
    assert errno_of(lambda: os.rmdir(mnt / "a" / "b")) == errno.ENOTEMPTY
    assert errno_of(lambda: os.rmdir(mnt / "a" / "file")) == errno.ENOTDIR
    assert errno_of(lambda: os.rmdir(mnt / "nope")) == errno.ENOENT
    os.mkdir(mnt / "gone")
    os.rmdir(mnt / "gone")
    assert not os.path.exists(mnt / "gone")
    assert sorted(os.listdir(mnt.path)) == ["a", "empty"]
    other = cluster.remount(mnt)
    assert sorted(os.listdir(other.path)) == ["a", "empty"]
    assert os.listdir(other / "empty") == []
    assert sorted(os.listdir(other / "a")) == ["b", "file"]
    assert os.listdir(other / "a" / "b" / "c") == []
    os.rmdir(other / "a" / "b" / "c")
    assert errno_of(lambda: os.rmdir(other / "a")) == errno.ENOTEMPTY
    os.rmdir(other / "empty")
    third = cluster.remount(other)
    assert os.listdir(third / "a" / "b") == []
    assert sorted(os.listdir(third.path)) == ["a"]


def test_create_trunc_append_excl(cluster: Cluster, mnt: Mount) -> None:
    p = mnt / "f"
    write(p, data(CHUNK + 500))
    with open(p, "wb") as f:  # O_TRUNC on an existing multi-chunk file
        f.write(b"short")
    assert p.read_bytes() == b"short"
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert p.read_bytes() == b"" and os.stat(p).st_size == 0
    write(p, b"base")
    with open(p, "ab") as f:  # O_APPEND: every write lands at the end
        f.write(b"+one")
        f.write(b"+two")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"+three")
    os.close(fd)
    assert p.read_bytes() == b"base+one+two+three"
    big = data(CHUNK + 10, 1)  # append across a chunk boundary of a published file
    with open(p, "ab") as f:
        f.write(big)
    want = b"base+one+two+three" + big
    same(p.read_bytes(), want)
    assert errno_of(lambda: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)) == errno.EEXIST
    assert errno_of(lambda: os.open(mnt.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)) \
        == errno.EEXIST
    fd = os.open(mnt / "excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"new")
    os.close(fd)
    assert errno_of(lambda: os.open(mnt / "nope", os.O_RDONLY)) == errno.ENOENT
    other = cluster.remount(mnt)
    same((other / "f").read_bytes(), want)
    assert (other / "excl").read_bytes() == b"new"
    with open(other / "f", "ab") as f:  # append to a file whose chunks are in the store
        f.write(b"!")
    same((other / "f").read_bytes(), want + b"!")


def test_o_direct(cluster: Cluster, mnt: Mount) -> None:
    size = 2 * CHUNK + 8192
    buf = mmap.mmap(-1, size)  # page-aligned memory
    blob = data(size, 3)
    buf.write(blob)
    fd = os.open(mnt / "direct", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    try:
        assert os.write(fd, buf) == size
    finally:
        os.close(fd)
    rbuf = mmap.mmap(-1, size)
    fd = os.open(mnt / "direct", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.readv(fd, [rbuf]) == size
    finally:
        os.close(fd)
    same(bytes(rbuf), blob)
    same((mnt / "direct").read_bytes(), blob)
    other = cluster.remount(mnt)
    same((other / "direct").read_bytes(), blob)


# ------------------------------------------------------------------------------ read/write
def test_large_sequential_file_16m_chunks(tmp_path: Path, nodes: Nodes) -> None:
    c = Cluster(tmp_path, nodes, chunk_size="16M")
    try:
        m = c.node()
        blob = data(50 * MiB + 777, 4)
        with open(m / "big", "wb") as f:
            f.writelines(blob[i:i + 4 * MiB] for i in range(0, len(blob), 4 * MiB))
        assert os.path.getsize(m / "big") == len(blob)
        same((m / "big").read_bytes(), blob)
        # uploaded in the background, with nobody waiting (no sync, no umount)
        wait_until(lambda: len(c.chunk_files()) >= 4, 60, "4 chunks uploaded")
        other = c.remount(m)
        same((other / "big").read_bytes(), blob)
        with open(other / "big", "rb") as f:  # reads spanning a chunk boundary
            f.seek(16 * MiB - 100)
            same(f.read(200), blob[16 * MiB - 100:16 * MiB + 100])
            f.seek(48 * MiB - 1)
            same(f.read(), blob[48 * MiB - 1:])
    finally:
        c.cleanup()


def test_random_writes_in_the_middle(cluster: Cluster, mnt: Mount, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    rng = random.Random(5)
    blob = data(5 * CHUNK + 333, 6)
    for target in (mnt / "r", ref):
        write(target, blob)
    with open(mnt / "r", "r+b") as f, open(ref, "r+b") as g:
        for _ in range(60):
            off = rng.randrange(0, 6 * CHUNK)
            piece = rng.randbytes(rng.choice([1, 100, 4096, CHUNK // 3, CHUNK + 17]))
            for h in (f, g):
                h.seek(off)
                h.write(piece)
    want = ref.read_bytes()
    same((mnt / "r").read_bytes(), want)
    other = cluster.remount(mnt)
    same((other / "r").read_bytes(), want)


def test_partial_overwrite_of_remote_chunks(cluster: Cluster, mnt: Mount, tmp_path: Path
                                            ) -> None:
    blob = data(4 * CHUNK + 1000, 7)
    write(mnt / "w", blob)
    other = cluster.remount(mnt)  # `other` has none of the chunks in its cache
    want = bytearray(blob)
    edits = [(CHUNK + 10, b"A" * 100),  # inside chunk 1
             (3 * CHUNK - 5, b"B" * 10),  # across the chunk 2/3 boundary
             (4 * CHUNK + 500, b"C" * 8),  # inside the short tail chunk
             (0, b"D")]
    with open(other / "w", "r+b") as f:
        for off, piece in edits:
            f.seek(off)
            f.write(piece)
            want[off:off + len(piece)] = piece
        f.seek(CHUNK + 50)  # read while open: untouched bytes of a partly written chunk
        same(f.read(1000), bytes(want[CHUNK + 50:CHUNK + 1050]))
    same((other / "w").read_bytes(), bytes(want))
    third = cluster.remount(other)
    same((third / "w").read_bytes(), bytes(want))
    # ... and extending a remote file whose last chunk is partial keeps its old tail bytes
    with open(third / "w", "ab") as f:
        f.write(b"tail")
    fourth = cluster.remount(third)
    same((fourth / "w").read_bytes(), bytes(want) + b"tail")


def chunk_names(blob: bytes) -> list[str]:
    return [xxhash.xxh3_128_hexdigest(blob[i:i + CHUNK]) for i in range(0, len(blob), CHUNK)]


def test_chunks_hashed_while_streaming_are_named_right(cluster: Cluster, mnt: Mount,
                                                       tmp_path: Path) -> None:
    """Sequential writes hash chunks as they fill them; every way of breaking the stream
    (a rewrite behind its frontier, truncation, a gap ahead, fsync of a partial tail)
    must still publish each chunk under the name of its final bytes."""
    blob = data(4 * CHUNK, 17)
    step = CHUNK // 3 + 7  # writes that straddle chunk boundaries

    def stream(f: Any, start: int, end: int) -> None:
        for off in range(start, end, step):
            f.write(blob[off:min(off + step, end)])

    def published(name: str) -> list[str]:
        run_cli("sync", str(mnt.path))
        m = Manifest.from_json(LocalStore(cluster.store).get(file_key(name)))
        return [h for h, _ in m.chunks]

    def fsync_tail(f: Any) -> None:
        stream(f, 0, CHUNK + 500)
        f.flush()
        os.fsync(f.fileno())  # publishes a streamed partial tail
        if f.name == str(mnt / "s"):
            assert published("s") == chunk_names(blob[:CHUNK + 500])
        stream(f, CHUNK + 500, 2 * CHUNK + 10)

    def rewrite_behind(f: Any) -> None:  # inside the chunk being streamed
        stream(f, 0, CHUNK + 500)
        f.seek(CHUNK + 100)
        f.write(b"behind")
        f.seek(CHUNK + 500)
        stream(f, CHUNK + 500, 3 * CHUNK + 10)

    def truncate(f: Any) -> None:
        stream(f, 0, 2 * CHUNK + 5000)
        f.truncate(2 * CHUNK + 100)
        f.seek(2 * CHUNK + 100)
        stream(f, 2 * CHUNK + 100, 3 * CHUNK + 50)

    def gap_ahead(f: Any) -> None:
        stream(f, 0, CHUNK + 10)
        f.seek(2 * CHUNK)
        f.write(b"ahead")
        f.seek(CHUNK + 10)
        stream(f, CHUNK + 10, 2 * CHUNK + 3)

    ref = tmp_path / "ref"
    for scenario in (fsync_tail, rewrite_behind, truncate, gap_ahead):
        for target in (mnt / "s", ref):
            with open(target, "wb") as f:
                scenario(f)
        want = ref.read_bytes()
        same((mnt / "s").read_bytes(), want)
        assert published("s") == chunk_names(want), scenario.__name__
    other = cluster.remount(mnt)  # fetching verifies every chunk against its name
    same((other / "s").read_bytes(), want)


def test_sparse_writes(cluster: Cluster, mnt: Mount, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    for target in (mnt / "s", ref):
        with open(target, "wb") as f:
            f.write(b"start")
            f.seek(3 * CHUNK + 5)
            f.write(b"middle")
            f.seek(7 * CHUNK)
            f.write(b"end")
    want = ref.read_bytes()
    assert len(want) == 7 * CHUNK + 3
    same((mnt / "s").read_bytes(), want)
    with open(mnt / "s", "r+b") as f:  # a hole past the end of a published file
        f.seek(9 * CHUNK + 1)
        f.write(b"x")
    want += bytes(2 * CHUNK - 2) + b"x"
    same((mnt / "s").read_bytes(), want)
    other = cluster.remount(mnt)
    assert os.path.getsize(other / "s") == len(want)
    same((other / "s").read_bytes(), want)


def test_read_while_open_for_writing(mnt: Mount) -> None:
    p = mnt / "live"
    blob = data(3 * CHUNK, 8)
    with open(p, "wb", buffering=0) as w:
        w.write(blob[:CHUNK + 10])
        assert os.getxattr(p, "user.ckptfs.state") == b"open"
        with open(p, "rb", buffering=0) as r:
            same(r.read(), blob[:CHUNK + 10])
            assert os.fstat(r.fileno()).st_size == CHUNK + 10
            w.write(blob[CHUNK + 10:])
            r.seek(0)
            same(r.read(), blob)
        w.seek(100)
        w.write(b"overwritten")
        with open(p, "rb") as r2:
            assert r2.read(111)[100:] == b"overwritten"
    want = blob[:100] + b"overwritten" + blob[111:]
    same(p.read_bytes(), want)


def test_fsync_file_and_directory(cluster: Cluster, mnt: Mount) -> None:
    os.mkdir(mnt / "d")
    fd = os.open(mnt / "d" / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"first")
    os.fsync(fd)
    os.fdatasync(fd)
    # fsync published a version: another node sees it while the file is still open
    os.write(fd, b"second")
    os.fsync(fd)
    dfd = os.open(mnt / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    rfd = os.open(mnt.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(rfd)
    finally:
        os.close(rfd)
    sync(mnt)
    reader = cluster.node()
    assert (reader / "d" / "f").read_bytes() == b"firstsecond"
    os.write(fd, b"third")
    os.close(fd)  # flush + release
    assert (mnt / "d" / "f").read_bytes() == b"firstsecondthird"
    other = cluster.remount(mnt)
    assert (other / "d" / "f").read_bytes() == b"firstsecondthird"


# ------------------------------------------------------------------------------ unlink/rename
def test_unlink(cluster: Cluster, mnt: Mount) -> None:
    write(mnt / "f", data(CHUNK + 1))
    os.mkdir(mnt / "d")
    assert errno_of(lambda: os.unlink(mnt / "d")) == errno.EISDIR
    assert errno_of(lambda: os.unlink(mnt / "nope")) == errno.ENOENT
    assert errno_of(lambda: os.unlink(mnt / "f" / "x")) == errno.ENOTDIR
    os.unlink(mnt / "f")
    assert not os.path.exists(mnt / "f")
    assert errno_of(lambda: os.stat(mnt / "f")) == errno.ENOENT
    write(mnt / "f", b"reborn")  # the name can be used again at once
    assert (mnt / "f").read_bytes() == b"reborn"
    other = cluster.remount(mnt)
    assert sorted(os.listdir(other.path)) == ["d", "f"]
    assert (other / "f").read_bytes() == b"reborn"
    os.unlink(other / "f")
    third = cluster.remount(other)
    assert os.listdir(third.path) == ["d"]


def test_unlink_open_file(cluster: Cluster, mnt: Mount) -> None:
    """Linux semantics: an unlinked file stays readable (and writable) through open fds."""
    blob = data(2 * CHUNK + 3, 9)
    write(mnt / "r", blob)
    with open(mnt / "r", "rb") as f:
        os.unlink(mnt / "r")
        assert not os.path.exists(mnt / "r")
        same(f.read(), blob)
        assert os.fstat(f.fileno()).st_size == len(blob)
    with open(mnt / "w", "w+b") as f:  # unlinked while being written
        f.write(b"abc")
        os.unlink(mnt / "w")
        f.write(b"def")
        f.seek(0)
        assert f.read() == b"abcdef"
    assert not os.path.exists(mnt / "w")
    write(mnt / "w", b"new file, same name")
    other = cluster.remount(mnt)
    assert os.listdir(other.path) == ["w"]
    assert (other / "w").read_bytes() == b"new file, same name"


def test_deleted_files_free_their_local_copy(mnt: Mount) -> None:
    """Checkpoint rotation: a deleted file's staged bytes (uploaded) leave the cache at
    once, not when LRU eviction gets to them; an open descriptor keeps them until close."""
    def staged() -> set[str]:
        return set(os.listdir(mnt.cache / "staging"))

    blobs = {name: data(2 * CHUNK + 5, seed) for seed, name in enumerate("abc")}
    before = staged()
    for name, blob in blobs.items():
        write(mnt / name, blob)
    sync(mnt)
    assert len(staged() - before) == 3
    os.unlink(mnt / "a")
    assert len(staged() - before) == 2
    with open(mnt / "b", "rb") as f:
        os.rename(mnt / "c", mnt / "b")  # replaces b: its copy stays while b is open
        assert len(staged() - before) == 2
        same(f.read(), blobs["b"])
    wait_until(lambda: len(staged() - before) == 1, 30, "one staging file left")
    same((mnt / "b").read_bytes(), blobs["c"])


def test_staging_files_that_serve_nothing_are_dropped(mnt: Mount, tmp_path: Path) -> None:
    """dd closes a duplicate of its output descriptor before writing (a FLUSH that
    publishes an empty version), and a copy of a file already staged here holds only
    chunks another staging file serves: neither version's staging file is kept."""
    def staged() -> set[str]:
        return set(os.listdir(mnt.cache / "staging"))

    before = staged()
    blob = data(2 * CHUNK + 5, 7)
    (tmp_path / "src").write_bytes(blob)
    subprocess.run(["dd", f"if={tmp_path / 'src'}", f"of={mnt / 'a'}", "bs=64K"],
                   check=True, capture_output=True)
    sync(mnt)
    assert len(staged() - before) == 1
    shutil.copyfile(mnt / "a", mnt / "b")  # the same bytes again
    sync(mnt)
    wait_until(lambda: len(staged() - before) == 1, 30, "one staging file left")
    same((mnt / "b").read_bytes(), blob)
    os.unlink(mnt / "a")
    same((mnt / "b").read_bytes(), blob)


def test_rename_files(cluster: Cluster, mnt: Mount) -> None:
    write(mnt / "a", b"AAA")
    os.rename(mnt / "a", mnt / "b")
    assert not os.path.exists(mnt / "a") and (mnt / "b").read_bytes() == b"AAA"
    os.mkdir(mnt / "d")
    os.rename(mnt / "b", mnt / "d" / "c")  # into another directory
    assert (mnt / "d" / "c").read_bytes() == b"AAA"
    old = data(3 * CHUNK, 10)
    write(mnt / "target", old)
    write(mnt / "tmp", b"new content")
    with open(mnt / "target", "rb") as held:
        os.replace(mnt / "tmp", mnt / "target")  # atomic replace of an existing file
        assert (mnt / "target").read_bytes() == b"new content"
        same(held.read(), old)  # an fd opened before the replace keeps the old bytes
    assert not os.path.exists(mnt / "tmp")
    assert errno_of(lambda: os.rename(mnt / "nope", mnt / "x")) == errno.ENOENT
    assert errno_of(lambda: os.rename(mnt / "target", mnt / "nope" / "x")) == errno.ENOENT
    os.rename(mnt / "target", mnt / "target")  # same name: a no-op
    other = cluster.remount(mnt)
    assert sorted(os.listdir(other.path)) == ["d", "target"]
    assert (other / "target").read_bytes() == b"new content"
    assert (other / "d" / "c").read_bytes() == b"AAA"
    assert cluster.file_keys() == {"%o", "target%o", "d/%o", "d/c%o"}


def test_rename_open_file(cluster: Cluster, mnt: Mount) -> None:
    """A file renamed while being written publishes under its new name."""
    with open(mnt / "a.tmp", "wb") as f:
        f.write(b"part1")
        os.rename(mnt / "a.tmp", mnt / "a")
        f.write(b"part2")
    assert (mnt / "a").read_bytes() == b"part1part2"
    assert not os.path.exists(mnt / "a.tmp")
    other = cluster.remount(mnt)
    assert os.listdir(other.path) == ["a"]
    assert (other / "a").read_bytes() == b"part1part2"


def test_rename_directory_with_open_file(cluster: Cluster, mnt: Mount) -> None:
    """Lightning/torch save into tmp dir, rename the dir while a file is still open."""
    os.makedirs(mnt / "tmp" / "sub")
    write(mnt / "tmp" / "done", b"done")
    with open(mnt / "tmp" / "sub" / "f", "wb") as f:
        f.write(data(CHUNK + 1, 30))
        os.rename(mnt / "tmp", mnt / "final")
        f.write(b"after")
    write(mnt / "final" / "sub" / "g", b"new in renamed dir")
    want = data(CHUNK + 1, 30) + b"after"
    same((mnt / "final" / "sub" / "f").read_bytes(), want)
    other = cluster.remount(mnt)
    assert os.listdir(other.path) == ["final"]
    same((other / "final" / "sub" / "f").read_bytes(), want)
    assert (other / "final" / "sub" / "g").read_bytes() == b"new in renamed dir"
    assert (other / "final" / "done").read_bytes() == b"done"


def test_two_writers_one_file(cluster: Cluster, mnt: Mount) -> None:
    """Two fds writing the same file: the first close publishes, the second keeps going."""
    p = mnt / "shared"
    with open(p, "wb", buffering=0) as a, open(p, "r+b", buffering=0) as b:
        a.write(b"A" * 10)
        b.seek(CHUNK)
        b.write(b"B" * 10)
        a.close()  # publishes A..A, hole, B..B while b is still open
        assert os.path.getsize(p) == CHUNK + 10
        b.seek(5)
        b.write(b"b")
    want = b"A" * 5 + b"b" + b"A" * 4 + bytes(CHUNK - 10) + b"B" * 10
    same(p.read_bytes(), want)
    other = cluster.remount(mnt)
    same((other / "shared").read_bytes(), want)


def test_rename_directories(cluster: Cluster, mnt: Mount) -> None:
    files = {"ckpt/model.bin": data(3 * CHUNK + 11, 11), "ckpt/opt/state.bin": data(CHUNK, 12),
             "ckpt/opt/deep/x": b"x", "ckpt/meta.json": b"{}"}
    for rel, blob in files.items():
        os.makedirs(os.path.dirname(mnt / rel), exist_ok=True)
        write(mnt / rel, blob)
    os.mkdir(mnt / "ckpt" / "empty")
    os.rename(mnt / "ckpt", mnt / "final")
    assert not os.path.exists(mnt / "ckpt")
    for rel, blob in files.items():
        same((mnt / rel.replace("ckpt", "final", 1)).read_bytes(), blob)
    assert os.listdir(mnt / "final" / "empty") == []
    # errors
    assert errno_of(lambda: os.rename(mnt / "final", mnt / "final" / "opt" / "inside")) \
        == errno.EINVAL
    assert errno_of(lambda: os.rename(mnt / "final", mnt / "final" / "sub")) == errno.EINVAL
    os.makedirs(mnt / "full" / "x")
    assert errno_of(lambda: os.rename(mnt / "final" / "opt", mnt / "full")) == errno.ENOTEMPTY
    write(mnt / "file", b"f")
    assert errno_of(lambda: os.rename(mnt / "file", mnt / "full")) == errno.EISDIR
    assert errno_of(lambda: os.rename(mnt / "full", mnt / "file")) == errno.ENOTDIR
    # a directory over an empty directory replaces it
    os.mkdir(mnt / "emptydst")
    os.rename(mnt / "full", mnt / "emptydst")
    assert os.listdir(mnt / "emptydst") == ["x"] and not os.path.exists(mnt / "full")
    sync(mnt)
    keys = cluster.file_keys()
    assert not any(k.startswith("ckpt/") or k == "ckpt%o" for k in keys), keys
    assert not any(k.startswith("full/") for k in keys), keys
    other = cluster.remount(mnt)
    assert sorted(os.listdir(other.path)) == ["emptydst", "file", "final"]
    for rel, blob in files.items():
        same((other / rel.replace("ckpt", "final", 1)).read_bytes(), blob)
    assert os.listdir(other / "final" / "empty") == []
    assert os.listdir(other / "emptydst" / "x") == []
    # a directory renamed by a node that did not create it (children only in the store)
    os.rename(other / "final", other / "again")
    for rel, blob in files.items():
        same((other / rel.replace("ckpt", "again", 1)).read_bytes(), blob)
    third = cluster.remount(other)
    assert sorted(os.listdir(third.path)) == ["again", "emptydst", "file"]
    for rel, blob in files.items():
        same((third / rel.replace("ckpt", "again", 1)).read_bytes(), blob)


def test_rename_noreplace(mnt: Mount) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("libc has no renameat2")
    at_fdcwd, noreplace = -100, 1
    write(mnt / "a", b"a")
    write(mnt / "b", b"b")

    def renameat2(src: Path, dst: Path) -> int:
        r = libc.renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace)
        return 0 if r == 0 else ctypes.get_errno()

    assert renameat2(mnt / "a", mnt / "b") == errno.EEXIST
    assert (mnt / "a").read_bytes() == b"a" and (mnt / "b").read_bytes() == b"b"
    assert renameat2(mnt / "a", mnt / "c") == 0
    assert (mnt / "c").read_bytes() == b"a" and not os.path.exists(mnt / "a")


def test_rename_never_copies_chunks(cluster: Cluster, mnt: Mount) -> None:
    os.mkdir(mnt / "run")
    for i in range(3):
        write(mnt / "run" / f"shard{i}", data(4 * CHUNK + i, 20 + i))
    sync(mnt)
    before = cluster.chunk_files()
    assert len(before) >= 12
    time.sleep(0.05)  # a rewrite would show as a newer mtime
    os.rename(mnt / "run", mnt / "run-final")
    os.rename(mnt / "run-final" / "shard0", mnt / "shard0-moved")
    sync(mnt)
    assert cluster.chunk_files() == before
    other = cluster.remount(mnt)
    assert cluster.chunk_files() == before
    same((other / "shard0-moved").read_bytes(), data(4 * CHUNK, 20))
    for i in (1, 2):
        same((other / "run-final" / f"shard{i}").read_bytes(), data(4 * CHUNK + i, 20 + i))


# ------------------------------------------------------------------------------ links
def test_symlinks_and_inodes(cluster: Cluster, mnt: Mount) -> None:
    os.mkdir(mnt / "ckpts")
    write(mnt / "ckpts" / "epoch=3.ckpt", b"weights")
    os.symlink("epoch=3.ckpt", mnt / "ckpts" / "last.ckpt")  # Lightning save_last="link"
    os.symlink("../ckpts/epoch=3.ckpt", mnt / "ckpts" / "up")
    os.symlink("ckpts", mnt / "dirlink")
    os.symlink("nowhere", mnt / "dangling")
    link = mnt / "ckpts" / "last.ckpt"
    assert os.readlink(link) == "epoch=3.ckpt"
    assert stat.S_ISLNK(os.lstat(link).st_mode)
    assert os.lstat(link).st_size == len("epoch=3.ckpt")
    assert link.read_bytes() == b"weights"
    assert os.path.samefile(link, mnt / "ckpts" / "epoch=3.ckpt")
    assert os.path.samefile(mnt / "ckpts" / "up", mnt / "ckpts" / "epoch=3.ckpt")
    assert (mnt / "dirlink" / "epoch=3.ckpt").read_bytes() == b"weights"
    assert os.readlink(mnt / "dangling") == "nowhere"
    assert errno_of(lambda: os.stat(mnt / "dangling")) == errno.ENOENT
    assert errno_of(lambda: os.readlink(mnt / "ckpts" / "epoch=3.ckpt")) == errno.EINVAL
    assert errno_of(lambda: os.symlink("x", mnt / "ckpts" / "last.ckpt")) == errno.EEXIST
    # relink (save_last: remove the old link, link to the newest checkpoint)
    write(mnt / "ckpts" / "epoch=4.ckpt", b"newer")
    os.unlink(link)
    os.symlink("epoch=4.ckpt", link)
    assert link.read_bytes() == b"newer"
    # stable inode numbers: repeated stats, and across a rename
    ino = os.stat(mnt / "ckpts" / "epoch=3.ckpt").st_ino
    for _ in range(3):
        assert os.stat(mnt / "ckpts" / "epoch=3.ckpt").st_ino == ino
        time.sleep(0.4)  # past part of the 1 s attribute/entry timeout
    os.rename(mnt / "ckpts" / "epoch=3.ckpt", mnt / "ckpts" / "renamed.ckpt")
    assert os.stat(mnt / "ckpts" / "renamed.ckpt").st_ino == ino
    dino = os.stat(mnt / "ckpts").st_ino
    os.rename(mnt / "ckpts", mnt / "ckpts2")
    assert os.stat(mnt / "ckpts2").st_ino == dino
    assert os.stat(mnt / "ckpts2" / "renamed.ckpt").st_ino == ino
    os.symlink("renamed.ckpt", mnt / "ckpts2" / "r")
    other = cluster.remount(mnt)
    assert os.readlink(other / "ckpts2" / "last.ckpt") == "epoch=4.ckpt"
    assert (other / "ckpts2" / "last.ckpt").read_bytes() == b"newer"
    assert os.readlink(other / "ckpts2" / "up") == "../ckpts/epoch=3.ckpt"
    assert os.readlink(other / "dirlink") == "ckpts"
    assert os.readlink(other / "dangling") == "nowhere"
    assert os.path.samefile(other / "ckpts2" / "r", other / "ckpts2" / "renamed.ckpt")
    assert stat.S_ISLNK(os.lstat(other / "ckpts2" / "r").st_mode)


def test_hard_link_is_eperm(mnt: Mount) -> None:
    write(mnt / "f", b"x")
    assert errno_of(lambda: os.link(mnt / "f", mnt / "g")) == errno.EPERM
    assert not os.path.exists(mnt / "g")


def test_statfs(mnt: Mount) -> None:
    s = os.statvfs(mnt.path)
    assert s.f_bavail > 0 and s.f_bfree > 0 and s.f_blocks > 0
    assert s.f_bsize > 0 and s.f_namemax == 255  # as on ext4 and xfs
    assert s.f_favail > 0
    # sizes are those of the cache directory's disk: what can still be written locally
    c = os.statvfs(mnt.cache)
    assert s.f_blocks * s.f_frsize == c.f_blocks * c.f_frsize
    for field in ("f_bfree", "f_bavail"):  # other processes write to that disk meanwhile
        got, want = getattr(s, field) * s.f_frsize, getattr(c, field) * c.f_frsize
        assert abs(got - want) < 256 * MiB, (field, got, want)
    ok = "n" * 255
    (mnt / ok).write_bytes(b"x")
    with pytest.raises(OSError) as e:
        (mnt / ("n" * 256)).write_bytes(b"x")
    assert e.value.errno == errno.ENAMETOOLONG
    assert (mnt / ok).read_bytes() == b"x"


def long_name(stem: str, size: int = 255) -> str:
    """`stem` padded with multi-byte characters to exactly `size` bytes of UTF-8."""
    name = stem
    for char in ("文", "é", "x"):
        while len((name + char).encode()) <= size:
            name += char
    return name


def test_names_of_255_bytes(any_cluster: Cluster) -> None:
    """File and directory names of 255 bytes of UTF-8, as ext4 and xfs allow, on every
    store: written, read, renamed, listed, and seen by a fresh node and the store tools
    exactly; 256 bytes is ENAMETOOLONG. An S3 key holds 1024 bytes in all, so a path of
    four such names is ENAMETOOLONG there, at once (mkdir, create, rename)."""
    c = any_cluster
    s3 = c.url.startswith("s3://")
    d1, d2 = long_name("run=ablation-7%-lr=3e-4-文-"), long_name("run=ablation-7%-final-🙂-")
    f1, f2 = long_name("model-rank=3-of-8-%25-🙂-"), long_name("model-rank=3-%o%t-%h%n-")
    link, top, a, b = long_name("latest-"), "%" * 255, long_name("a-"), long_name("b-")
    blob = data(2 * CHUNK + 7, 31)
    m = c.node()
    os.mkdir(m / d1)
    write(m / d1 / f1, blob)
    write(m / top, b"top")
    same((m / d1 / f1).read_bytes(), blob)
    assert sorted(os.listdir(m.path)) == sorted([d1, top])
    os.rename(m / d1 / f1, m / d1 / f2)
    os.symlink(f2, m / d1 / link)
    os.rename(m / d1, m / d2)  # copies every key under the directory's prefix
    assert sorted(os.listdir(m / d2)) == sorted([f2, link])
    same((m / d2 / link).read_bytes(), blob)
    too_long = long_name("x", 256)
    for call in (lambda: write(m / too_long, b"x"), lambda: os.mkdir(m / too_long),
                 lambda: os.rename(m / top, m / too_long),
                 lambda: os.symlink("x", m / too_long)):
        assert errno_of(call) == errno.ENAMETOOLONG
    assert os.statvfs(m.path).f_namemax == 255
    # S3: run/files/<d2>/<a>/<b>/<255 bytes> is 1033 bytes; a directory store takes it
    os.makedirs(m / d2 / a / b)
    write(m / d2 / a / b / ("x" * 200), b"deep")
    deepest = long_name("c-")
    if s3:
        assert errno_of(lambda: os.mkdir(m / d2 / a / b / deepest)) == errno.ENAMETOOLONG
        assert errno_of(lambda: write(m / d2 / a / b / deepest, b"")) == errno.ENAMETOOLONG
    else:
        write(m / d2 / a / b / deepest, b"deepest")
    os.makedirs(m / "s" / a)
    write(m / "s" / a / b, b"moved")
    if s3:  # run/files/<d2>/<255 bytes>/<a>/<b> would be 1033 bytes
        assert errno_of(lambda: os.rename(m / "s", m / d2 / d1)) == errno.ENAMETOOLONG
        assert (m / "s" / a / b).read_bytes() == b"moved"

    other = c.remount(m)  # `ckptfs umount` exits 0: no op was refused by the store
    assert sorted(os.listdir(other.path)) == sorted([d2, top, "s"])
    assert sorted(os.listdir(other / d2)) == sorted([f2, link, a])
    same((other / d2 / f2).read_bytes(), blob)
    assert os.readlink(other / d2 / link) == f2
    assert (other / top).read_bytes() == b"top"
    assert (other / d2 / a / b / ("x" * 200)).read_bytes() == b"deep"
    deep_names = ["x" * 200] if s3 else sorted(["x" * 200, deepest])
    assert sorted(os.listdir(other / d2 / a / b)) == deep_names
    if s3:  # this node never listed s/: the check lists its keys in the store
        assert errno_of(lambda: os.rename(other / "s", other / d2 / d1)) == errno.ENAMETOOLONG
    else:
        os.rename(other / "s", other / d2 / d1)
        assert (other / d2 / d1 / a / b).read_bytes() == b"moved"
        assert any("%h" in p.name for p in c.store.rglob("*"))  # names mapped on disk
    sync(other)

    r = run_cli("ls", c.url, *c.extra, "--json")
    shown = {f["path"] for f in json.loads(r.stdout)}
    assert {f"{d2}/{f2}", f"{d2}/{link}", top, f"{d2}/{a}/{b}/{'x' * 200}"} <= shown
    assert run_cli("latest", c.url, *c.extra, "--pattern", "run=*").stdout == d2 + "\n"
    assert "complete: " in run_cli("verify", c.url, d2, *c.extra).stdout
    assert run_cli("fsck", c.url, *c.extra).returncode == 0


# ------------------------------------------------------------------------------ xattrs
def test_xattrs(mnt: Mount) -> None:
    p = mnt / "f"
    write(p, data(2 * CHUNK, 13))
    assert os.getxattr(p, "user.ckptfs.state") in (b"pending", b"durable")
    sync(mnt)
    assert os.getxattr(p, "user.ckptfs.state") == b"durable"
    assert "user.ckptfs.state" in os.listxattr(p)
    with open(mnt / "g", "wb") as f:
        f.write(b"1")
        assert os.getxattr(mnt / "g", "user.ckptfs.state") == b"open"
    assert errno_of(lambda: os.setxattr(p, "user.foo", b"bar")) in ENOTSUP
    assert errno_of(lambda: os.setxattr(mnt.path, "user.foo", b"bar")) in ENOTSUP
    assert errno_of(lambda: os.removexattr(p, "user.foo")) in ENOTSUP
    assert errno_of(lambda: os.getxattr(p, "user.unknown")) == errno.ENODATA
    assert errno_of(lambda: os.getxattr(p, "security.selinux")) == errno.ENODATA
    os.mkdir(mnt / "d")
    assert errno_of(lambda: os.getxattr(mnt / "d", "user.ckptfs.state")) == errno.ENODATA


def test_xattr_state_remote(cluster: Cluster, mnt: Mount) -> None:
    write(mnt / "f", data(CHUNK + 1, 14))
    other = cluster.remount(mnt)
    assert os.getxattr(other / "f", "user.ckptfs.state") == b"remote"


# ------------------------------------------------------------------------------ errnos
def test_exact_errnos(mnt: Mount) -> None:
    os.mkdir(mnt / "d")
    write(mnt / "f", b"x")
    assert errno_of(lambda: os.open(mnt / "nope", os.O_RDONLY)) == errno.ENOENT
    assert errno_of(lambda: os.open(mnt / "nope" / "x", os.O_WRONLY | os.O_CREAT)) \
        == errno.ENOENT
    assert errno_of(lambda: os.mkdir(mnt / "d")) == errno.EEXIST
    assert errno_of(lambda: os.open(mnt / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)) \
        == errno.EEXIST
    write(mnt / "d" / "child", b"")
    assert errno_of(lambda: os.rmdir(mnt / "d")) == errno.ENOTEMPTY
    assert errno_of(lambda: os.open(mnt / "d", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)) \
        == errno.EISDIR
    assert errno_of(lambda: os.open(mnt / "d", os.O_RDWR)) == errno.EISDIR
    assert errno_of(lambda: os.unlink(mnt / "d")) == errno.EISDIR
    assert errno_of(lambda: os.open(mnt / "f" / "x", os.O_RDONLY)) == errno.ENOTDIR
    assert errno_of(lambda: os.open(mnt / "f" / "x", os.O_WRONLY | os.O_CREAT)) \
        == errno.ENOTDIR
    assert errno_of(lambda: os.listdir(mnt / "f")) == errno.ENOTDIR
    assert errno_of(lambda: os.rmdir(mnt / "f")) == errno.ENOTDIR
    assert errno_of(lambda: os.truncate(mnt / "d", 0)) == errno.EISDIR


def test_directory_mtime_advances(mnt: Mount) -> None:
    os.mkdir(mnt / "d")
    d = mnt / "d"
    past = 1_000_000_000_000_000_000
    steps: list[Callable[[], object]] = [
        lambda: write(d / "f", b"1"),
        lambda: os.mkdir(d / "sub"),
        lambda: os.symlink("f", d / "l"),
        lambda: os.rename(d / "f", d / "g"),
        lambda: os.unlink(d / "g"),
        lambda: os.rmdir(d / "sub"),
    ]
    for step in steps:
        os.utime(d, ns=(past, past))
        assert os.stat(d).st_mtime_ns == past
        step()
        assert os.stat(d).st_mtime_ns > past, step
    # a rename between directories touches both
    os.mkdir(mnt / "e")
    os.utime(d, ns=(past, past))
    os.utime(mnt / "e", ns=(past, past))
    os.rename(d / "l", mnt / "e" / "l")
    assert os.stat(d).st_mtime_ns > past and os.stat(mnt / "e").st_mtime_ns > past


# ------------------------------------------------------------------------------ mmap
def test_mmap_reads(cluster: Cluster, mnt: Mount) -> None:
    blob = data(3 * CHUNK + 100, 15)
    write(mnt / "m", blob)
    for node in (mnt, None):
        if node is None:
            node = cluster.remount(mnt)
        with open(node / "m", "rb") as f:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as shared:
                same(shared[:], blob)
                same(shared[CHUNK - 5:CHUNK + 5], blob[CHUNK - 5:CHUNK + 5])
            with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as priv:
                same(priv[:], blob)


def test_sendfile_into_a_write_only_file(cluster: Cluster, mnt: Mount, tmp_path: Path
                                         ) -> None:
    """shutil.copyfile uses sendfile(2): the kernel's splice path, into a write-only,
    direct-I/O descriptor."""
    src = tmp_path / "src"
    blob = data(3 * CHUNK + 11, 18)
    src.write_bytes(blob)
    shutil.copyfile(src, mnt / "copy")
    other = cluster.remount(mnt)
    same((other / "copy").read_bytes(), blob)


def test_readers_see_write_only_writers(mnt: Mount) -> None:
    """Write-only descriptors bypass the page cache (direct I/O): a reader that already
    cached the old bytes, by read() or by mmap, must still see the new ones."""
    p = mnt / "coherent"
    write(p, data(2 * CHUNK, 16))
    r = os.open(p, os.O_RDONLY)
    try:
        with mmap.mmap(r, 0, prot=mmap.PROT_READ) as view:
            assert os.pread(r, 4, CHUNK) == view[CHUNK:CHUNK + 4] != b"new!"
            w = os.open(p, os.O_WRONLY)
            try:
                assert os.pwrite(w, b"new!", CHUNK) == 4
                assert os.pread(r, 4, CHUNK) == b"new!"
                assert view[CHUNK:CHUNK + 4] == b"new!"
            finally:
                os.close(w)
            assert os.pread(r, 4, CHUNK) == b"new!"
    finally:
        os.close(r)
    with open(p, "rb") as again:
        again.seek(CHUNK)
        assert again.read(4) == b"new!"


# ------------------------------------------------------------------------------ concurrency
def test_concurrent_writers(cluster: Cluster, mnt: Mount) -> None:
    blobs = {i: data(5 * MiB + i, 100 + i) for i in range(8)}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        try:
            barrier.wait()
            with open(mnt / f"w{i}", "wb") as f:
                f.writelines(blobs[i][off:off + 256 * 1024]
                             for off in range(0, len(blobs[i]), 256 * 1024))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, blob in blobs.items():
        same((mnt / f"w{i}").read_bytes(), blob)
    other = cluster.remount(mnt)
    for i, blob in blobs.items():
        same((other / f"w{i}").read_bytes(), blob)


# ------------------------------------------------------------------------------ umount
def test_umount_then_everything_readable_elsewhere(cluster: Cluster, mnt: Mount) -> None:
    tree: dict[str, bytes] = {}
    for i in range(20):
        rel = f"d{i % 3}/sub{i % 2}/f{i}"
        tree[rel] = data((i * 300_000) % (3 * CHUNK) + i, 200 + i)
        os.makedirs(os.path.dirname(mnt / rel), exist_ok=True)
        write(mnt / rel, tree[rel])
    os.makedirs(mnt / "empty" / "nested")
    write(mnt / "zero", b"")
    tree["zero"] = b""
    os.symlink("d0/sub0/f0", mnt / "link")
    os.chmod(mnt / "d1", 0o750)
    modes = {rel: os.stat(mnt / rel).st_mode for rel in tree}
    mtimes = {rel: os.stat(mnt / rel).st_mtime_ns for rel in tree}
    r = run_cli("umount", str(mnt.path))
    assert r.returncode == 0 and "everything is in the store" in r.stdout
    mnt.wait_exit()
    other = cluster.node()
    for rel, blob in tree.items():
        same((other / rel).read_bytes(), blob)
        st = os.stat(other / rel)
        assert st.st_size == len(blob)
        assert st.st_mode == modes[rel], rel
        assert st.st_mtime_ns == mtimes[rel], rel
    assert os.listdir(other / "empty") == ["nested"]
    assert os.listdir(other / "empty" / "nested") == []
    assert os.readlink(other / "link") == "d0/sub0/f0"
    assert stat.S_IMODE(os.stat(other / "d1").st_mode) == 0o750
