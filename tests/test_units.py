"""Unit tests of the pure modules: chunking, codec, manifests and the SQLite journal."""

from __future__ import annotations

import itertools
import json
import os
import stat
import struct

import pytest
import xxhash

from ckptfs import codec, manifests
from ckptfs.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, FixedChunker
from ckptfs.errors import CorruptChunkError, FormatError, InvalidKeyError, JournalError
from ckptfs.journal import Journal, PendingChunk, read_lost
from ckptfs.manifests import Manifest, StoreInfo

CS = MIN_CHUNK_SIZE  # the smallest legal chunk size keeps the arithmetic readable
H1 = "0" * 32
H2 = "0123456789abcdef" * 2


# -- chunking ----------------------------------------------------------------------------

def test_chunk_size_bounds() -> None:
    assert FixedChunker(MIN_CHUNK_SIZE).chunk_size == MIN_CHUNK_SIZE
    assert FixedChunker(MAX_CHUNK_SIZE).chunk_size == MAX_CHUNK_SIZE
    for bad in (0, -1, MIN_CHUNK_SIZE - 1, MAX_CHUNK_SIZE + 1):
        with pytest.raises(ValueError):
            FixedChunker(bad)


@pytest.mark.parametrize(("size", "count"), [
    (0, 0), (1, 1), (CS - 1, 1), (CS, 1), (CS + 1, 2), (3 * CS, 3), (3 * CS + 7, 4)])
def test_chunk_count(size: int, count: int) -> None:
    assert FixedChunker(CS).count(size) == count


