"""Where the chunks of one version of a file begin and end: a growing list of cuts.

A Layout holds the cut offsets of a file being written. Chunk i runs from cut i-1 (0 for
the first) to cut i; the last chunk runs to the file's size and is *open*: it grows with
the file until a cut ends it. Where the cuts fall is decided elsewhere: formats.py
decides them while a new file is written in order (at tensor boundaries, or every
chunk_size bytes), and WriteBuffer re-cuts a version written any other way when it is
sealed. Cuts only ever get added at the end, so a chunk's index never changes while the
file is written in order.
"""

from __future__ import annotations

import bisect

DEFAULT_CHUNK_SIZE = 16 * 1024 * 1024
MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 256 * 1024 * 1024


def check_chunk_size(chunk_size: int) -> int:
    """`chunk_size`, or ValueError if a store cannot use it."""
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk size must be in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]")
    return chunk_size


class Layout:
    """The chunks of one version of one file, as its cuts (see the module docstring).

    Every cut is > 0 and <= the file's size; a cut equal to the size ends the last chunk
    and starts no new one until the file grows past it.
    """

    def __init__(self, cuts: list[int] | None = None) -> None:
        self.cuts: list[int] = cuts or []

    @classmethod
    def of_chunks(cls, lengths: list[int]) -> Layout:
        """The layout of a stored version whose chunks have these lengths, in order."""
        cuts, pos = [], 0
        for n in lengths[:-1]:
            pos += n
            cuts.append(pos)
        return cls(cuts)

    def count(self, size: int) -> int:
        """Number of chunks of the file at `size` bytes."""
        return bisect.bisect_left(self.cuts, size) + 1 if size > 0 else 0

    def index(self, offset: int) -> int:
        """The chunk holding byte `offset`."""
        return bisect.bisect_right(self.cuts, offset)

    def span(self, index: int, size: int) -> tuple[int, int]:
        """Byte range [start, end) of chunk `index` in the file at `size` bytes."""
        start = self.cuts[index - 1] if index else 0
        return start, min(self.cuts[index], size) if index < len(self.cuts) else size

    def end_of(self, index: int) -> int | None:
        """Where chunk `index` ends, or None for the open last chunk."""
        return self.cuts[index] if index < len(self.cuts) else None

    def touched(self, offset: int, length: int) -> range:
        """Indexes of the chunks that bytes [offset, offset + length) touch."""
        if length <= 0:
            return range(0)
        return range(self.index(offset), self.index(offset + length - 1) + 1)

    def completed(self, old_end: int, new_end: int) -> range:
        """Indexes of the chunks whose end lies in (old_end, new_end]: those a write in
        order from old_end to new_end has just completed."""
        return range(bisect.bisect_right(self.cuts, old_end),
                     bisect.bisect_right(self.cuts, new_end))

    def add(self, cut: int) -> None:
        """End the open chunk at `cut` (> every cut so far)."""
        assert not self.cuts or cut > self.cuts[-1], (cut, self.cuts[-1:])
        self.cuts.append(cut)

    def cut_back(self, size: int) -> None:
        """Drop the cuts past `size` (the file was truncated to it)."""
        del self.cuts[bisect.bisect_right(self.cuts, size):]
