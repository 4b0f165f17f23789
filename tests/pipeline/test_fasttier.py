"""The fast tier's movers (pipeline/fasttier.py) on two directory stores, no mount: the
object store never takes an older manifest over a newer one, a mover that dies half way
leaves its record to another, leases are taken over only once run out and by one mover,
and one node's ops reach the store in its order."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trio
from pipeline_helpers import move_all
from support import random_bytes

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, file_key
from ckptfs.pipeline import fasttier
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fasttier import Leases, Record, Replayer
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.local import LocalStore
from ckptfs.store.tiered import TieredStore


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[LocalStore, LocalStore]:
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    return LocalStore(tmp_path / "fast"), LocalStore(tmp_path / "slow")


def publish(fast: LocalStore, queue: str, seq: int, path: str, data: bytes, gen: int) -> bytes:
    """What a fast-tier mount leaves for a closed file: its chunk and its manifest (with
    `gen`) in the fast tier, and the pending record; returns the manifest."""
    h = codec.chunk_hash(data)
    parts, _ = codec.encode_chunk_parts(data, "zstd4")
    fast.put_parts(manifests.chunk_key(h), parts)
    body = manifests.with_generation(
        Manifest(len(data), 0o100644, 0, ((h, len(data)),), writer=queue).to_json(), gen)
    fast.put(file_key(path), body)
    fast.put(fasttier.record_key(queue, seq), Record(queue, Op(seq, "put_file", path,
                                                               body=body)).to_json())
    return body


def test_an_older_manifest_moved_late_never_replaces_a_newer(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """Node a publishes x (gen 1), node b publishes x again (gen 2); b's record reaches
    the store first, a's late: the store keeps b's, and both records are gone."""
    fast, slow = tiers
    publish(fast, "a", 1, "x", random_bytes(1000), gen=1)
    newer = publish(fast, "b", 1, "x", random_bytes(1000), gen=2)
    move_all(fast, slow, "b")
    move_all(fast, slow, "a")
    assert slow.get(file_key("x")) == newer
    assert fasttier.queues(fast) == []


class LatePut(LocalStore):
    """A store where, right after the first PUT of files/x, another mover's PUT of an
    older version lands (it had checked the store before the first PUT)."""

    late: bytes = b""

    def put(self, key: str, data: bytes | memoryview) -> None:
        super().put(key, data)
        if key == file_key("x") and self.late:
            late, self.late = self.late, b""
            super().put(key, late)


def test_a_late_put_over_a_newer_manifest_is_undone(tmp_path: Path) -> None:
    """The mover looks again after its PUT: an older version PUT just after it (by a
    mover that checked before) is replaced by the newer one again."""
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast, slow = LocalStore(tmp_path / "fast"), LatePut(tmp_path / "slow")
    older = publish(fast, "a", 1, "x", random_bytes(1000), gen=1)
    newer = publish(fast, "b", 1, "x", random_bytes(1000), gen=2)
    slow.late = older
    move_all(fast, slow, "b")
    assert slow.get(file_key("x")) == newer


class DiesAfter(LocalStore):
    """A store whose writer dies (an exception no mover catches) at its n-th chunk PUT."""

    def __init__(self, root: Path, n: int) -> None:
        super().__init__(root)
        self.n = n

    def put(self, key: str, data: bytes | memoryview) -> None:
        if key.startswith(manifests.CHUNKS):
            self.n -= 1
            if self.n == 0:
                raise KeyboardInterrupt("killed")
        super().put(key, data)


def test_a_mover_killed_mid_copy_leaves_its_record_to_another(tmp_path: Path) -> None:
    """A mover dies after copying some chunks of a file: the record stays in the fast
    tier, another mover takes the lease once it runs out and finishes: every chunk and
    the manifest are in the store, the record is gone."""
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast = LocalStore(tmp_path / "fast")
    data = [random_bytes(3000) for _ in range(4)]
    body = b""
    for i, d in enumerate(data):
        body = publish(fast, "a", i + 1, f"f{i}", d, gen=1)
    dying = DiesAfter(tmp_path / "slow", 2)
    first = Leases(fast, "mover-1", lease=30)
    assert first.take_over("a", first.store_now())
    with pytest.raises(KeyboardInterrupt):
        fasttier.move_queue(Replayer(fast, dying), first, "a")
    assert len(Replayer(fast, dying).queue_keys("a")) == 3  # f0 moved, f1 half way
    slow = LocalStore(tmp_path / "slow")
    second = Leases(fast, "mover-2", lease=30)
    now = second.store_now()
    assert not second.take_over("a", now)  # the first mover's lease still runs
    assert second.take_over("a", now + 31)
    assert fasttier.move_queue(Replayer(fast, slow), second, "a")
    for i, d in enumerate(data):
        m = Manifest.from_json(slow.get(file_key(f"f{i}")))
        assert codec.decode_chunk(slow.get(manifests.chunk_key(m.chunks[0][0])),
                                  m.chunks[0][0]) == d
    assert slow.get(file_key("f3")) == body
    assert fasttier.queues(fast) == []


def test_one_mover_takes_a_lease_that_ran_out(tiers: tuple[LocalStore, LocalStore]) -> None:
    """Three movers find node a's lease run out, and try to take it at the same moment:
    exactly one does; a fresh lease is not taken; the lost node, back, no longer holds it."""
    fast, _ = tiers
    owner = Leases(fast, "a", lease=0.5)
    assert owner.renew("a")
    movers = [Leases(fast, f"m{i}", lease=0.5) for i in range(3)]
    assert not movers[0].take_over("a", movers[0].store_now())
    time.sleep(0.6)
    barrier = threading.Barrier(3)

    def take(m: Leases) -> bool:
        now = m.store_now()
        barrier.wait()
        return m.take_over("a", now)

    with ThreadPoolExecutor(3) as pool:
        won = list(pool.map(take, movers))
    assert won.count(True) == 1
    assert not owner.renew("a")
    assert Leases(fast, "x", 30).owner_of("a") == f"m{won.index(True)}"


def test_one_nodes_ops_reach_the_store_in_its_order(tiers: tuple[LocalStore, LocalStore]
                                                    ) -> None:
    """A file published, renamed, and a new file under the old name: the store ends with
    both, each with its own bytes, as the node left them."""
    fast, slow = tiers
    first = publish(fast, "a", 1, "x", random_bytes(1000), gen=1)
    fast.put(fasttier.record_key("a", 2), Record("a", Op(2, "rename_file", "x", "y")).to_json())
    second = publish(fast, "a", 3, "x", random_bytes(1000), gen=2)
    fasttier.move_queue(Replayer(fast, slow), Leases(fast, "a", 30), "a")
    assert slow.get(file_key("y")) == first
    assert slow.get(file_key("x")) == second


def damaged(blob: bytes) -> bytes:
    """The chunk object with one payload byte flipped."""
    at = codec.HEADER_SIZE + 10
    return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1:]


def test_a_chunk_damaged_in_the_fast_tier_is_read_from_the_store(
        tiers: tuple[LocalStore, LocalStore], cache: LocalCache) -> None:
    """A mount reads a chunk from the fast tier first; where that copy fails its name,
    the object store's is read instead."""
    fast, slow = tiers
    data = random_bytes(64 * 1024)
    h = codec.chunk_hash(data)
    blob = codec.encode_chunk(data)[0]
    slow.put(manifests.chunk_key(h), blob)
    fast.put(manifests.chunk_key(h), damaged(blob))
    f = Fetcher(TieredStore(fast, slow), cache, workers=2, missing_timeout=0.5)
    f.behind = slow

    async def body() -> None:
        async with trio.open_nursery() as n:
            await n.start(f.run)
            assert bytes(await f.read(h, 0, len(data))) == data
            n.cancel_scope.cancel()

    trio.run(body)


