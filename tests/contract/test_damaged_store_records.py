"""The store tools on a directory store with one damaged record: each names it on one line
with the documented exit code and no traceback, and works on everything else; gc stops
before it changes anything."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from crafting import StoreUnderTest, checkpoint, make_st, put_file, snapshot
from mounting import run_cli

from ckptfs.common.config import LIMITS
from ckptfs.format import manifests
from ckptfs.format.codec import chunk_hash, encode_chunk
from ckptfs.format.manifests import Manifest

DAMAGE: list[dict[str, Any]] = [{"mode": -1}, {"mode": 2**70},
                                {"size": 1e308, "chunks": [["0" * 32, 1e308]]}]
BAD = "step-2/model.pt"


@pytest.fixture
def local(request: pytest.FixtureRequest) -> StoreUnderTest:
    return make_st("local", request)


def damage(st: StoreUnderTest, key: str, **changes: Any) -> None:
    st.store.put(key, json.dumps({**json.loads(st.store.get(key)), **changes}).encode())


def lines_naming(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if name in line]


def no_traceback(*outputs: str) -> None:
    for out in outputs:
        assert "Traceback" not in out and "Error:" not in out, out


@pytest.mark.parametrize("changes", DAMAGE, ids=["mode-1", "mode-2**70", "length-1e308"])
def test_a_damaged_manifest_is_one_line_in_every_store_tool(
        local: StoreUnderTest, changes: dict[str, Any]) -> None:
    st = local
    checkpoint(st.store, "step-1")
    checkpoint(st.store, "step-2")
    key = manifests.file_key(BAD)
    damage(st, key, **changes)

    r = st.cli("ls")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 0 and r.stderr == ""
    [line] = lines_naming(r.stdout, BAD)
    assert "damaged" in line and "manifest is not valid" in line, line
    assert len([x for x in r.stdout.splitlines() if "  ok  " in x]) == 3, r.stdout

    r = st.cli("verify")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 1 and r.stderr == ""
    assert [x for x in r.stdout.splitlines() if x.startswith("DAMAGED")] == \
        lines_naming(r.stdout, BAD) and len(lines_naming(r.stdout, BAD)) == 1, r.stdout
    assert st.cli("verify", "step-1").returncode == 0

    r = st.cli("latest")
    no_traceback(r.stdout, r.stderr)
    assert (r.returncode, r.stdout) == (0, "step-1\n")
    [line] = r.stderr.splitlines()
    assert f"DAMAGED {BAD}: manifest is not valid" in line, r.stderr

    r = st.cli("du")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 0 and r.stderr == ""
    assert len(lines_naming(r.stdout, key)) == 1, r.stdout

    before = snapshot(st.store)
    for dry in (["--dry-run"], []):
        r = st.cli("gc", "--grace", "0", "--no-writers", *dry)
        no_traceback(r.stdout)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        [line] = r.stderr.splitlines()
        assert key in line and "gc stopped" in line, line
        assert snapshot(st.store) == before

    r = st.cli("fsck")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 1 and r.stderr == ""
    [line] = lines_naming(r.stdout, BAD)
    assert line.startswith("DAMAGED ") and "manifest is not valid" in line, line
    assert "PROBLEMS     1 problems" in r.stdout, r.stdout


def test_gc_stops_before_it_expires_the_trash(local: StoreUnderTest) -> None:
    """The trash entries whose time is up are deleted only after every manifest was read."""
    st = local
    checkpoint(st.store, "step-1")
    put_file(st.store, "gone.bin", b"x" * 100)
    st.store.copy(manifests.file_key("gone.bin"),
                  f"{manifests.TRASH}20260101T000000Z-1s-1-node-a/gone.bin")
    st.store.delete(manifests.file_key("gone.bin"))
    damage(st, manifests.file_key("step-1/model.pt"), mode=True)
    time.sleep(1.5)  # the trash entry's time is up
    before = snapshot(st.store)
    r = st.cli("gc", "--grace", "0", "--no-writers")
    assert r.returncode == 2 and "files/step-1/model.pt" in r.stderr, r.stderr
    assert snapshot(st.store) == before


def test_damaged_markers_trash_entries_and_intents(local: StoreUnderTest) -> None:
    st = local
    checkpoint(st.store, "step-1")
    checkpoint(st.store, "d/step-2")
    st.store.put(manifests.dir_key("d"), b'{"v": 1, "mode": 16877, "mtime_ns": 1e400}')
    put_file(st.store, "old.bin", b"old bytes")
    trashed = f"{manifests.TRASH}20260101T000000Z-7d-1-node-a/old.bin"
    st.store.copy(manifests.file_key("old.bin"), trashed)
    st.store.delete(manifests.file_key("old.bin"))
    damage(st, trashed, chunks="none")
    intent = f"{manifests.INTENTS}node-a-9.json"
    st.store.put(intent, b'{"v": 1, "op": "rename_dir", "src": "x", "dst": "x/y"}')

    r = st.cli("fsck")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 1, r.stdout
    for name in ("files/d/", trashed, intent):
        [line] = lines_naming(r.stdout, name)
        assert line.startswith("DAMAGED "), line
    assert "PROBLEMS     3 problems" in r.stdout, r.stdout

    r = st.cli("verify", "step-1")  # a damaged intent may be a rename half done anywhere
    assert r.returncode == 1 and len(lines_naming(r.stdout, intent)) == 1, r.stdout
    assert st.cli("ls", "d").returncode == 0  # a damaged marker: its files are listed

    before = snapshot(st.store)
    r = st.cli("gc", "--dry-run", "--grace", "0", "--no-writers")
    assert r.returncode == 2 and trashed in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(st.store) == before

    r = run_cli("trash", "ls", st.url, check=False)
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 0 and len(lines_naming(r.stdout, f"DAMAGED  {trashed}")) == 1
    r = run_cli("trash", "restore", st.url, "old.bin", check=False)
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 1 and "left in the trash" in r.stdout and "damaged" in r.stdout
    assert snapshot(st.store) == before


@pytest.mark.parametrize("info", [b'{"format": true, "chunk_size": 65536}',
                                  b'{"format": 2, "chunk_size": 1e308}',
                                  b'{"format": 1, "chunk_size": 65536, "created_at": NaN}',
                                  b'{"format": 2, "chunk_size": 65536, "chunking": "records",'
                                  b' "codec": ["zstd4"]}'])
def test_a_damaged_ckptfs_json_is_one_line_and_exit_2(local: StoreUnderTest,
                                                      info: bytes) -> None:
    st = local
    checkpoint(st.store, "step-1")
    st.store.put(manifests.INFO_KEY, info)
    for command in (["ls"], ["verify"], ["latest"], ["du"], ["gc", "--dry-run"],
                    ["trash", "ls"], ["trash", "restore"], ["upgrade"]):
        r = run_cli(*command[:-1], command[-1], st.url, check=False) if command[0] == "trash" \
            else st.cli(*command)
        assert r.returncode == 2 and r.stdout == "", (command, r.stdout, r.stderr)
        [line] = r.stderr.splitlines()
        assert line.startswith("ckptfs: ckptfs.json is not valid: "), (command, line)
    r = st.cli("fsck")  # the tool for damage reports it, and checks the rest
    assert r.returncode == 1 and "ERROR        ckptfs.json is not valid: " in r.stdout


def test_a_manifest_over_the_record_cap_is_damaged_unread(
        request: pytest.FixtureRequest) -> None:
    """A manifest larger than LIMITS.record_bytes on S3 (SeaweedFS), here a valid one of
    1.8 million empty chunks (70 MB): a reader refuses it by its length, before reading
    it, as damaged, on one line; the other files read as before."""
    st = make_st("s3", request)
    checkpoint(st.store, "step-1")
    empty = chunk_hash(b"")
    st.store.put(manifests.chunk_key(empty), encode_chunk(b"")[0])
    entry = f'["{empty}",0]'.encode()

    def manifest(chunks: int) -> bytes:  # as Manifest.to_json writes it, only faster
        return (b'{"v":1,"size":0,"mode":33188,"mtime_ns":0,"chunk_size":65536,"chunks":['
                + b",".join([entry] * chunks) + b'],"writer":"node-a"}')

    assert Manifest.from_json(manifest(3)).chunks == ((empty, 0),) * 3
    body = manifest(1_800_000)
    assert len(body) > LIMITS.record_bytes
    st.store.put(manifests.file_key("step-1/huge.pt"), body)
    del body

    r = st.cli("ls")
    no_traceback(r.stdout, r.stderr)
    assert r.returncode == 0 and r.stderr == ""
    [line] = lines_naming(r.stdout, "huge.pt")
    assert "damaged" in line and f"more than the {LIMITS.record_bytes >> 20} MiB" in line, line
    assert len([x for x in r.stdout.splitlines() if "  ok  " in x]) == 2, r.stdout
