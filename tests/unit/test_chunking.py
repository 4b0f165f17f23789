"""chunking: the chunk arithmetic of a Layout (cuts that grow at the end)."""

from __future__ import annotations

import itertools

import pytest

from ckptfs.format.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Layout, check_chunk_size


def test_chunk_size_bounds() -> None:
    assert check_chunk_size(MIN_CHUNK_SIZE) == MIN_CHUNK_SIZE
    assert check_chunk_size(MAX_CHUNK_SIZE) == MAX_CHUNK_SIZE
    for bad in (0, -1, MIN_CHUNK_SIZE - 1, MAX_CHUNK_SIZE + 1):
        with pytest.raises(ValueError):
            check_chunk_size(bad)


@pytest.mark.parametrize(("size", "count"), [
    (0, 0), (1, 1), (9, 1), (10, 1), (11, 2), (25, 2), (26, 3), (40, 3)])
def test_chunk_count(size: int, count: int) -> None:
    # a cut equal to the size ends the last chunk and starts no empty one
    assert Layout([10, 25]).count(size) == count


def test_index_span_and_open_chunk() -> None:
    lay = Layout([10, 25])
    assert [lay.index(o) for o in (0, 9, 10, 24, 25, 99)] == [0, 0, 1, 1, 2, 2]
    size = 31
    assert [lay.span(i, size) for i in range(lay.count(size))] == [(0, 10), (10, 25), (25, 31)]
    assert lay.span(1, 20) == (10, 20)  # clamped to the size (a truncation in progress)
    assert (lay.end_of(1), lay.end_of(2)) == (25, None)  # the last chunk is open
    spans = [lay.span(i, size) for i in range(lay.count(size))]
    assert spans[0][0] == 0 and spans[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_touched_and_completed() -> None:
    lay = Layout([10, 25])
    assert list(lay.touched(0, 0)) == []
    assert list(lay.touched(5, -3)) == []
    assert list(lay.touched(0, 10)) == [0]
    assert list(lay.touched(9, 2)) == [0, 1]
    assert list(lay.touched(10, 100)) == [1, 2]
    assert list(lay.completed(0, 9)) == []
    assert list(lay.completed(0, 10)) == [0]  # a chunk is complete when its end is reached
    assert list(lay.completed(10, 30)) == [1]
    assert list(lay.completed(5, 25)) == [0, 1]


def test_add_cut_back_and_of_chunks() -> None:
    lay = Layout.of_chunks([10, 15, 6])
    assert lay.cuts == [10, 25]
    lay.add(40)
    with pytest.raises(AssertionError):
        lay.add(40)  # cuts only grow
    lay.cut_back(25)
    assert lay.cuts == [10, 25]
    lay.cut_back(12)
    assert lay.cuts == [10]
    assert Layout.of_chunks([]).cuts == [] and Layout.of_chunks([7]).cuts == []
