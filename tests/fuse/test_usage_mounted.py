"""`ckptfs du` given a path inside a real mount: two checkpoints written through it, the
second a copy of the first plus one new file (deduplicated: only that file's chunks are
new)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mounting import Nodes, run_cli
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.format.manifests import Manifest
from ckptfs.store.local import LocalStore

CHUNK = 64 * 1024


def chunk_bytes(store: LocalStore, path: str) -> int:
    """The stored bytes of the chunks of the file at `path`."""
    m = Manifest.from_json(store.get(manifests.file_key(path)))
    sizes = [store.head(manifests.chunk_key(h)) for h, _ in m.chunks]
    assert None not in sizes and sizes, (path, sizes)
    return sum(s for s in sizes if s is not None)


def test_du_of_a_copied_checkpoint_through_a_mount(tmp_path: Path, nodes: Nodes) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = LocalStore(store_dir)
    m = nodes.mount(str(store_dir), tmp_path, "writer", "--chunk-size", "64K")
    run = m / "run"
    (run / "ck-1").mkdir(parents=True)
    (run / "ck-1" / "model.pt").write_bytes(random_bytes(3 * CHUNK + 10, seed=1))
    (run / "ck-1" / "meta.json").write_text('{"step": 1}')
    shutil.copytree(run / "ck-1", run / "ck-2")
    (run / "ck-2" / "extra.pt").write_bytes(random_bytes(CHUNK + 5, seed=2))
    run_cli("sync", str(m.path), timeout=60)

    r = run_cli("du", str(run), "--json", timeout=60)
    d = json.loads(r.stdout)
    dirs = {x["path"]: x for x in d["dirs"]}
    one, two = dirs["run/ck-1"], dirs["run/ck-2"]
    extra = chunk_bytes(store, "run/ck-2/extra.pt")
    shared = chunk_bytes(store, "run/ck-1/model.pt") + chunk_bytes(store, "run/ck-1/meta.json")
    assert (one["files"], one["unique_bytes"], one["referenced_bytes"]) == (2, 0, shared)
    assert (two["files"], two["unique_bytes"], two["referenced_bytes"]) == (
        3, extra, shared + extra)
    assert two["logical_bytes"] == one["logical_bytes"] + CHUNK + 5
    assert d["total"]["unique_bytes"] == d["total"]["referenced_bytes"] == shared + extra
    assert d["unreferenced_bytes"] == 0 and d["stored_bytes"] == shared + extra

    table = run_cli("du", str(run), timeout=60).stdout.splitlines()
    assert table[1].startswith(f"{run / 'ck-1'} ") and table[1].endswith(
        " 0 B   1.00x   1.00x"), table  # nothing unique; random bytes: no dedup, stored raw
    assert table[3].startswith(f"{run} (all) "), table
    dedup = d["total"]["dedup_ratio"]  # ck-2 repeats ck-1's 3 chunks and adds 1
    assert 1.7 < dedup < 1.8 and table[3].split()[-2] == f"{dedup:.2f}x", table
    m.umount()
