"""Store tools (inspection.py and `ckptfs verify/ls/latest/fsck`) on crafted stores.

The tests craft the store directly (chunks + manifests, as a writer would PUT them), on a
directory store and on real SeaweedFS S3. The same tools through a real mount:
tests/fuse/test_inspection_mounted.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from crafting import CHUNK, T0, StoreUnderTest, checkpoint, flip_byte, new_store, put_file, s3_url
from mounting import run_cli
from seaweed import SeaweedServer
from support import random_bytes

from ckptfs.common.errors import NoEntry
from ckptfs.format import manifests
from ckptfs.format.codec import chunk_hash, encode_chunk
from ckptfs.format.manifests import Manifest
from ckptfs.store.local import LocalStore
from ckptfs.store.s3 import S3Store
from ckptfs.tools import inspection


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture
def local(local_store: LocalStore) -> LocalStore:
    new_store(local_store)
    return local_store


# ---------------------------------------------------------------------------- the tools
def test_complete_file(st: StoreUnderTest) -> None:
    checkpoint(st.store, "step-1")
    files = inspection.list_files(st.store)
    assert [f.path for f in files] == ["step-1/config.json", "step-1/model.pt"]
    model = files[1]
    assert (model.size, model.n_chunks, model.writer, model.mtime_ns) == (
        3 * CHUNK + 100, 4, "node-a", T0)
    assert model.complete and not model.missing and not model.corrupt
    assert inspection.list_files(st.store, "step-1/model.pt")[0].size == 3 * CHUNK + 100
    assert inspection.verify(st.store, "step-1", deep=True).complete

    r = st.cli("verify", "step-1")
    assert r.returncode == 0, r.stderr
    assert "complete: 2 files" in r.stdout
    r = st.cli("ls", "--json")
    listed = {f["path"]: f for f in json.loads(r.stdout)}
    assert listed["step-1/model.pt"]["complete"] and listed["step-1/model.pt"]["chunks"] == 4


def test_missing_chunk_names_the_chunk_and_the_writer(st: StoreUnderTest) -> None:
    checkpoint(st.store, "step-1")
    hashes = put_file(st.store, "step-2/model.pt", random_bytes(3 * CHUNK), writer="node-7",
                      skip=(1,))
    result = inspection.verify(st.store, "step-2")
    assert not result.complete
    [p] = result.problems
    assert (p.path, p.kind, p.chunk, p.index, p.writer) == (
        "step-2/model.pt", "missing", hashes[1], 1, "node-7")
    assert inspection.verify(st.store, "step-1").complete

    r = st.cli("verify", "step-2")
    assert r.returncode == 1
    out = r.stdout
    assert "INCOMPLETE  step-2/model.pt" in out and "node-7" in out
    assert manifests.chunk_key(hashes[1]) in out and "1 of 3 chunks missing" in out
    assert out.strip().splitlines()[-1].startswith("INCOMPLETE: 1 of 1 files")
    r = st.cli("ls", "step-2")
    assert "missing 1" in r.stdout and "node-7" in r.stdout


def test_corrupt_chunk_is_found_only_deep(st: StoreUnderTest) -> None:
    hashes = put_file(st.store, "step-1/model.pt", random_bytes(2 * CHUNK))
    flip_byte(st.store, hashes[0])
    assert inspection.verify(st.store, "step-1").complete  # HEAD cannot see it
    deep = inspection.verify(st.store, "step-1", deep=True)
    assert [(p.kind, p.chunk, p.writer) for p in deep.problems] == [
        ("corrupt", hashes[0], "node-a")]
    assert st.cli("verify", "step-1").returncode == 0
    r = st.cli("verify", "step-1", "--deep")
    assert r.returncode == 1 and "corrupt" in r.stdout


def test_latest_orders_by_number_and_skips_incomplete(st: StoreUnderTest) -> None:
    for n in (2, 9, 10):
        checkpoint(st.store, f"run/checkpoint-{n}", mtime_ns=T0 - n)  # mtimes disagree
    checkpoint(st.store, "run/checkpoint-11", writer="node-dead", skip=(2,))
    st.store.put(manifests.dir_key("run/checkpoint-12"), b"")  # no files: not a checkpoint
    checkpoint(st.store, "run/other-99")
    assert inspection.latest(st.store, "run", "checkpoint-*") == "run/checkpoint-10"
    assert inspection.latest(st.store, "run") == "run/other-99"
    assert inspection.latest(st.store, "run", "nothing-*") is None

    r = st.cli("latest", "run", "--pattern", "checkpoint-*")
    assert (r.returncode, r.stdout) == (0, "run/checkpoint-10\n")
    r = st.cli("latest", "run", "--pattern", "nothing-*")
    assert r.returncode == 1 and "no complete checkpoint" in r.stderr


def test_latest_without_numbers_uses_mtime(local: LocalStore) -> None:
    checkpoint(local, "ck/alpha", mtime_ns=T0 + 5)
    checkpoint(local, "ck/beta", mtime_ns=T0 + 9)
    checkpoint(local, "ck/gamma", mtime_ns=T0 + 20, skip=(0,))
    checkpoint(local, "ck/delta", mtime_ns=T0 + 1)
    assert inspection.latest(local, "ck") == "ck/beta"


def test_rename_in_flight_is_not_complete(local: LocalStore) -> None:
    checkpoint(local, "run/step-1")
    checkpoint(local, "run/step-2")  # half copied from run/tmp-2 by a rename in flight
    local.put("intents/node-b-7.json", json.dumps(
        {"v": 1, "op": "rename_dir", "src": "run/tmp-2", "dst": "run/step-2",
         "writer": "node-b"}).encode())
    assert inspection.latest(local, "run", "step-*") == "run/step-1"
    result = inspection.verify(local, "run/step-2")
    assert [(p.kind, p.writer) for p in result.problems] == [("renaming", "node-b")]
    assert inspection.verify(local, "run/step-1").complete
    report = inspection.fsck(local)
    assert report.clean and [i.dst for i in report.intents] == ["run/step-2"]


def test_symlinks_unreadable_manifests_and_missing_paths(local: LocalStore) -> None:
    link = Manifest(size=8, mode=0o120777, mtime_ns=T0, target="step-1/x", writer="n")
    local.put(manifests.file_key("latest"), link.to_json())
    local.put(manifests.file_key("broken"), b"{not json")
    files = {f.path: f for f in inspection.list_files(local)}
    assert files["latest"].complete and files["latest"].target == "step-1/x"
    assert not files["broken"].complete and "not valid" in (files["broken"].error or "")
    with pytest.raises(NoEntry):
        inspection.verify(local, "no/such/dir")


def test_fsck(st: StoreUnderTest) -> None:
    checkpoint(st.store, "step-1")
    garbage = random_bytes(1000)
    st.store.put(manifests.chunk_key(chunk_hash(garbage)), encode_chunk(garbage)[0])
    report = inspection.fsck(st.store, deep=True)
    assert report.clean, report.to_dict()
    assert (report.files, report.chunks_referenced, report.garbage_chunks) == (2, 5, 1)
    r = st.cli("fsck")
    assert r.returncode == 0 and "1 unreferenced" in r.stdout

    hashes = put_file(st.store, "step-2/model.pt", random_bytes(2 * CHUNK))
    flip_byte(st.store, hashes[1])
    assert st.cli("fsck").returncode == 0
    r = st.cli("fsck", "--deep")
    assert r.returncode == 1, r.stdout
    assert "CORRUPT" in r.stdout and hashes[1] in r.stdout

    st.store.put(manifests.file_key("step-3/bad"), b'{"v": 1, "size": "x"}')
    missing = put_file(st.store, "step-3/model.pt", random_bytes(CHUNK), writer="node-9", skip=(0,))
    report = inspection.fsck(st.store)
    assert not report.clean
    assert {(p.path, p.kind) for p in report.problems} == {
        ("step-3/bad", "damaged"), ("step-3/model.pt", "missing")}
    r = st.cli("fsck", "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 1 and not d["clean"]
    assert {"path": "step-3/model.pt", "kind": "missing", "chunk": missing[0], "index": 0,
            "writer": "node-9", "detail": None} in d["problems"]


def test_fsck_without_store_info(local_store: LocalStore) -> None:
    put_file(local_store, "a", b"x")
    report = inspection.fsck(local_store)
    assert not report.clean and "no ckptfs.json" in (report.info_error or "")


def test_fsck_of_what_is_not_a_store_is_one_line_with_exit_2(
        tmp_path: Path, s3_store: S3Store) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a store")
    for args in ([str(plain)], [str(plain), "--json"],
                 [s3_url(s3_store), "--endpoint-url", s3_store.endpoint]):
        r = run_cli("fsck", *args, check=False, timeout=60)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
        assert "not a ckptfs store" in r.stderr, r.stderr
    # a store that lost only its ckptfs.json is still checked, and that is a problem found
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    put_file(LocalStore(damaged), "a", b"x")
    r = run_cli("fsck", str(damaged), check=False, timeout=60)
    assert r.returncode == 1 and "no ckptfs.json" in r.stdout, r.stdout + r.stderr


def test_errors_are_one_line_with_exit_2(tmp_path: Path, seaweed: SeaweedServer) -> None:
    cases = [
        ("verify", str(tmp_path / "nowhere")),
        ("ls", str(tmp_path)),  # a directory, but not a store
        ("fsck", f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", "--endpoint-url",
         seaweed.endpoint),
        ("latest", "ftp://x/y"),
    ]
    for args in cases:
        r = run_cli(*args, check=False, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    (tmp_path / "s").mkdir()
    store = new_store(LocalStore(tmp_path / "s"))
    r = run_cli("verify", str(tmp_path / "s"), "no/such/file", check=False)
    assert r.returncode == 2 and "no such file or directory in the store" in r.stderr
    store.put(manifests.INFO_KEY, b'{"format": 99, "chunk_size": 65536}')
    r = run_cli("ls", str(tmp_path / "s"), check=False)
    assert r.returncode == 2 and "newer than this ckptfs" in r.stderr
