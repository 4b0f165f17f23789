"""Two movers on one fast tier at once, one killed mid-move, gc running on the object
store meanwhile: nothing is lost, and the object store never takes an older manifest of
a path over a newer one (docs/FORMAT.md, "The fast tier": generations, leases, gc)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pipeline_helpers import publish
from support import random_bytes

from ckptfs.common.errors import NotFoundError
from ckptfs.daemon.mount import create_store
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, file_key
from ckptfs.pipeline import fasttier, publisher
from ckptfs.pipeline.fasttier import Leases, Replayer
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, inspection

ROOT = Path(__file__).resolve().parents[2]
LOST, LIVE = "a-lost", "b-live"  # queue names: a drain looks at the lost node's first
LEASE = 1.0
WINDOW = 0.1  # the confirmation window, shortened as the soak does (docs/SOAK.md)
GRACE = 2 * WINDOW + 1.0  # gc's grace beside the movers: above the window

#: the lost node's mover, in a process of its own: it takes the lost queue's lease, says
#: so, and moves that queue, its chunk PUTs a little slow (it moves beside the other
#: mover); it kills itself (SIGKILL) at its n-th chunk PUT (argv 3), or where
#: CKPTFS_CRASH_AT says; it pauses (argv 7 seconds) at its m-th chunk PUT (argv 6)
MOVER = """
import os, signal, sys, time
from ckptfs.format import manifests
from ckptfs.pipeline import fasttier
from ckptfs.store.local import LocalStore

class Slow(LocalStore):
    puts = 0
    def put(self, key, data):
        if key.startswith(manifests.CHUNKS):
            time.sleep(0.01)
            Slow.puts += 1
            if Slow.puts == int(sys.argv[3]):
                os.kill(os.getpid(), signal.SIGKILL)
            if Slow.puts == int(sys.argv[6]):
                time.sleep(float(sys.argv[7]))
        super().put(key, data)

fast = LocalStore(sys.argv[1])
leases = fasttier.Leases(fast, "mover-x", float(sys.argv[4]))
assert leases.take_over(sys.argv[5], leases.store_now())
print("leased", flush=True)
fasttier.move_queue(fasttier.Replayer(fast, Slow(sys.argv[2])), leases, sys.argv[5])
"""


def read_back(store: LocalStore, path: str) -> bytes:
    """A file's bytes straight from the object store (chunks/, else fossils/), verified."""
    out = b""
    for h, _ in Manifest.from_json(store.get(file_key(path))).chunks:
        try:
            blob = store.get(manifests.chunk_key(h))
        except NotFoundError:
            blob = store.get(manifests.fossil_key(h))
        out += codec.decode_chunk(blob, h)
    return out


class Watcher(threading.Thread):
    """Reads the object store's manifest of each path over and over; notes any moment
    its generation went down (an older version over a newer one)."""

    def __init__(self, store: LocalStore, paths: list[str]) -> None:
        super().__init__(daemon=True)
        self.store, self.paths = store, paths
        self.seen = dict.fromkeys(paths, -1)
        self.regressions: dict[str, str] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for p in self.paths:
                try:
                    gen = manifests.generation(self.store.get(file_key(p)))
                except NotFoundError:
                    continue
                if gen < self.seen[p]:  # the first time, for each path
                    self.regressions.setdefault(p, f"generation {self.seen[p]} then {gen}")
                self.seen[p] = max(self.seen[p], gen)
            time.sleep(0.002)


@pytest.mark.parametrize("kill,pause", [("chunk:5", 0), ("fast_manifest_put:1", 0),
                                        ("fast_moved:2", 0), ("fast_moved:2", 4)])
