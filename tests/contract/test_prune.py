"""`ckptfs prune` (retention.py) on crafted stores, local and SeaweedFS S3: the kept set
for --keep-last and --keep-every, the newest complete checkpoint kept behind an
incomplete one, --dry-run, a rename in flight, and bad input. Through a real mount:
tests/fuse/test_prune_mounted.py."""

from __future__ import annotations

import json
from pathlib import Path

from crafting import StoreUnderTest, checkpoint, new_store, read_back, snapshot
from mounting import run_cli

from ckptfs.format import manifests
from ckptfs.store.base import Store
from ckptfs.store.local import LocalStore
from ckptfs.tools import inspection, retention

STEPS = list(range(100, 1300, 100))  # step-100 .. step-1200


def series(store: Store, skip_newest: bool = False) -> None:
    """run/step-100 .. run/step-1200; the newest with a missing chunk if `skip_newest`."""
    for n in STEPS:
        checkpoint(store, f"run/step-{n}", skip=(1,) if skip_newest and n == STEPS[-1] else ())


def dirs(store: Store, path: str = "run") -> list[str]:
    prefix = manifests.dir_prefix(path)
    return sorted(p[len(prefix):].rstrip("/") for p in store.list(prefix).prefixes)


def steps(*ns: int) -> list[str]:
    return sorted(f"step-{n}" for n in ns)


# ---------------------------------------------------------------------------- policy
def test_keep_last_removes_the_older_ones(st: StoreUnderTest) -> None:
    series(st.store)
    st.store.put(manifests.file_key("run/notes.txt"), st.store.get(
        manifests.file_key("run/step-100/config.json")))  # a file beside: not a candidate
    want = {p: read_back(st.store, p) for p in ("run/step-1100/model.pt",
                                                  "run/step-1200/config.json")}
    d = st.json("prune", "run", "--keep-last", "3")
    assert d["kept"] == ["run/step-1200", "run/step-1100", "run/step-1000"]
    assert d["removed"] == [f"run/step-{n}" for n in reversed(STEPS[:-3])]
    assert d["newest_complete"] == "run/step-1200" and d["order"] == "number"
    assert d["deleted_keys"] == 2 * 9
    assert dirs(st.store) == steps(1000, 1100, 1200)
    assert st.store.head(manifests.file_key("run/notes.txt")) is not None
    for p, data in want.items():
        assert read_back(st.store, p) == data
    assert inspection.fsck(st.store).clean  # only manifests went; chunks wait for gc


def test_keep_every_keeps_the_multiples(st: StoreUnderTest) -> None:
    series(st.store)
    r = st.cli("prune", "run", "--keep-last", "3", "--keep-every", "500")
    assert r.returncode == 0, r.stderr
    assert dirs(st.store) == steps(500, 1000, 1100, 1200)
    assert "kept         run/step-500: step 500 is a multiple of 500 (--keep-every 500)" \
        in r.stdout, r.stdout
    assert "removed      run/step-900 (2 manifests and markers)" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("done         removed 8 of 12 ")


def test_incomplete_newest_keeps_its_complete_predecessor(st: StoreUnderTest) -> None:
    series(st.store, skip_newest=True)  # step-1200 lost a chunk
    d = st.json("prune", "run", "--keep-last", "1")
    assert dirs(st.store) == steps(1100, 1200)
    assert d["newest_complete"] == "run/step-1100"
    why = {c["path"]: c["reasons"] for c in d["checkpoints"]}  # type: ignore[attr-defined]
    assert why["run/step-1200"] == ["newest", "newer"]
    assert why["run/step-1100"] == ["latest"]
    assert inspection.latest(st.store, "run") == "run/step-1100"


def test_dry_run_changes_nothing(st: StoreUnderTest) -> None:
    series(st.store)
    before = snapshot(st.store)
    r = st.cli("prune", "run", "--keep-last", "2", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert snapshot(st.store) == before
    assert "would remove run/step-100 (2 manifests and markers)" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("dry run      10 of 12 ")
    d = st.json("prune", "run", "--keep-last", "2", "--dry-run")
    assert d["dry_run"] and len(d["removed"]) == 10 and d["deleted_keys"] == 0  # type: ignore[arg-type]
    assert snapshot(st.store) == before


def test_rename_in_flight_is_kept(st: StoreUnderTest) -> None:
    series(st.store)
    st.store.put("intents/node-b-7.json", json.dumps(
        {"v": 1, "op": "rename_dir", "src": "run/step-300", "dst": "old/step-300",
         "writer": "node-b"}).encode())
    d = st.json("prune", "run", "--keep-last", "2")
    assert dirs(st.store) == steps(300, 1100, 1200)
    [kept] = [c for c in d["checkpoints"] if c["path"] == "run/step-300"]  # type: ignore[attr-defined]
    assert kept["reasons"] == ["renaming"] and "node-b" in kept["why"][0]


def test_mtime_order_and_no_complete_checkpoint(local_store: LocalStore) -> None:
    """Names without numbers: ordered by mtime, as latest() does; with no complete
    checkpoint at all nothing is removed."""
    store = new_store(local_store)
    for i, name in enumerate(["alpha", "beta", "gamma", "delta"]):
        checkpoint(store, f"ck/{name}", mtime_ns=10**18 + i)
    r = retention.prune(store, "ck", keep_last=2)
    assert r.order == "mtime" and dirs(store, "ck") == ["delta", "gamma"]
    assert r.newest_complete == inspection.latest(store, "ck") == "ck/delta"
    for name in ["one", "two", "three"]:
        checkpoint(store, f"bad/{name}", skip=(0,))
    r = retention.prune(store, "bad", keep_last=1)
    assert not r.removed and dirs(store, "bad") == ["one", "three", "two"]


def test_children_go_before_their_directory_marker(local_store: LocalStore) -> None:
    keys = ["files/r/s/", "files/r/s/a", "files/r/s/sub/", "files/r/s/sub/x", "files/r/s/z"]
    groups = retention._deletion_order(keys)
    assert groups == [["files/r/s/sub/x"], ["files/r/s/z", "files/r/s/sub/", "files/r/s/a"],
                      ["files/r/s/"]]


# ---------------------------------------------------------------------------- errors
def test_bad_input_is_one_line_with_exit_2(tmp_path: Path, st: StoreUnderTest) -> None:
    series(st.store)
    before = snapshot(st.store)
    plain = tmp_path / "plain"
    plain.mkdir()
    cases = [
        ["ftp://x/y", "--keep-last", "1"],
        [str(plain), "--keep-last", "1"],                     # not a store
        [st.url, "run", "--keep-last", "0", *st.extra],
        [st.url, "run", "--keep-last", "-3", *st.extra],
        [st.url, "run", "--keep-last", "2", "--keep-every", "0", *st.extra],
        [st.url, "no/such/dir", "--keep-last", "2", *st.extra],
    ]
    for args in cases:
        r = run_cli("prune", *args, check=False, timeout=60)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(st.store) == before
