"""gc's races with the filesystem core as the writer (docs/FORMAT.md, "Garbage
collection"), gc run between the writer's steps so that the interleaving is exact: a
writer finds chunks already in the store (its HEAD: dedup) just before gc's mark decides
they are unreferenced, and publishes the manifest naming them after gc listed the
manifests (race a); a journaled manifest published after a restart on a node whose wall
clock was stepped (rule W3); a file kept open for longer than the confirmation window
and gc's grace, whose chunks uploaded early were freed from the cache (rule W2)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
from corefs import CHUNK, ROOT, core, read_file, run, write_file
from support import random_bytes, wait_until_async

from ckptfs.common.errors import MissingChunkError
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import chunk_key, file_key, fossil_key
from ckptfs.fs.namespace import FileNode
from ckptfs.fs.writebuffer import WriteBuffer
from ckptfs.pipeline import publisher
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc


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
        m.setattr("ckptfs.pipeline.fetcher.manifests.fossil_key", chunk_key)
        run(blind_reader)
    run(lambda: reader("reader", 4))

    # the next gc run (at least the grace later) sees the manifest: restores the chunks
    report = gc.collect(store, 0.0)
    assert report.restored.count == 4 and report.freed.count == 0
    assert report.fossilized.count == 0
    assert all(store.head(chunk_key(h)) is not None for h in hashes)
    assert all(store.head(fossil_key(h)) is None for h in hashes)
    run(lambda: reader("late-reader", 0))


def hashes_of(data: bytes) -> list[str]:
    return [codec.chunk_hash(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]


def freed_by_gc(store: LocalStore, runs: int) -> None:
    """`runs` gc runs with no grace: the first sets every unreferenced chunk aside, the
    second frees them (the grace is shortened to nothing: the writer's window too)."""
    for _ in range(runs):
        gc.collect(store, 0.0)


# --------------------------------------------- W3: a replay, whatever the wall clock says
@pytest.mark.parametrize("step", [-(publisher.CONFIRM_WINDOW + 3600), 10 * 86400],
                         ids=["stepped-back", "stepped-forward"])
def test_a_replayed_manifest_is_confirmed_whatever_the_wall_clock_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    """A file is closed and its chunks uploaded; the node stops before the manifest is
    PUT. gc frees the chunks meanwhile (nothing named them). The node restarts with its
    wall clock stepped back by more than the window (or forward): the journaled op is
    from an earlier process, so its chunks are HEADed whatever its time says, uploaded
    again from the staging file, and only then is the manifest PUT. A fresh node reads
    the file whole."""
    data = random_bytes(4 * CHUNK + 10, 41)
    hashes = hashes_of(data)
    store = LocalStore(tmp_path / "store")

    async def stopped_before_publish() -> None:
        async with core(tmp_path, publish=False) as fs:
            await write_file(fs, "model.pt", data)
            await wait_until_async(lambda: fs.uploader.pending_count() == 0)

    run(stopped_before_publish)
    freed_by_gc(store, 2)
    assert all(store.head(chunk_key(h)) is None for h in hashes)
    assert all(store.head(fossil_key(h)) is None for h in hashes)

    real_time = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real_time() + step)

        async def restarted() -> None:
            async with core(tmp_path) as fs:
                await fs.wait_all_flushed()
                assert fs.statistics().problems == [] and fs.durable()

        run(restarted)
    assert store.head(file_key("model.pt")) is not None
    assert all(store.head(chunk_key(h)) is not None for h in hashes)

    async def fresh_node() -> None:
        async with core(node(tmp_path, "fresh")) as fs:
            assert await read_file(fs, "model.pt") == data

    run(fresh_node)


# ----------------------------------------- W2: chunks uploaded early and freed, at close
CACHE = 4 * CHUNK  # the cache holds 4 chunks: a 12-chunk file has its first ones freed


def open_buffer(fs: object, fh: int) -> WriteBuffer:
    node = fs.handle(fh).node  # type: ignore[attr-defined]
    assert isinstance(node, FileNode) and node.buffer is not None
    return node.buffer


@pytest.mark.parametrize("gc_runs", [0, 1, 2], ids=["present", "fossil", "freed"])
def test_chunks_freed_from_the_cache_of_a_long_open_file_are_confirmed_at_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gc_runs: int) -> None:
    """A file larger than the cache is written and kept open; its first chunks are
    uploaded early and freed from the cache (remote chunks of the open version). It
    stays open longer than the confirmation window (shortened to 0.3 s) and gc runs
    meanwhile (grace shortened to 0): not at all, once (the chunks are set aside), or
    twice (they are freed). At close, exactly the freed chunks are HEADed before the
    manifest's PUT: found (present), copied back from fossils/, or, gone for good, the
    file is recorded as lost (status, the log, umount) and published all the same."""
    data = random_bytes(12 * CHUNK, 42)
    store = LocalStore(tmp_path / "store")
    heads: list[str] = []
    real_head = LocalStore.head

    def head(self: LocalStore, key: str) -> int | None:
        heads.append(key)
        return real_head(self, key)

    async def main() -> None:
        async with core(tmp_path, cache_size=CACHE) as fs:
            fh = await write_file(fs, "big.bin", data, close=False)
            buf = open_buffer(fs, fh)
            await wait_until_async(lambda: len(buf.remote) >= 4)
            freed = {h for h, _ in buf.remote.values()}  # (a new file: none kept)
            fs.uploader.confirm_window = 0.3
            await trio.sleep(0.4)  # the file stays open: its sightings grow old
            freed_by_gc(store, gc_runs)
            monkeypatch.setattr(LocalStore, "head", head)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert freed <= {manifests.chunk_name(k) for k in heads}
            m = manifests.Manifest.from_json(store.get(file_key("big.bin")))
            assert [h for h, _ in m.chunks] == hashes_of(data)
            if gc_runs < 2:
                assert all(store.head(chunk_key(h)) is not None for h in hashes_of(data))
                assert fs.statistics().problems == [] and fs.durable()
            else:
                lost = fs.uploader.lost_files()
                assert {f.path for f in lost} == {"big.bin"}
                assert {f.hash for f in lost} == freed - {
                    h for h in freed if store.head(chunk_key(h)) is not None}
                assert all(f.reason == publisher.STALE_LOST_REASON for f in lost)
                assert any(p.startswith("DATA LOST: big.bin: chunk ")
                           for p in fs.statistics().problems)

    run(main)
    if gc_runs < 2:
        async def fresh_node() -> None:
            async with core(node(tmp_path, "fresh")) as fs:
                assert await read_file(fs, "big.bin") == data

        run(fresh_node)


def test_a_file_open_a_short_time_costs_no_request_at_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The normal case: chunks uploaded early and freed from the cache were seen well
    within the window, so the close sends no request for them (none is HEADed again)."""
    data = random_bytes(12 * CHUNK, 43)
    heads: list[str] = []
    real_head = LocalStore.head

    def head(self: LocalStore, key: str) -> int | None:
        heads.append(key)
        return real_head(self, key)

    async def main() -> None:
        async with core(tmp_path, cache_size=CACHE) as fs:
            fh = await write_file(fs, "big.bin", data, close=False)
            buf = open_buffer(fs, fh)
            await wait_until_async(lambda: len(buf.remote) >= 4)
            freed = {h for h, _ in buf.remote.values()}  # (a new file: none kept)
            monkeypatch.setattr(LocalStore, "head", head)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert not freed & {manifests.chunk_name(k) for k in heads}
            assert fs.durable()

    run(main)
