"""Bugs the seeded soak found (docs/SOAK.md, "Bugs found"), each made exact."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
from corefs import CHUNK, ROOT, core, overwrite, read_file, run, write_file
from crafting import read_back
from support import random_bytes

from ckptfs.common.errors import CkptfsError
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, trash


def test_an_early_upload_finishing_after_a_truncate_dropped_its_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written in order has its full chunks uploaded early; the HEADs of those
    uploads are held. The file is truncated to 10 bytes, which drops chunks 1 and 2;
    then the uploads finish. Their callbacks must see that the chunks are gone (before
    the fix: IndexError in the upload worker, which ended the mount's tasks)."""
    data = random_bytes(3 * CHUNK + 5, 1045)
    gate = threading.Event()
    held = threading.Semaphore(0)
    real_head = LocalStore.head

    def head(self: LocalStore, key: str) -> int | None:
        if key.startswith("chunks/") and not gate.is_set():
            held.release()
            gate.wait(10)
        return real_head(self, key)

    monkeypatch.setattr(LocalStore, "head", head)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fh = await write_file(fs, "a.bin", data, close=False)
            await trio.to_thread.run_sync(held.acquire)  # an early upload is held
            await fs.setattr(fs.handle(fh).node.inode, size=10)
            gate.set()
            await trio.sleep(0.2)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert await read_file(fs, "a.bin") == data[:10]

    run(main)


def test_a_copy_in_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """Found by the soak (seed 1052, while the store was out). On a node whose cache
    holds only the file's last chunk, a write that overwrites part of the stored chunk
    before it and goes past the end must copy that chunk in first. When the fetch
    fails, the write fails (EIO) and the file is as it was: before the fix it had
    already grown, and was published longer than anything ever written to it."""
    data = random_bytes(2 * CHUNK + 100, 1052)
    store = tmp_path / "a" / "store"

    async def main() -> None:
        async with core(tmp_path / "a") as fs:
            await write_file(fs, "f.bin", data)
            await fs.wait_all_flushed()
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "store").symlink_to(store)
        async with core(tmp_path / "b", prefetch_window=0) as fs:  # another node
            node = await fs.lookup(ROOT, "f.bin")
            fh, _ = await fs.open(node.inode, os.O_RDWR)
            assert await fs.read(fh, 2 * CHUNK, 100) == data[2 * CHUNK:]  # now cached
            (store / "chunks").rename(store / "chunks.out")  # the store is out
            with pytest.raises(CkptfsError):
                await fs.write(fh, CHUNK + 10, b"x" * (CHUNK + 200))
            (store / "chunks.out").rename(store / "chunks")  # back
            assert await fs.read(fh, 0, len(data) + 300) == data
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert await read_file(fs, "f.bin") == data

    run(main)


def test_a_file_unlinked_while_open_keeps_its_bytes_after_an_fsync(tmp_path: Path) -> None:
    """Found by the soak (seed 14770, on its node with the small cache). A file open for
    writing is unlinked, then fsynced: its version is sealed, but never journaled, so
    none of its chunks will be uploaded. The staging file holding them was then clean
    and evictable, and other writes evicted it: the file's own descriptor read and
    copied in chunks that were nowhere (MissingChunkError). They stay until the last
    descriptor closes."""
    data = random_bytes(3 * CHUNK + 7, 14770)

    async def main() -> None:
        async with core(tmp_path, cache_size=4 * CHUNK, prefetch_window=0) as fs:
            fh, _ = await fs.create(ROOT, "f.bin", 0o644, os.O_RDWR)
            await fs.write(fh, 0, data)
            await fs.unlink(ROOT, "f.bin")
            await fs.fsync(fh)
            for i in range(3):  # other files fill the small cache
                await write_file(fs, f"other{i}.bin", random_bytes(3 * CHUNK, i))
                await fs.wait_all_flushed()
            assert await fs.read(fh, 0, len(data) + 1) == data
            await fs.write(fh, CHUNK + 5, b"y" * 10)  # copies chunk 1 in
            assert await fs.read(fh, CHUNK, 20) == data[CHUNK:CHUNK + 5] + b"y" * 10 + \
                data[CHUNK + 15:CHUNK + 20]
            await fs.release(fh)
            assert fs.cache.used_bytes <= 4 * CHUNK + CHUNK  # let go once closed

    run(main)


def test_an_overwrite_cut_by_a_crash_keeps_the_old_version_restorable(tmp_path: Path) -> None:
    """Found by the soak (seed 17324). A file is saved, then saved over (its old version
    goes to the trash); the node dies after the first of the overwrite's two metadata
    PUTs, and gc runs with no grace while it is down. Before the fix the first PUT was
    the new manifest: the old version was then named by no key, gc freed its chunks,
    and the replay put into the trash a version that could never be restored. The old
    version now reaches the trash first, so gc keeps its chunks."""
    old, new = random_bytes(2 * CHUNK + 1, 17324), random_bytes(CHUNK + 3, 17325)
    root = tmp_path / "node"
    store = LocalStore(root / "store")

    async def save_both() -> None:  # the ops are journaled, none is applied
        async with core(root, publish=False, trash_keep=3600.0) as fs:
            await write_file(fs, "f", old)
            await overwrite(fs, "f", new)
            while fs.uploader.pending_count():
                await fs.uploader.wait_changed()

    async def replay() -> None:
        async with core(root, trash_keep=3600.0) as fs:
            await fs.publisher.wait_empty()
            assert await read_file(fs, "f") == new

    run(save_both)
    journal = Journal(str(root / "journal.sqlite"))
    publisher = Publisher(store, journal, None, "node-a",  # type: ignore[arg-type]
                          trash_keep=3600.0)
    ops = journal.pending_ops()
    assert [op.kind for op in ops].count("put_file") == 2 and len(ops) == 3
    publisher._apply_sync(ops[:1])  # the first save is in the store
    journal.remove_ops([ops[0].seq])
    publisher._apply_sync(ops[1:2])  # the overwrite's first PUT, and then the node dies
    journal.close()
    for _ in range(3):  # while it is down: set aside, then freed, what no key names
        gc.collect(store, 0.0)
    run(replay)
    [entry] = trash.entries(store, "f")
    assert [e.key for e in trash.restore(store, "f", "g").restored] == [entry.key]
    assert read_back(store, "g") == old and read_back(store, "f") == new
