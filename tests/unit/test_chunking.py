"""chunking: the chunk-boundary arithmetic of FixedChunker."""

from __future__ import annotations

import itertools

import pytest

from ckptfs.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, FixedChunker

CS = MIN_CHUNK_SIZE  # the smallest legal chunk size keeps the arithmetic readable


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
