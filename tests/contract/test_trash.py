"""The trash on crafted stores, local and SeaweedFS S3: what deletes (as a mount's
publisher applies them) and prune put there, `ckptfs trash ls|restore|empty`, and gc
counting trashed manifests as references until their time is up. Through real mounts:
tests/fuse/test_trash_mounted.py."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crafting import CHUNK, StoreUnderTest, checkpoint, put_file, read_back, stored_names
from mounting import run_cli
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.format.manifests import FILES, TRASH
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import Publisher
from ckptfs.store.base import ObjectInfo, Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.tools import gc, retention, trash

HOUR = 3600.0


@pytest.fixture
def publisher(st: StoreUnderTest, tmp_path: Path) -> Iterator[Publisher]:
    """A mount's publisher on `st`, node 'node-a', trash kept for an hour."""
    journal = Journal(str(tmp_path / "journal.sqlite"))
    yield Publisher(st.store, journal, None, "node-a", trash_keep=HOUR)  # type: ignore[arg-type]
    journal.close()


def tcli(st: StoreUnderTest, verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`ckptfs trash VERB STORE ARGS...`"""
    return run_cli("trash", verb, st.url, *args, *st.extra, check=False)


def tjson(st: StoreUnderTest, verb: str, *args: str) -> dict[str, Any]:
    """`ckptfs trash VERB STORE ARGS... --json`, which must exit 0: its answer."""
    r = tcli(st, verb, *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(json.loads(r.stdout))


def trash_keys(store: Store) -> list[str]:
    return sorted(k for k, _ in store.list(TRASH, None).objects)


def files_under(store: Store, path: str) -> dict[str, bytes]:
    return {k[len(FILES):]: read_back(store, k[len(FILES):])
            for k, _ in store.list(manifests.dir_prefix(path), None).objects
            if not k.endswith("/")}


def names_under(store: Store, path: str) -> set[str]:
    """The chunks the files under `path` name."""
    return {h for k, _ in store.list(manifests.dir_prefix(path), None).objects
            if not k.endswith("/")
            for h, _ in manifests.Manifest.from_json(store.get(k)).chunks}


def rm_rf(publisher: Publisher, path: str, seq: int = 10) -> list[Op]:
    """What `rm -rf path` journals, applied as the publisher applies a batch of deletes:
    the files, then the directory. Returns the ops (applying them again is a replay)."""
    files = [k[len(FILES):] for k, _ in publisher.store.list(manifests.dir_prefix(path),
                                                             None).objects
             if not k.endswith("/")]
    now = time.time()
    ops = [Op(seq + i, "delete_file", p, journaled_at=now) for i, p in enumerate(files)]
    ops.append(Op(seq + len(files), "delete_dir", path, journaled_at=now))
    publisher._apply_sync(ops)
    return ops


def test_rm_rf_goes_to_the_trash_and_comes_back_byte_for_byte(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """The deletes copy every manifest, and the directory's marker, into one trash batch
    before deleting them; applied again (a replay after a crash) they change nothing;
    `trash ls` shows one item; `trash restore` puts back the same bytes and leaves the
    trash empty."""
    st.store.put(manifests.dir_key("run/step-1"), manifests.DirMarker(0o750, 123).to_json())
    checkpoint(st.store, "run/step-1")
    checkpoint(st.store, "run/step-2")
    want = files_under(st.store, "run/step-1")
    marker = st.store.get(manifests.dir_key("run/step-1"))

    ops = rm_rf(publisher, "run/step-1")
    assert st.store.list(manifests.dir_prefix("run/step-1"), None).objects == []
    keys = trash_keys(st.store)
    batch = keys[0].split("/")[1]
    assert batch.endswith("-1h-10-node-a") and trash.BATCH.fullmatch(batch)
    assert keys == [f"{TRASH}{batch}/run/step-1/{n}" for n in ("", "config.json", "model.pt")]
    before = {k: st.store.get(k) for k in keys}
    publisher._apply_sync(ops)  # a replay: the manifests are gone, the trash stays
    assert {k: st.store.get(k) for k in trash_keys(st.store)} == before

    ls = tjson(st, "ls")
    [item] = ls["items"]
    assert (item["path"], item["dir"], item["files"], item["node"]) == (
        "run/step-1", True, 2, "node-a")
    assert item["bytes"] == sum(len(v) for v in want.values())
    assert item["expires"] - item["deleted"] == HOUR

    r = tcli(st, "restore", "run/step-1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("restored 2 files"), r.stdout
    assert files_under(st.store, "run/step-1") == want
    if st.local:  # SeaweedFS keeps no body in the marker of a directory with entries
        assert st.store.get(manifests.dir_key("run/step-1")) == marker  # mode and mtime
    assert trash_keys(st.store) == []
    assert gc.collect(st.store, 0.0).fossilized.count == 0


def test_a_rename_over_a_file_keeps_the_replaced_version(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """torch.save to a temporary name, then a rename over the last checkpoint: the
    replaced version goes to the trash, once (not again on a replay, when the name holds
    the new version), and comes back under another name."""
    old, new = random_bytes(CHUNK + 5, seed=1), random_bytes(CHUNK + 7, seed=2)
    put_file(st.store, "last.pt", old)
    put_file(st.store, "last.pt.tmp", new)
    op = Op(20, "rename_file", "last.pt.tmp", "last.pt", journaled_at=time.time())
    publisher._apply_sync([op])
    publisher._apply_sync([op])
    [key] = trash_keys(st.store)
    assert key.endswith("-1h-20-node-a/last.pt")
    assert read_back(st.store, "last.pt") == new

    r = tcli(st, "restore", "last.pt")  # the name is taken: left in the trash
    assert r.returncode == 1 and "left in the trash last.pt: last.pt exists" in r.stdout, (
        r.stdout + r.stderr)
    r = tcli(st, "restore", "last.pt", "--to", "previous.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert read_back(st.store, "previous.pt") == old
    assert read_back(st.store, "last.pt") == new


def test_put_if_absent_never_replaces_an_object(st: StoreUnderTest) -> None:
    """The conditional create restore writes with: refused over an object that exists,
    by the server itself where it can (S3 If-None-Match: *, Azure If-None-Match: *, GCS
    ifGenerationMatch=0, link(2) on a directory store): all four servers here honour it
    (an S3 server's is probed once: SeaweedFS answers 412)."""
    assert st.store.put_if_absent("x/new", b"first") is True
    assert st.store.put_if_absent("x/new", b"second") is False
    assert st.store.get("x/new") == b"first"
    assert st.store.atomic_create is True
    assert [k for k, _ in st.store.list("", None).objects if "probe" in k] == []


class PublishedMeanwhile(FaultyStore):
    """A store on which another node publishes `path` just after restore found it free:
    between its check (a HEAD) and its write."""

    def __init__(self, inner: Store, path: str, data: bytes) -> None:
        super().__init__(inner)
        self.key, self.data, self.done = manifests.file_key(path), data, False

    def head(self, key: str) -> int | None:
        size = self.inner.head(key)
        if key == self.key and size is None and not self.done:
            self.done = True
            put_file(self.inner, self.key[len(FILES):], self.data)
        return size


def test_a_restore_that_loses_the_race_leaves_the_new_file_alone(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """A file published at the name while restore runs wins: restore skips that path
    (exit 1 on the command line, as for a name that exists again) and never overwrites
    it; the old version stays in the trash."""
    old, new = random_bytes(CHUNK + 3, seed=5), random_bytes(CHUNK + 9, seed=6)
    put_file(st.store, "d/model.pt", old)
    put_file(st.store, "d/other.pt", b"other")
    rm_rf(publisher, "d")
    r = trash.restore(PublishedMeanwhile(st.store, "d/model.pt", new), "d")
    assert [e.path for e in r.restored] == ["d", "d/other.pt"]
    [(entry, why)] = r.skipped
    assert (entry.path, why) == ("d/model.pt", "d/model.pt exists (published while this "
                                 "restore ran)")
    assert read_back(st.store, "d/model.pt") == new
    assert read_back(st.store, "d/other.pt") == b"other"
    [left] = trash_keys(st.store)
    assert left.endswith("/d/model.pt")


class SwappedAfterRead(FaultyStore):
    """A store on which someone replaces the trash entry `key` with `data` right after its
    first GET: between the read that checked it and whatever comes after."""

    def __init__(self, inner: Store, key: str, data: bytes) -> None:
        super().__init__(inner)
        self.key, self.data, self.swapped = key, data, False

    def get(self, key: str, limit: int | None = None) -> bytes:
        blob = self.inner.get(key) if limit is None else self.inner.get(key, limit)
        if key == self.key and not self.swapped:
            self.swapped = True
            self.inner.put(key, self.data)
        return blob


def test_restore_publishes_only_bytes_it_has_checked(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """A trash entry swapped, after restore checked it, for bytes that are no manifest (a
    root-only file's, say): restore publishes exactly the bytes it parsed, never those of
    a second read it did not check; here it skips the entry as damaged, and the name stays
    free."""
    put_file(st.store, "d/model.pt", random_bytes(CHUNK + 3, seed=7))
    rm_rf(publisher, "d")
    [key] = [k for k in trash_keys(st.store) if k.endswith("/d/model.pt")]
    swapped = SwappedAfterRead(st.store, key, b"root-only bytes, not a manifest")
    r = trash.restore(swapped, "d")
    assert swapped.swapped and [e.path for e in r.restored] == ["d"]
    [(entry, why)] = r.skipped
    assert entry.path == "d/model.pt" and why.startswith("damaged: manifest is not valid"), why
    assert st.store.head(manifests.file_key("d/model.pt")) is None


def test_without_trash_deletes_are_final(st: StoreUnderTest, publisher: Publisher) -> None:
    publisher.trash_keep = 0
    checkpoint(st.store, "step-1")
    rm_rf(publisher, "step-1")
    assert trash_keys(st.store) == []
    assert st.store.list(FILES, None).objects == []


def test_gc_keeps_what_the_trash_names_until_its_time_is_up(
        st: StoreUnderTest, publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a deleted checkpoint is in the trash, gc (grace 0) keeps its chunks, even a
    minute before its time is up by the store's clock; once it is up, gc deletes the
    entry and the next runs set the chunks aside and free them, leaving the files that
    remain intact. gc's store clock is moved on instead of waiting (S3 times have whole
    seconds)."""
    checkpoint(st.store, "step-1")
    checkpoint(st.store, "step-2")
    doomed = names_under(st.store, "step-1") - names_under(st.store, "step-2")
    keep = files_under(st.store, "step-2")
    rm_rf(publisher, "step-1")  # kept for HOUR
    deleted = max(i.mtime for i in st.store.scan(TRASH))
    real_store_time = gc.store_time
    ahead = 0.0

    def moved_on(store: Store) -> float:
        return real_store_time(store) + ahead

    monkeypatch.setattr(gc, "store_time", moved_on)
    r = gc.collect(st.store, 0.0)
    assert r.trash_expired.count == 0 and r.fossilized.count == 0, r.to_dict()
    ahead = deleted + HOUR - 60.0 - real_store_time(st.store)  # a minute before
    r = gc.collect(st.store, 0.0)
    assert r.trash_expired.count == 0 and r.fossilized.count == 0, r.to_dict()
    assert doomed <= stored_names(st.store)
    ahead = HOUR + 1.0  # its time is up
    dry = gc.collect(st.store, 0.0, dry_run=True)
    assert dry.trash_expired.count == 3 and dry.fossilized.count == len(doomed)
    assert len(trash_keys(st.store)) == 3
    r = gc.collect(st.store, 0.0)
    assert r.trash_expired.count == 3 and r.fossilized.count == len(doomed), r.to_dict()
    assert trash_keys(st.store) == []
    assert gc.collect(st.store, 0.0).freed.count == len(doomed)
    assert stored_names(st.store) & doomed == set()
    assert files_under(st.store, "step-2") == keep


def test_restore_takes_the_newest_version_of_each_file(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """A directory deleted twice (rebuilt in between): the trash lists both, and restore
    puts back the newest version of each file, including one only the older deletion
    had; `trash empty` then deletes the rest."""
    put_file(st.store, "d/a", b"a1")
    put_file(st.store, "d/b", b"b1")
    rm_rf(publisher, "d", seq=10)
    time.sleep(1.1)  # S3 times have whole seconds: two deletions, in order
    put_file(st.store, "d/a", b"a2")
    rm_rf(publisher, "d", seq=20)
    ls = tjson(st, "ls")
    assert [(i["path"], i["files"]) for i in ls["items"]] == [("d", 1), ("d", 2)]
    tjson(st, "restore", "d")
    assert files_under(st.store, "d") == {"d/a": b"a2", "d/b": b"b1"}
    gone = tjson(st, "empty")
    assert gone["entries"] == 2 and gone["files"] == 1
    assert trash_keys(st.store) == []


def test_prune_moves_what_it_removes_to_the_trash(st: StoreUnderTest) -> None:
    for step in (1, 2, 3):
        checkpoint(st.store, f"run/step-{step}")
    want = files_under(st.store, "run/step-1")
    r = st.cli("prune", "run", "--keep-last", "2")
    assert r.returncode == 0 and "in the trash for 24h" in r.stdout, r.stdout + r.stderr
    assert st.store.list(manifests.dir_prefix("run/step-1"), None).objects == []
    [item] = tjson(st, "ls", "run")["items"]
    assert (item["path"], item["files"]) == ("run/step-1", 2)
    tjson(st, "restore", "run/step-1")
    assert files_under(st.store, "run/step-1") == want
    r = st.cli("prune", "run", "--keep-last", "2", "--trash-hours", "0")
    assert r.returncode == 0 and trash_keys(st.store) == []


class ScanInFlight(FaultyStore):
    """A store whose `nth` scan of `prefix` calls `during` once, after yielding the key
    `after`: a change made while gc lists (keys it creates behind the walk are missed)."""

    def __init__(self, inner: Store, prefix: str, after: str,
                 during: Callable[[], object], nth: int = 1) -> None:
        super().__init__(inner)
        self.prefix, self.after, self.during, self.nth = prefix, after, during, nth
        self.scans = 0
        self.done = False

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        self.scans += prefix == self.prefix
        for info in self.inner.scan(prefix):
            yield info
            if (prefix == self.prefix and info.key == self.after and not self.done
                    and self.scans == self.nth):
                self.done = True
                self.during()


@pytest.mark.parametrize("passes", [1, 2])
def test_a_delete_during_the_listing_is_counted_from_the_trash(
        st: StoreUnderTest, publisher: Publisher, passes: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`rm -rf z` lands while gc lists files/ (after a/keep): the listing misses z's
    manifests, but the trash is listed after files/, and the delete copied them there
    first: even one listing keeps z's chunks."""
    monkeypatch.setattr(gc, "LISTING_PASSES", passes)
    put_file(st.store, "a/keep", random_bytes(CHUNK, seed=3))
    checkpoint(st.store, "z")
    want = files_under(st.store, "z")
    store = ScanInFlight(st.store, FILES, manifests.file_key("a/keep"),
                         lambda: rm_rf(publisher, "z"))
    r = gc.collect(store, 0.0)
    assert store.done and r.fossilized.count == 0, r.to_dict()
    tjson(st, "restore", "z")
    assert files_under(st.store, "z") == want


def test_a_restore_during_the_listing_is_counted_by_the_second_pass(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """`trash restore` moves a manifest from trash/ back to files/ while gc lists trash/
    (after the listing of files/ missed it): the second listing finds it in files/."""
    checkpoint(st.store, "z")
    want = files_under(st.store, "z")
    rm_rf(publisher, "z")
    put_file(st.store, "a/keep", random_bytes(CHUNK, seed=4))
    first = trash_keys(st.store)[0]
    # (gc's first scan of trash/ is its first listing of references; it looks for expired
    # entries only after the second)
    store = ScanInFlight(st.store, TRASH, first, lambda: trash.restore(st.store, "z"), 1)
    r = gc.collect(store, 0.0)
    assert store.done and r.fossilized.count == 0 and r.manifests_reread >= 2, r.to_dict()
    assert files_under(st.store, "z") == want


def test_bad_input_is_one_line(st: StoreUnderTest, tmp_path: Path) -> None:
    cases = [
        (["trash", "restore", st.url, "nothing/here", *st.extra], "nothing at nothing/here"),
        (["trash", "restore", st.url, *st.extra], "name what to restore"),
        (["trash", "ls", str(tmp_path / "absent")], "store directory does not exist"),
        (["trash", "ls", "s3://", *st.extra], "ckptfs: "),
        (["prune", st.url, "--keep-last", "1", "--trash-hours", "-1", *st.extra],
         "--trash-hours must be 0"),
    ]
    for verb in ("ls", "restore", "empty"):  # the same refusal from each verb
        cases.append((["trash", verb, st.url, "run/../x", *st.extra],
                      "'..' in a path in the store: run/../x"))
    cases.append((["trash", "restore", st.url, "a", "--to", "../b", *st.extra],
                  "'..' in a path in the store: ../b"))
    for args, words in cases:
        r = run_cli(*args, check=False)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_unknown_batch_names_are_kept_until_emptied(st: StoreUnderTest) -> None:
    """A trash object whose batch ckptfs cannot read is a reference for good: gc never
    expires it (it cannot know its time), `trash empty` deletes it."""
    put_file(st.store, "x", b"payload")
    st.store.copy(manifests.file_key("x"), f"{TRASH}by-hand/x")
    st.store.delete(manifests.file_key("x"))
    r = gc.collect(st.store, 0.0)
    assert r.trash_expired.count == 0 and r.fossilized.count == 0
    [item] = tjson(st, "ls")["items"]
    assert item["expires"] is None and item["node"] == "?"
    assert json.loads(tcli(st, "empty", "--json").stdout)["entries"] == 1


def test_retention_remove_tree_with_a_batch(st: StoreUnderTest) -> None:
    checkpoint(st.store, "c")
    n = retention.remove_tree(st.store, "c", trash.batch_id(HOUR, 0, "cli"))
    assert n == 2 and len(trash_keys(st.store)) == 3


def test_path_forms_and_hints_are_commands_that_work(
        st: StoreUnderTest, publisher: Publisher) -> None:
    """`trash ls` shows its times in UTC and ends with a restore command that works as
    printed; `--to` takes a path from the root with or without a leading '/', and each
    line names where the entry went; a prune's node is `<host>-cli`."""
    put_file(st.store, "run/a.pt", b"a1")
    put_file(st.store, "run/b.pt", b"b1")
    rm_rf(publisher, "run")
    r = tcli(st, "ls", "/run")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("20") and lines[1][:23].endswith(" UTC"), lines
    hint = lines[-1].split("put one back with: ")[1]
    assert shlex.split(hint)[:4] == ["ckptfs", "trash", "restore", st.url]
    r = tcli(st, "restore", "run/a.pt", "--to", "/elsewhere/a.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "restored run/a.pt to elsewhere/a.pt (2 B)", r.stdout
    assert read_back(st.store, "elsewhere/a.pt") == b"a1"
    r = run_cli(*shlex.split(hint)[1:], check=False)  # the hint, as printed
    assert r.returncode == 0, r.stdout + r.stderr
    assert read_back(st.store, "run/b.pt") == b"b1"

    checkpoint(st.store, "ckpt/step-1")
    checkpoint(st.store, "ckpt/step-2")
    assert st.cli("prune", "ckpt", "--keep-last", "1").returncode == 0
    [item] = tjson(st, "ls", "ckpt")["items"]
    assert item["node"] == f"{socket.gethostname()}-cli", item


def test_a_removed_directory_is_on_record_with_its_files(st: StoreUnderTest) -> None:
    """remove_tree keeps a directory's marker beside its files in one batch, every time:
    `trash ls` folds them into one line, and a restore brings the directory back. (On
    SeaweedFS, a marker copied at the same moment as its files went missing in 2 of 40
    such removals while keep_all copied everything at once: 40 of them there.)"""
    removals = 40 if st.kind == "s3" else 5
    for n in range(removals):
        st.store.put(manifests.dir_key(f"run/c{n}"), manifests.DirMarker().to_json())
        for i in range(5):
            put_file(st.store, f"run/c{n}/f{i}", random_bytes(100, n * 5 + i))
        retention.remove_tree(st.store, f"run/c{n}", trash.batch_id(3600, n, "t"))
    found = trash.entries(st.store, "run")
    removed = sorted(f"run/c{n}" for n in range(removals))
    assert sorted(e.path for e in found if e.is_dir) == removed
    assert sorted(it.head.path for it in trash.items(found)) == removed
