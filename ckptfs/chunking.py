"""Where chunk boundaries fall in a file: pure arithmetic, no I/O.

Format v1 cuts files at fixed multiples of the store's chunk size. Everything else in
ckptfs only asks this module which chunks a byte range touches and where a chunk starts
and ends, so a content-aware chunker (cuts at tensor boundaries) can replace it later:
manifests already record each chunk's length.
"""

from __future__ import annotations

DEFAULT_CHUNK_SIZE = 16 * 1024 * 1024
MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 256 * 1024 * 1024


class FixedChunker:
    """Chunk i covers bytes [i * chunk_size, min((i + 1) * chunk_size, file size))."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size must be in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
        self.chunk_size = chunk_size

    def count(self, size: int) -> int:
        """Number of chunks of a file of `size` bytes."""
        return -(-size // self.chunk_size)

    def index(self, offset: int) -> int:
        """The chunk holding byte `offset`."""
        return offset // self.chunk_size

    def span(self, index: int, size: int) -> tuple[int, int]:
        """Byte range [start, end) of chunk `index` in a file of `size` bytes."""
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, size)

    def touched(self, offset: int, length: int) -> range:
        """Indexes of the chunks that bytes [offset, offset + length) touch."""
        if length <= 0:
            return range(0)
        return range(offset // self.chunk_size, (offset + length - 1) // self.chunk_size + 1)

    def end_of(self, index: int) -> int:
        """Where chunk `index` ends in a file that goes on past it."""
        return (index + 1) * self.chunk_size

    def completed(self, old_end: int, new_end: int) -> range:
        """Indexes of the chunks that end in (old_end, new_end]: those a sequential write
        from old_end to new_end has just filled (in a file that goes on)."""
        return range(self.index(old_end), new_end // self.chunk_size)

    def matches(self, lengths: list[int]) -> bool:
        """Whether chunks of these lengths, in order, have this chunker's boundaries."""
        return all(n == self.chunk_size for n in lengths[:-1]) and (
            not lengths or lengths[-1] <= self.chunk_size)
