"""codec: chunk names (xxh3-128) and the chunk encoding (header, raw or lz4)."""

from __future__ import annotations

import os
import struct

import pytest
import xxhash

from ckptfs import codec
from ckptfs.errors import CorruptChunkError


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
