"""Checkpoint rotation through a real mount, then `ckptfs gc`: the store shrinks to what
the checkpoints kept need (the scenario of the gc issue; scripts/bench_gc.py prints the
same numbers for torch checkpoints of any size)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mounting import Nodes, run_cli
from support import random_bytes

from ckptfs.cli.output import human
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, inspection, trash

MiB = 1 << 20
SAVES, KEEP = 12, 3


def checkpoint_files(step: int) -> dict[str, bytes]:
    """One save of a training run: frozen weights (the same bytes at every save, so
    deduplicated), trained weights and optimizer state (new bytes at every save)."""
    return {"frozen.bin": random_bytes(MiB, seed=0),
            "model.bin": random_bytes(2 * MiB + 12345, seed=step),
            "optimizer.bin": random_bytes(MiB + 678, seed=1000 + step)}


def chunk_bytes(store: LocalStore) -> tuple[int, int]:
    """(bytes of every chunk object in the store, fossils included; bytes of the chunk
    objects the files need: each referenced chunk once)."""
    r = inspection.fsck(store)
    assert r.clean and not r.problems, r.to_dict()
    return r.stored_bytes + r.fossil_bytes, r.stored_bytes - r.garbage_bytes


def test_rotation_then_gc_leaves_only_what_the_kept_checkpoints_need(
        tmp_path: Path, nodes: Nodes) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = LocalStore(store_dir)
    # no trash: what the rotation deletes is unreferenced at once, and only the grace
    # keeps gc off it
    trainer = nodes.mount(str(store_dir), tmp_path, "trainer", "--chunk-size", "256K",
                          "--trash-hours", "0")
    for step in range(1, SAVES + 1):
        d = trainer / f"step-{step}"
        d.mkdir()
        for name, data in checkpoint_files(step).items():
            (d / name).write_bytes(data)
        if step > KEEP:
            shutil.rmtree(trainer / f"step-{step - KEEP}")  # keep the last KEEP
    trainer.sync()  # every chunk written is in the store
    fsck = inspection.fsck(store)
    garbage = (fsck.garbage_chunks, fsck.garbage_bytes)
    assert fsck.trash_files == 0 and garbage[0] > 0, fsck.to_dict()
    # gc given a path in the mount works on its store; with the default grace of a day,
    # nothing written minutes ago is old enough: the garbage is kept, for the grace
    r = run_cli("gc", str(trainer / "step-12"), "--dry-run")
    assert f"store        {store.url}: " in r.stdout, r.stdout
    assert (f"0 (0 B) would be set aside as fossils, {garbage[0]} ({human(garbage[1])}) "
            f"unreferenced kept for the grace") in r.stdout, r.stdout
    # (a grace of 0 would set all of it aside: it is the grace that keeps it)
    dry = gc.collect(store, 0.0, dry_run=True)
    assert (dry.fossilized.count, dry.fossilized.bytes) == garbage, dry.to_dict()
    trainer.umount()
    kept = [f"step-{s}" for s in range(SAVES - KEEP + 1, SAVES + 1)]
    assert store.list("files/").prefixes == sorted(f"files/{k}/" for k in kept)
    assert store.list("trash/").objects == []
    before, needed = chunk_bytes(store)
    assert before > 3 * needed  # nine saves' trained bytes are garbage

    r = run_cli("gc", str(store_dir), "--grace", "0", "--no-writers", "--json")
    assert json.loads(r.stdout)["fossilized"]["count"] == garbage[0], r.stdout  # set aside
    aside, _ = chunk_bytes(store)
    assert aside == before  # moved to fossils/, not freed yet
    r = run_cli("gc", str(store_dir), "--grace", "0", "--no-writers", "--json")
    assert json.loads(r.stdout)["freed"]["count"] == garbage[0], r.stdout  # frees them
    after, needed_after = chunk_bytes(store)
    assert needed_after == needed
    assert after <= 1.05 * needed, (before, after, needed)

    reader = nodes.mount(str(store_dir), tmp_path, "reader")  # a fresh node; trash 24 h
    for k in kept:
        step = int(k.split("-")[1])
        for name, data in checkpoint_files(step).items():
            assert (reader / k / name).read_bytes() == data, (k, name)
    # a checkpoint deleted where there is a trash: gc keeps its chunks
    shutil.rmtree(reader / kept[0])
    reader.umount()
    assert gc.collect(store, 0.0).fossilized.count == 0
    assert len(trash.entries(store, kept[0])) == 4  # 3 files and the marker
    r = run_cli("fsck", str(store_dir), "--deep")
    assert "0 unreferenced" in r.stdout and "fossils" not in r.stdout, r.stdout
