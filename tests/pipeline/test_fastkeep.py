"""The fast tier's retention (pipeline/fastkeep.py) on two directory stores, no mount: of
8 checkpoints only the newest 2 stay in the fast tier once the object store has them
(their manifests and the chunks they name, shared ones too), every one still reads byte
for byte through both tiers, and the newest complete checkpoint and anything pending or
newer than the object store's copy stay."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import (
    SHARED,
    fast_state,
    move_all,
    named_by,
    publish,
    read,
    save_steps,
)
from support import random_bytes

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, file_key
from ckptfs.pipeline import fasttier
from ckptfs.pipeline.fastkeep import Retention, trim
from ckptfs.store.local import LocalStore
from ckptfs.store.tiered import TieredStore


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[LocalStore, LocalStore]:
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    return LocalStore(tmp_path / "fast"), LocalStore(tmp_path / "slow")


def test_the_fast_tier_keeps_the_newest_two_once_the_store_has_everything(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    fast, slow = tiers
    files = save_steps(fast)
    move_all(fast, slow, "a")
    done = trim(fast, slow, keep=2)
    paths, chunks = fast_state(fast)
    newest = {"step-7/model.pt", "step-7/opt.pt", "step-8/model.pt", "step-8/opt.pt"}
    assert paths == newest
    assert chunks == named_by(fast, newest)  # the shared chunk too: step-7 and 8 name it
    assert (done.checkpoints, done.manifests) == (6, 12)
    view = TieredStore(fast, slow, manifests.FILES, fasttier.newer_manifest)
    for path, data in files.items():
        assert read(view, path) == data, path
    assert trim(fast, slow, keep=2).manifests == 0  # nothing more to do
    assert fast_state(fast) == (paths, chunks)


def test_the_newest_complete_checkpoint_and_everything_newer_stay(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """step-7 and step-8 name a chunk that is nowhere (a node died mid-save): with
    --fast-keep 1, step-6 (the newest complete) stays, and so do the newer ones."""
    fast, slow = tiers
    save_steps(fast)
    move_all(fast, slow, "a")
    lost = "0" * 64
    for step in (7, 8):
        key = file_key(f"step-{step}/opt.pt")
        m = Manifest.from_json(fast.get(key))
        body = manifests.with_generation(
            Manifest(m.size + 1, 0o100644, 0, (*m.chunks, (lost, 1))).to_json(), 100)
        fast.put(key, body)
        slow.put(key, body)
    trim(fast, slow, keep=1)
    paths, _ = fast_state(fast)
    assert {p.partition("/")[0] for p in paths} == {"step-6", "step-7", "step-8"}


def test_nothing_the_store_lacks_leaves_the_fast_tier(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """step-3 is still pending (another node's queue, not moved); step-4 was published
    again (generation 20) and the store holds its older generation: both stay, with
    their chunks."""
    fast, slow = tiers
    files = save_steps(fast)
    again = random_bytes(1500)
    publish(fast, "b", 1, "step-3/extra.pt", [again], 30)
    move_all(fast, slow, "a")
    fast.put(file_key("step-4/opt.pt"), manifests.with_generation(Manifest(
        len(again), 0o100644, 0, ((codec.chunk_hash(again), len(again)),)).to_json(), 20))
    trim(fast, slow, keep=2)
    paths, chunks = fast_state(fast)
    assert {"step-3/extra.pt", "step-4/opt.pt"} <= paths
    assert codec.chunk_hash(again) in chunks
    assert not any(p.startswith(("step-1/", "step-2/", "step-5/", "step-6/")) for p in paths)
    move_all(fast, slow, "b")  # once moved, step-3 goes too; step-4 waits for its move
    trim(fast, slow, keep=2)
    paths, _ = fast_state(fast)
    assert "step-3/extra.pt" not in paths and "step-4/opt.pt" in paths
    view = TieredStore(fast, slow, manifests.FILES, fasttier.newer_manifest)
    assert read(view, "step-3/extra.pt") == again
    assert read(view, "step-4/opt.pt") == again
    assert read(view, "step-5/model.pt") == files["step-5/model.pt"]


def held(fast: LocalStore) -> int:
    """The fast tier's bytes as --fast-size counts them: chunks and manifests."""
    return sum(i.size for p in (manifests.CHUNKS, manifests.FILES) for i in fast.scan(p))


def test_fast_size_trims_the_kept_checkpoints_oldest_first_until_they_fit(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """--fast-keep 8 keeps all 8 steps; --fast-size a little less than the 8 hold takes
    the oldest ones out, oldest first, until the rest fits: step-1 and step-2 only (step-3
    stays since step-1 and step-2's own bytes are enough); every step still reads byte for
    byte through both tiers."""
    fast, slow = tiers
    files = save_steps(fast)
    move_all(fast, slow, "a")
    before = held(fast)
    own = {s: held_by(fast, s) for s in range(1, 9)}
    limit = before - own[1] - own[2] + 1
    done = trim(fast, slow, keep=8, size=limit)
    paths, _ = fast_state(fast)
    assert {p.partition("/")[0] for p in paths} == {f"step-{s}" for s in range(3, 9)}
    assert (done.over, done.held) == (0, held(fast)) and held(fast) <= limit
    view = TieredStore(fast, slow, manifests.FILES, fasttier.newer_manifest)
    for path, data in files.items():
        assert read(view, path) == data, path


def held_by(fast: LocalStore, step: int) -> int:
    """The bytes that trimming step `step` alone frees: its manifests and own chunks."""
    names = {f"step-{step}/model.pt", f"step-{step}/opt.pt"}
    others = named_by(fast, {p for p in fast_state(fast)[0]} - names)
    mine = named_by(fast, names) - others
    return (sum(fast.head(file_key(p)) or 0 for p in names)
            + sum(fast.head(manifests.chunk_key(h)) or 0 for h in mine))


def test_fast_size_never_takes_the_newest_complete_nor_anything_pending(
        tiers: tuple[LocalStore, LocalStore], caplog: pytest.LogCaptureFixture) -> None:
    """--fast-size 0: step-3 (a pending record of another queue names a file in it) and
    step-8 (the newest complete) stay, with their chunks; the trim says how much is over,
    and a mount's Retention logs that once, not at every trim."""
    fast, slow = tiers
    save_steps(fast)
    again = random_bytes(1500)
    publish(fast, "b", 1, "step-3/extra.pt", [again], 30)
    move_all(fast, slow, "a")
    done = trim(fast, slow, keep=1, size=0)
    paths, chunks = fast_state(fast)
    assert {p.partition("/")[0] for p in paths} == {"step-3", "step-8"}
    assert codec.chunk_hash(again) in chunks and codec.chunk_hash(SHARED) in chunks
    assert done.held == held(fast) == done.over > 0
    retention = Retention(fast, slow, 1, 0, None)
    for _ in range(3):
        retention()
    over = [r for r in caplog.records if "more than --fast-size" in r.getMessage()]
    assert len(over) == 1, caplog.text
    move_all(fast, slow, "b")  # once moved, step-3 fits the rule: only step-8 stays
    assert retention().over
    assert {p.partition("/")[0] for p in fast_state(fast)[0]} == {"step-8"}
    assert len([r for r in caplog.records if "more than --fast-size" in r.getMessage()]) == 1


def test_fast_keep_and_fast_size_both_apply(tiers: tuple[LocalStore, LocalStore]) -> None:
    """--fast-keep 3 with a --fast-size the 8 steps fit in: the keep rule alone acts
    (step-6 to step-8 stay); with one that 3 steps do not fit in, step-6 goes too."""
    fast, slow = tiers
    save_steps(fast)
    move_all(fast, slow, "a")
    trim(fast, slow, keep=3, size=held(fast))
    assert {p.partition("/")[0] for p in fast_state(fast)[0]} == {"step-6", "step-7",
                                                                  "step-8"}
    trim(fast, slow, keep=3, size=held(fast) - 1)
    assert {p.partition("/")[0] for p in fast_state(fast)[0]} == {"step-7", "step-8"}
