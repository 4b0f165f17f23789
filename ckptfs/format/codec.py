"""Chunk encoding: the content name (xxh3-128), the chunk header, and compression.

This is the only module that imports lz4 or zstandard, and the only one that knows the
chunk layout:

    offset  size  field
    0       4     magic b"CKC1"
    4       1     codec id (0 = raw, 1 = lz4 block, 2 = zstd4)
    5       3     reserved, zero
    8       8     raw (uncompressed) length L, little-endian unsigned
    16      ...   payload

The zstd4 payload holds the chunk's W = L // 4 four-byte words split into 4 byte planes
(plane k: byte k of every word; the exponent bytes of float weights are low-entropy), each
compressed on its own with zstd (ZSTD_PARAMS), then the L % 4 tail bytes:

    offset  size  field
    0       16    stored size of planes 0..3, each 4 bytes little-endian unsigned
    16      ...   planes 0..3 one after the other: a plane of stored size W is its raw
                  bytes, a smaller one is one zstd frame, with the content size in
                  its header, that decodes to W bytes
    ...     L%4   the tail bytes, unchanged

A plane that zstd does not make 3% smaller (the mantissa bytes) is stored raw: decoding
only copies it back into place, and zstd itself passes quickly over such bytes.
"""

from __future__ import annotations

import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

import lz4.block
import xxhash
import zstandard

from ckptfs.common.errors import CorruptChunkError
from ckptfs.format.chunking import MAX_CHUNK_SIZE

if TYPE_CHECKING:  # imported where used: numpy costs a mount ~0.1 s, and no chunk is
    import numpy as np  # encoded or decoded before the mount answers

MAGIC = b"CKC1"
CODEC_RAW = 0
CODEC_LZ4 = 1
CODEC_ZSTD4 = 2
CODEC_NAMES = {CODEC_RAW: "raw", CODEC_LZ4: "lz4", CODEC_ZSTD4: "zstd4"}
#: the methods a store can compress its chunks with (encode_chunk's `method`)
CODECS = ("lz4", "zstd4")
_HEADER = struct.Struct("<4sB3xQ")
HEADER_SIZE = _HEADER.size  # 16
#: the largest chunk object a writer makes: a writer compresses only when that saves 3%,
#: so no payload is longer than the raw bytes; a reader refuses a larger object unread
MAX_OBJECT_SIZE = HEADER_SIZE + MAX_CHUNK_SIZE
HASH_NAME = "xxh3-128"
#: zstd level 1 with a 256-entry match table instead of 32K: the exponent planes of
#: weights and optimizer moments are near-random bytes of low entropy, where zstd's Huffman
#: literals do the work and the short matches that a big table finds only cost time; this
#: compresses those planes ~2x faster and ~7% smaller (scripts/bench_codec.py)
ZSTD_PARAMS = zstandard.ZstdCompressionParameters.from_level(1, hash_log=8)
_PLANES = struct.Struct("<4I")

Buffer = bytes | bytearray | memoryview
#: memory a decode writes into: a bytearray, or a view of new_buffer()'s
WritableBuffer = bytearray | memoryview
B = TypeVar("B", bytearray | memoryview, "np.ndarray")


def new_buffer(size: int) -> memoryview:
    """`size` bytes of fresh, writable memory, not filled in. bytearray(size) zero-fills
    its memory with the GIL held: for a 16 MiB chunk that was 2-30 ms here, during
    which the FUSE thread could answer no request. This holds the GIL only to allocate;
    the pages are faulted in by the first write, a decode that has released the GIL."""
    if not size:  # a pool's placeholder, made at import (_Buffers): no numpy needed yet
        return memoryview(bytearray())
    return new_array(size).data


def new_array(size: int) -> np.ndarray:
    """`size` bytes of fresh memory as a numpy array, not filled in."""
    import numpy as np

    return np.empty(size, np.uint8)


def preload() -> None:
    """Import now what encodes and decodes import at their first use (numpy): a mount
    calls this once it answers, so that its first read or write does not wait for it."""
    import numpy  # noqa: F401


Hasher = xxhash.xxh3_128


