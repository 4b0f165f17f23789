"""The filesystem core driven directly (no kernel, no FUSE): CheckpointFS over a LocalStore
in a trio nursery, as the mount wires it. Fast, and exact about the state behind a call."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from corefs import CHUNK, ROOT, core, read_file, run, write_file
from support import random_bytes, wait_until_async

from ckptfs.common.errors import JournalFull
from ckptfs.format import codec
from ckptfs.format.manifests import Manifest, chunk_key, file_key, fossil_key
from ckptfs.pipeline import journal as journal_module
from ckptfs.pipeline.uploader import UploadJob
from ckptfs.store.local import LocalStore


# ---------------------------------------------------------------------------- cache bound
def test_a_file_larger_than_the_cache_stays_within_cache_size(tmp_path: Path) -> None:
    """Uploaded chunks of a file still being written leave the cache, so one file many
    times --cache-size never holds more than the limit plus the chunks in flight; the
    file reads back exactly, before and after close, and from the store alone."""
    limit = 4 * CHUNK
    data = random_bytes(40 * CHUNK + 123)
    peak = 0

    async def main() -> None:
        async with core(tmp_path, cache_size=limit) as fs:
            def check() -> None:
                nonlocal peak
                peak = max(peak, fs.cache.used_bytes)

            fh = await write_file(fs, "big.bin", data, close=False, check=check)
            node = fs.handle(fh).node
            assert node.buffer is not None and len(node.buffer.remote) > 20  # freed
            assert await fs.read(fh, 0, len(data)) == data  # evicted chunks come back
            await fs.flush(fh)
            await fs.release(fh)
            assert await read_file(fs, "big.bin") == data
            await fs.wait_all_flushed()
            fs.cache.evict()
            assert fs.cache.used_bytes <= limit

    run(main)
    # the dirty limit, plus the chunk being written, plus one chunk per upload thread
    assert peak <= limit + CHUNK + 2 * CHUNK, peak
    m = Manifest.from_json(LocalStore(tmp_path / "store").get(file_key("big.bin")))
    assert m.size == len(data) and len(m.chunks) == 41

    async def fresh_node() -> None:
        other = tmp_path / "node-b"
        other.mkdir()
        os.symlink(tmp_path / "store", other / "store")
        async with core(other) as fs:
            assert await read_file(fs, "big.bin") == data

    run(fresh_node)


def test_partial_overwrite_of_an_evicted_chunk_while_open(tmp_path: Path) -> None:
    """A chunk freed from the cache while its file is open is fetched back when a write
    covers part of it (copy-on-write), and the result is exact."""
    limit = 4 * CHUNK
    data = bytearray(random_bytes(24 * CHUNK))

    async def main() -> None:
        async with core(tmp_path, cache_size=limit) as fs:
            fh = await write_file(fs, "f.bin", bytes(data), close=False)
            buf = fs.handle(fh).node.buffer
            assert buf is not None and 2 in buf.remote  # chunk 2 was freed
            patch = b"P" * 100
            await fs.write(fh, 2 * CHUNK + 7, patch)
            data[2 * CHUNK + 7:2 * CHUNK + 107] = patch
            assert 2 not in buf.remote
            await fs.flush(fh)
            await fs.release(fh)
            assert await read_file(fs, "f.bin") == bytes(data)

    run(main)


# ---------------------------------------------------------------------------- status
def test_not_durable_while_a_file_is_open_with_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path) as fs:
            fh = await write_file(fs, "a.bin", b"x" * 1000, close=False)
            await trio.sleep(0.1)
            st = fs.statistics()
            assert st.open_files == 1 and st.durable is False, st
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert fs.statistics().durable is True

    run(main)


def test_a_failed_publish_at_release_is_one_line_and_shown_until_saved(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """close() reports the failure; release() can tell nobody, so status and the log say
    it (one line, no traceback) until a later publish succeeds (unmount tries again)."""
    full = JournalFull("the cache disk is full (journal: database or disk is full)")

    async def main() -> None:
        async with core(tmp_path) as fs:
            def disk_full(*args: object) -> list[int]:
                raise full

            monkeypatch.setattr(fs.uploader.journal, "add_chunks", disk_full)
            fh = await write_file(fs, "a.bin", b"y" * 5000, close=False)
            with pytest.raises(JournalFull):
                await fs.flush(fh)  # what close() returns (ENOSPC at the FUSE edge)
            await fs.release(fh)
            st = fs.statistics()
            want = "could not publish a.bin; its data is not saved: the cache disk is full"
            assert want in st.errors and st.problems == [want], st
            assert not st.durable
            records = [r for r in caplog.records if "could not publish a.bin" in r.message]
            assert len(records) == 1 and records[0].exc_info is None
            assert records[0].levelno == logging.ERROR
            monkeypatch.undo()  # the disk has room again
            await fs.publish_leftovers()
            await fs.wait_all_flushed()
            st = fs.statistics()
            assert st.problems == [] and st.durable, st
            assert await read_file(fs, "a.bin") == b"y" * 5000

    run(main)


# ---------------------------------------------------------------------------- data loss
def test_a_chunk_lost_before_upload_is_reported_until_the_file_is_rewritten(
        tmp_path: Path) -> None:
    """Staged bytes damaged while the daemon was down: the next mount cannot upload the
    chunk. It must name the file (through renames) in status and never say durable,
    across remounts, until the file is rewritten or deleted."""
    data = random_bytes(3 * CHUNK)

    async def crash_before_upload() -> None:
        async with core(tmp_path, upload=False) as fs:
            await fs.mkdir(ROOT, "ckpt", 0o755)
            ckpt = await fs.lookup(ROOT, "ckpt")
            fh, _ = await fs.create(ckpt.inode, "model.pt", 0o644, os.O_WRONLY)
            await fs.write(fh, 0, data)
            await fs.flush(fh)
            await fs.release(fh)
            assert fs.uploader.pending_count() == 3

    run(crash_before_upload)
    [staging] = os.listdir(tmp_path / "cache" / "staging")
    with open(tmp_path / "cache" / "staging" / staging, "r+b") as f:
        f.seek(CHUNK + 5)
        f.write(b"\xff")  # chunk 1 damaged on the cache disk

    want = "DATA LOST: {}: chunk "

    async def remount() -> None:
        async with core(tmp_path) as fs:
            await fs.wait_all_flushed()
            st = fs.statistics()
            assert not st.durable and len(st.problems) == 1, st
            assert st.problems[0].startswith(want.format("ckpt/model.pt")), st
            ckpt = await fs.lookup(ROOT, "ckpt")
            await fs.rename(ckpt.inode, "model.pt", ckpt.inode, "final.pt")
            assert fs.statistics().problems[0].startswith(want.format("ckpt/final.pt"))
            await fs.rename(ROOT, "ckpt", ROOT, "step-1")
            assert fs.statistics().problems[0].startswith(want.format("step-1/final.pt"))

    run(remount)

    async def remount_and_rewrite() -> None:
        async with core(tmp_path) as fs:
            st = fs.statistics()
            assert st.problems[0].startswith(want.format("step-1/final.pt")), st
            step = await fs.lookup(ROOT, "step-1")
            node = await fs.lookup(step.inode, "final.pt")
            fh, _ = await fs.open(node.inode, os.O_WRONLY | os.O_TRUNC)
            await fs.write(fh, 0, data)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            st = fs.statistics()
            assert st.problems == [] and st.durable, st

    run(remount_and_rewrite)


def test_a_lost_chunk_of_a_deleted_file_is_forgotten(tmp_path: Path) -> None:
    async def main() -> None:
        async with core(tmp_path, upload=False) as fs:
            await write_file(fs, "a.bin", random_bytes(CHUNK))
        [staging] = os.listdir(tmp_path / "cache" / "staging")
        os.truncate(tmp_path / "cache" / "staging" / staging, 10)
        async with core(tmp_path) as fs:
            assert fs.statistics().problems, "the loss is reported"
            await fs.unlink(ROOT, "a.bin")
            await fs.wait_all_flushed()
            assert fs.statistics().problems == [] and fs.durable()

    run(main)


# ------------------------------------------------- a node down longer than gc's grace
def test_a_node_down_long_puts_gc_ed_chunks_back_before_publishing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file is closed and its chunks uploaded, but its manifest is not yet in the store
    when the node goes down (for longer than CONFIRM_WINDOW). The version's staging file
    stays meanwhile, even when eviction wants the space, because its op is unapplied.
    While the node is down, gc deletes one chunk and sets another aside in fossils/. The
    next mount keeps the staging file at its scan and, the op being old, puts both chunks
    back (uploaded from staging; copied from fossils/) before the manifest; a fresh node
    reads the file whole."""
    data = random_bytes(3 * CHUNK + 100, 31)
    hashes = [codec.chunk_hash(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    monkeypatch.setattr(journal_module, "time", SimpleNamespace(  # journaled an hour ago
        time=lambda: time.time() - 3600))

    async def down_before_publish() -> None:
        async with core(tmp_path, publish=False) as fs:
            await write_file(fs, "model.pt", data)
            await wait_until_async(lambda: fs.uploader.pending_count() == 0)
            [st] = fs.cache.staging.values()
            fs.cache.limit_bytes = CHUNK  # all clean, and over the limit
            fs.cache.evict()
            assert fs.cache.staging == {st.id: st} and os.path.exists(st.path)

    run(down_before_publish)
    monkeypatch.undo()
    store = LocalStore(tmp_path / "store")
    assert store.head(file_key("model.pt")) is None
    fossil = store.get(chunk_key(hashes[2]))
    store.put(fossil_key(hashes[2]), fossil)  # gc, while the node is down
    for h in hashes[1:3]:
        store.delete(chunk_key(h))

    async def remount() -> None:
        async with core(tmp_path) as fs:
            assert len(fs.cache.staging) == 1  # kept by the scan
            await fs.wait_all_flushed()
            assert fs.statistics().problems == [] and fs.durable()
            assert fs.cache.staging == {}  # released once the op was applied

    run(remount)
    assert all(store.head(chunk_key(h)) for h in hashes)
    assert store.get(chunk_key(hashes[2])) == fossil and store.head(fossil_key(hashes[2]))
    assert Manifest.from_json(store.get(file_key("model.pt"))).chunks == tuple(
        (h, len(data[i * CHUNK:(i + 1) * CHUNK])) for i, h in enumerate(hashes))

    async def fresh_node() -> None:
        other = tmp_path / "node-b"
        other.mkdir()
        os.symlink(tmp_path / "store", other / "store")
        async with core(other) as fs:
            assert await read_file(fs, "model.pt") == data

    run(fresh_node)


# ---------------------------------------------------------------------------- upload queue
def test_chunks_whose_early_upload_found_the_queue_full_are_uploaded_after_close(
        tmp_path: Path) -> None:
    """The upload queue holds one job here: the early uploads of all chunks but the first
    are dropped while the file is written, yet the close journals every chunk, each is
    uploaded, and another node reads the file whole."""
    data = random_bytes(6 * CHUNK + 1000)

    async def main() -> None:
        async with core(tmp_path, upload=False, queue_limit=1) as fs:
            await write_file(fs, "model.pt", data)
            assert fs.uploader.dropped_early >= 5
            assert fs.uploader.pending_count() == 7  # every chunk journaled at close
            async with trio.open_nursery() as nursery:
                await nursery.start(fs.uploader.run)
                await fs.wait_all_flushed()
                nursery.cancel_scope.cancel()
            assert fs.durable() and fs.cache.dirty_bytes == 0

    run(main)
    other = tmp_path / "node-b"
    other.mkdir()
    os.symlink(tmp_path / "store", other / "store")

    async def fresh_node() -> None:
        async with core(other) as fs:
            assert await read_file(fs, "model.pt") == data

    run(fresh_node)


def test_an_early_upload_reuses_the_hash_streamed_as_its_chunk_was_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte of a save is hashed once: a chunk uploaded while its file is still
    being written is named by the hash streamed as it was written, not hashed again
    when the upload reads it back; the store gets the right bytes under that name."""
    data = random_bytes(20 * CHUNK)
    hashed: list[int] = []
    real = codec.chunk_hash

    def counting(d: codec.Buffer) -> str:
        hashed.append(len(d))
        return real(d)

    monkeypatch.setattr(codec, "chunk_hash", counting)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fh = await write_file(fs, "f.bin", data, close=False)
            await wait_until_async(
                lambda: fs.uploader.statistics().uploaded_bytes >= 19 * CHUNK)
            assert hashed.count(CHUNK) == 0
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()

    run(main)
    m = Manifest.from_json(LocalStore(tmp_path / "store").get(file_key("f.bin")))
    store = LocalStore(tmp_path / "store")
    assert b"".join(bytes(codec.decode_chunk(store.get(chunk_key(h)), h))
                    for h, _ in m.chunks) == data


def test_a_chunk_rewritten_before_its_early_upload_is_hashed_again(tmp_path: Path) -> None:
    """The streamed hash names an early upload only while the chunk is unchanged: after
    an in-place overwrite the job offers none (the upload hashes what it reads), and
    the other chunks keep theirs, which match their bytes."""
    data = bytearray(random_bytes(10 * CHUNK))
    jobs: list[UploadJob] = []

    async def main() -> None:
        async with core(tmp_path, upload=False) as fs:
            fs.uploader.submit_early_nowait = jobs.append  # type: ignore[method-assign,assignment]
            fh = await write_file(fs, "f.bin", bytes(data), close=False)
            assert [j.offset for j in jobs] == [i * CHUNK for i in range(len(jobs))]
            assert len(jobs) >= 9
            await fs.write(fh, 3 * CHUNK + 100, b"rewritten")
            data[3 * CHUNK + 100:3 * CHUNK + 109] = b"rewritten"
            for j in jobs:
                assert j.streamed is not None
                if j.offset == 3 * CHUNK:
                    assert j.streamed() is None
                else:
                    assert j.streamed() == codec.chunk_hash(data[j.offset:j.offset + j.length])
            await fs.release(fh)

    run(main)
