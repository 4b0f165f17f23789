"""Variable-length chunks in the write path: however a file's bytes are written (in order,
out of order, truncated, starting from a stored version, with chunks freed from the
cache meanwhile), the version published is cut exactly as a fresh cutter cuts the same
bytes, so the same bytes always give the same chunks (and dedup).

The cutter here is a stand-in with boundaries that depend on content: a chunk ends
after each b"|" (and no chunk is longer than MAX), so a test can move the boundaries
by changing bytes. formats.py's cutters are tested on real files in
tests/unit/test_formats.py and through a mount in tests/fuse/test_efficiency.py.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from corefs import CHUNK, ROOT, core, read_file, run, write_file

from ckptfs.format import codec
from ckptfs.format.formats import Read
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import FileNode

MAX = CHUNK


class BarCutter:
    """Cuts after every b"|", and every MAX bytes since the last cut."""

    def __init__(self) -> None:
        self.pos = 0  # bytes looked at so far
        self.last = 0

    def feed(self, read: Read, available: int) -> list[int]:
        cuts: list[int] = []
        data = read(self.pos, available - self.pos) if available > self.pos else b""
        for i, byte in enumerate(data, self.pos):
            while i + 1 - self.last > MAX:
                self.last += MAX
                cuts.append(self.last)
            if byte == ord("|") and i + 1 > self.last:
                self.last = i + 1
                cuts.append(self.last)
        self.pos = max(self.pos, available)
        return cuts


class LateBarCutter(BarCutter):
    """BarCutter that tells a cut only once a byte past it is written (as a cutter that
    needs to look ahead would): the chunk has then been streamed past its end."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []

    def feed(self, read: Read, available: int) -> list[int]:
        self.held += super().feed(read, available)
        told = [c for c in self.held if c < available]
        self.held = self.held[len(told):]
        return told


def expected_chunks(data: bytes) -> list[tuple[str, int]]:
    cuts = [c for c in BarCutter().feed(lambda o, n: data[o:o + n], len(data)) if c < len(data)]
    bounds = [0, *cuts, len(data)] if data else [0]
    return [(codec.chunk_hash(data[a:b]), b - a) for a, b in zip(bounds, bounds[1:],
                                                                   strict=False)]


def records(rng: random.Random, n: int) -> bytes:
    """n records of random length (some longer than MAX), each ended by b"|"."""
    out = bytearray()
    for _ in range(n):
        length = rng.choice([10, 500, 5000, CHUNK // 3, CHUNK + 777, 2 * CHUNK + 5])
        out += rng.randbytes(length).replace(b"|", b"-") + b"|"
    return bytes(out)


async def chunks_of(fs: CheckpointFS, name: str) -> list[tuple[str, int]]:
    node = await fs.lookup(ROOT, name)
    assert isinstance(node, FileNode) and node.manifest is not None
    return list(node.manifest.chunks)


async def write_pieces(fs: CheckpointFS, name: str, pieces: list[tuple[int, bytes]],
                       flags: int = os.O_WRONLY) -> None:
    fh, _ = await fs.create(ROOT, name, 0o644, flags)
    for offset, piece in pieces:
        await fs.write(fh, offset, piece)
    await fs.flush(fh)
    await fs.release(fh)


def split(data: bytes, rng: random.Random) -> list[tuple[int, bytes]]:
    """data as writes of random sizes, in order."""
    pieces, pos = [], 0
    while pos < len(data):
        n = rng.choice([1, 7, 4096, 65536, 131072, 300000])
        pieces.append((pos, data[pos:pos + n]))
        pos += n
    return pieces


@pytest.mark.parametrize("cutter", [BarCutter, LateBarCutter])
def test_in_order_and_out_of_order_writes_give_the_same_chunks(
        tmp_path: Path, cutter: type[BarCutter]) -> None:
    rng = random.Random(7)
    data = records(rng, 40)
    pieces = split(data, rng)
    shuffled = pieces[:]
    rng.shuffle(shuffled)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fs.new_cutter = cutter
            await write_pieces(fs, "in-order", pieces)
            await write_pieces(fs, "shuffled", shuffled)
            await write_pieces(fs, "backwards", pieces[::-1])
            want = expected_chunks(data)
            assert len(want) > 40  # records, and pieces of the long ones
            for name in ("in-order", "shuffled", "backwards"):
                assert await chunks_of(fs, name) == want, name
                assert await read_file(fs, name) == data

    run(main)


def test_freed_chunks_come_back_when_a_late_write_moves_the_cuts(tmp_path: Path) -> None:
    """A file larger than the cache, written in order (its uploaded chunks freed), then
    patched near the start so that the boundaries move: the chunks whose span changed
    are fetched back and cut again; the bytes and the cuts are exact."""
    rng = random.Random(8)
    data = bytearray(records(rng, 60))
    first_bar = data.index(b"|")

    async def main() -> None:
        async with core(tmp_path, cache_size=4 * CHUNK) as fs:
            fs.new_cutter = BarCutter
            fh = await write_file(fs, "big", bytes(data), piece=100_000, close=False)
            buf = fs.handle(fh).node.buffer
            assert buf is not None and len(buf.remote) > 10  # chunks were freed
            await fs.write(fh, first_bar, b"x")  # one record fewer: cuts move
            data[first_bar] = ord("x")
            await fs.write(fh, 3, b"|")  # one more, near the start
            data[3] = ord("|")
            await fs.flush(fh)
            await fs.release(fh)
            assert await chunks_of(fs, "big") == expected_chunks(bytes(data))
            assert await read_file(fs, "big") == bytes(data)

    run(main)


def test_a_stored_version_changed_in_place_keeps_its_unchanged_chunks(tmp_path: Path) -> None:
    """Open a published file, change one record and append: the version is cut as its
    bytes would be from scratch, and the records that did not change are the same
    stored chunks (not copied in, not uploaded again)."""
    rng = random.Random(9)
    data = records(rng, 30)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fs.new_cutter = BarCutter
            await write_file(fs, "f", data)
            before = await chunks_of(fs, "f")
            node = await fs.lookup(ROOT, "f")
            fh, _ = await fs.open(node.inode, os.O_RDWR)
            mid = len(data) // 2
            await fs.write(fh, mid, b"|changed|")
            await fs.write(fh, len(data), b"tail|more")
            new = data[:mid] + b"|changed|" + data[mid + 9:] + b"tail|more"
            buf = fs.handle(fh).node.buffer
            await fs.flush(fh)
            await fs.release(fh)
            after = await chunks_of(fs, "f")
            assert after == expected_chunks(new)
            assert await read_file(fs, "f") == new
            kept = set(before) & set(after)
            assert len(kept) >= len(before) - 4  # only the chunks around the changes differ
            assert buf is not None and buf.closed

    run(main)


def test_truncate_and_extend_give_the_chunks_of_the_bytes(tmp_path: Path) -> None:
    """Truncating a stored version into the middle of a chunk, then writing past its
    end: the version is cut as its bytes would be from scratch."""
    rng = random.Random(10)
    data = records(rng, 20)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fs.new_cutter = BarCutter
            await write_file(fs, "t", data)
            node = await fs.lookup(ROOT, "t")
            fh, _ = await fs.open(node.inode, os.O_RDWR)
            cut = len(data) // 3
            await fs.setattr(node.inode, size=cut)
            await fs.write(fh, cut + 10, b"a|b")  # leaves a hole of zeros
            await fs.flush(fh)
            await fs.release(fh)
            new = data[:cut] + bytes(10) + b"a|b"
            assert await chunks_of(fs, "t") == expected_chunks(new)
            assert await read_file(fs, "t") == new

    run(main)