def test_chunk_index_and_span() -> None:
    c = FixedChunker(CS)
    assert [c.index(o) for o in (0, CS - 1, CS, 2 * CS - 1, 2 * CS)] == [0, 0, 1, 1, 2]
    size = 2 * CS + 10
    assert c.span(0, size) == (0, CS)
    assert c.span(1, size) == (CS, 2 * CS)
    assert c.span(2, size) == (2 * CS, 2 * CS + 10)  # the last chunk is short
    assert c.span(0, 5) == (0, 5)
    # the spans of all chunks tile the file exactly
    spans = [c.span(i, size) for i in range(c.count(size))]
    assert spans[0][0] == 0 and spans[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_chunks_touched() -> None:
    c = FixedChunker(CS)
    assert list(c.touched(0, 0)) == []
    assert list(c.touched(5 * CS, -3)) == []
    assert list(c.touched(0, 1)) == [0]
    assert list(c.touched(0, CS)) == [0]
    assert list(c.touched(0, CS + 1)) == [0, 1]
    assert list(c.touched(CS - 1, 1)) == [0]
    assert list(c.touched(CS - 1, 2)) == [0, 1]
    assert list(c.touched(CS, CS)) == [1]
    assert list(c.touched(CS + 1, 3 * CS)) == [1, 2, 3, 4] == list(
        range(c.index(CS + 1), c.index(4 * CS) + 1))


# -- codec -------------------------------------------------------------------------------

def test_chunk_hash_is_xxh3_128_hex() -> None:
    assert codec.HASH_NAME == "xxh3-128"
    assert codec.chunk_hash(b"") == "99aa06d3014798d86001c324468d497f"  # reference vector
    data = os.urandom(1000)
    h = codec.chunk_hash(data)
    assert h == xxhash.xxh3_128(data).hexdigest()
    assert len(h) == 32 and all(ch in "0123456789abcdef" for ch in h)
    # every buffer type gives the same name
    assert codec.chunk_hash(bytearray(data)) == codec.chunk_hash(memoryview(data)) == h


def test_codec_compressible_uses_lz4() -> None:
    data = b"checkpoint " * 10_000
    blob, cid = codec.encode_chunk(data)
    assert cid == codec.CODEC_LZ4
    assert blob[:4] == codec.MAGIC and blob[4] == codec.CODEC_LZ4
    assert len(blob) < len(data) // 10
    assert struct.unpack_from("<Q", blob, 8)[0] == len(data)
    assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data


def test_codec_incompressible_stays_raw() -> None:
    data = os.urandom(64 * 1024)
    blob, cid = codec.encode_chunk(data)
    assert cid == codec.CODEC_RAW  # lz4 would have been larger
    assert len(blob) == codec.HEADER_SIZE + len(data)
    assert blob[codec.HEADER_SIZE:] == data
    assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data
    # memoryview / bytearray inputs work too
    assert codec.decode_chunk(memoryview(blob)) == data
    assert codec.encode_chunk(bytearray(data))[0] == blob


def test_codec_lz4_only_when_strictly_smaller() -> None:
    for data in (b"x", b"ab", os.urandom(17), b"\0" * 16, b"\0" * 4096):
        blob, cid = codec.encode_chunk(data)
        raw_blob_len = codec.HEADER_SIZE + len(data)
        if cid == codec.CODEC_LZ4:
            assert len(blob) < raw_blob_len
        else:
            assert len(blob) == raw_blob_len
        assert codec.decode_chunk(blob) == data
    assert codec.encode_chunk(b"\0" * 4096)[1] == codec.CODEC_LZ4
    assert codec.encode_chunk(b"x")[1] == codec.CODEC_RAW


def test_codec_empty() -> None:
    blob, cid = codec.encode_chunk(b"")
    assert cid == codec.CODEC_RAW
    assert len(blob) == codec.HEADER_SIZE
    assert codec.decode_chunk(blob, codec.chunk_hash(b"")) == b""


def _corrupt(blob: bytes, at: int, value: int) -> bytes:
    b = bytearray(blob)
    b[at] = value
    return bytes(b)


@pytest.mark.parametrize("data", [b"a" * 5000, os.urandom(5000)], ids=["lz4", "raw"])
def test_codec_rejects_corruption(data: bytes) -> None:
    blob, _ = codec.encode_chunk(data)
    h = codec.chunk_hash(data)
    bad = {
        "bad magic": b"XKC1" + blob[4:],
        "unknown codec": _corrupt(blob, 4, 7),
        "truncated payload": blob[:-10],
        "shorter than header": blob[:10],
        "empty": b"",
        "raw length too big": blob[:8] + struct.pack("<Q", len(data) + 1) + blob[16:],
        "raw length too small": blob[:8] + struct.pack("<Q", len(data) - 1) + blob[16:],
        "flipped payload byte": _corrupt(blob, len(blob) - 1, blob[-1] ^ 0x55),
    }
    for what, b in bad.items():
        with pytest.raises(CorruptChunkError):
            codec.decode_chunk(b, h)
            pytest.fail(f"{what}: decoded")
    with pytest.raises(CorruptChunkError, match="magic"):
        codec.decode_chunk(bad["bad magic"])
    with pytest.raises(CorruptChunkError, match="codec id 7"):
        codec.decode_chunk(bad["unknown codec"])
    with pytest.raises(CorruptChunkError, match="does not match"):
        codec.decode_chunk(blob, codec.chunk_hash(b"something else"))
    assert codec.decode_chunk(blob, h) == data


@pytest.mark.parametrize("raw_len", [2**31, 2**62, 2**64 - 1])
def test_codec_absurd_header_length_is_corruption(raw_len: int) -> None:
    """A flipped bit in the length must not become OverflowError/MemoryError."""
    blob, _ = codec.encode_chunk(b"a" * 5000)
    with pytest.raises(CorruptChunkError):
        codec.decode_chunk(blob[:8] + struct.pack("<Q", raw_len) + blob[16:])


# -- manifests ---------------------------------------------------------------------------

def test_manifest_roundtrip_file() -> None:
    m = Manifest(size=CS + 5, mode=stat.S_IFREG | 0o640, mtime_ns=1_700_000_000_123_456_789,
                 chunks=((H1, CS), (H2, 5)), chunk_size=CS, writer="node-1")
    back = Manifest.from_json(m.to_json())
    assert back == m
    assert not back.is_symlink
    assert back.chunk_offsets() == [0, CS, CS + 5]
    offs = back.chunk_offsets()
    assert [back.chunk_at(offs, o) for o in (0, CS - 1, CS, CS + 4)] == [0, 0, 1, 1]


def test_manifest_roundtrip_empty_file_and_symlink() -> None:
    empty = Manifest(size=0, mode=stat.S_IFREG | 0o600, mtime_ns=1)
    assert Manifest.from_json(empty.to_json()) == empty
    link = Manifest(size=9, mode=stat.S_IFLNK | 0o777, mtime_ns=42, target="../a/b.pt",
                    writer="w")
    blob = link.to_json()
    assert "chunks" not in json.loads(blob)
    back = Manifest.from_json(blob)
    assert back == link
    assert back.is_symlink and back.target == "../a/b.pt"
    assert stat.S_ISLNK(back.mode)


def test_manifest_regular_mode_normalised() -> None:
    d = json.loads(Manifest(size=0, mode=0o644, mtime_ns=0).to_json())
    d["mode"] = stat.S_IFDIR | 0o4755  # a file manifest can only describe a regular file
    m = Manifest.from_json(json.dumps(d).encode())
    assert m.mode == stat.S_IFREG | 0o4755


def _manifest_dict(**changes: object) -> bytes:
    d: dict[str, object] = json.loads(
        Manifest(size=10, mode=stat.S_IFREG | 0o644, mtime_ns=5,
                 chunks=((H1, 4), (H2, 6)), chunk_size=CS).to_json())
    d.update(changes)
    return json.dumps(d).encode()


def test_manifest_helper_is_valid() -> None:
    assert Manifest.from_json(_manifest_dict()).size == 10


@pytest.mark.parametrize("blob", [
    _manifest_dict(v=2),
    _manifest_dict(size=11),  # chunk lengths add up to 10
    _manifest_dict(size=-10, chunks=[[H1, -4], [H2, -6]]),
    _manifest_dict(chunks=[[H1[:-1], 4], [H2, 6]]),  # 31 hex digits
    _manifest_dict(chunks=[["z" * 32, 4], [H2, 6]]),  # not hex
    _manifest_dict(chunks=[["../../../../../etc/passwd" + "x" * 7, 4], [H2, 6]]),
    _manifest_dict(chunks=[[H1.upper().replace("0", "A"), 4], [H2, 6]]),  # not lowercase
    _manifest_dict(chunks=[[H1, 4, 9], [H2, 6]]),
    _manifest_dict(chunks=[[H1, "four"], [H2, 6]]),
    _manifest_dict(chunks=None),
    _manifest_dict(mode="rw"),
    _manifest_dict(v="one"),
    b"",
    b"garbage",
    b"\xff\xfe\x00",
    b"[]",
    b"null",
    b"42",
    b"{}",
    b'{"v": 1}',
])
def test_manifest_rejects(blob: bytes) -> None:
    with pytest.raises(FormatError):
        Manifest.from_json(blob)


def test_manifest_newer_version_message() -> None:
    with pytest.raises(FormatError, match="newer"):
        Manifest.from_json(_manifest_dict(v=manifests.FORMAT_VERSION + 1))


def test_store_info_roundtrip_and_checks() -> None:
    info = StoreInfo(chunk_size=CS, created_by="test", created_at=12.5)
    assert StoreInfo.from_json(info.to_json()) == info
    d = json.loads(info.to_json())
    d["format"] = manifests.FORMAT_VERSION + 1
    with pytest.raises(FormatError, match=r"newer than this ckptfs.*upgrade ckptfs"):
        StoreInfo.from_json(json.dumps(d).encode())
    d["format"] = 1
    d["hash"] = "sha256"
    with pytest.raises(FormatError, match="sha256"):
        StoreInfo.from_json(json.dumps(d).encode())
    for blob in (b"", b"nope", b"[]", b"{}", b'{"format": 1}', b'{"format": 1, "chunk_size": "x"}',
                 b'{"format": 1, "chunk_size": 0}',
                 b'{"format": 1, "chunk_size": %d}' % (MAX_CHUNK_SIZE * 2)):
        with pytest.raises(FormatError):
            StoreInfo.from_json(blob)
    assert StoreInfo.from_json(b'{"format": 1, "chunk_size": %d}' % CS).chunk_size == CS


@pytest.mark.parametrize("path", ["a", "a/b", "a b/c.pt", ".hidden", "a..b", "...", ""])
def test_check_path_accepts(path: str) -> None:
    assert manifests.check_path(path) == path


@pytest.mark.parametrize("path", [
    "..", "a/..", "../a", "a/../b", ".", "a/./b", "/a", "/", "a//b", "a/", "//", "a\0b", "\0"])
def test_check_path_rejects(path: str) -> None:
    with pytest.raises(InvalidKeyError):
        manifests.check_path(path)


def test_keys() -> None:
    assert manifests.file_key("a/b.pt") == "files/a/b.pt"
    assert manifests.dir_key("a/b") == "files/a/b/"
    assert manifests.dir_key("") == "files/"
    assert manifests.dir_prefix("a") == "files/a/"
    assert manifests.chunk_key(H2) == f"chunks/01/{H2}"
    assert manifests.join("", "x") == "x" and manifests.join("a/b", "x") == "a/b/x"
    for p in ("a", "a/b", "d/e/f.bin"):
        assert manifests.path_of_key(manifests.file_key(p)) == p
        assert manifests.path_of_key(manifests.dir_key(p)) == p
    assert manifests.path_of_key("files/") == ""
    for bad in ("chunks/00/" + H1, "file/a", "files/../x", "files//a", "files/a/../b", "x"):
        with pytest.raises(InvalidKeyError):
            manifests.path_of_key(bad)
    for bad in ("../x", "/x", "a/../b", "a\0"):
        with pytest.raises(InvalidKeyError):
            manifests.file_key(bad)
        with pytest.raises(InvalidKeyError):
            manifests.dir_key(bad)


def test_dir_marker_roundtrip() -> None:
    m = manifests.DirMarker(mode=stat.S_IFDIR | 0o700, mtime_ns=99)
    assert manifests.DirMarker.from_json(m.to_json()) == m
    assert manifests.DirMarker.from_json(b"") == manifests.DirMarker()
    with pytest.raises(FormatError):
        manifests.DirMarker.from_json(b"not json")


# -- journal -----------------------------------------------------------------------------

def test_journal_survives_reopen(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "journal.sqlite")
    j = Journal(path)
    assert j.counts() == (0, 0)
    c1, c2 = PendingChunk(H1, 2, 0, 100), PendingChunk(H2, 1, CS, 5)
    seqs = j.add_chunks([c1, c2], [("put_file", "a", None, b"{}"),
                                   ("rename_file", "a", "b", None)])
    assert len(seqs) == 2 and seqs[0] < seqs[1]
    seq3 = j.add_op("delete_file", "b")
    assert seq3 > seqs[1]
    j.add_chunks([PendingChunk(H1, 9, 9, 9)])  # same hash: the first location is kept
    j.set_meta("writer", "node-7")
    assert j.counts() == (2, 3)
    j.close()

    j = Journal(path)
    assert j.counts() == (2, 3)
    assert sorted(j.pending_chunks(), key=lambda c: c.hash) == [c1, c2]
    assert j.pending_chunks() == [c2, c1]  # ordered by staging file, then offset
    ops = j.pending_ops()
    assert [o.seq for o in ops] == [*seqs, seq3]
    assert [(o.kind, o.path, o.path2, o.body) for o in ops] == [
        ("put_file", "a", None, b"{}"), ("rename_file", "a", "b", None),
        ("delete_file", "b", None, None)]
    assert j.get_meta("writer") == "node-7" and j.get_meta("other") is None
    j.close()


def test_journal_ops_in_seq_order_and_remove(tmp_path: os.PathLike[str]) -> None:
    j = Journal(os.path.join(tmp_path, "j.sqlite"))
    seqs = [j.add_op("put_dir", f"d{i}", body=b"x") for i in range(20)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 20
    j.remove_ops(seqs[5:10])
    j.remove_ops([seqs[0], 10_000])  # an unknown seq is ignored
    assert [o.path for o in j.pending_ops()] == [f"d{i}" for i in (1, 2, 3, 4, *range(10, 20))]
    newer = j.add_op("put_dir", "last")
    assert newer > seqs[-1]  # seqs are never reused
    assert j.pending_ops()[-1].path == "last"
    j.add_chunks([PendingChunk(H1, 1, 0, 1), PendingChunk(H2, 1, 1, 1)])
    j.remove_chunk(H1)
    j.remove_chunk("f" * 32)  # absent: no error
    assert [c.hash for c in j.pending_chunks()] == [H2]
    assert j.counts() == (1, 15)
    j.close()


def test_journal_names_the_files_that_lost_a_chunk(tmp_path: os.PathLike[str]) -> None:
    """A lost chunk is reported by the path of every file that needs it, followed through
    renames (of the file and of its directory, not of a sibling with a longer name), and
    forgotten when the file is deleted or rewritten without it; not on chmod."""
    path = os.path.join(tmp_path, "j.sqlite")
    j = Journal(path)
    body = json.dumps({"chunks": [[H1, 1], [H2, 1]]}).encode()
    chunks = [PendingChunk(H1, 1, 0, 1), PendingChunk(H2, 1, 1, 1)]
    j.add_chunks(chunks, [("put_file", "ckpt/a.pt", None, body)], "ckpt/a.pt")
    j.add_chunks(chunks[:1], [("put_file", "ckpt2/b.pt", None, body)], "ckpt2/b.pt")
    j.add_op("rename_dir", "ckpt", "step-1")
    assert sorted(j.mark_lost(H1, "damaged")) == ["ckpt2/b.pt", "step-1/a.pt"]
    assert j.pending_chunks() == [chunks[1]]  # no longer tracked for upload
    j.add_op("put_file", "step-1/a.pt", body=body)  # chmod: same chunks, still lost
    j.add_op("rename_file", "step-1/a.pt", "step-1/final.pt")
    j.close()
    j = Journal(path)  # survives a restart
    assert [(f.path, f.hash, f.reason) for f in j.lost_files()] == [
        ("ckpt2/b.pt", H1, "damaged"), ("step-1/final.pt", H1, "damaged")]
    j.add_op("delete_file", "ckpt2/b.pt")
    j.add_chunks([PendingChunk(H2, 2, 0, 1)], [(
        "put_file", "step-1/final.pt", None, json.dumps({"chunks": [[H2, 1]]}).encode())],
        "step-1/final.pt")  # rewritten without the lost chunk
    assert j.lost_files() == []
    assert read_lost(path) == []
    j.close()


def test_journal_failed_transaction_rolls_back(tmp_path: os.PathLike[str]) -> None:
    j = Journal(os.path.join(tmp_path, "j.sqlite"))
    with pytest.raises(JournalError):
        # the second op has a NULL kind: the whole transaction, chunks included, is undone
        j.add_chunks([PendingChunk(H1, 1, 0, 1)], [("put_file", "a", None, None),
                                                   (None, "b", None, None)])  # type: ignore[list-item]
    assert j.counts() == (0, 0)
    j.add_op("put_file", "c")
    assert j.counts() == (0, 1)
    j.close()


def test_journal_file_mode(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "journal.sqlite")
    old = os.umask(0o022)
    try:
        j = Journal(path)
        j.add_op("put_file", "secret/name.pt", body=b"{}")
        # the WAL holds the same data as the database until a checkpoint
        for p in (path, path + "-wal", path + "-shm"):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
        j.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