def chunk_hash(data: Buffer) -> str:
    """The chunk's name: xxh3-128 of its uncompressed bytes, as 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def chunk_hasher() -> Hasher:
    """An incremental chunk_hash(): update() with the chunk's bytes in order, then
    hexdigest() (which may be asked again after more updates)."""
    return xxhash.xxh3_128()


def encode_chunk(data: Buffer, method: str = "lz4") -> tuple[bytes, int]:
    """Header + payload for `data`, compressed with `method` (one of CODECS) when that
    makes it at least 3% smaller, else raw. The same bytes always give the same blob.

    Returns (blob, codec id).
    """
    parts, codec = encode_chunk_parts(data, method)
    return b"".join(parts), codec


def encode_chunk_parts(data: Buffer, method: str = "lz4") -> tuple[list[Buffer], int]:
    """encode_chunk() as [header, payload parts...], the payload of a raw chunk being
    `data` itself (no copy), in memory of their own otherwise. Returns (parts, codec id)."""
    return _encode_parts(data, method, None)


@contextmanager
def encoded(data: Buffer, method: str = "lz4") -> Iterator[tuple[list[Buffer], int]]:
    """encode_chunk_parts() for a caller that is done with the parts when the block ends
    (the uploader PUTs them): a zstd4 chunk's regrouped words go into one of a few reused
    buffers, one per core, instead of fresh memory per chunk (page faults dominate on some
    VMs), and its payload is left in parts, not joined (the store joins them once, or
    writes them one after the other)."""
    with _GROUPED.lent() as take:
        yield _encode_parts(data, method, take)


def _encode_parts(data: Buffer, method: str,
                  take: Callable[[int], np.ndarray] | None) -> tuple[list[Buffer], int]:
    compress: Callable[[Buffer, Callable[[int], np.ndarray] | None], list[Buffer]]
    if method == "lz4":
        codec, compress = CODEC_LZ4, lambda d, _: [_lz4(d)]
    elif method == "zstd4":
        codec, compress = CODEC_ZSTD4, _zstd4_parts
    else:
        raise ValueError(f"unknown chunk codec {method!r} (one of {', '.join(CODECS)})")
    raw_len = len(data)
    if raw_len and _worth_compressing(data, lambda d: compress(d, None)):
        with _ENCODES:
            payload = compress(data, take)
        if _saves(sum(map(len, payload)), raw_len):
            if take is None and len(payload) > 1:  # in memory of its own, as promised
                payload = [b"".join(payload)]
            return [_HEADER.pack(MAGIC, codec, raw_len), *payload], codec
    return [_HEADER.pack(MAGIC, CODEC_RAW, raw_len), data], CODEC_RAW


def _saves(stored: int, raw: int) -> bool:
    """Whether `stored` bytes are at least 3% fewer than `raw`: less is not worth decoding."""
    return stored * 100 <= raw * 97


def _lz4(data: Buffer) -> bytes:
    block: bytes = lz4.block.compress(data, store_size=False)
    return block


class _Zstd(threading.local):
    """Each thread's own zstd contexts: a context serves one call at a time, and upload
    and fetch threads encode and decode chunks at once."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(compression_params=ZSTD_PARAMS)
        self.decompressor = zstandard.ZstdDecompressor()


_zstd = _Zstd()


def _zstd4(data: Buffer) -> bytes:
    """The zstd4 payload of `data` (module docstring)."""
    return b"".join(_zstd4_parts(data, None))


def _zstd4_parts(data: Buffer, take: Callable[[int], np.ndarray] | None) -> list[Buffer]:
    """The zstd4 payload of `data` as parts: plane sizes, planes, tail. The words are
    regrouped into memory from `take(size)` if given (a raw plane is a view of it)."""
    import numpy as np

    zc = _zstd.compressor
    words = len(data) // 4
    source = np.frombuffer(data, np.uint8, words * 4).reshape(-1, 4).T
    if take is None:
        grouped = np.ascontiguousarray(source)
    else:
        grouped = take(words * 4)[:words * 4].reshape(4, words)
        np.copyto(grouped, source)
    planes: list[Buffer] = []
    for plane in grouped:
        raw = memoryview(plane)
        frame = zc.compress(raw)
        planes.append(frame if _saves(len(frame), words) else raw)
    tail = memoryview(data)[words * 4:]
    return [_PLANES.pack(*map(len, planes)), *planes, *([tail] if len(tail) else [])]


