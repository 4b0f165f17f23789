"""A damaged record in the store is that file's problem: the file is listed and gives
DamagedRecord (EIO at the FUSE edge) with one log line naming its key, every other file
reads back, a repaired manifest reads again; a damaged directory marker or rename intent
is logged and left alone."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from corefs import ROOT, core, read_file, run, write_file
from support import random_bytes

from ckptfs.common.errors import DamagedRecord
from ckptfs.format import manifests
from ckptfs.fs.namespace import FileNode
from ckptfs.store.local import LocalStore

DAMAGE: list[dict[str, Any]] = [{"mode": -1}, {"mode": 2**70},
                                {"size": 1e308, "chunks": [["0" * 32, 1e308]]}]


def damaged_logs(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR and key in r.getMessage()]


@pytest.mark.parametrize("damage", DAMAGE, ids=["mode-1", "mode-2**70", "length-1e308"])
def test_a_damaged_manifest_is_eio_on_that_file_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: dict[str, Any]) -> None:
    good = {f"f{i}.bin": random_bytes(100_000 + i) for i in range(3)}

    async def write() -> None:
        async with core(tmp_path) as fs:
            for name, data in good.items():
                await write_file(fs, name, data)
            await write_file(fs, "bad.bin", b"will be damaged")

    run(write)
    store = LocalStore(tmp_path / "store")
    key = manifests.file_key("bad.bin")
    sound = store.get(key)
    store.put(key, json.dumps({**json.loads(sound), **damage}).encode())

    async def read() -> None:
        async with core(tmp_path) as fs:
            await fs.list_root()  # as the mount does before it is ready: no exception
            for _ in range(3):
                assert [n for n, _ in await fs.readdir(ROOT)] == sorted([*good, "bad.bin"])
                with pytest.raises(DamagedRecord, match="bad.bin"):
                    await fs.lookup(ROOT, "bad.bin")
                node = dict(await fs.readdir(ROOT))["bad.bin"]
                with pytest.raises(DamagedRecord):
                    fs.getattr(node.inode)
                with pytest.raises(DamagedRecord):
                    await fs.open(node.inode, 0)
                for name, data in good.items():
                    assert await read_file(fs, name) == data
                await fs.refresh_dir("")  # listed again: read again, still damaged
            assert len(damaged_logs(caplog, key)) == 1, damaged_logs(caplog, key)
            store.put(key, sound)  # repaired
            await fs.refresh_dir("")
            assert await read_file(fs, "bad.bin") == b"will be damaged"

    run(read)


def test_a_file_damaged_after_it_was_read_gives_eio_at_its_next_open(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with core(tmp_path) as fs:
            await write_file(fs, "a.bin", b"abc")
        store = LocalStore(tmp_path / "store")
        async with core(tmp_path) as fs:
            assert await read_file(fs, "a.bin") == b"abc"
            node = await fs.lookup(ROOT, "a.bin")
            assert isinstance(node, FileNode)
            key = manifests.file_key("a.bin")
            store.put(key, store.get(key).replace(b'"mode":33188', b'"mode":true'))
            node.checked_at = 0.0  # older than the TTL: open reads the manifest again
            with pytest.raises(DamagedRecord):
                await fs.open(node.inode, 0)
            with pytest.raises(DamagedRecord):
                await fs.lookup(ROOT, "a.bin")
            assert len(damaged_logs(caplog, key)) == 1

    run(main)


def test_a_damaged_marker_keeps_its_directory_and_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with core(tmp_path) as fs:
            d = await fs.mkdir(ROOT, "d", 0o700)
            await write_file(fs, "x.bin", b"xyz", parent=d.inode)
        store = LocalStore(tmp_path / "store")
        store.put(manifests.dir_key("d"), b'{"v": 1, "mode": -1, "mtime_ns": 5}')
        async with core(tmp_path) as fs:
            looked = await fs.lookup(ROOT, "d")
            assert looked.mode == 0o40755  # the default mode
            assert await read_file(fs, "x.bin", parent=looked.inode) == b"xyz"
            assert len(damaged_logs(caplog, "files/d/")) == 1

    run(main)


def test_a_damaged_rename_intent_is_logged_and_left_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with core(tmp_path) as fs:
            d = await fs.mkdir(ROOT, "d", 0o755)
            await write_file(fs, "x.bin", b"xyz", parent=d.inode)
        store = LocalStore(tmp_path / "store")
        bodies = {"intents/n-1.json": b'{"v": 1, "op": "rename_dir", "src": "d", "dst": "d"}',
                  "intents/n-2.json": b'{"v": 1, "op": "rename_dir", "src": "d", '
                                      b'"dst": "e", "time": 1e999}',
                  "intents/n-3.json": b'{"v": true, "op": "rename_dir", "src": "d", '
                                      b'"dst": "e"}'}
        for key, body in bodies.items():
            store.put(key, body)
        async with core(tmp_path) as fs:
            looked = await fs.lookup(ROOT, "d")
            assert await read_file(fs, "x.bin", parent=looked.inode) == b"xyz"
        assert {k: store.get(k) for k in bodies} == bodies
        for key in bodies:
            assert len(damaged_logs(caplog, key)) == 1, key

    run(main)
