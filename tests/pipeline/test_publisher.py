"""Publisher: journaled metadata ops applied to the store in order (batched deletes,
directory renames and their replay, retries) against a LocalStore behind a FaultyStore."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from pipeline_helpers import RecordingStore, run
from support import wait_until_async

from ckptfs.journal import Journal, Op
from ckptfs.manifests import DirMarker, dir_key, file_key
from ckptfs.publisher import Publisher
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