SAMPLE = 64 * 1024  # a multiple of 4: zstd4 samples must be whole words
SAMPLES = 4


def _worth_compressing(data: Buffer, compress: Callable[[Buffer], list[Buffer]]) -> bool:
    """Whether `compress` is likely to make `data` 3% smaller, judged on a few samples.

    Random bytes, and weights and optimizer moments for lz4 (docs/PERFORMANCE.md), do not
    compress; trying costs CPU on every chunk, so only chunks whose samples shrink are
    tried. Samples start at multiples of 4, so zstd4 sees the words of the chunk.
    """
    n = len(data)
    if n <= SAMPLE * SAMPLES:
        return True
    view = memoryview(data)
    step = (n - SAMPLE) // (SAMPLES - 1) // 4 * 4
    sampled = sum(sum(map(len, compress(view[i * step:i * step + SAMPLE])))
                  for i in range(SAMPLES))
    return _saves(sampled, SAMPLE * SAMPLES)


def decode_chunk(blob: Buffer, expected_hash: str | None = None) -> Buffer:
    """The raw bytes of an encoded chunk; CorruptChunkError if anything does not match.

    A raw (uncompressed) chunk comes back as a view into `blob`, without a copy; a
    decoded one in memory of its own.
    """
    return _decode(blob, expected_hash, new_buffer)


@contextmanager
def decoded(blob: Buffer, expected_hash: str | None = None) -> Iterator[Buffer]:
    """decode_chunk() for a caller that is done with the bytes when the block ends (the
    fetcher writes them to the cache): a zstd4 chunk is decoded into one of a few reused
    buffers, one per core, so that at most that many decodes run at once and none pays
    for fresh memory (page faults dominate on some VMs)."""
    with _OUTPUTS.lent() as take:
        yield _decode(blob, expected_hash, take)


def decode_into(blob: Buffer, expected_hash: str | None,
                alloc: Callable[[int], WritableBuffer]) -> Buffer:
    """decode_chunk() into memory from `alloc(size)` (called at most once; not for a raw
    chunk, which comes back as a view into `blob`)."""
    return _decode(blob, expected_hash, alloc)


def is_raw(blob: Buffer) -> bool:
    """Whether an encoded chunk is stored raw (its payload is its bytes)."""
    return len(blob) > 4 and blob[4] == CODEC_RAW


#: at most one encode per core at once: the upload threads outnumber the cores, and each
#: encode holds a regrouped copy of its chunk while it runs
_ENCODES = threading.BoundedSemaphore(os.cpu_count() or 1)


class _Buffers(Generic[B]):
    """At most `keep` reused buffers, lent for the length of a block: one that is too
    small is replaced by new(size) (not resized: a view of it may still exist). With
    `wait`, the pool holds `keep` from the start and a borrower waits for one, which
    bounds how many blocks run at once; else a borrower that finds none makes one."""

    def __init__(self, new: Callable[[int], B], keep: int, wait: bool) -> None:
        self.new: Callable[[int], B] = new
        self.keep = keep
        self.wait = wait
        self._free: queue.LifoQueue[B] = queue.LifoQueue()
        for _ in range(keep if wait else 0):
            self._free.put(new(0))

    def qsize(self) -> int:
        """How many buffers the pool holds now (not lent)."""
        return self._free.qsize()

    @contextmanager
    def lent(self) -> Iterator[Callable[[int], B]]:
        """A take(size) that lends a buffer of at least `size` until the block ends."""
        taken: list[B] = []

        def take(size: int) -> B:
            try:
                buf = self._free.get(block=self.wait)
            except queue.Empty:
                buf = self.new(0)
            if len(buf) < size:
                buf = self.new(size)
            taken.append(buf)
            return buf

        try:
            yield take
        finally:
            for buf in taken:
                if self._free.qsize() < self.keep:
                    self._free.put(buf)


#: decode buffers of decoded(): as many as cores
_OUTPUTS: _Buffers[WritableBuffer] = _Buffers(new_buffer, os.cpu_count() or 1, wait=True)
#: regrouping buffers of encoded(): kept for as many encodes as cores, made as needed
_GROUPED: _Buffers[np.ndarray] = _Buffers(new_array, os.cpu_count() or 1, wait=False)


