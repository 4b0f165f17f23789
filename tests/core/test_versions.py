"""Versions: a publish that replaces a file keeps the replaced manifest in the trash (a
keep_version op journaled before the put_file, applied first), with one PUT and nothing
for a new file; a replay PUTs the journaled bytes again. Through a mount:
tests/fuse/test_trash_mounted.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import trio
from corefs import core, overwrite, read_file, run, write_file
from crafting import read_back
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.format.manifests import TRASH
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import Publisher, RetryingStore
from ckptfs.store.base import Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore
from ckptfs.tools import trash

HOUR = 3600.0


class TrashHeld(FaultyStore):
    """Counts calls; a PUT under trash/ waits for `go` (set: none waits)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.go = threading.Event()
        self.go.set()
        self.trash_puts = 0

    def put(self, key: str, data: bytes | memoryview) -> None:
        if key.startswith(TRASH):
            self.trash_puts += 1
            self.go.wait(30)
        super().put(key, data)


def trashing(fs: CheckpointFS) -> TrashHeld:
    """Give the publisher of `fs` a trash of an hour, on a store that counts its calls."""
    store = TrashHeld(fs.publisher.store.store)  # type: ignore[attr-defined]
    fs.publisher.store = RetryingStore(store)  # type: ignore[assignment]
    fs.publisher.trash_keep = HOUR
    return store


def test_an_overwrite_keeps_the_previous_version_in_the_trash(tmp_path: Path) -> None:
    """torch.save over latest.pt twice: the trash holds the first two versions, numbered
    newest first, each at the cost of one PUT (a new file costs nothing more); restore
    --version brings back the chosen one byte for byte."""
    versions = [random_bytes(200_000 + i, seed=i) for i in range(3)]

    async def body() -> None:
        async with core(tmp_path) as fs:
            store = trashing(fs)
            await write_file(fs, "latest.pt", versions[0])
            await fs.publisher.wait_empty()
            assert store.trash_puts == 0 and store.counts["copy"] == 0
            before = dict(store.counts)
            for data in versions[1:]:
                await overwrite(fs, "latest.pt", data)
            await fs.publisher.wait_empty()
            assert store.trash_puts == 2
            assert {op: store.counts[op] - before.get(op, 0) for op in
                    ("head", "stat", "copy", "get", "put_if_absent")} == dict.fromkeys(
                        ("head", "stat", "copy", "get", "put_if_absent"), 0), store.counts
            assert await read_file(fs, "latest.pt") == versions[2]
            await fs.wait_all_flushed()  # every version's chunks in the store

    run(body)
    store = LocalStore(tmp_path / "store")
    found = trash.entries(store, "latest.pt")
    assert [(e.path, e.version) for e in found] == [("latest.pt", 2), ("latest.pt", 1)]
    for e in found:  # by time, as trash ls shows it: the newest set aside by then
        shown = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(e.deleted))
        assert trash.pick_version(found, "latest.pt", shown).version <= e.version
    assert trash.pick_version(found, "latest.pt", time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(found[-1].deleted + 1))).version == 1
    # (the oldest first: a restored version leaves the trash, the others move up)
    for version, want in (("2", versions[0]), ("1", versions[1])):
        r = trash.restore(store, "latest.pt", f"v{version}.pt", version=version)
        assert [e.version for e in r.restored] == [int(version)] and not r.skipped
        assert read_back(store, f"v{version}.pt") == want
    assert read_back(store, "latest.pt") == versions[2]


def test_the_old_version_is_in_the_trash_before_the_new_one_replaces_it(
        tmp_path: Path) -> None:
    """While the trash PUT of the replaced manifest is held, the close waits and the
    store still holds the old version: no moment where neither key names its chunks (a
    gc then, with the node down, could free them: the soak's seed 17324)."""

    async def body() -> None:
        async with core(tmp_path) as fs:
            store = trashing(fs)
            await write_file(fs, "f", b"one")
            await fs.wait_all_flushed()
            store.go.clear()
            closed = trio.Event()

            async def save() -> None:
                await overwrite(fs, "f", b"two")
                closed.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(save)
                while not store.trash_puts:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)
                assert not closed.is_set()
                assert read_back(store.inner, "f") == b"one"
                store.go.set()
            await fs.publisher.wait_empty()
        [e] = trash.entries(store.inner)
        assert read_back(store.inner, "f") == b"two"
        assert [r.key for r in trash.restore(store.inner, "f", "g").restored] == [e.key]
        assert read_back(store.inner, "g") == b"one"

    run(body)


def test_a_replay_keeps_the_journaled_version_not_the_store_s(tmp_path: Path) -> None:
    """A crash after both PUTs, before the journal let go of the ops: the replay PUTs
    the journaled old manifest (the store holds the new one by then), under the same
    key as the first attempt did."""
    (tmp_path / "store").mkdir()
    store = LocalStore(tmp_path / "store")
    journal = Journal(str(tmp_path / "journal.sqlite"))
    publisher = Publisher(store, journal, None, "node-a",  # type: ignore[arg-type]
                          trash_keep=HOUR)
    old = manifests.Manifest(size=0, mode=0o100644, mtime_ns=1).to_json()
    new = manifests.Manifest(size=0, mode=0o100644, mtime_ns=2).to_json()
    store.put(manifests.file_key("f"), old)
    ops = [Op(7, "keep_version", "f", body=old, journaled_at=time.time()),
           Op(8, "put_file", "f", body=new, journaled_at=time.time())]
    for op in ops:  # then the crash
        publisher._apply_sync([op])
    for op in ops:  # the replay
        publisher._apply_sync([op])
    [key] = [k for k, _ in store.list(TRASH, None).objects]
    assert key.endswith("-1h-7-node-a/f")
    assert store.get(key) == old and store.get(manifests.file_key("f")) == new
    publisher.trash_keep = 0  # the trash off: nothing is kept
    publisher._apply_sync([Op(9, "keep_version", "f", body=old, journaled_at=time.time())])
    assert len(store.list(TRASH, None).objects) == 1
    journal.close()
