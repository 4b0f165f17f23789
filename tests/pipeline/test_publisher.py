"""Publisher: journaled metadata ops applied to the store in order (batched deletes,
directory renames and their replay, retries; the chunks of a manifest published long
after it was journaled re-confirmed first) against a LocalStore behind a FaultyStore."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from pipeline_helpers import RecordingStore, put_chunk, run, staged, stored_chunk
from support import random_bytes, wait_until_async

from ckptfs.format import codec
from ckptfs.format.manifests import DirMarker, Manifest, chunk_key, dir_key, file_key, fossil_key
from ckptfs.pipeline import journal as journal_module
from ckptfs.pipeline import publisher as publisher_module
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import LOST_REASON, Publisher
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore

KiB = 1024


def enqueue(pub: Publisher, journal: Journal, kind: str, path: str, path2: str | None = None,
            body: bytes | None = None) -> int:
    seq = journal.add_op(kind, path, path2, body)
    pub.enqueue(Op(seq, kind, path, path2, body))
    return seq


async def with_publisher(store: FaultyStore, journal: Journal,
                         body: Callable[[Publisher], Awaitable[None]],
                         setup: Callable[[Publisher], None] | None = None) -> None:
    pub = Publisher(store, journal, trio.CapacityLimiter(1))
    if setup is not None:
        setup(pub)
    async with trio.open_nursery() as n:
        await n.start(pub.run)
        await body(pub)
        n.cancel_scope.cancel()


def keys(store: FaultyStore, prefix: str = "files/") -> dict[str, bytes]:
    return {k: store.inner.get(k) for k, _ in store.inner.list(prefix, delimiter=None).objects}


def test_publisher_applies_ops_in_order(store: RecordingStore, journal: Journal) -> None:
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "put_dir", "d", body=b'{"mode": 448}'))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v1"))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v2"))
        seqs.append(enqueue(pub, journal, "rename_file", "d/a", "d/b"))
        seqs.append(enqueue(pub, journal, "put_file", "d/a", body=b"v3"))
        seqs.append(enqueue(pub, journal, "put_file", "gone", body=b"x"))
        seqs.append(enqueue(pub, journal, "delete_file", "gone"))
        assert pub.is_pending("d/a") and pub.is_pending("d/a/deeper") and pub.is_pending("d")
        assert not pub.is_pending("other") and not pub.is_pending("")
        assert pub.pending_count == 7

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == {"files/d/": b'{"mode": 448}', "files/d/a": b"v3",
                               "files/d/b": b"v2"}
        assert store.log == [
            ("put", "files/d/"), ("put", "files/d/a"), ("put", "files/d/a"),
            ("copy", "files/d/b"), ("delete", "files/d/a"), ("put", "files/d/a"),
            ("put", "files/gone"), ("delete", "files/gone")]
        assert journal.counts() == (0, 0)
        assert pub.pending_count == 0 and not pub.is_pending("d/a")
        assert pub.applied_seq == seqs[-1]
        assert pub.statistics() == {"pending_ops": 0, "applied_ops": 7, "last_error": None}
        # ops added while running are applied too
        seq = journal.add_op("put_file", "late", None, b"l")
        await pub.add(Op(seq, "put_file", "late", None, b"l"))
        assert await pub.wait_applied(seq, timeout=5.0)
        assert store.inner.get("files/late") == b"l"
        await pub.wait_empty()

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_batches_deletes(store: RecordingStore, journal: Journal) -> None:
    for name in ("a", "b", "c", "x"):
        store.inner.put(file_key(name), b"m")
    store.inner.put(dir_key("d1"), b"")
    store.inner.put(dir_key("d2"), b"")
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        for name in ("a", "b", "c"):
            seqs.append(enqueue(pub, journal, "delete_file", name))
        seqs.append(enqueue(pub, journal, "delete_dir", "d1"))
        seqs.append(enqueue(pub, journal, "put_file", "y", body=b"m"))
        seqs.append(enqueue(pub, journal, "delete_file", "x"))
        seqs.append(enqueue(pub, journal, "delete_dir", "d2"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert store.batches == [["files/a", "files/b", "files/c", "files/d1/"],
                                 ["files/x", "files/d2/"]]
        assert keys(store) == {"files/y": b"m"}
        assert journal.counts() == (0, 0)

    run(lambda: with_publisher(store, journal, body, setup))


def make_tree(store: FaultyStore) -> dict[str, bytes]:
    """A directory 'src' with a marker, files, a subdirectory; and a sibling 'srcx'."""
    tree = {
        "files/src/": DirMarker(mode=0o40700, mtime_ns=7).to_json(),
        "files/src/a": b"manifest a",
        "files/src/sub/": DirMarker(mode=0o40750, mtime_ns=8).to_json(),
        "files/src/sub/b": b"manifest b",
        "files/src/sub/deep/c": b"manifest c",  # an implicit directory: no marker
        "files/srcx/z": b"not moved",
        "files/other": b"not moved either",
    }
    for k, v in tree.items():
        store.inner.put(k, v)
    return tree


def renamed(tree: dict[str, bytes]) -> dict[str, bytes]:
    return {k.replace("files/src/", "files/dst/"): v for k, v in tree.items()}


def test_publisher_rename_dir(store: RecordingStore, journal: Journal) -> None:
    tree = make_tree(store)
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)
        assert journal.counts() == (0, 0)
        # replaying the op after it was fully applied (crash before the journal row was
        # removed) changes nothing, and keeps the directory marker's mode and mtime
        store.log.clear()
        await pub.add(Op(seqs[0] + 1, "rename_dir", "src", "dst"))
        assert await pub.wait_applied(seqs[0] + 1, timeout=5.0)
        assert keys(store) == renamed(tree)
        assert DirMarker.from_json(store.inner.get("files/dst/")).mode == 0o40700

    run(lambda: with_publisher(store, journal, body, setup))


@pytest.mark.parametrize("copied", ["all", "half"])
def test_publisher_rename_dir_replay_after_partial_copy(store: RecordingStore,
                                                        journal: Journal, copied: str) -> None:
    tree = make_tree(store)
    src_keys = sorted(k for k in tree if k.startswith("files/src/"))
    # a crash after the copy half (or part of it) was applied, before the deletes
    for k in src_keys if copied == "all" else src_keys[::2]:
        store.inner.copy(k, k.replace("files/src/", "files/dst/"))
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_rename_dir_replay_after_partial_delete(store: RecordingStore,
                                                          journal: Journal) -> None:
    tree = make_tree(store)
    src_keys = sorted(k for k in tree if k.startswith("files/src/"))
    for k in src_keys:
        store.inner.copy(k, k.replace("files/src/", "files/dst/"))
    for k in src_keys[:2]:  # the crash came in the middle of the deletes
        store.inner.delete(k)
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_dir", "src", "dst"))

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == renamed(tree)

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_rename_file_replay(store: RecordingStore, journal: Journal) -> None:
    store.inner.put(file_key("a"), b"m")
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "rename_file", "a", "b"))
        seqs.append(enqueue(pub, journal, "rename_file", "a", "b"))  # the replay

    async def body(pub: Publisher) -> None:
        assert await pub.wait_applied(seqs[-1], timeout=5.0)
        assert keys(store) == {"files/b": b"m"}

    run(lambda: with_publisher(store, journal, body, setup))


def test_publisher_retries_failures(store: RecordingStore, journal: Journal) -> None:
    store.fail("put", times=8)  # more than RetryingStore's 6 attempts: the op itself fails
    seqs: list[int] = []
    seen_unhealthy: list[str | None] = []

    def setup(pub: Publisher) -> None:
        seqs.append(enqueue(pub, journal, "put_file", "a", body=b"1"))
        seqs.append(enqueue(pub, journal, "put_file", "b", body=b"2"))

    async def body(pub: Publisher) -> None:
        await wait_until_async(lambda: not pub.healthy)
        seen_unhealthy.append(pub.last_error)
        assert not await pub.wait_applied(seqs[0], timeout=5.0)  # unhealthy: returns at once
        assert journal.counts() == (0, 2)
        await wait_until_async(lambda: pub.applied_seq >= seqs[-1], timeout=5.0)
        assert pub.healthy and pub.last_error is None
        assert keys(store) == {"files/a": b"1", "files/b": b"2"}
        assert store.counts["put"] == 10 and journal.counts() == (0, 0)

    run(lambda: with_publisher(store, journal, body, setup))
    assert seen_unhealthy and "TransientStoreError" in (seen_unhealthy[0] or "")


def test_publisher_tells_of_each_op_once_it_is_in_the_store(
        store: RecordingStore, journal: Journal) -> None:
    """on_applied (the auto-prune's trigger) hears of every op applied, after its store
    calls, never of one dropped as undoable; pending_under covers the whole subtree."""
    seen: list[tuple[str, str, bool]] = []

    def applied(op: Op) -> None:
        key = file_key(op.path) if op.kind == "put_file" else dir_key(op.path2 or op.path)
        there = store.inner.head(key) is not None
        seen.append((op.kind, op.path2 or op.path, there))

    def setup(pub: Publisher) -> None:
        pub.on_applied = applied
        enqueue(pub, journal, "put_dir", "run/ck-1", body=b'{"mode": 448}')
        enqueue(pub, journal, "put_file", "run/ck-1/a", body=b"1")
        enqueue(pub, journal, "put_file", "run/../bad", body=b"x")  # unsafe: dropped
        enqueue(pub, journal, "rename_dir", "run/ck-1", "run/ck-2")
        enqueue(pub, journal, "delete_file", "run/ck-2/a")
        assert pub.pending_under("run") and pub.pending_under("run/ck-1")
        assert pub.pending_under("run/ck-1/a/deeper") and pub.pending_under("")
        assert not pub.pending_under("ru") and not pub.pending_under("other")

    async def body(pub: Publisher) -> None:
        await wait_until_async(lambda: pub.pending_count == 0, timeout=5.0)
        assert not pub.pending_under("") and not pub.pending_under("run")

    run(lambda: with_publisher(store, journal, body, setup))
    assert seen == [("put_dir", "run/ck-1", True), ("put_file", "run/ck-1/a", True),
                    ("rename_dir", "run/ck-2", True), ("delete_file", "run/ck-2/a", False)]


def test_publisher_wait_applied_timeout(store: RecordingStore, journal: Journal) -> None:
    seqs: list[int] = []

    def setup(pub: Publisher) -> None:
        store.hang("put")
        seqs.append(enqueue(pub, journal, "put_file", "a", body=b"1"))

    async def body(pub: Publisher) -> None:
        start = time.monotonic()
        assert await pub.wait_applied(seqs[0], timeout=0.2) is False
        assert 0.19 <= time.monotonic() - start < 10  # the timeout, not the hung PUT
        assert pub.healthy and journal.counts() == (0, 1)
        store.release()
        assert await pub.wait_applied(seqs[0], timeout=5.0) is True
        assert store.inner.get("files/a") == b"1"

    run(lambda: with_publisher(store, journal, body, setup))


def test_directory_rename_completes_under_sustained_throttling(tmp_path: Path) -> None:
    """A checkpoint directory of 60 files is committed by a directory rename while 10% of
    the store's COPY requests fail with a transient error (throttling, 503). The rename must
    finish in bounded time: a failed copy must not throw away the whole pass."""
    (tmp_path / "store").mkdir()
    store = FaultyStore(LocalStore(tmp_path / "store", fsync=False), seed=3)
    store.inner.put("files/tmp/", DirMarker().to_json())
    for i in range(60):
        store.inner.put(f"files/tmp/rank{i}.pt", b"manifest %d" % i)
    journal = Journal(str(tmp_path / "journal.sqlite"))
    store.fail_rate("copy", 0.1)
    applied: list[bool] = []

    async def main() -> None:
        pub = Publisher(store, journal, trio.CapacityLimiter(1), "n")
        seq = journal.add_op("rename_dir", "tmp", "ckpt")
        pub.enqueue(Op(seq, "rename_dir", "tmp", "ckpt"))
        async with trio.open_nursery() as n:
            await n.start(pub.run)
            with trio.move_on_after(12):
                while pub.applied_seq < seq:
                    await trio.sleep(0.05)
            applied.append(pub.applied_seq >= seq)
            n.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        journal.close()
    assert applied == [True], (f"the rename did not finish in 12 s: {store.counts['copy']} "
                               f"copies for 61 keys")
    assert store.counts["copy"] > 61  # copies failed (throttled) and were retried
    listing = store.inner.list("files/", delimiter=None).objects
    assert sorted(k for k, _ in listing) == sorted(
        ["files/ckpt/"] + [f"files/ckpt/rank{i}.pt" for i in range(60)])


# -- a manifest published long after it was journaled: its chunks re-confirmed first ----
CHUNK = 64 * KiB


def journaled_ago(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Ops journaled from now on get a time `seconds` in the past: as if this node had
    been down that long between journaling them and the replay."""
    monkeypatch.setattr(journal_module, "time", SimpleNamespace(
        time=lambda: time.time() - seconds))


def version(data: bytes, writer: str = "node-a") -> tuple[Manifest, list[str]]:
    """The manifest of `data` cut into CHUNK-sized chunks, and the chunk names."""
    hashes = [codec.chunk_hash(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    chunks = tuple((h, len(data[i * CHUNK:(i + 1) * CHUNK])) for i, h in enumerate(hashes))
    return Manifest(len(data), 0o100644, 1, chunks, CHUNK, writer), hashes


async def replay(store: RecordingStore, journal: Journal, cache: LocalCache) -> Publisher:
    """A publisher started as a mount starts one on this cache: the journaled ops loaded,
    applied until none is left; returns it."""
    pub = Publisher(store, journal, trio.CapacityLimiter(1), "node-a", cache)
    pub.load(journal.pending_ops())
    async with trio.open_nursery() as n:
        await n.start(pub.run)
        await wait_until_async(lambda: pub.pending_count == 0, timeout=20)
        n.cancel_scope.cancel()
    return pub


def chunk_data(data: bytes, i: int) -> bytes:
    return data[i * CHUNK:(i + 1) * CHUNK]


def test_old_manifest_gets_its_deleted_chunk_uploaded_again_from_staging(
        store: RecordingStore, journal: Journal, cache: LocalCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A put_file journaled longer ago than CONFIRM_WINDOW, its chunks stored long ago;
    gc deleted one meanwhile. On replay the publisher HEADs every chunk, uploads the
    missing one from the version's staging file (kept for the op), and only then PUTs
    the manifest. The staging file goes once the op is applied."""
    data = random_bytes(3 * CHUNK + 500, 1)
    m, hashes = version(data)
    st = staged(cache, data)
    for i in range(len(hashes)):
        put_chunk(store, chunk_data(data, i))
    journaled_ago(monkeypatch, publisher_module.CONFIRM_WINDOW + 60)
    journal.add_op("put_file", "ckpt/model.pt", body=m.to_json(), staging_id=st.id)
    store.inner.delete(chunk_key(hashes[1]))  # gc, while the node was down
    assert journal.staging_in_use() == {st.id}

    async def main() -> None:
        await replay(store, journal, cache)
        assert sorted(store.heads) == sorted(chunk_key(h) for h in hashes)
        assert store.log == [("put", chunk_key(hashes[1])), ("put", "files/ckpt/model.pt")]
        assert stored_chunk(store, hashes[1]) == chunk_data(data, 1)
        assert journal.counts() == (0, 0) and journal.lost_files() == []
        assert st.unpublished == 0 and st.id not in cache.staging  # released, then dropped

    run(main)


def test_old_manifest_gets_its_fossilized_chunk_copied_back(
        store: RecordingStore, journal: Journal, cache: LocalCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gc set a chunk of the old manifest aside (chunks/ -> fossils/): it is copied back
    before the manifest PUT, rather than uploaded from staging; the fossil stays (gc
    deletes or restores it later)."""
    data = random_bytes(2 * CHUNK, 2)
    m, hashes = version(data)
    st = staged(cache, data)
    for i in range(len(hashes)):
        put_chunk(store, chunk_data(data, i))
    journaled_ago(monkeypatch, publisher_module.CONFIRM_WINDOW + 60)
    journal.add_op("put_file", "model.pt", body=m.to_json(), staging_id=st.id)
    blob = store.inner.get(chunk_key(hashes[0]))
    store.inner.put(fossil_key(hashes[0]), blob)
    store.inner.delete(chunk_key(hashes[0]))

    async def main() -> None:
        await replay(store, journal, cache)
        assert store.log == [("copy", chunk_key(hashes[0])), ("put", "files/model.pt")]
        assert store.inner.get(chunk_key(hashes[0])) == blob
        assert store.inner.head(fossil_key(hashes[0])) == len(blob)
        assert journal.lost_files() == []

    run(main)


def test_old_manifest_with_a_chunk_gone_for_good_is_published_and_the_file_reported_lost(
        store: RecordingStore, journal: Journal, cache: LocalCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of the old manifest is gone from the store, has no fossil, and is not in
    the staging file (a chunk kept from the previous version: remote, so a hole there).
    The file is recorded as lost in the journal, under the name a later journaled rename
    gives it, and the manifest is published anyway (the rest of the file stays readable;
    verify and latest see it incomplete)."""
    data = random_bytes(3 * CHUNK, 3)
    m, hashes = version(data)
    local = data[:2 * CHUNK]  # chunk 2 was remote in this version: not in staging
    st = staged(cache, local)
    os.ftruncate(st.fd, len(data))
    for i in range(len(hashes)):
        put_chunk(store, chunk_data(data, i))
    journaled_ago(monkeypatch, publisher_module.CONFIRM_WINDOW + 60)
    journal.add_op("put_file", "ckpt/model.pt", body=m.to_json(), staging_id=st.id)
    journal.add_op("rename_file", "ckpt/model.pt", "ckpt/final.pt")
    store.inner.delete(chunk_key(hashes[2]))

    async def main() -> None:
        await replay(store, journal, cache)
        assert store.log == [("put", "files/ckpt/model.pt"), ("copy", "files/ckpt/final.pt"),
                             ("delete", "files/ckpt/model.pt")]
        assert Manifest.from_json(store.inner.get("files/ckpt/final.pt")) == m
        assert [(f.path, f.hash, f.reason) for f in journal.lost_files()] == [
            ("ckpt/final.pt", hashes[2], LOST_REASON)]
        assert store.inner.head(chunk_key(hashes[2])) is None

    run(main)


def test_young_manifest_is_published_without_extra_heads(
        store: RecordingStore, journal: Journal, cache: LocalCache) -> None:
    """Only a put_file journaled by this process more than CONFIRM_WINDOW ago (on the
    monotonic clock), or by an earlier process (replayed, whatever its wall-clock time),
    costs HEADs: one journaled here a minute within the window is PUT as it is (its
    chunks were confirmed at its close); one journaled here a minute past the window and
    one replayed with a time of just now have each of their distinct chunks HEADed once."""
    young, young_hashes = version(random_bytes(2 * CHUNK, 4))
    old_data = random_bytes(2 * CHUNK, 5)
    old, old_hashes = version(old_data + old_data[:CHUNK])  # a chunk named twice
    replayed_data = random_bytes(CHUNK, 6)
    replayed, replayed_hashes = version(replayed_data)
    for h in young_hashes:
        store.inner.put(chunk_key(h), b"x" * 100)
    for data in (chunk_data(old_data, 0), chunk_data(old_data, 1), replayed_data):
        put_chunk(store, data)
    for path, m in (("replayed.pt", replayed), ("young.pt", young), ("old.pt", old)):
        journal.add_op("put_file", path, body=m.to_json())
    replayed_op, young_op, old_op = journal.pending_ops()
    assert time.time() - (replayed_op.journaled_at or 0) < 60
    window = publisher_module.CONFIRM_WINDOW

    async def main() -> None:
        pub = Publisher(store, journal, trio.CapacityLimiter(1), "node-a", cache)
        pub.load([replayed_op])
        pub.enqueue(young_op, journaled_at=time.monotonic() - window + 60)
        pub.enqueue(old_op, journaled_at=time.monotonic() - window - 60)
        async with trio.open_nursery() as n:
            await n.start(pub.run)
            await wait_until_async(lambda: pub.pending_count == 0, timeout=20)
            n.cancel_scope.cancel()
        assert sorted(store.heads) == sorted({chunk_key(h)
                                              for h in old_hashes + replayed_hashes})
        assert len(store.heads) == 3
        assert store.log == [("put", "files/replayed.pt"), ("put", "files/young.pt"),
                             ("put", "files/old.pt")]

    run(main)
