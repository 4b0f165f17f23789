"""A fast tier that fails (pipeline/fastfail.py) on two directory stores, no mount: an op
goes straight to the object store only after this mount's earlier records, a manifest
published so wins over the fast tier's copy, a delete or rename so is not undone by the
fast tier's copies (or waits), an unmounted tier is never written, chunks follow."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from pipeline_helpers import move_all

from ckptfs.common.errors import Deferred, PermanentStoreError
from ckptfs.format import manifests
from ckptfs.format.manifests import Manifest, file_key
from ckptfs.pipeline import fasttier
from ckptfs.pipeline.fastfail import Direct, Health
from ckptfs.pipeline.fasttier import Mover, Recorder
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.local import LocalStore
from ckptfs.store.tiered import TieredStore

QUEUE = "node-a-1"


class Breakable(LocalStore):
    """A directory store whose writes fail with `broken` (an errno) once it is set; its
    deletes too, but for ENOSPC (a full file system frees space)."""

    broken: int | None = None

    def _fail(self, key: str, deleting: bool = False) -> None:
        if self.broken is not None and not (deleting and self.broken == errno.ENOSPC):
            error = OSError(self.broken, "injected")
            raise PermanentStoreError(f"put {key}: injected") from error

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._fail(key)
        super().put(key, data)

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self._fail(key)
        super().put_parts(key, parts)

    def delete_many(self, keys: object) -> None:
        self._fail("(deletes)", deleting=True)
        super().delete_many(keys)  # type: ignore[arg-type]

    def delete(self, key: str) -> None:
        self._fail(key, deleting=True)
        super().delete(key)


class Tier:
    """A fast tier (marked as attach does), an object store, and a mount's hooks on them."""

    def __init__(self, tmp_path: Path) -> None:
        (tmp_path / "fast").mkdir()
        (tmp_path / "slow").mkdir()
        self.fast = Breakable(tmp_path / "fast", fsync=False)
        self.slow = LocalStore(tmp_path / "slow", fsync=False)
        self.fast.put(manifests.INFO_KEY, b"{}")
        self.health = Health(self.fast, "fast", QUEUE)
        self.mover = Mover(self.fast, self.slow, QUEUE, lambda seq: True, lambda h: False)
        self.mover.fast_usable, self.mover.fast_failed = self.health.is_usable, self.health.judge
        self.mover.fast_mounted = self.health.marker
        self.direct = Direct(self.fast, self.slow, self.health, self.mover)
        self.recorder = Recorder(self.fast, QUEUE, 0.0, self.mover.recorded)
        self.recorder.fast_failed, self.recorder.mounted = self.health.judge, self.health.marker
        self.recorder.floor = self.direct.generations
        self.view = TieredStore(self.fast, self.slow, manifests.FILES, fasttier.newer_manifest)

    def publisher(self, journal: Journal) -> Publisher:
        """A publisher wired as a fast-tier mount wires it (daemon/mount.py)."""
        pub = Publisher(self.view, journal, trio.CapacityLimiter(1), QUEUE)
        pub.before_apply = self.recorder.before_apply
        pub.route, pub.hold_after_apply = self.direct.route, fasttier.held
        pub.before_direct, pub.after_direct = self.direct.before, self.direct.after
        return pub


def manifest(gen: int | None = None) -> bytes:
    body = Manifest(0, 0o100644, 0).to_json()
    return body if gen is None else manifests.with_generation(body, gen)


@pytest.fixture
def tier(tmp_path: Path) -> Tier:
    return Tier(tmp_path)