def _decode(blob: Buffer, expected_hash: str | None,
            alloc: Callable[[int], WritableBuffer]) -> Buffer:
    if len(blob) < HEADER_SIZE:
        raise CorruptChunkError(f"chunk shorter than its header ({len(blob)} bytes)")
    magic, codec, raw_len = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptChunkError("bad chunk magic")
    if raw_len > MAX_CHUNK_SIZE:  # a damaged header must not make a decoder allocate
        raise CorruptChunkError(f"chunk header length {raw_len} exceeds {MAX_CHUNK_SIZE}")
    payload = memoryview(blob)[HEADER_SIZE:]
    data: Buffer
    if codec == CODEC_RAW:
        data = payload
    elif codec == CODEC_LZ4:
        try:
            data = lz4.block.decompress(payload, uncompressed_size=raw_len)
        except lz4.block.LZ4BlockError as e:
            raise CorruptChunkError(f"lz4 payload does not decode: {e}") from None
    elif codec == CODEC_ZSTD4:
        data = _unzstd4(payload, raw_len, alloc)
    else:
        raise CorruptChunkError(f"unknown chunk codec id {codec}")
    if len(data) != raw_len:
        raise CorruptChunkError(f"chunk length {len(data)} != header length {raw_len}")
    if expected_hash is not None and chunk_hash(data) != expected_hash:
        raise CorruptChunkError("content does not match the chunk's name")
    return data


def _unzstd4(payload: memoryview, raw_len: int,
             alloc: Callable[[int], WritableBuffer]) -> memoryview:
    """The `raw_len` bytes of a zstd4 payload (module docstring), in memory from `alloc`."""
    import numpy as np

    words = raw_len // 4
    if len(payload) < _PLANES.size:
        raise CorruptChunkError(f"zstd4 payload of {len(payload)} bytes has no plane sizes")
    sizes = _PLANES.unpack_from(payload)
    if max(sizes) > words or _PLANES.size + sum(sizes) + raw_len % 4 != len(payload):
        raise CorruptChunkError(f"zstd4 plane sizes {sizes} do not fit a payload of "
                                f"{len(payload)} bytes for {raw_len} raw bytes")
    planes = []
    start = _PLANES.size
    for k, size in enumerate(sizes):
        stored = payload[start:start + size]
        start += size
        plane = stored if size == words else _unzstd_plane(stored, words, k)
        planes.append(np.frombuffer(plane, np.uint8))
    out = memoryview(alloc(raw_len))[:raw_len]
    interleave(planes, np.frombuffer(out, np.uint8, words * 4).reshape(-1, 4))
    out[words * 4:] = payload[start:]
    return out


#: words per block of interleave(): 256 KiB of output, which stays in the core's cache
#: across its four plane passes
INTERLEAVE_BLOCK = 1 << 16


def interleave(planes: list[np.ndarray], out: np.ndarray) -> None:
    """out[i] = (planes[0][i], ..., planes[3][i]), a block of words at a time: each
    plane's pass writes a quarter of every cache line of `out`, so in one piece the
    four passes would each bring the whole output back from memory (3x the traffic,
    which shows when several fetch threads decode at once); GIL released."""
    import numpy as np

    for i in range(0, len(out), INTERLEAVE_BLOCK):
        block = slice(i, i + INTERLEAVE_BLOCK)
        np.stack([plane[block] for plane in planes], axis=1, out=out[block])


def _unzstd_plane(frame: memoryview, words: int, k: int) -> bytes:
    """The `words` bytes of zstd4 plane `k` from its zstd frame."""
    try:
        # checked first: the frame header's size is what zstd would allocate
        if zstandard.frame_content_size(frame) != words:
            raise CorruptChunkError(f"zstd4 plane {k}: frame is not of {words} bytes")
        plane = _zstd.decompressor.decompress(frame, max_output_size=words,
                                              allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CorruptChunkError(f"zstd4 plane {k} does not decode: {e}") from None
    if len(plane) != words:
        raise CorruptChunkError(f"zstd4 plane {k} decodes to {len(plane)} bytes, not {words}")
    return plane
