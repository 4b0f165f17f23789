"""`ckptfs du` on crafted stores, local and SeaweedFS S3: logical, referenced and unique
bytes of checkpoint directories that share chunks, unreferenced chunks and fossils, and
the one-line errors. Through a real mount: tests/fuse/test_usage_mounted.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from crafting import CHUNK, StoreUnderTest, put_file
from mounting import run_cli
from seaweed import SeaweedServer
from support import random_bytes

from ckptfs.common.errors import NoEntry
from ckptfs.format import manifests
from ckptfs.format.codec import chunk_hash, encode_chunk
from ckptfs.store.base import Store
from ckptfs.tools import usage


def stored(store: Store, *hashes: str, prefix: str = manifests.CHUNKS) -> int:
    """The stored bytes of these chunk objects (under chunks/ or fossils/)."""
    key = manifests.chunk_key if prefix == manifests.CHUNKS else manifests.fossil_key
    sizes = [store.head(key(h)) for h in hashes]
    assert None not in sizes, hashes
    return sum(s for s in sizes if s is not None)


def put_chunk(store: Store, data: bytes, key: str = manifests.CHUNKS) -> str:
    h = chunk_hash(data)
    store.put(f"{key}{h[:2]}/{h}", encode_chunk(data)[0])
    return h


def test_shared_unique_and_unreferenced_bytes(st: StoreUnderTest) -> None:
    """run/step-1 and run/step-2 share a0 and a1; step-2 adds b (set aside as a fossil by
    gc, still referenced); run/notes is a file directly in run; other/x, outside run,
    names a1 too. A garbage chunk and an unreferenced fossil are what gc would free."""
    s = st.store
    a = random_bytes(2 * CHUNK, seed=11)
    b = random_bytes(CHUNK, seed=12)
    a0, a1 = put_file(s, "run/step-1/model.pt", a)
    put_file(s, "run/step-2/model.pt", a + b)
    b0 = chunk_hash(b)
    s.rename(manifests.chunk_key(b0), manifests.fossil_key(b0))
    [t] = put_file(s, "run/notes", b"hello")
    [o] = put_file(s, "other/x", a[CHUNK:] + random_bytes(100, seed=13))[1:]
    garbage = put_chunk(s, random_bytes(1000, seed=14))
    fossil = put_chunk(s, random_bytes(2000, seed=15), manifests.FOSSILS)
    s.put(manifests.dir_key("run/empty"), b"")  # a directory without files

    r = usage.du(s, "run")
    dirs = {d.path: d for d in r.dirs}
    assert list(dirs) == ["run/empty", "run/step-1", "run/step-2"]
    one, two, empty = dirs["run/step-1"], dirs["run/step-2"], dirs["run/empty"]
    b_bytes = stored(s, b0, prefix=manifests.FOSSILS)
    assert (one.files, one.logical_bytes, one.referenced.count, one.referenced.bytes) == (
        1, 2 * CHUNK, 2, stored(s, a0, a1))
    assert (one.unique.count, one.unique.bytes) == (0, 0)
    assert (two.files, two.logical_bytes, two.referenced.count, two.referenced.bytes) == (
        1, 3 * CHUNK, 3, stored(s, a0, a1) + b_bytes)
    assert (two.unique.count, two.unique.bytes) == (1, b_bytes)
    assert (empty.files, empty.logical_bytes, empty.referenced.bytes, empty.unique.bytes
            ) == (0, 0, 0, 0)
    total = r.total
    assert (total.files, total.logical_bytes) == (3, 5 * CHUNK + 5)
    assert (total.referenced.count, total.referenced.bytes) == (
        4, stored(s, a0, a1, t) + b_bytes)
    assert (total.unique.count, total.unique.bytes) == (3, stored(s, a0, t) + b_bytes)  # not a1
    # ratios from the manifests' chunk lengths: a0 and a1 are named twice in run
    assert (one.referenced_raw, two.referenced_raw, total.referenced_raw) == (
        2 * CHUNK, 3 * CHUNK, 3 * CHUNK + 5)
    assert total.dedup_ratio == round((5 * CHUNK + 5) / (3 * CHUNK + 5), 3)
    assert total.compression_ratio == round((3 * CHUNK + 5) / total.referenced.bytes, 3)
    assert total.referenced.bytes > total.referenced_raw  # random bytes: raw, plus headers
    assert empty.dedup_ratio is None and empty.compression_ratio is None
    fossil_bytes = stored(s, fossil, prefix=manifests.FOSSILS)
    assert (r.stored.count, r.stored.bytes) == (
        7, stored(s, a0, a1, t, o, garbage) + b_bytes + fossil_bytes)
    assert (r.fossils.count, r.fossils.bytes) == (2, b_bytes + fossil_bytes)
    assert (r.unreferenced.count, r.unreferenced.bytes) == (
        2, stored(s, garbage) + fossil_bytes)
    assert r.missing == 0 and r.unreadable == []

    whole = usage.du(s)
    assert [d.path for d in whole.dirs] == ["other", "run"]
    assert whole.total.referenced.bytes == whole.total.unique.bytes == (
        r.stored.bytes - r.unreferenced.bytes)
    assert whole.dirs[1].unique.bytes == total.unique.bytes

    cli = st.cli("du", "run", "--json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == r.to_dict()
    table = st.cli("du", "run")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["directory", "files", "logical", "referenced", "unique",
                                "dedup", "compr"]
    assert lines[2].split()[:2] == ["run/step-1", "1"] and lines[2].split()[-4:-2] == [
        "0", "B"]
    assert lines[4].split()[-2] == f"{total.dedup_ratio:.2f}x"
    assert lines[4].startswith("run (all) ")
    assert "7 chunk objects" in lines[5] and "2 unreferenced" in lines[5]


def test_a_fossil_beside_its_chunk_is_freed_and_a_missing_chunk_is_counted(
        st: StoreUnderTest) -> None:
    s = st.store
    [h] = put_file(s, "ck/a", random_bytes(CHUNK, seed=21))
    s.copy(manifests.chunk_key(h), manifests.fossil_key(h))  # uploaded again after gc
    put_file(s, "ck/b", random_bytes(CHUNK, seed=22), skip=(0,))
    r = usage.du(s)
    assert r.missing == 1
    assert (r.unreferenced.count, r.unreferenced.bytes) == (
        1, stored(s, h, prefix=manifests.FOSSILS))
    assert r.total.referenced.bytes == stored(s, h)
    out = st.cli("du").stdout
    assert "1 chunks named by a manifest are in neither" in out, out


def test_errors_are_one_line_with_exit_2(st: StoreUnderTest, tmp_path: Path,
                                         seaweed: SeaweedServer) -> None:
    put_file(st.store, "run/step-1/a", b"x")
    with pytest.raises(NoEntry):
        usage.du(st.store, "run/nope")
    plain = tmp_path / "plain"
    plain.mkdir()
    cases = [
        [st.url, "run/nope", *st.extra],
        [st.url, "run/step-1/a", *st.extra],  # a file, not a directory
        [str(plain)],
        [str(tmp_path / "nowhere")],
        ["ftp://x/y"],
        [f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", "--endpoint-url", seaweed.endpoint],
    ]
    for args in cases:
        r = run_cli("du", *args, check=False, timeout=60)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    r = st.cli("du", "run/nope")
    assert "no such directory in the store: run/nope" in r.stderr