def test_a_mover_never_copies_a_damaged_chunk(tiers: tuple[LocalStore, LocalStore]) -> None:
    """A chunk damaged in the fast tier is not copied into the store (reported lost):
    the store never holds a chunk that fails its name."""
    fast, slow = tiers
    data = random_bytes(5000)
    publish(fast, "a", 1, "x", data, gen=1)
    key = manifests.chunk_key(codec.chunk_hash(data))
    fast.put(key, damaged(fast.get(key)))
    replayer = Replayer(fast, slow)
    record = replayer.read(fasttier.record_key("a", 1))
    assert record is not None
    replayer.move(record)
    assert slow.head(key) is None and replayer.moved.lost == 1


def test_readers_take_the_newer_manifest_of_the_two_tiers(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """Where both tiers hold a manifest, a mount reads the one with the higher generation
    (the fast tier's on a tie), and lists each name once."""
    fast, slow = tiers
    view = TieredStore(fast, slow, manifests.FILES, fasttier.newer_manifest)
    body = Manifest(0, 0o100644, 0).to_json()
    slow.put(file_key("a"), manifests.with_generation(body, 5))
    fast.put(file_key("a"), manifests.with_generation(body, 3))
    assert manifests.generation(view.get_record(file_key("a"))) == 5
    fast.put(file_key("a"), manifests.with_generation(body, 7))
    slow.put(file_key("b"), body)  # written without a fast tier: generation 0
    assert manifests.generation(view.get_record(file_key("a"))) == 7
    assert [k for k, _ in view.list(manifests.FILES).objects] == [file_key("a"),
                                                                   file_key("b")]


def test_a_writer_deduplicates_against_the_fast_tier_only(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """The uploader's view finds a chunk only in the fast tier (so it writes there every
    chunk a new manifest adds, out of gc's reach), while readers still find it in the
    object store."""
    fast, slow = tiers
    data = random_bytes(1000)
    key = manifests.chunk_key(codec.chunk_hash(data))
    slow.put(key, codec.encode_chunk(data)[0])
    uploads = TieredStore(fast, slow, fast_heads=(manifests.CHUNKS,))
    assert uploads.head(key) is None
    assert TieredStore(fast, slow).head(key) is not None
    assert uploads.get(key) == slow.get(key)


def test_a_delete_stays_pending_on_its_node_until_moved(tmp_path: Path,
                                                        journal: Journal) -> None:
    """With a fast tier, a delete applied to the fast tier keeps its path pending on the
    mount (its listings do not show the name again from the object store) until the
    mover has it in the object store; waiting for the path to settle does not wait for
    the mover; once moved, the path is free."""
    (tmp_path / "fast").mkdir()
    pub = Publisher(LocalStore(tmp_path / "fast"), journal, trio.CapacityLimiter(1))
    pub.hold_after_apply = fasttier.held
    seq = journal.add_op("delete_file", "d/a", None, None)
    pub.enqueue(Op(seq, "delete_file", "d/a"))

    async def body() -> None:
        async with trio.open_nursery() as n:
            await n.start(pub.run)
            assert await pub.wait_applied(seq, timeout=5.0)
            assert pub.is_pending("d/a") and pub.pending_under("d")
            with trio.fail_after(2):
                assert not await pub.wait_settled("d/a", timeout=30)
            pub.release_held(Op(seq, "delete_file", "d/a"))
            assert not pub.is_pending("d/a") and not pub.pending_under("d")
            n.cancel_scope.cancel()

    trio.run(body)
