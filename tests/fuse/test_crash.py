"""Nothing acknowledged is ever lost: the daemon SIGKILLed at named crash points.

Each case mounts node A with CKPTFS_CRASH_AT=<point>[:<n>] (ckptfs/common/crashpoints.py), runs a
scripted checkpoint save through the real FUSE mount until the daemon dies under it, and
recovers the way docs/OPERATIONS.md says to:

1. lazy-unmount the dead mount;
2. mount again with the SAME cache directory (the journal is replayed); that node must
   already show the acknowledged tree; `ckptfs umount` must then exit 0 (all durable);
3. mount a fresh node with an EMPTY cache and compare its whole tree with the workload's
   model: every acknowledged file with its exact bytes, every acknowledged mkdir, rename,
   unlink and rmdir, and nothing else. The one call in flight when the daemon died may
   have taken effect or not, but only as a whole;
4. `ckptfs fsck --json` the store: clean (no missing chunk), no unfinished directory
   rename (no intent left), no stray key.

Acknowledged (docs/SEMANTICS.md, Durability): a file once close() or fsync() returned
without error; mkdir, rename, unlink and rmdir once they returned. A file still open for
writing when the daemon dies keeps exactly its last fsynced version: the writes after
the fsync are an unpublished version, which the next mount discards.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from faultproxy import FaultProxy, never
from mounting import Mount, Nodes, is_mounted, lazy_unmount, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.format.manifests import chunk_key, fossil_key

WRITE = 64 * 1024  # bytes per os.write: one FUSE write request each (no writeback cache)
DIR = "<dir>"
#: what file calls get once the daemon is gone (ECONNABORTED for the request in flight)
DEAD = {errno.EIO, errno.ENOTCONN, errno.ECONNABORTED}
LIVE = "ckpt/live.bin"  # the file kept open for writing
LIVE_MOVED = "ckpt/live-final.bin"  # ... and renamed while open

State = dict[str, "bytes | str"]  # path -> file bytes, or DIR


class Died(Exception):
    """The mount died under the workload."""


def write_all(fd: int, body: bytes) -> None:
    view = memoryview(body)
    for start in range(0, len(body), WRITE):
        piece = view[start:start + WRITE]
        while piece:
            piece = piece[os.write(fd, piece):]


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


@dataclass
class Workload:
    """Runs file calls on a mount and models what they acknowledged.

    `state` is the tree implied by every acknowledged call. When a call fails because
    the mount died, `inflight` names it and holds the tree it would have produced:
    recovery must show exactly `state` or exactly that tree.
    """

    root: Path
    state: State = field(default_factory=dict)
    inflight: tuple[str, State] | None = None
    acked: list[str] = field(default_factory=list)
    live_fd: int | None = None
    live_path: str = LIVE
    live_written: bytes = b""
    live_fsynced: bytes | None = None  # the version the last acknowledged fsync published

    def _do(self, what: str, after: State, action: Callable[[], None]) -> None:
        try:
            action()
        except OSError as e:
            if e.errno not in DEAD:
                raise
            self.inflight = (what, after)
            raise Died(f"{what}: {e}") from e
        self.state = after
        self.acked.append(what)

    def mkdir(self, p: str) -> None:
        self._do(f"mkdir {p}", {**self.state, p: DIR}, lambda: os.mkdir(self.root / p))

    def put(self, p: str, body: bytes) -> None:
        """open(O_CREAT|O_TRUNC), write in 64 KiB pieces, close: acknowledged by close."""
        def action() -> None:
            fd = os.open(self.root / p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, body)
            except OSError:
                close_quietly(fd)
                raise
            os.close(fd)
        self._do(f"write+close {p}", {**self.state, p: body}, action)

    def rename(self, src: str, dst: str) -> None:
        after = {k: v for k, v in self.state.items() if k != dst and not k.startswith(dst + "/")}
        for k, v in self.state.items():
            if k == src or k.startswith(src + "/"):
                del after[k]
                after[dst + k[len(src):]] = v
        self._do(f"rename {src} -> {dst}", after,
                 lambda: os.rename(self.root / src, self.root / dst))
        if self.live_path == src:
            self.live_path = dst

    def unlink(self, p: str) -> None:
        self._do(f"unlink {p}", {k: v for k, v in self.state.items() if k != p},
                 lambda: os.unlink(self.root / p))

    def rmdir(self, p: str) -> None:
        self._do(f"rmdir {p}", {k: v for k, v in self.state.items() if k != p},
                 lambda: os.rmdir(self.root / p))

    # the file kept open: its writes acknowledge nothing; fsync and close do
    def live_open(self) -> None:
        def action() -> None:
            self.live_fd = os.open(self.root / self.live_path,
                                   os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._do(f"create {self.live_path}, kept open", dict(self.state), action)

    def live_write(self, body: bytes) -> None:
        def action() -> None:
            assert self.live_fd is not None
            write_all(self.live_fd, body)
            self.live_written += body
        self._do(f"write to the open {self.live_path}", dict(self.state), action)

    def live_fsync(self) -> None:
        written = self.live_written
        self._do(f"fsync {self.live_path}", {**self.state, self.live_path: written},
                 lambda: os.fsync(self.live_fd))  # type: ignore[arg-type]
        self.live_fsynced = written

    def live_close(self) -> None:
        fd, self.live_fd = self.live_fd, None
        assert fd is not None
        self._do(f"close {self.live_path}",
                 {**self.state, self.live_path: self.live_written}, lambda: os.close(fd))

    def abandon(self) -> None:
        """After the mount died: drop the descriptor still open on it (acknowledges
        nothing: the close fails on the dead mount)."""
        if self.live_fd is not None:
            close_quietly(self.live_fd)


# Where the counted points land (FUSE writes are 64 KiB): writes w0 1-17, live A 18-23,
# w1 24-47, old 48-55, new 56-68, stage 69-87, doomed 88-91, live B 92-99, w2, w0'.
# put_file (close or fsync): w0, live, w1, old, new, s0..s3, doomed, w2, w0', live.
# put_dir: ckpt, stage, scratch. rename_file: new->old, live->live-final.
# Ops applied in order (op_applied): ckpt, w0, live, w1, old, new, new->old, stage, s0,
# s1 (10), ..., the version of w0 that w0' replaces kept in the trash (18: a keep_version
# op, applied before its put_file), w0' (19), mkdir scratch (20), rmdir scratch (21), the
# fsynced version of live kept in the trash (22) and the close of live (23).
def workload(w: Workload, close_live: bool) -> None:
    """A checkpoint save with every kind of acknowledged call; raises Died."""
    w.mkdir("ckpt")
    w.put("ckpt/w0.bin", random_bytes(2**20 + 123, 1))
    w.live_open()
    w.live_write(random_bytes(320 * 1024 + 7, 2))
    w.live_fsync()  # acknowledged: exactly this version must survive what comes after
    w.put("ckpt/w1.bin", random_bytes(3 * 2**19, 3))
    w.put("old.bin", random_bytes(512 * 1024, 4))
    w.put("new.bin", random_bytes(768 * 1024 + 5, 5))
    w.rename("new.bin", "old.bin")  # a file rename over an existing file
    w.mkdir("stage")
    for i in range(4):
        w.put(f"stage/s{i}.bin", random_bytes(256 * 1024 + 1000 * i, 10 + i))
    w.rename("stage", "step-1")  # the directory rename that commits a checkpoint
    w.put("doomed.bin", random_bytes(200 * 1024, 6))
    w.unlink("doomed.bin")
    w.rename(LIVE, LIVE_MOVED)  # the open file moves; its fsynced version with it
    w.live_write(random_bytes(448 * 1024 + 3, 7))  # after the fsync: never acknowledged
    w.put("ckpt/w2.bin", random_bytes(2**20, 8))
    w.put("ckpt/w0.bin", random_bytes(640 * 1024 + 1, 9))  # O_TRUNC rewrite of a closed file
    w.mkdir("scratch")
    w.rmdir("scratch")
    if close_live:  # the runs that end in an unmount: nothing may stay open
        w.live_close()
        w.unlink("ckpt/w1.bin")  # not waited for: likely still queued at the unmount


AFTER = "<after the workload>"


@dataclass(frozen=True)
class Case:
    point: str  # CKPTFS_CRASH_AT
    lands: str | None  # the call in flight at the kill, or AFTER; None: timing decides
    store: str = "local"  # or "s3" (SeaweedFS)
    end: str = "wait"  # if the daemon outlives the workload: "wait" (for a background
    # point, with the file still open), "umount" (ckptfs umount) or "fusermount"
    # (fusermount3 -u); for the last two the workload closes everything first
    then: str | None = None  # a second kill, at this point of the first recovery mount


CASES = [
    Case("write:95", f"write to the open {LIVE_MOVED}"),  # after its fsync and rename
    Case("write:50", "write+close old.bin"),
    Case("before_journal_put_file:2", f"fsync {LIVE}"),
    Case("journaled_put_file:5", "write+close new.bin"),  # journaled, manifest not PUT
    Case("applied_put_file:3", "write+close ckpt/w1.bin"),  # PUT, close not returned
    Case("journaled_put_dir:2", "mkdir stage"),
    Case("journaled_rename_file:1", "rename new.bin -> old.bin"),
    Case("applied_rename_file:2", f"rename {LIVE} -> {LIVE_MOVED}"),
    Case("journaled_rename_dir:1", "rename stage -> step-1", store="s3"),
    Case("rename_dir_intent:1", "rename stage -> step-1"),  # intent PUT, nothing copied
    Case("rename_dir_copied:1", "rename stage -> step-1", store="s3"),  # not deleted
    Case("journaled_delete_file:1", "unlink doomed.bin"),
    Case("journaled_delete_dir:1", "rmdir scratch"),
    Case("op_applied:10", "write+close stage/s1.bin"),  # applied, journal row not deleted
    Case("op_applied:21", AFTER),  # rmdir's delete, applied once the workload is done:
    # the kill comes while the fsynced file is open and idle
    Case("chunk_before_put:40", None),
    Case("chunk_after_put:70", None, store="s3"),  # in the store, journal row still there
    Case("unmounted:1", AFTER, end="umount"),  # in the final flush of `ckptfs umount`
    Case("unmounted:1", AFTER, end="fusermount"),  # in the flush after fusermount3 -u
    # killed again while recovering: the journal replay itself is interrupted
    Case("journaled_rename_dir:1", "rename stage -> step-1", then="rename_dir_copied:1"),
    Case("journaled_put_file:5", "write+close new.bin", then="chunk_after_put:1"),
]


def walk(root: Path) -> State:
    """The whole tree under a mount: path -> bytes, or DIR."""
    out: State = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = DIR
        for f in filenames:
            out[os.path.normpath(os.path.join(rel, f))] = (Path(dirpath) / f).read_bytes()
    return out


def describe(v: bytes | str | None) -> str:
    return "absent" if v is None else "a directory" if isinstance(v, str) else f"{len(v)} bytes"


def diff(seen: State, want: State) -> list[str]:
    out = []
    for p in sorted(set(seen) | set(want)):
        a, b = seen.get(p), want.get(p)
        if a == b:
            continue
        line = f"    {p}: expected {describe(b)}, found {describe(a)}"
        if isinstance(a, bytes) and isinstance(b, bytes):
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                         min(len(a), len(b)))
            line += f", first difference at byte {first}"
        out.append(line)
    return out


def check_tree(where: str, seen: State, w: Workload, point: str) -> None:
    """`seen` is the acknowledged tree, or the tree after the call in flight."""
    outcomes = [("the acknowledged tree", w.state)]
    if w.inflight is not None:
        outcomes.append((f"the tree after the in-flight '{w.inflight[0]}'", w.inflight[1]))
    if any(seen == want for _, want in outcomes):
        return
    report = [f"{where}, after a kill at {point}, shows neither tree. Acknowledged: {w.acked}"]
    for name, want in outcomes:
        report.append(f"  vs {name}:")
        report += diff(seen, want)
    pytest.fail("\n".join(report))


def killed_while_recovering(a: Mount, point: str) -> None:
    """Mount A's cache again with CKPTFS_CRASH_AT=point; wait until the daemon dies there
    (its cache lock is free again) without any file call: replay alone must reach it."""
    r = run_cli("mount", a.store, str(a.path), "--cache-dir", str(a.cache), "--node-id",
                a.path.name, *a.extra, check=False,
                env={**os.environ, "CKPTFS_CRASH_AT": point})
    # killed before or after it reported ready; any other failure is one
    assert r.returncode == 0 or "exited before the mount was ready" in r.stderr, r.stderr
    fd = os.open(a.cache / "lock", os.O_RDWR)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    try:  # let the cleanup stop it
                        a.pid = int(str(a.status()["pid"]))
                    except (AssertionError, ValueError, KeyError):
                        pass
                    raise AssertionError(f"the recovering daemon never reached {point}") from None
                time.sleep(0.05)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    lazy_unmount(a.path)
    assert not is_mounted(a.path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[
    f"{c.point}-{c.store}-{c.end}" + (f"-then-{c.then}" if c.then else "") for c in CASES])
def test_kill_at_crash_point_loses_nothing_acknowledged(
        case: Case, tmp_path: Path, nodes: Nodes, request: pytest.FixtureRequest) -> None:
    if case.store == "s3":
        seaweed = request.getfixturevalue("seaweed")
        url = f"s3://{seaweed.new_bucket()}/crash"
        store_args = ["--endpoint-url", seaweed.endpoint]
    else:
        (tmp_path / "store").mkdir()
        url, store_args = str(tmp_path / "store"), []
    extra = [*store_args, "--chunk-size", "64K", "--missing-chunk-timeout", "5"]

    a = Mount(url, tmp_path, "a", extra=extra, env={**os.environ, "CKPTFS_CRASH_AT": case.point})
    nodes.append(a)
    a.mount()
    assert a.pid is not None

    w = Workload(a.path)
    try:
        workload(w, close_live=case.end != "wait")
    except Died:
        pass
    except BaseException:
        w.abandon()
        raise
    ended = None
    # the daemon outlived the workload: the point is further on. No subprocess may start
    # while the file is open: a child's close of its inherited descriptor (at exec or
    # exit) is a FUSE flush, which publishes the file as a close would
    if w.inflight is None and case.end != "wait":
        if case.end == "umount":
            ended = run_cli("umount", str(a.path), "--timeout", "60", check=False)
        else:
            subprocess.run(["fusermount3", "-u", str(a.path)], check=True)
    assert a.exited(30), f"the daemon never reached {case.point}"
    assert a.exit_code == -9, f"the daemon exited with {a.exit_code}, not at {case.point}"
    w.abandon()  # only now: a close while the daemon lives would publish the file
    lazy_unmount(a.path)
    assert not is_mounted(a.path)
    where = w.inflight[0] if w.inflight else AFTER
    flushing = [line.split(": ", 1)[1] for line in (a.cache / "ckptfs.log").read_text()
                .splitlines() if "unmounted; flushing" in line]
    print(f"{case.point}: killed during {where!r} after {len(w.acked)} acknowledged calls"
          + (f"; then {ended.args[3]} exited {ended.returncode}" if ended else "")
          + (f"; daemon: {flushing[0]}" if flushing else ""))
    if case.lands is not None:
        assert where == case.lands, "the crash point no longer lands where this case aims"
    if case.end == "umount" and ended is not None and ended.returncode == 0:
        # umount said "everything is in the store" although its daemon was killed: then
        # a fresh node must see everything before any recovery
        c = Mount(url, tmp_path, "c", extra=extra)
        nodes.append(c)
        c.mount()
        check_tree("a fresh node before recovery (umount exited 0)", walk(c.path), w,
                   case.point)
        c.umount()

    if case.then is not None:
        killed_while_recovering(a, case.then)
    # the same cache directory: the journal is replayed, then umount drains it
    a.env = None
    a.mount()
    recovered = walk(a.path)
    check_tree("the recovered node", recovered, w, case.point)
    r = a.umount()
    assert r.returncode == 0 and "everything is in the store" in r.stdout, r.stdout

    # a fresh node, empty cache: the store alone holds exactly the same tree
    b = Mount(url, tmp_path, "b", extra=extra)
    nodes.append(b)
    b.mount()
    seen = walk(b.path)
    check_tree("a fresh node", seen, w, case.point)
    assert seen == recovered, "the fresh node and the recovered node disagree"
    if w.live_fd is not None and w.live_fsynced is not None and not (
            w.inflight and w.inflight[0].startswith(("fsync", "close"))):
        # open for writing at the kill: exactly the fsynced version, under one of its names
        assert [seen[p] for p in (LIVE, LIVE_MOVED) if p in seen] == [w.live_fsynced]
    b.umount()
    r = run_cli("fsck", url, *store_args, "--json", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["clean"] and report["problems"] == [], report  # no chunk missing
    assert report["intents"] == [], report  # no directory rename left unfinished
    assert report["strays"] == [], report


# ------------------------------------------------- a node down longer than gc's grace
def manifest_put(method: str, path: str) -> bool:
    return method == "PUT" and "/files/" in path


@pytest.mark.timeout(180)
def test_node_down_longer_than_gc_grace_puts_chunks_back_before_its_manifest(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """A file is closed and its chunks uploaded while the store refuses its manifest PUT
    (503 from the proxy); the daemon is killed (-9) with the manifest still journaled.
    While the node is down, "gc runs": two chunks are deleted and two set aside in
    fossils/. The node's journal is aged by an hour (the node was down that long: more
    than publisher.CONFIRM_WINDOW). Mounted again on the same cache directory, it HEADs
    the chunks, copies the fossils back, uploads the deleted ones from the staging file
    it kept, and only then PUTs the manifest; a fresh node reads identical bytes, and
    fsck finds the store clean."""
    bucket = seaweed.new_bucket()
    url = f"s3://{bucket}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint, "--chunk-size", "1M")
    proxy.throttle(1.0, manifest_put)  # every manifest PUT refused: retried, never stored
    data = random_bytes(4 * 2**20 + 123, 41)
    (a / "model.pt").write_bytes(data)
    wait_until(lambda: a.status()["pending_chunks"] == 0, 60, "the chunks are uploaded")
    assert a.status()["pending_ops"] == 1
    a.kill()

    s3 = seaweed.s3
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="job/chunks/")["Contents"]
    hashes = sorted(o["Key"].rpartition("/")[2] for o in listed)
    assert len(hashes) == 5
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="job/files/model.pt")
    deleted, fossilized = hashes[:2], hashes[2:4]  # gc, while the node is down
    for h in fossilized:
        s3.copy_object(Bucket=bucket, Key=f"job/{fossil_key(h)}",
                       CopySource={"Bucket": bucket, "Key": f"job/{chunk_key(h)}"})
    for h in deleted + fossilized:
        s3.delete_object(Bucket=bucket, Key=f"job/{chunk_key(h)}")
    db = sqlite3.connect(a.cache / "journal.sqlite")
    with db:
        db.execute("UPDATE ops SET journaled_at = journaled_at - 3600")
    db.close()

    proxy.throttle(0.0, never)
    seen = len(proxy.log)
    a.mount()
    r = a.umount()
    assert "everything is in the store" in r.stdout, r.stdout
    log = proxy.log[seen:]
    [manifest] = [q for q in log if manifest_put(q.method, q.path) and q.status == 200
                  and q.path.endswith("/files/model.pt")]
    for h in hashes:
        heads = [q for q in log if q.method == "HEAD" and q.path.endswith(chunk_key(h))]
        assert heads and heads[0].end <= manifest.start, h
    for h in deleted + fossilized:  # an upload, or a server-side copy: both are PUTs
        puts = [q for q in log if q.method == "PUT" and q.path.endswith(chunk_key(h))
                and q.status == 200]
        assert puts and puts[0].end <= manifest.start, h
    assert not [q for q in log if q.method == "PUT" and q.path.endswith(chunk_key(hashes[4]))]
    assert ("re-confirmed the 5 chunks of model.pt before its late publish" in a.log()
            and "2 copied back from fossils/, 2 uploaded again from staging, 0 lost"
            in a.log()), a.log()

    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
    assert (b / "model.pt").read_bytes() == data
    b.umount()
    r = run_cli("fsck", url, "--endpoint-url", seaweed.endpoint, "--json", check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["clean"] and report["strays"] == [], report


# ------------------------------------------------- a journal damaged while the node is down
def chunk_put(method: str, path: str) -> bool:
    return method == "PUT" and "/chunks/" in path


@pytest.mark.timeout(180)
def test_a_journal_damaged_after_a_kill_is_checked_not_trusted(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """Issue 18 item 6: a file closed and published while its chunk uploads kept failing,
    the daemon killed (-9), a few bytes of the journal's write-ahead log damaged. SQLite
    would replay nothing of it: `umount` of the dead mount said everything closed was in
    the store, the next mount deleted the staging file, and the file stayed without its
    chunks. Now umount says the journal lost committed state and exits 1; the next mount
    is not durable until it has checked the file against the store and uploaded its
    chunks again from the staging file it kept; a fresh node reads identical bytes."""
    bucket = seaweed.new_bucket()
    url = f"s3://{bucket}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint, "--chunk-size", "1M")
    proxy.throttle(1.0, chunk_put)  # every chunk PUT refused: retried, never stored
    data = random_bytes(4 * 2**20, 43)
    (a / "model.pt").write_bytes(data)
    wait_until(lambda: a.status()["pending_ops"] == 0, 60, "the manifest is in the store")
    assert a.status()["pending_chunks"] == 4
    a.kill_daemon()
    wal = a.cache / "journal.sqlite-wal"
    with open(wal, "r+b") as f:
        f.seek(32 + 24 + 100)  # the first frame's page
        f.write(b"\xa5" * 8)

    r = run_cli("umount", str(a.path), check=False)
    assert r.returncode == 1 and "lost committed state" in r.stderr, r
    assert "everything" not in r.stdout + r.stderr, r
    proxy.throttle(0.0, never)
    a.mount()
    wait_until(lambda: a.status()["durable"], 60, "the journal check is done")
    assert "journal check done: 1 files written here" in a.log(), a.log()
    assert "4 were missing, 0 copied back from fossils/, 4 uploaded again from staging, " \
           "0 lost" in a.log(), a.log()
    r = a.umount()
    assert "everything is in the store" in r.stdout, r.stdout

    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
    assert (b / "model.pt").read_bytes() == data
    b.umount()
