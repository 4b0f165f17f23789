"""The read path's prefetch: a bounded window ahead of each reader, which follows it."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from corefs import CHUNK, ROOT, core, run, write_file
from support import random_bytes, wait_until_async

from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import FileNode

N = 40  # chunks in the file
WINDOW = 4  # chunks of prefetch window


def other_node(tmp_path: Path) -> Path:
    """The root of a second node on the same store, with an empty cache."""
    other = tmp_path / "node-b"
    other.mkdir()
    os.symlink(tmp_path / "store", other / "store")
    return other


def read_on_another_node(tmp_path: Path, data: bytes,
                         body: Callable[[CheckpointFS, int], Awaitable[None]]) -> None:
    """Write `data` as ckpt.bin on one node, then run body(fs, fh) with it open
    read-only on another node, whose fetches start from nothing."""

    async def write() -> None:
        async with core(tmp_path) as fs:
            await write_file(fs, "ckpt.bin", data)
            await fs.wait_all_flushed()

    async def read() -> None:
        async with core(other_node(tmp_path), prefetch_window=WINDOW * CHUNK) as fs:
            node = await fs.lookup(ROOT, "ckpt.bin")
            assert isinstance(node, FileNode)
            fh, _ = await fs.open(node.inode, os.O_RDONLY)
            await body(fs, fh)
            await fs.release(fh)

    run(write)
    run(read)


async def fetched(fs: CheckpointFS) -> int:
    """Chunks fetched so far, once every fetch started has finished."""
    await wait_until_async(lambda: fs.fetcher.statistics().inflight == 0)
    return fs.fetcher.statistics().fetched_chunks


def test_a_reader_prefetches_a_window_ahead_of_it_not_the_whole_file(tmp_path: Path) -> None:
    """Open fetches the first window; each read keeps the window ahead of it; a fresh
    node never holds the whole file fetched and unread."""
    data = random_bytes(N * CHUNK)

    async def body(fs: CheckpointFS, fh: int) -> None:
        assert await fetched(fs) == WINDOW
        for i in range(N):
            assert await fs.read(fh, i * CHUNK, CHUNK) == data[i * CHUNK:(i + 1) * CHUNK]
            assert await fetched(fs) == min(N, i + 1 + WINDOW)

    read_on_another_node(tmp_path, data, body)


def test_the_window_follows_a_reader_that_jumps(tmp_path: Path) -> None:
    """torch.load reads a zip's directory at the end first, then the records from the
    start: each jump starts a new window there, and what is already local is not
    fetched twice."""
    data = random_bytes(N * CHUNK)

    async def body(fs: CheckpointFS, fh: int) -> None:
        assert await fetched(fs) == WINDOW  # chunks 0-3
        end = (N - 1) * CHUNK
        assert await fs.read(fh, end, CHUNK) == data[end:]
        assert await fetched(fs) == WINDOW + 1  # the last chunk: nothing after it
        mid = 20 * CHUNK
        assert await fs.read(fh, mid, CHUNK) == data[mid:mid + CHUNK]
        assert await fetched(fs) == WINDOW + 1 + 1 + WINDOW  # 20, then 21-24
        assert await fs.read(fh, CHUNK, CHUNK) == data[CHUNK:2 * CHUNK]
        assert await fetched(fs) == 2 * WINDOW + 2 + 2  # 2-5: 4 and 5 are new

    read_on_another_node(tmp_path, data, body)
