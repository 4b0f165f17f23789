"""The core tier's harness: a CheckpointFS over a LocalStore in a trio nursery, wired as
the mount wires it (uploader, fetcher, publisher), and file calls made through it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import trio

from ckptfs.common.config import LIMITS
from ckptfs.daemon.mount import create_store, read_store_info
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import FileNode
from ckptfs.fs.options import Options
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.pipeline.uploader import Uploader
from ckptfs.store.base import AsyncStore
from ckptfs.store.local import LocalStore

KiB = 1024
CHUNK = 64 * KiB
ROOT = 1


@contextlib.asynccontextmanager
async def core(root: Path, cache_size: int = 1 << 30, upload: bool = True,
               upload_threads: int = 2, publish: bool = True,
               queue_limit: int = LIMITS.upload_queue,
               prefetch_window: int = Options.prefetch_window,
               trash_keep: float = 0.0) -> AsyncIterator[CheckpointFS]:
    """A CheckpointFS on the store root/store with its cache in root/cache (kept between
    calls, like a remount with the same --cache-dir). upload=False: nothing reaches the
    store's chunks (the upload workers are not started). publish=False: no metadata op
    reaches the store (the publisher is not started, and nothing waits for it).
    queue_limit: how many jobs the upload queue holds. prefetch_window: Options'.
    trash_keep: seconds deleted and replaced versions stay in the trash (0: off)."""
    (root / "store").mkdir(parents=True, exist_ok=True)
    store = LocalStore(root / "store")
    info = read_store_info(store) or create_store(store, CHUNK)
    journal = Journal(str(root / "journal.sqlite"))
    cache = LocalCache(str(root / "cache"), cache_size)
    cache.scan(keep_staging=journal.staging_in_use(), keep_unnamed=journal.damage is not None)
    journal_limiter = trio.CapacityLimiter(1)
    uploader = Uploader(store, cache, journal, journal_limiter, workers=upload_threads,
                        codec_name=info.codec, queue_limit=queue_limit)
    fetcher = Fetcher(store, cache, workers=2, missing_timeout=1.0)
    publisher = Publisher(store, journal, journal_limiter, "node-a", cache,
                          trash_keep=trash_keep)
    fs = CheckpointFS(AsyncStore(store, trio.CapacityLimiter(4)), cache, uploader, fetcher,
                      publisher, info,
                      Options(writer_id="node-a", publish_timeout=10.0 if publish else 0.0,
                              prefetch_window=prefetch_window))
    damage = journal.damage
    if damage is not None:
        fs.journal_check = JournalCheck(store, journal, journal_limiter, cache, uploader,
                                        publisher, "node-a", damage)
    try:
        await uploader.resume(journal.pending_chunks())
        publisher.load(journal.pending_ops())
        async with trio.open_nursery() as nursery:
            if upload:
                await nursery.start(uploader.run)
            await nursery.start(fetcher.run)
            if publish:
                await nursery.start(publisher.run)
            if fs.journal_check is not None:
                await nursery.start(fs.journal_check.run)
            yield fs
            nursery.cancel_scope.cancel()
    finally:
        cache.close()
        journal.close()


def run(fn: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body under trio."""
    trio.run(fn)


async def write_file(fs: CheckpointFS, name: str, data: bytes, piece: int = 16 * KiB,
                     close: bool = True, check: Callable[[], None] | None = None,
                     parent: int = ROOT) -> int:
    """create + sequential writes (+ flush/release); `check` runs after every write."""
    fh, _ = await fs.create(parent, name, 0o644, os.O_WRONLY)
    for offset in range(0, len(data), piece):
        await fs.write(fh, offset, data[offset:offset + piece])
        if check is not None:
            check()
    if close:
        await fs.flush(fh)
        await fs.release(fh)
    return fh


async def overwrite(fs: CheckpointFS, name: str, data: bytes, parent: int = ROOT) -> None:
    """open(O_WRONLY | O_TRUNC) an existing file, write `data`, close: torch.save."""
    node = await fs.lookup(parent, name)
    fh, _ = await fs.open(node.inode, os.O_WRONLY | os.O_TRUNC)
    await fs.write(fh, 0, data)
    await fs.flush(fh)
    await fs.release(fh)


async def read_file(fs: CheckpointFS, name: str, parent: int = ROOT) -> bytes:
    """lookup + open + read it all + release."""
    node = await fs.lookup(parent, name)
    assert isinstance(node, FileNode)
    fh, _ = await fs.open(node.inode, os.O_RDONLY)
    try:
        return bytes(await fs.read(fh, 0, node.size + 1))
    finally:
        await fs.release(fh)
