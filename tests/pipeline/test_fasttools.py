"""prune, trash restore and gc on both tiers (pipeline/fasttools.py), two directory stores,
no mount: a pruned checkpoint is gone from every reader's view and stays gone (a trim
does not bring it back), one with pending changes is kept with its reason, a restore
comes back where every reader sees it and not over a pending change, and gc keeps what
pending records and the fast tier's manifests need while it clears the fast tier of the
old chunks nothing names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import SHARED, fast_state, move_all, publish, read, save_steps
from support import random_bytes

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, StoreInfo, file_key
from ckptfs.pipeline import fasttier
from ckptfs.pipeline.fastkeep import trim
from ckptfs.pipeline.fasttools import BothTiers, FastGc
from ckptfs.pipeline.journal import Op
from ckptfs.store.base import Store
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, retention, trash


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[LocalStore, LocalStore]:
    for name in ("fast", "slow"):
        (tmp_path / name).mkdir()
    fast, slow = LocalStore(tmp_path / "fast"), LocalStore(tmp_path / "slow")
    info = StoreInfo().to_json()
    slow.put(manifests.INFO_KEY, info)
    fast.put(manifests.INFO_KEY, info)
    return fast, slow


def steps(store: Store) -> set[str]:
    return {p for p in store.list(manifests.FILES).prefixes}


def prune(both: BothTiers, keep_last: int) -> retention.PruneResult:
    view = fasttier.view(both.fast, both.slow)
    return retention.prune(view, "", keep_last, pattern="step-*", trash_keep=3600,
                           keep=both.busy, remove=both.remove_tree)


def test_a_pruned_checkpoint_leaves_both_tiers_and_stays_gone(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """8 steps, all moved to the store, all still in the fast tier (--fast-keep 8): a
    prune --keep-last 2 leaves step-7 and step-8 in every reader's view; the store's
    trash holds the others; a trim afterwards puts nothing back; a restore of step-3
    comes back byte for byte, in the store (a node without the fast tier reads it)."""
    fast, slow = tiers
    files = save_steps(fast)
    move_all(fast, slow, "a")
    both = BothTiers(fast, slow)
    r = prune(both, 2)
    assert [c.path for c in r.removed] == [f"step-{s}" for s in range(6, 0, -1)]
    view = fasttier.view(fast, slow)
    assert steps(view) == {"files/step-7/", "files/step-8/"}
    trim(fast, slow, keep=8)
    assert steps(view) == {"files/step-7/", "files/step-8/"}
    assert {p.partition("/")[0] for p in fast_state(fast)[0]} == {"step-7", "step-8"}
    r2 = trash.restore(both.restore_store(), "step-3", busy=both.pending)
    assert not r2.skipped and len(r2.restored) == 3  # the marker and the two files
    for name in ("model.pt", "opt.pt"):
        assert read(view, f"step-3/{name}") == files[f"step-3/{name}"]
        assert slow.head(file_key(f"step-3/{name}")) is not None
    assert not trash.entries(slow, "step-3")


def test_a_checkpoint_with_pending_changes_is_kept_and_not_restored_over(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """step-2 has a file another node published whose record is not moved yet: prune
    keeps it, saying why; once moved, the next prune removes it from both tiers, and
    the mover has nothing left to bring it back with. A restore of step-1 while a
    pending delete of it waits is left in the trash (the mover would delete it again)."""
    fast, slow = tiers
    save_steps(fast)
    move_all(fast, slow, "a")
    publish(fast, "b", 1, "step-2/extra.pt", [random_bytes(500)], 50)
    both = BothTiers(fast, slow)
    r = prune(both, 2)
    kept = {c.path: c.detail for c in r.checkpoints if c.keep}
    assert "step-2" in kept and "pending in the fast tier" in kept["step-2"][-1], kept
    view = fasttier.view(fast, slow)
    assert "files/step-2/" in steps(view) and "files/step-1/" not in steps(view)
    move_all(fast, slow, "b")
    r = prune(both, 2)
    assert [c.path for c in r.removed] == ["step-2"]
    assert "files/step-2/" not in steps(view) and "files/step-2/" not in steps(slow)

    fast.put(fasttier.record_key("c", 1), fasttier.Record(
        "c", Op(1, "delete_dir", "step-1")).to_json())
    r2 = trash.restore(both.restore_store(), "step-1", busy=both.pending)
    assert not r2.restored and all("pending in the fast tier" in why for _, why in r2.skipped)
    assert "files/step-1/" not in steps(view)


def test_gc_keeps_what_the_fast_tier_needs_and_clears_what_nothing_names(
        tiers: tuple[LocalStore, LocalStore]) -> None:
    """A pending put_file names a chunk the store holds and no manifest of the store
    names (a version kept from one since deleted): two gc runs with grace 0 leave it
    (without the fast tier they free it). In the fast tier, an unreferenced chunk the
    store has is deleted, one it lacks is copied there first; referenced ones stay."""
    fast, slow = tiers
    kept_data, orphan_data, moved_data = (random_bytes(700 + i) for i in range(3))
    kept = codec.chunk_hash(kept_data)
    slow.put_parts(manifests.chunk_key(kept), codec.encode_chunk_parts(kept_data, "zstd4")[0])
    body = manifests.with_generation(Manifest(len(kept_data), 0o100644, 0,
                                              ((kept, len(kept_data)),)).to_json(), 9)
    fast.put(file_key("run/a.pt"), body)
    fast.put(fasttier.record_key("q", 1),
             fasttier.Record("q", Op(1, "put_file", "run/a.pt", body=body)).to_json())
    publish(fast, "q", 2, "run/b.pt", [SHARED], 10)  # in the fast tier only, referenced
    orphans = {}
    for data in (orphan_data, moved_data):
        h = codec.chunk_hash(data)
        fast.put_parts(manifests.chunk_key(h), codec.encode_chunk_parts(data, "zstd4")[0])
        orphans[h] = data
    orphan, moved = list(orphans)
    slow.put(manifests.chunk_key(orphan), fast.get(manifests.chunk_key(orphan)))
    r = gc.collect(slow, 0, fast=FastGc(fast, slow))
    assert r.fast_records == 2 and r.fast_manifests == 2
    assert (r.fast_freed.count, r.fast_moved.count, r.fast_chunks.count) == (1, 1, 3)
    _, chunks = fast_state(fast)
    assert chunks == {codec.chunk_hash(SHARED)}
    assert slow.head(manifests.chunk_key(moved)) is not None  # the store's gc takes it on
    gc.collect(slow, 0, fast=FastGc(fast, slow))
    assert slow.head(manifests.chunk_key(kept)) is not None  # still in chunks/
    view = fasttier.view(fast, slow)
    assert read(view, "run/a.pt") == kept_data and read(view, "run/b.pt") == SHARED
    with codec.decoded(slow.get(manifests.fossil_key(moved)), moved) as got:
        assert bytes(got) == moved_data  # set aside by the second run, then freed
    # and without the fast tier, the store's gc frees the chunk the pending record needs
    for _ in range(2):
        gc.collect(slow, 0)
    assert slow.head(manifests.chunk_key(kept)) is None
    assert slow.head(manifests.fossil_key(kept)) is None


def test_gc_stops_on_a_damaged_pending_record(tiers: tuple[LocalStore, LocalStore]) -> None:
    fast, slow = tiers
    fast.put(fasttier.record_key("q", 1), b"{not json")
    with pytest.raises(gc.GcError, match="pending record pending/q/000000000001"):
        gc.collect(slow, 0, fast=FastGc(fast, slow))
    assert [i.key for i in slow.scan("")] == [manifests.INFO_KEY]  # nothing was changed
