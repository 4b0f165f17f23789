"""Bugs the seeded soak found (docs/SOAK.md, "Bugs found"), each made exact."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
from corefs import CHUNK, core, read_file, run, write_file
from support import random_bytes

from ckptfs.store.local import LocalStore


def test_an_early_upload_finishing_after_a_truncate_dropped_its_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written in order has its full chunks uploaded early; the HEADs of those
    uploads are held. The file is truncated to 10 bytes, which drops chunks 1 and 2;
    then the uploads finish. Their callbacks must see that the chunks are gone (before
    the fix: IndexError in the upload worker, which ended the mount's tasks)."""
    data = random_bytes(3 * CHUNK + 5, 1045)
    gate = threading.Event()
    held = threading.Semaphore(0)
    real_head = LocalStore.head

    def head(self: LocalStore, key: str) -> int | None:
        if key.startswith("chunks/") and not gate.is_set():
            held.release()
            gate.wait(10)
        return real_head(self, key)

    monkeypatch.setattr(LocalStore, "head", head)

    async def main() -> None:
        async with core(tmp_path) as fs:
            fh = await write_file(fs, "a.bin", data, close=False)
            await trio.to_thread.run_sync(held.acquire)  # an early upload is held
            await fs.setattr(fs.handle(fh).node.inode, size=10)
            gate.set()
            await trio.sleep(0.2)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert await read_file(fs, "a.bin") == data[:10]

    run(main)
