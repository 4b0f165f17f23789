"""gc's hard race, with the filesystem core as the writer (docs/FORMAT.md, "Garbage
collection", race a): a writer finds chunks already in the store (its HEAD: dedup) just
before gc's mark decides they are unreferenced, and publishes the manifest naming them
after gc listed the manifests. gc runs between the two, so the interleaving is exact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from corefs import CHUNK, ROOT, core, read_file, run, write_file
from support import random_bytes, wait_until_async

from ckptfs import codec, gc
from ckptfs.errors import MissingChunkError
from ckptfs.manifests import chunk_key, fossil_key
from ckptfs.store.local import LocalStore


def node(tmp_path: Path, name: str) -> Path:
    """The root of another node of the store at tmp_path/store (its own cache)."""
    root = tmp_path / name
    root.mkdir()
    os.symlink(tmp_path / "store", root / "store")
    return root


def test_a_chunk_deduplicated_just_before_the_mark_is_set_aside_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = random_bytes(4 * CHUNK)
    hashes = [codec.chunk_hash(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    store = LocalStore(tmp_path / "store")

    async def first_writer() -> None:  # stores the chunks, then its file is deleted
        async with core(tmp_path) as fs:
            await write_file(fs, "old.bin", data)
            await fs.wait_all_flushed()
            await fs.unlink(ROOT, "old.bin")
            await fs.wait_all_flushed()

    run(first_writer)
    assert all(store.head(chunk_key(h)) is not None for h in hashes)

    async def writer() -> None:
        async with core(node(tmp_path, "writer")) as fs:
            fh = await write_file(fs, "new.bin", data, close=False)
            # the early uploads HEAD each chunk, find it, and put nothing: dedup
            await wait_until_async(lambda: all(fs.uploader.confirmed(h) for h in hashes))
            assert fs.uploader.statistics().uploaded_bytes == 0
            # gc runs now: no manifest names the chunks, they are old enough (grace 0)
            report = await trio.to_thread.run_sync(gc.collect, store, 0.0)
            assert report.fossilized.count == 4 and report.freed.count == 0
            # the close publishes a manifest naming them; the writer still trusts its
            # HEADs (within the confirmation window), so nothing is uploaded again
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert fs.uploader.statistics().uploaded_bytes == 0

    run(writer)
    # the manifest names chunks that are in chunks/ no more: only the fossils hold them
    assert all(store.head(chunk_key(h)) is None for h in hashes)
    assert all(store.head(fossil_key(h)) is not None for h in hashes)

    async def reader(name: str, fossil_reads: int) -> None:
        async with core(node(tmp_path, name)) as fs:
            assert await read_file(fs, "new.bin") == data
            # a prefetch makes its chunk readable before it counts it: let them finish
            await wait_until_async(lambda: fs.fetcher.statistics().inflight == 0)
            assert fs.fetcher.fossil_chunks == fossil_reads

    async def blind_reader() -> None:
        async with core(node(tmp_path, "blind-reader")) as fs:
            with pytest.raises(MissingChunkError):
                await read_file(fs, "new.bin")

    # a reader that looked in chunks/ only would fail (EIO) after its timeout
    with monkeypatch.context() as m:
        m.setattr("ckptfs.fetcher.manifests.fossil_key", chunk_key)
        run(blind_reader)
    run(lambda: reader("reader", 4))

    # the next gc run (at least the grace later) sees the manifest: restores the chunks
    report = gc.collect(store, 0.0)
    assert report.restored.count == 4 and report.freed.count == 0
    assert report.fossilized.count == 0
    assert all(store.head(chunk_key(h)) is not None for h in hashes)
    assert all(store.head(fossil_key(h)) is None for h in hashes)
    run(lambda: reader("late-reader", 0))
