"""Chunk encoding: the content name (xxh3-128), the chunk header, and lz4 compression.

This is the only module that imports lz4 and the only one that knows the chunk layout:

    offset  size  field
    0       4     magic b"CKC1"
    4       1     codec id (0 = raw, 1 = lz4 block)
    5       3     reserved, zero
    8       8     raw (uncompressed) length, little-endian unsigned
    16      ...   payload
"""

from __future__ import annotations

import struct

import lz4.block
import xxhash

from .chunking import MAX_CHUNK_SIZE
from .errors import CorruptChunkError

MAGIC = b"CKC1"
CODEC_RAW = 0
CODEC_LZ4 = 1
CODEC_NAMES = {CODEC_RAW: "raw", CODEC_LZ4: "lz4"}
_HEADER = struct.Struct("<4sB3xQ")
HEADER_SIZE = _HEADER.size  # 16
HASH_NAME = "xxh3-128"

Buffer = bytes | bytearray | memoryview
Hasher = xxhash.xxh3_128


def chunk_hash(data: Buffer) -> str:
    """The chunk's name: xxh3-128 of its uncompressed bytes, as 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def chunk_hasher() -> Hasher:
    """An incremental chunk_hash(): update() with the chunk's bytes in order, then
    hexdigest() (which may be asked again after more updates)."""
    return xxhash.xxh3_128()


def encode_chunk(data: Buffer, method: str = "lz4") -> tuple[bytes, int]:
    """Header + payload for `data`, lz4-compressed when that makes it smaller.

    Returns (blob, codec id).
    """
    parts, codec = encode_chunk_parts(data)
    return b"".join(parts), codec


def encode_chunk_parts(data: Buffer, method: str = "lz4") -> tuple[list[Buffer], int]:
    """encode_chunk() as [header, payload], the payload of a raw chunk being `data`
    itself (no copy). Returns (parts, codec id)."""
    raw_len = len(data)
    if raw_len and _worth_compressing(data):
        compressed = lz4.block.compress(data, store_size=False)
        if len(compressed) < raw_len:
            return [_HEADER.pack(MAGIC, CODEC_LZ4, raw_len), compressed], CODEC_LZ4
    return [_HEADER.pack(MAGIC, CODEC_RAW, raw_len), data], CODEC_RAW


SAMPLE = 64 * 1024
SAMPLES = 4


def _worth_compressing(data: Buffer) -> bool:
    """Whether lz4 is likely to shrink `data`, judged on a few small samples.

    Weights and optimizer moments do not compress with plain lz4 (docs/PERFORMANCE.md);
    trying costs CPU on every chunk, so only chunks whose samples shrink by 3% are tried.
    """
    n = len(data)
    if n <= SAMPLE * SAMPLES:
        return True
    view = memoryview(data)
    step = (n - SAMPLE) // (SAMPLES - 1)
    sampled = sum(len(lz4.block.compress(view[i * step:i * step + SAMPLE], store_size=False))
                  for i in range(SAMPLES))
    return sampled < 0.97 * SAMPLE * SAMPLES


def decode_chunk(blob: Buffer, expected_hash: str | None = None) -> bytes | memoryview:
    """The raw bytes of an encoded chunk; CorruptChunkError if anything does not match.

    A raw (uncompressed) chunk comes back as a view into `blob`, without a copy.
    """
    if len(blob) < HEADER_SIZE:
        raise CorruptChunkError(f"chunk shorter than its header ({len(blob)} bytes)")
    magic, codec, raw_len = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptChunkError("bad chunk magic")
    if raw_len > MAX_CHUNK_SIZE:  # a damaged header must not make lz4 allocate (or overflow)
        raise CorruptChunkError(f"chunk header length {raw_len} exceeds {MAX_CHUNK_SIZE}")
    payload = memoryview(blob)[HEADER_SIZE:]
    data: bytes | memoryview
    if codec == CODEC_RAW:
        data = payload
    elif codec == CODEC_LZ4:
        try:
            data = lz4.block.decompress(payload, uncompressed_size=raw_len)
        except lz4.block.LZ4BlockError as e:
            raise CorruptChunkError(f"lz4 payload does not decode: {e}") from None
    else:
        raise CorruptChunkError(f"unknown chunk codec id {codec}")
    if len(data) != raw_len:
        raise CorruptChunkError(f"chunk length {len(data)} != header length {raw_len}")
    if expected_hash is not None and chunk_hash(data) != expected_hash:
        raise CorruptChunkError("content does not match the chunk's name")
    return data
