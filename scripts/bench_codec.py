"""Benchmark: the chunk codecs on checkpoint-like data, one core.

Trains a small transformer a few AdamW steps on CPU (no downloads), then cuts into
16 MiB chunks: its fp32 weights, the same weights in bf16, the optimizer state (Adam's
moments) and random bytes, MIB MiB of each. Per codec it prints the stored/logical ratio,
encode MB/s (chunk_hash + encode_chunk_parts, as the uploader) and decode MB/s
(decode_chunk with the name verified, as the fetcher), medians of 3 runs. The rows
"zstd4 L1 32K" (zstd's own level-1 match table) and "zstd4 L3" are for the record: they
run zstd4 with another compressor than codec.ZSTD_PARAMS.

    .venv/bin/python scripts/bench_codec.py             # 64 MiB of each
    .venv/bin/python scripts/bench_codec.py --mib 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckptfs.format import codec  # noqa: E402

CHUNK = 16 * 1024 * 1024
RUNS = 3


def tensor_bytes(tensors: list[torch.Tensor], size: int) -> bytes:
    """The first `size` bytes of the tensors one after the other (repeated if short)."""
    flat = b"".join(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
                    for t in tensors)
    return (flat * (size // len(flat) + 1))[:size]


def checkpoint_data(size: int) -> dict[str, bytes]:
    """`size` bytes each of fp32 weights, bf16 weights, optimizer state, random bytes."""
    torch.manual_seed(0)
    d_model, vocab = 512, 4096
    layers = max(1, round(size / (4 * 12 * d_model * d_model)))  # ~12 d^2 params a layer
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, d_model),
        torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d_model, 8, 4 * d_model, batch_first=True),
            layers),
        torch.nn.Linear(d_model, vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (4, 65))
    for _ in range(5):
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        torch.autograd.backward(
            torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)))
        opt.step()
    weights = list(model.state_dict().values())
    moments = [t for state in opt.state.values() for t in state.values() if t.numel() > 1]
    return {
        "fp32 weights": tensor_bytes(weights, size),
        "bf16 weights": tensor_bytes([t.to(torch.bfloat16) for t in weights], size),
        "optimizer state": tensor_bytes(moments, size),
        "random": np.random.default_rng(0).bytes(size),
    }


@contextmanager
def zstd_compressor(compressor: zstandard.ZstdCompressor | None) -> Iterator[None]:
    """zstd4 with `compressor` in this thread (None: codec.ZSTD_PARAMS)."""
    own = codec._zstd.compressor
    codec._zstd.compressor = compressor or own
    try:
        yield
    finally:
        codec._zstd.compressor = own


def encode_raw(data: memoryview) -> list[codec.Buffer]:
    return [codec._HEADER.pack(codec.MAGIC, codec.CODEC_RAW, len(data)), data]


METHODS: dict[str, tuple[Callable[[memoryview], list[codec.Buffer]],
                         zstandard.ZstdCompressor | None]] = {
    "raw": (encode_raw, None),
    "lz4": (lambda c: codec.encode_chunk_parts(c, "lz4")[0], None),
    "zstd4": (lambda c: codec.encode_chunk_parts(c, "zstd4")[0], None),
    "zstd4 L1 32K": (lambda c: codec.encode_chunk_parts(c, "zstd4")[0],
                     zstandard.ZstdCompressor(level=1)),
    "zstd4 L3": (lambda c: codec.encode_chunk_parts(c, "zstd4")[0],
                 zstandard.ZstdCompressor(level=3)),
}


def timed(f: Callable[[], object]) -> float:
    """Median seconds of RUNS calls of f."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(data: bytes, encode: Callable[[memoryview], list[codec.Buffer]]) -> tuple[float, ...]:
    """(stored/logical, encode MB/s, decode MB/s) of `data` in CHUNK-sized chunks."""
    view = memoryview(data)
    chunks = [view[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    names = [codec.chunk_hash(c) for c in chunks]
    blobs = [b"".join(encode(c)) for c in chunks]
    encode_s = timed(lambda: [(codec.chunk_hash(c), encode(c)) for c in chunks])
    decode_s = timed(lambda: [codec.decode_chunk(b, h) for b, h in zip(blobs, names, strict=True)])
    return (sum(map(len, blobs)) / len(data), len(data) / encode_s / 1e6,
            len(data) / decode_s / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--mib", type=int, default=64, help="MiB of each kind of data (64)")
    args = parser.parse_args()
    datasets = checkpoint_data(args.mib * 1024 * 1024)
    print(f"{'data':16} {'codec':13} {'stored':>7} {'encode MB/s':>12} {'decode MB/s':>12}")
    for name, data in datasets.items():
        for method, (encode, compressor) in METHODS.items():
            with zstd_compressor(compressor):
                ratio, enc, dec = bench(data, encode)
            print(f"{name:16} {method:13} {ratio:7.3f} {enc:12.0f} {dec:12.0f}")


if __name__ == "__main__":
    main()