def test_an_op_waits_for_the_mounts_records_still_in_the_fast_tier(tier: Tier,
                                                                   journal: Journal) -> None:
    """Op 1 (put x) is recorded in the fast tier; then the tier fills up; op 2 (delete x)
    is not applied to the object store (it waits in the journal, no error) until op 1's
    record is moved; then it is, after op 1: x is gone from the store and from the
    listing of both tiers."""
    pub = tier.publisher(journal)
    s1 = journal.add_op("put_file", "x", None, manifest())
    pub.enqueue(Op(s1, "put_file", "x", body=manifest()))

    async def body() -> None:
        async with trio.open_nursery() as n:
            await n.start(pub.run)
            assert await pub.wait_applied(s1, timeout=5)
            assert tier.mover.own_seqs() == [s1]
            tier.fast.broken = errno.ENOSPC
            tier.health.down("full")
            s2 = journal.add_op("delete_file", "x")
            await pub.add(Op(s2, "delete_file", "x"))
            await trio.sleep(1.0)
            assert not pub.applied(s2) and journal.pending_ops()[0].seq == s2
            assert tier.slow.head(file_key("x")) is None  # op 1 not there yet either
            move_all(tier.fast, tier.slow, QUEUE)  # a full tier still deletes the record
            assert tier.slow.head(file_key("x")) is not None
            tier.mover.forget(s1)
            assert await pub.wait_applied(s2, timeout=5)
            n.cancel_scope.cancel()

    trio.run(body)
    assert tier.slow.head(file_key("x")) is None
    assert tier.view.list(manifests.FILES).objects == []


def test_a_manifest_published_straight_wins_over_the_fast_tiers_copy(tier: Tier) -> None:
    """The fast tier holds x at a generation far ahead of this node's clock; x published
    straight to the object store gets a higher one, so readers of both tiers read it;
    once the tier is back, the next version of x is higher again."""
    ahead = time.time_ns() + 10**12  # another node's clock, 1000 s ahead
    tier.fast.put(file_key("x"), manifest(ahead))
    tier.health.down("full")
    body = Manifest(5, 0o100644, 0).to_json()
    store = tier.direct.route([Op(1, "put_file", "x", body=body)])
    assert store is not None
    [op] = tier.direct.before([Op(1, "put_file", "x", body=body)])
    store.put(file_key("x"), op.body or b"")
    gen = manifests.generation(op.body or b"")
    assert gen > ahead
    assert tier.view.get(file_key("x")) == op.body
    tier.health.up()
    [again] = tier.recorder.before_apply([Op(2, "put_file", "x", body=body)])
    assert manifests.generation(again.body or b"") > gen


@pytest.mark.parametrize("how", ["read-only", "unmounted"])
def test_a_delete_straight_to_the_store_waits_while_the_fast_tier_keeps_copies(
        tier: Tier, how: str) -> None:
    """A delete or rename must not be undone by the fast tier's copies of the old names:
    on a full tier they are deleted there first; on a read-only or unmounted one the op
    waits (Deferred), with nothing deleted anywhere."""
    for store in (tier.fast, tier.slow):
        store.put(file_key("x"), manifest(1))
        store.put(file_key("d/y"), manifest(1))
        store.put(manifests.dir_key("d"), b"")
    tier.health.down(how)
    if how == "read-only":
        tier.fast.broken = errno.EROFS
    else:
        tier.fast.delete(manifests.INFO_KEY)
    for op in (Op(1, "delete_file", "x"), Op(1, "rename_dir", "d", "e")):
        with pytest.raises(Deferred):
            tier.direct.before([op])
    assert tier.fast.head(file_key("x")) is not None
    assert tier.fast.head(file_key("d/y")) is not None
    tier.fast.broken = None
    tier.fast.put(manifests.INFO_KEY, b"{}")
    tier.fast.broken = errno.ENOSPC  # full: deletes work, the copies go first
    tier.direct.before([Op(1, "delete_file", "x")])
    tier.direct.before([Op(2, "rename_dir", "d", "e")])
    assert tier.fast.head(file_key("x")) is None
    assert tier.fast.list(manifests.dir_key("d"), delimiter=None).objects == []