def test_two_movers_a_kill_and_gc_lose_nothing_and_never_go_back(
        tmp_path: Path, kill: str, pause: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost node's queue (its versions of f0..f3, and g0, g1 nobody else wrote) and a
    live node's queue (newer versions of f0..f3, one chunk shared with the lost node's)
    are moved at once: the lost node's mover in a process killed mid-copy (at its 5th
    chunk PUT), after a manifest PUT, or after a move before the record's delete; a
    drain moves the live queue meanwhile, then takes the lost queue over once its lease
    runs out (with `pause`, while the lost node's mover is paused at that chunk PUT
    past its lease: it then goes on with the record it was on, which the drain has
    moved meanwhile, and is killed after it: two movers on one queue at once); gc (a
    short grace) runs on the object store all the while, which holds older versions of
    f0..f3 whose chunks it frees. The object store ends with the newest version of every
    path, its manifest generation never went down, every record is gone, and once the
    fast tier is deleted every file reads back byte-exact, also after gc with no grace,
    and fsck --deep finds nothing wrong."""
    monkeypatch.setattr(manifests, "CONFIRM_WINDOW", WINDOW)
    monkeypatch.setattr(publisher, "CONFIRM_WINDOW", WINDOW)
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast, slow = LocalStore(tmp_path / "fast"), LocalStore(tmp_path / "slow")
    create_store(slow, 64 * 1024)
    f_paths, g_paths = [f"ckpt/f{i}" for i in range(4)], ["ckpt/g0", "ckpt/g1"]
    want: dict[str, bytes] = {}  # path -> the newest version's bytes
    for p in f_paths:  # published before the fast tier (generation 0)
        first = random_bytes(3000)
        slow.put_parts(manifests.chunk_key(codec.chunk_hash(first)),
                       codec.encode_chunk_parts(first, "zstd4")[0])
        slow.put(file_key(p), Manifest(3000, 0o100644, 0, ((codec.chunk_hash(first), 3000),),
                                       writer="old").to_json())
    lost_chunks = {}
    order = [g_paths[0], f_paths[0], g_paths[1], *f_paths[1:]]
    for seq, p in enumerate(order, 1):  # the lost node's versions: generation 1000 on
        lost_chunks[p] = [random_bytes(3000) for _ in range(3)]
        publish(fast, LOST, seq, p, lost_chunks[p], 1000 + seq)
        want[p] = b"".join(lost_chunks[p])
    for seq, p in enumerate(f_paths, 1):  # the live node's: newer, one chunk kept
        chunks = [lost_chunks[p][0], random_bytes(3000), random_bytes(3000)]
        publish(fast, LIVE, seq, p, chunks, 2000 + seq)
        want[p] = b"".join(chunks)

    point, _, n = kill.partition(":")
    env = {"PYTHONPATH": str(ROOT), manifests.CONFIRM_WINDOW_ENV: str(WINDOW),
           **({"CKPTFS_CRASH_AT": kill} if point != "chunk" else {})}
    mover = subprocess.Popen(
        [sys.executable, "-c", MOVER, str(tmp_path / "fast"), str(tmp_path / "slow"),
         n if point == "chunk" else "0", str(LEASE), LOST, str(pause), str(2.5 * LEASE)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    watcher = Watcher(slow, f_paths + g_paths)
    done = threading.Event()
    gc_runs: list[gc.GcReport] = []
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            while not done.is_set():
                gc_runs.append(gc.collect(slow, grace=GRACE))
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    try:
        assert mover.stdout is not None
        assert mover.stdout.readline().strip() == "leased"
        watcher.start()
        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        drained = fasttier.drain(fast, slow, lambda s: None, time.monotonic() + 60,
                                 lease=LEASE)
        assert mover.wait(30) == -signal.SIGKILL  # it was killed where asked
        time.sleep(GRACE + 0.3)  # gc runs on past the grace of the last moves
    finally:
        done.set()
        if mover.poll() is None:
            mover.kill()
            mover.wait()
        watcher.done.set()
    collector.join(30)
    watcher.join(5)
    assert not errors, errors
    assert drained and fasttier.queues(fast) == []
    assert watcher.regressions == {}
    assert sum(r.fossilized.count for r in gc_runs) >= 4  # the generation-0 versions' chunks
    shutil.rmtree(tmp_path / "fast")  # the object store alone from here on
    for _ in range(2):  # every referenced chunk survives
        for p, data in sorted(want.items()):
            assert read_back(slow, p) == data, p
        gc.collect(slow, grace=0.0)
        time.sleep(0.05)
    assert inspection.fsck(slow, deep=True).problems == []


class DiesAtLeasePut(LocalStore):
    """A fast tier whose mover dies (an exception no mover catches) at its PUT of a
    lease, which take_over makes right after winning the claim."""

    def put(self, key: str, data: bytes | memoryview) -> None:
        if key == fasttier.lease_key(LOST):
            raise KeyboardInterrupt("killed")
        super().put(key, data)


def test_a_mover_killed_between_its_claim_and_the_lease_does_not_block_the_queue(
        tmp_path: Path) -> None:
    """A mover wins the claim on a lost node's lease and dies before it replaces the
    lease: the claim it leaves, once older than the lease time, is taken over the same
    way (exactly one of the movers that find it wins), so the queue is moved; a claim
    younger than the lease time still stops every other mover."""
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast, slow = LocalStore(tmp_path / "fast"), LocalStore(tmp_path / "slow")
    body = publish(fast, LOST, 1, "ckpt/f0", [random_bytes(3000)], 1000)
    lease = 0.5
    assert Leases(fast, LOST, lease).renew(LOST)  # the lost node's own lease
    time.sleep(lease + 0.1)
    dying = Leases(DiesAtLeasePut(tmp_path / "fast"), "mover-x", lease)
    with pytest.raises(KeyboardInterrupt):
        dying.take_over(LOST, dying.store_now())
    other = Leases(fast, "mover-y", lease)
    assert not other.take_over(LOST, other.store_now())  # the claim is fresh: held
    time.sleep(lease + 0.1)
    movers = [Leases(fast, f"mover-{i}", lease) for i in range(3)]
    barrier = threading.Barrier(3)

    def take(m: Leases) -> bool:
        now = m.store_now()
        barrier.wait()
        return m.take_over(LOST, now)

    with ThreadPoolExecutor(3) as pool:
        won = list(pool.map(take, movers))
    assert won.count(True) == 1
    winner = movers[won.index(True)]
    assert fasttier.move_queue(Replayer(fast, slow), winner, LOST)
    winner.release(LOST)
    assert slow.get(file_key("ckpt/f0")) == body
    assert fasttier.queues(fast) == []
    assert [k for k, _ in fast.list(fasttier.LEASES, None).objects] == []  # no claim left
