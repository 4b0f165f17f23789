"""codec: chunk names (xxh3-128) and the chunk encoding (header, raw, lz4 or zstd4)."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import xxhash
import zstandard

from ckptfs.common.errors import CorruptChunkError
from ckptfs.format import codec


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


def test_codec_small_and_zero_payloads_round_trip_raw_or_smaller() -> None:
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


#: (fewest, most) percent that a payload saves, and whether the chunk is then compressed:
#: only a saving of 3% or more is worth decoding (codec._saves)
SAVINGS = [((1.0, 2.0), False), ((2.0, 3.0), False), ((3.0, 4.0), True)]


def _saving(payload: bytes, data: bytes) -> float:
    return 100 * (1 - len(payload) / len(data))


def _shrinking_by(low: float, high: float, make: Callable[[int], bytes],
                  compress: Callable[[bytes], bytes]) -> bytes:
    """The first make(k), k = 0, 16, 32, ..., whose payload saves low% to high%."""
    for k in range(0, 1 << 16, 16):
        data = make(k)
        if low <= _saving(compress(data), data) < high:
            return data
    raise AssertionError(f"no payload saves {low}% to {high}%")


def _zeros_at_the_end(k: int) -> bytes:
    """64 KiB (one sample: all of it is compressed) of random bytes, the last k zeros."""
    return random.Random(5).randbytes(65536 - k) + bytes(k)


@pytest.mark.parametrize(("saving", "compressed"), SAVINGS, ids=["1-2%", "2-3%", "3-4%"])
def test_codec_lz4_only_when_three_percent_smaller(saving: tuple[float, float],
                                                   compressed: bool) -> None:
    data = _shrinking_by(*saving, _zeros_at_the_end, codec._lz4)
    blob, cid = codec.encode_chunk(data)
    assert cid == (codec.CODEC_LZ4 if compressed else codec.CODEC_RAW), _saving(
        codec._lz4(data), data)
    assert len(blob) == codec.HEADER_SIZE + (len(codec._lz4(data)) if compressed else len(data))
    assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data


def _zero_plane_bytes(plane: int, base: bytes | None = None) -> Callable[[int], bytes]:
    """make(k): 64 KiB of random bytes (or `base`), byte `plane` of the first k words zero."""
    def make(k: int) -> bytes:
        words = np.frombuffer(base or random.Random(6).randbytes(65536), np.uint8).copy()
        words.reshape(-1, 4)[:k, plane] = 0
        return words.tobytes()

    return make


@pytest.mark.parametrize(("saving", "compressed"), SAVINGS, ids=["1-2%", "2-3%", "3-4%"])
def test_codec_zstd4_only_when_three_percent_smaller(saving: tuple[float, float],
                                                     compressed: bool) -> None:
    """The whole payload must save 3% (here one plane is a zstd frame, three are raw)."""
    data = _shrinking_by(*saving, _zero_plane_bytes(3), codec._zstd4)
    payload = codec._zstd4(data)
    assert struct.unpack_from("<4I", payload)[3] < len(data) // 4  # plane 3 is a frame
    blob, cid = codec.encode_chunk(data, "zstd4")
    assert cid == (codec.CODEC_ZSTD4 if compressed else codec.CODEC_RAW), _saving(payload, data)
    assert blob[codec.HEADER_SIZE:] == (payload if compressed else data)
    assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data


def test_zstd4_plane_only_a_frame_when_three_percent_smaller() -> None:
    """In a zstd4 chunk, a plane that zstd makes 1-2% smaller stays raw, one it makes 3-4%
    smaller is a frame."""
    words = 65536 // 4
    plane_3_zero = _zero_plane_bytes(3)(words)  # plane 3 all zeros: the chunk compresses

    def plane_saving(data: bytes, plane: int) -> float:
        frame = zstandard.ZstdCompressor(compression_params=codec.ZSTD_PARAMS).compress(
            np.frombuffer(data, np.uint8).reshape(-1, 4)[:, plane].tobytes())
        return 100 * (1 - len(frame) / words)

    for (low, high), framed in SAVINGS:
        make = _zero_plane_bytes(2, plane_3_zero)
        data = next((d for d in map(make, range(0, words, 4))
                     if low <= plane_saving(d, 2) < high), None)
        assert data is not None, (low, high)
        blob, cid = codec.encode_chunk(data, "zstd4")
        assert cid == codec.CODEC_ZSTD4
        sizes = struct.unpack_from("<4I", blob, codec.HEADER_SIZE)
        assert (sizes[2] < words) == framed, (low, high, sizes)
        assert sizes[:2] == (words, words) and sizes[3] < words // 10
        assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data


def test_codec_empty() -> None:
    blob, cid = codec.encode_chunk(b"")
    assert cid == codec.CODEC_RAW
    assert len(blob) == codec.HEADER_SIZE
    assert codec.decode_chunk(blob, codec.chunk_hash(b"")) == b""


def _corrupt(blob: bytes, at: int, value: int) -> bytes:
    b = bytearray(blob)
    b[at] = value
    return bytes(b)


@pytest.mark.parametrize(("method", "data"), [
    ("lz4", b"a" * 5000), ("lz4", os.urandom(5000)),
    ("zstd4", b"a" * 5000), ("zstd4", b"ab" * 2501), ("zstd4", os.urandom(5000)),
], ids=["lz4", "raw", "zstd4", "zstd4-tail", "zstd4-raw"])
def test_codec_rejects_corruption(method: str, data: bytes) -> None:
    blob, _ = codec.encode_chunk(data, method)
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


@pytest.mark.parametrize("method", codec.CODECS)
@pytest.mark.parametrize("raw_len", [2**31, 2**62, 2**64 - 1])
def test_codec_absurd_header_length_is_corruption(raw_len: int, method: str) -> None:
    """A flipped bit in the length must not become OverflowError/MemoryError."""
    blob, _ = codec.encode_chunk(b"a" * 5000, method)
    with pytest.raises(CorruptChunkError):
        codec.decode_chunk(blob[:8] + struct.pack("<Q", raw_len) + blob[16:])


# -- zstd4: byte planes of 4-byte words, each zstd-compressed -----------------------------

def _fp32_weights(n: int, seed: int = 0) -> torch.Tensor:
    """Freshly initialized weights: normal, std 0.02 (as in GPT-style models)."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.02