def test_the_batchs_own_record_is_deleted_before_it_goes_straight(tier: Tier) -> None:
    """A record written before the tier failed, for the very op now applied straight to
    the object store, is deleted from the fast tier first (no mover applies it again
    after a later op); with the tier unmounted, the op waits instead."""
    op = Op(7, "delete_file", "x")
    [recorded] = tier.recorder.before_apply([op])
    assert tier.mover.own_seqs() == [7]
    tier.fast.delete(manifests.INFO_KEY)
    assert tier.health.marker() is False and tier.health.usable is False
    with pytest.raises(Deferred):
        tier.direct.route([Op(8, "put_dir", "d", body=b"")])
    with pytest.raises(Deferred):  # its record is hidden: never taken for moved
        tier.direct.route([op])
    tier.fast.put(manifests.INFO_KEY, b"{}")
    assert tier.health.check() is True
    tier.health.down("full")
    assert tier.direct.route([op]) is not None
    tier.direct.before([op])
    assert tier.mover.own_seqs() == []
    assert tier.fast.head(fasttier.record_key(QUEUE, 7)) is None


def test_an_unmounted_fast_tier_gets_no_record(tier: Tier) -> None:
    """The fast tier's ckptfs.json missing (its file system not mounted), the recorder
    writes no record: Deferred, and the tier is marked unusable."""
    tier.fast.delete(manifests.INFO_KEY)
    with pytest.raises(Deferred):
        tier.recorder.before_apply([Op(1, "put_dir", "d", body=b"")])
    assert tier.fast.list(fasttier.PENDING, delimiter=None).objects == []
    assert tier.health.usable is False and tier.health.mounted is False


def test_chunks_follow_and_one_warning_per_episode(tier: Tier,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The uploader's view: a chunk PUT that fails with ENOSPC goes to the object store,
    as do the next ones, with one warning line; a probe that finds the tier usable says
    so once, and chunks go to the fast tier again."""
    uploads = TieredStore(tier.fast, tier.slow, fast_heads=(manifests.CHUNKS,))
    uploads.writes_follow = True
    uploads.fast_usable, uploads.fast_failed = tier.health.is_usable, tier.health.judge
    uploads.wrote_slow = tier.health.count_direct
    tier.fast.broken = errno.ENOSPC
    with caplog.at_level(logging.WARNING, "ckptfs.pipeline.fastfail"):
        for n in range(3):
            uploads.put_parts(f"chunks/{n}", [b"abc"])
            assert uploads.head(f"chunks/{n}") == 3
        tier.fast.broken = None
        assert tier.health.check() is True
        uploads.put_parts("chunks/9", [b"abc"])
    assert [tier.slow.head(f"chunks/{n}") for n in range(3)] == [3, 3, 3]
    assert tier.fast.head("chunks/9") == 3 and tier.slow.head("chunks/9") is None
    assert tier.health.direct_bytes == 9 and tier.health.episodes == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unusable (ENOSPC" in lines[0] and "usable again" in lines[1]


def test_ops_wait_until_another_nodes_mover_has_the_queue(tier: Tier) -> None:
    """On a read-only tier this mount can neither renew its lease nor delete a record it
    moved: its next op waits; once another node's mover has moved the queue, this mount's
    mover sees its records gone, and the op goes straight to the object store."""
    tier.recorder.before_apply([Op(3, "put_dir", "d", body=b"")])
    tier.fast.broken = errno.EROFS
    tier.health.down("read-only")
    later = [Op(4, "put_dir", "e", body=b"")]
    with pytest.raises(Deferred):
        tier.direct.route(later)
    moved: list[Op] = []
    with pytest.raises(PermanentStoreError):  # its lease: the mover's loop retries quietly
        tier.mover._move_records(list(tier.mover.own.values()), moved)
    assert moved == [] and tier.mover.own_seqs() == [3]
    with pytest.raises(Deferred):
        tier.direct.route(later)
    tier.fast.broken = None
    move_all(tier.fast, tier.slow, QUEUE)  # another node's mover, which can delete
    tier.fast.broken = errno.EROFS
    tier.mover._move_records(list(tier.mover.own.values()), moved)
    assert [op.seq for op in moved] == [3] and tier.mover.own_seqs() == []
    assert tier.direct.route(later) is not None