def _trained_weights() -> torch.Tensor:
    """The weights of a small MLP after a few AdamW steps on a regression task."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    for _ in range(5):
        opt.zero_grad()
        torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _as_bytes(t: torch.Tensor) -> bytes:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return bytes(t.numpy().tobytes())


def _zstd4_blob(data: bytes) -> bytes:
    """A codec-2 chunk of `data`, even where encode_chunk would store it raw."""
    return (codec.MAGIC + bytes([codec.CODEC_ZSTD4, 0, 0, 0]) + struct.pack("<Q", len(data))
            + codec._zstd4(data))


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 4 * 1000 + 3, 3 * 1024 * 1024 + 3,
                               4 * (2 * codec.INTERLEAVE_BLOCK + 17) + 2])  # a part block
def test_zstd4_round_trip(n: int) -> None:
    weights = _as_bytes(_fp32_weights(n // 4 + 1))[:n]
    for data in (weights, b"\0" * n, bytes(range(256)) * (n // 256) + bytes(n % 256)):
        blob = _zstd4_blob(data)
        assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data
        blob, cid = codec.encode_chunk(data, "zstd4")
        assert cid in (codec.CODEC_RAW, codec.CODEC_ZSTD4)
        assert len(blob) <= codec.HEADER_SIZE + n
        assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data
    if n > 4096:
        assert codec.encode_chunk(b"\0" * n, "zstd4")[1] == codec.CODEC_ZSTD4
        assert codec.encode_chunk(weights, "zstd4")[1] == codec.CODEC_ZSTD4


@pytest.mark.parametrize(("dtype", "limit"), [(torch.float32, 0.85), (torch.bfloat16, 0.75)])
@pytest.mark.parametrize("kind", ["init", "trained"])
def test_zstd4_compresses_weights(kind: str, dtype: torch.dtype, limit: float) -> None:
    weights = _fp32_weights(1 << 20) if kind == "init" else _trained_weights()
    data = _as_bytes(weights.to(dtype))
    blob, cid = codec.encode_chunk(data, "zstd4")
    assert cid == codec.CODEC_ZSTD4
    assert blob[4] == codec.CODEC_ZSTD4
    assert len(blob) < limit * len(data)
    assert codec.decode_chunk(blob, codec.chunk_hash(data)) == data
    # plain lz4 does not compress weights: such chunks stay raw with codec "lz4"
    assert codec.encode_chunk(data)[1] == codec.CODEC_RAW


@pytest.mark.parametrize("n", [5000, 4 * 1024 * 1024 + 1])
def test_zstd4_random_bytes_stay_raw_without_copy(n: int) -> None:
    data = os.urandom(n)
    parts, cid = codec.encode_chunk_parts(data, "zstd4")
    assert cid == codec.CODEC_RAW
    assert parts[1] is data
    blob = b"".join(parts)
    decoded = codec.decode_chunk(blob, codec.chunk_hash(data))
    assert isinstance(decoded, memoryview) and decoded == data


def test_zstd4_payload_layout() -> None:
    """Mantissa planes stay raw, exponent planes are zstd frames, the tail is appended."""
    data = _as_bytes(_fp32_weights(100_000)) + b"xyz"
    payload = codec.encode_chunk(data, "zstd4")[0][codec.HEADER_SIZE:]
    sizes = struct.unpack_from("<4I", payload)
    assert sizes[:3] == (100_000,) * 3 and sizes[3] < 50_000
    words = np.frombuffer(data, np.uint8, 400_000).reshape(-1, 4)
    assert payload[16:16 + 100_000] == words[:, 0].tobytes()
    assert payload[16 + 300_000:16 + 300_000 + 4] == b"\x28\xb5\x2f\xfd"  # zstd magic
    assert payload[-3:] == b"xyz" and len(payload) == 16 + sum(sizes) + 3


def test_zstd4_rejects_damaged_planes() -> None:
    data = _as_bytes(_fp32_weights(10_000)) + b"t"
    blob = codec.encode_chunk(data, "zstd4")[0]
    sizes = list(struct.unpack_from("<4I", blob, 16))
    frame = 16 + 16 + sum(sizes[:3])  # plane 3's frame, in the blob

    def with_sizes(*new: int) -> bytes:
        return blob[:16] + struct.pack("<4I", *new) + blob[32:]

    bad = {
        "no plane sizes": blob[:16 + 10],
        "sizes too short": with_sizes(sizes[0], sizes[1], sizes[2], sizes[3] - 1),
        "size above the words": with_sizes(10_001, sizes[1], sizes[2] - 1, sizes[3]),
        "raw plane read as frame": with_sizes(sizes[0] - 1, sizes[1], sizes[2], sizes[3] + 1),
        "frame magic": _corrupt(blob, frame, 0),
        "frame content size": _corrupt(blob, frame + 5, blob[frame + 5] ^ 0x01),
        "frame body": _corrupt(blob, frame + 40, blob[frame + 40] ^ 0xFF),
        "tail byte": _corrupt(blob, len(blob) - 1, ord("u")),
    }
    for what, b in bad.items():
        with pytest.raises(CorruptChunkError):
            codec.decode_chunk(b, codec.chunk_hash(data))
            pytest.fail(f"{what}: decoded")
    with pytest.raises(CorruptChunkError, match="plane sizes"):
        codec.decode_chunk(bad["sizes too short"])
    with pytest.raises(CorruptChunkError, match="plane 3"):
        codec.decode_chunk(bad["frame magic"])
    with pytest.raises(CorruptChunkError, match="plane 0"):
        codec.decode_chunk(bad["raw plane read as frame"])


def test_zstd4_is_deterministic_across_threads() -> None:
    """The same bytes give the same blob in every thread (the store compares sizes)."""
    chunks = [_as_bytes(_fp32_weights(300_000, seed)) for seed in range(4)]
    chunks += [_as_bytes(_fp32_weights(300_000, seed).to(torch.bfloat16)) for seed in range(2)]
    expected = [codec.encode_chunk(c, "zstd4")[0] for c in chunks]
    jobs = [i % len(chunks) for i in range(4 * len(chunks))]

    def encode(i: int) -> bytes:
        return b"".join(codec.encode_chunk_parts(chunks[i], "zstd4")[0])

    with ThreadPoolExecutor(4) as pool:
        blobs = list(pool.map(encode, jobs))
    assert blobs == [expected[i] for i in jobs]


@pytest.mark.parametrize("method", ["zstd", "LZ4", "", "raw"])
def test_unknown_method_is_an_error(method: str) -> None:
    with pytest.raises(ValueError, match="lz4, zstd4"):
        codec.encode_chunk(b"data", method)
    with pytest.raises(ValueError):
        codec.encode_chunk_parts(b"", method)


def test_decoded_reuses_a_buffer_per_core_and_gives_the_same_bytes() -> None:
    """codec.decoded() (the fetcher's path) gives decode_chunk's bytes; its zstd4 output
    lives in one of os.cpu_count() reused buffers, all back in the pool after the block,
    and at most that many decodes hold one at once."""
    weights = (torch.randn(1 << 18) * 0.02).numpy().tobytes()
    blobs = [codec.encode_chunk(d, m)[0] for d, m in (
        (weights, "zstd4"), (bytes(1 << 16), "lz4"), (os.urandom(1 << 16), "zstd4"))]
    assert [b[4] for b in blobs] == [codec.CODEC_ZSTD4, codec.CODEC_LZ4, codec.CODEC_RAW]
    assert [codec.is_raw(b) for b in blobs] == [False, False, True]
    cores = os.cpu_count() or 1
    for blob in blobs:
        with codec.decoded(blob, codec.chunk_hash(codec.decode_chunk(blob))) as data:
            assert bytes(data) == bytes(codec.decode_chunk(blob))
        assert codec._OUTPUTS.qsize() == cores
    with ThreadPoolExecutor(cores + 2) as pool:
        def hold(_: int) -> int:
            with codec.decoded(blobs[0]):
                return cores - codec._OUTPUTS.qsize()  # buffers in use, this one included

        assert max(pool.map(hold, range(4 * cores))) <= cores
    assert codec._OUTPUTS.qsize() == cores


@pytest.mark.parametrize("method", codec.CODECS)
def test_encoded_gives_the_bytes_of_encode_chunk_in_reused_memory(method: str) -> None:
    """codec.encoded() (the uploader's) is encode_chunk() as parts; a zstd4 chunk's raw
    planes stay right until the block ends, and the regrouping buffer is reused."""
    weights = torch.randn(1 << 18).numpy().tobytes() + b"xyz"  # a tail, and raw planes
    for data in (weights, os.urandom(1 << 20), bytes(1 << 20), b"", b"ab"):
        with codec.encoded(data, method) as (parts, codec_id):
            joined = b"".join(parts)
            codec.encode_chunk(os.urandom(1 << 20), method)  # others encoding meanwhile
            assert b"".join(parts) == joined
        assert (joined, codec_id) == codec.encode_chunk(data, method)
        assert bytes(codec.decode_chunk(joined, codec.chunk_hash(data))) == data
    if method == "zstd4":
        with codec.encoded(weights, method) as (parts, _):
            first = [p.obj for p in parts if isinstance(p, memoryview) and
                     isinstance(p.obj, np.ndarray)]
        with codec.encoded(weights, method) as (parts, _):
            again = [p.obj for p in parts if isinstance(p, memoryview) and
                     isinstance(p.obj, np.ndarray)]
        assert first and again and first[0].base is again[0].base  # the same buffer
