"""Each namespace operation of CheckpointFS called directly (no FUSE): the project exception
of every failure (fuseops turns each into its errno), and renames of every kind, then
read back after a restart of the core on the same store (as S3QL's t3_fs_api does)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from corefs import ROOT, core, read_file, run, write_file
from support import random_bytes, wait_until_async

from ckptfs.common.errors import (
    Exists,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NoAttribute,
    NoEntry,
    NotADirectory,
    NotEmpty,
    NotPermitted,
    NotSupported,
)
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.names import NAME_MAX
from ckptfs.fs.namespace import DirNode, FileNode, Node
from ckptfs.fs.ownership import Caller


def on_core(tmp_path: Path, body: Callable[[CheckpointFS], Awaitable[None]]) -> None:
    """Run `body` on a fresh core over an empty store."""
    async def main() -> None:
        async with core(tmp_path) as fs:
            await body(fs)

    run(main)


async def names(fs: CheckpointFS, inode: int = ROOT) -> list[str]:
    return [name for name, _ in await fs.readdir(inode)]


async def mkdir(fs: CheckpointFS, path: str) -> DirNode:
    """mkdir -p, one call per level."""
    parent: Node = fs.root
    for name in path.split("/"):
        try:
            parent = await fs.lookup(parent.inode, name)
        except NoEntry:
            parent = await fs.mkdir(parent.inode, name, 0o755)
    assert isinstance(parent, DirNode)
    return parent


async def lookup(fs: CheckpointFS, path: str) -> Node:
    node: Node = fs.root
    for name in path.split("/"):
        node = await fs.lookup(node.inode, name)
    return node


async def put(fs: CheckpointFS, path: str, data: bytes) -> FileNode:
    """Create the file (in an existing directory), write `data`, close it."""
    parent, _, name = path.rpartition("/")
    parent_inode = (await lookup(fs, parent)).inode if parent else ROOT
    await write_file(fs, name, data, parent=parent_inode)
    node = await fs.lookup(parent_inode, name)
    assert isinstance(node, FileNode)
    return node


async def cat(fs: CheckpointFS, path: str) -> bytes:
    parent, _, name = path.rpartition("/")
    return await read_file(fs, name, (await lookup(fs, parent)).inode if parent else ROOT)


# ---------------------------------------------------------------------------- errors
def test_lookup_of_a_missing_name_is_no_entry(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        with pytest.raises(NoEntry):
            await fs.lookup(ROOT, "nope")
        d = await mkdir(fs, "d")
        with pytest.raises(NoEntry):
            await fs.lookup(d.inode, "nope")
        with pytest.raises(NoEntry):
            fs.node(123456)  # an inode the kernel never got

    on_core(tmp_path, body)


def test_create_and_mkdir_of_an_existing_name_is_exists(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await put(fs, "f", b"1")
        await mkdir(fs, "d")
        for name in ("f", "d"):
            with pytest.raises(Exists):
                await fs.create(ROOT, name, 0o644, os.O_WRONLY)
            with pytest.raises(Exists):
                await fs.mkdir(ROOT, name, 0o755)
            with pytest.raises(Exists):
                await fs.symlink(ROOT, name, "target")
        assert await cat(fs, "f") == b"1"  # unharmed
        assert await names(fs) == ["d", "f"]

    on_core(tmp_path, body)


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        f = await put(fs, "f", b"x")
        with pytest.raises(NotADirectory):
            await fs.mkdir(f.inode, "sub", 0o755)  # mkdir under a file
        with pytest.raises(NotADirectory):
            await fs.create(f.inode, "sub", 0o644, os.O_WRONLY)
        with pytest.raises(NotADirectory):
            await fs.lookup(f.inode, "sub")
        with pytest.raises(NotADirectory):
            await fs.readdir(f.inode)
        with pytest.raises(NotADirectory):
            await fs.rmdir(ROOT, "f")

    on_core(tmp_path, body)


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        d = await mkdir(fs, "d")
        with pytest.raises(IsADirectory):
            await fs.unlink(ROOT, "d")
        with pytest.raises(IsADirectory):
            await fs.open(d.inode, os.O_RDONLY)
        with pytest.raises(IsADirectory):
            await fs.setattr(d.inode, size=0)  # truncate
        assert await names(fs) == ["d"]

    on_core(tmp_path, body)


def test_rmdir_of_a_non_empty_directory_is_not_empty(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await mkdir(fs, "a/b")
        with pytest.raises(NotEmpty):
            await fs.rmdir(ROOT, "a")  # a subdirectory in it
        await put(fs, "a/b/f", b"x")
        b = await lookup(fs, "a/b")
        with pytest.raises(NotEmpty):
            await fs.rmdir((await lookup(fs, "a")).inode, "b")  # a file in it
        await fs.unlink(b.inode, "f")
        await fs.rmdir((await lookup(fs, "a")).inode, "b")
        await fs.rmdir(ROOT, "a")
        assert await names(fs) == []
        with pytest.raises(NoEntry):
            await fs.rmdir(ROOT, "a")
        with pytest.raises(NoEntry):
            await fs.unlink(ROOT, "a")

    on_core(tmp_path, body)


LONGEST = ["n" * NAME_MAX,  # and in UTF-8 bytes, not characters (é is 2):
           "é" * (NAME_MAX // 2) + "x" * (NAME_MAX % 2)]


def test_names_up_to_name_max_bytes(tmp_path: Path) -> None:
    """A name of NAME_MAX bytes (UTF-8, not characters) is taken by every call that makes
    a name; one byte more is NameTooLong, and nothing is created."""
    limit = NAME_MAX
    assert [len(name.encode()) for name in LONGEST] == [limit, limit]

    async def body(fs: CheckpointFS) -> None:
        d = await mkdir(fs, "d")
        for longest in LONGEST:
            too_long = longest + "x"
            fh, _ = await fs.create(d.inode, longest, 0o644, os.O_WRONLY)
            await fs.release(fh)
            await fs.mkdir(ROOT, longest, 0o755)
            with pytest.raises(NameTooLong):
                await fs.create(ROOT, too_long, 0o644, os.O_WRONLY)
            with pytest.raises(NameTooLong):
                await fs.mkdir(ROOT, too_long, 0o755)
            with pytest.raises(NameTooLong):
                await fs.symlink(ROOT, too_long, "target")
            with pytest.raises(NameTooLong):
                await fs.rename(d.inode, longest, ROOT, too_long)
            with pytest.raises(NoEntry):
                await fs.lookup(ROOT, too_long)
        assert await names(fs, d.inode) == sorted(LONGEST)
        assert await names(fs) == sorted(["d", *LONGEST])
        assert fs.statfs()["namemax"] == limit

    on_core(tmp_path, body)


@pytest.mark.parametrize("longest", LONGEST, ids=["ascii", "utf-8"])
def test_a_file_named_with_name_max_bytes_reaches_the_store(
        tmp_path: Path, longest: str) -> None:
    """What the kernel lets through (NAME_MAX bytes) every store must hold: the file is
    published, and read back by a fresh node."""
    async def body(fs: CheckpointFS) -> None:
        await write_file(fs, longest, b"long")
        await wait_until_async(lambda: fs.flushed() or fs.publisher.last_error, 60,
                               "published, or failed")
        assert fs.flushed(), fs.statistics().errors

    on_core(tmp_path, body)

    async def fresh_node() -> None:
        other = tmp_path / "node-b"
        other.mkdir()
        os.symlink(tmp_path / "store", other / "store")
        async with core(other) as fs:
            assert await read_file(fs, longest) == b"long"

    run(fresh_node)


def test_bad_names_are_invalid(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        for bad in (".", "..", "a/b", "a\0b"):
            with pytest.raises(InvalidArgument):
                await fs.create(ROOT, bad, 0o644, os.O_WRONLY)
        await put(fs, "f", b"x")
        for bad in ("a/b", "a\0b"):
            with pytest.raises(InvalidArgument):
                await fs.rename(ROOT, "f", ROOT, bad)
        assert await names(fs) == ["f"]

    on_core(tmp_path, body)


def test_other_refusals(tmp_path: Path) -> None:
    """chown to someone else, readlink of a file, unknown and set extended attributes."""
    async def body(fs: CheckpointFS) -> None:
        f = await put(fs, "f", b"x")
        with pytest.raises(NotPermitted):  # only root gives a file away
            await fs.setattr(f.inode, uid=os.getuid() + 1, caller=Caller(1001, 1001))
        with pytest.raises(InvalidArgument):
            fs.readlink(f.inode)
        with pytest.raises(NoAttribute):
            fs.xattr(f.inode, "user.unknown")
        with pytest.raises(NotSupported):
            fs.set_xattr("user.foo")
        link = await fs.symlink(ROOT, "l", "f")
        assert fs.readlink(link.inode) == "f"

    on_core(tmp_path, body)


def test_statistics_is_a_frozen_snapshot(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        st = fs.statistics()
        with pytest.raises(dataclasses.FrozenInstanceError):
            st.dirty_bytes = 1  # type: ignore[misc]
        fh = await write_file(fs, "f", b"x" * 1000, close=False)
        assert st.open_files == 0 and fs.statistics().open_files == 1  # not a live view
        await fs.flush(fh)
        await fs.release(fh)

    on_core(tmp_path, body)


# ---------------------------------------------------------------------------- renames
def test_rename_a_file_over_a_file(tmp_path: Path) -> None:
    new, old = random_bytes(3 * 1024), random_bytes(5 * 1024)

    async def body(fs: CheckpointFS) -> None:
        src = await put(fs, "new", new)
        await put(fs, "old", old)
        held = await fs.lookup(ROOT, "old")
        fh, _ = await fs.open(held.inode, os.O_RDONLY)  # open before the replace
        await fs.rename(ROOT, "new", ROOT, "old")
        assert await names(fs) == ["old"]
        assert await fs.lookup(ROOT, "old") is src  # the same inode, under its new name
        assert await cat(fs, "old") == new
        assert await fs.read(fh, 0, len(old) + 1) == old  # the replaced file, still open
        await fs.release(fh)
        with pytest.raises(NoEntry):
            await fs.lookup(ROOT, "new")
        await fs.rename(ROOT, "old", ROOT, "old")  # onto itself: nothing happens
        assert await cat(fs, "old") == new
        with pytest.raises(NoEntry):
            await fs.rename(ROOT, "missing", ROOT, "x")

    on_core(tmp_path, body)


def test_rename_a_directory_over_an_empty_directory(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await mkdir(fs, "src/sub")
        await put(fs, "src/sub/f", b"f")
        await mkdir(fs, "dst")
        await fs.rename(ROOT, "src", ROOT, "dst")
        assert await names(fs) == ["dst"]
        assert await cat(fs, "dst/sub/f") == b"f"

    on_core(tmp_path, body)


def test_rename_a_directory_over_a_non_empty_directory_is_not_empty(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await mkdir(fs, "src")
        await mkdir(fs, "dst")
        await put(fs, "dst/keep", b"k")
        with pytest.raises(NotEmpty):
            await fs.rename(ROOT, "src", ROOT, "dst")
        assert await names(fs) == ["dst", "src"]
        assert await cat(fs, "dst/keep") == b"k"

    on_core(tmp_path, body)


def test_rename_a_directory_into_itself_is_invalid(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        deep = await mkdir(fs, "d/a/b")
        d = await lookup(fs, "d")
        with pytest.raises(InvalidArgument):
            await fs.rename(ROOT, "d", d.inode, "inside")
        with pytest.raises(InvalidArgument):
            await fs.rename(ROOT, "d", deep.inode, "inside")
        assert await names(fs) == ["d"] and await names(fs, deep.inode) == []

    on_core(tmp_path, body)


def test_rename_between_a_file_and_a_directory(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await put(fs, "f", b"x")
        await mkdir(fs, "d")
        with pytest.raises(IsADirectory):  # a file over a directory
            await fs.rename(ROOT, "f", ROOT, "d")
        with pytest.raises(NotADirectory):  # a directory over a file
            await fs.rename(ROOT, "d", ROOT, "f")
        assert await names(fs) == ["d", "f"] and await cat(fs, "f") == b"x"

    on_core(tmp_path, body)


def test_rename_noreplace(tmp_path: Path) -> None:
    async def body(fs: CheckpointFS) -> None:
        await put(fs, "a", b"a")
        await put(fs, "b", b"b")
        await mkdir(fs, "d")
        with pytest.raises(Exists):
            await fs.rename(ROOT, "a", ROOT, "b", noreplace=True)
        with pytest.raises(Exists):
            await fs.rename(ROOT, "a", ROOT, "d", noreplace=True)
        assert await cat(fs, "a") == b"a" and await cat(fs, "b") == b"b"
        await fs.rename(ROOT, "a", ROOT, "c", noreplace=True)
        assert await names(fs) == ["b", "c", "d"] and await cat(fs, "c") == b"a"

    on_core(tmp_path, body)


def test_renamed_and_unlinked_files_after_a_restart(tmp_path: Path) -> None:
    """Renames (a file over a file, a file into another directory, a directory with its
    files) and unlinks, then the core stops at once (its journal not yet drained), starts
    again on the same store and cache, and reads every file back right away; then a
    fresh node with an empty cache reads the same from the store alone."""
    blobs = {name: random_bytes(100 * 1024 + i, i) for i, name in enumerate("abcdef")}
    want = {"b": blobs["a"], "ckpt/e": blobs["e"], "ckpt/moved": blobs["c"],
            "ckpt/sub/f": blobs["f"]}

    async def tree(fs: CheckpointFS, prefix: str = "") -> dict[str, bytes]:
        out = {}
        parent = await lookup(fs, prefix) if prefix else fs.root
        for name, node in await fs.readdir(parent.inode):
            path = f"{prefix}/{name}" if prefix else name
            if isinstance(node, DirNode):
                out.update(await tree(fs, path))
            else:
                out[path] = await cat(fs, path)
        return out

    async def first() -> None:
        async with core(tmp_path) as fs:
            for name in "abcd":
                await put(fs, name, blobs[name])
            await mkdir(fs, "tmp/sub")
            await put(fs, "tmp/e", blobs["e"])
            await put(fs, "tmp/sub/f", blobs["f"])
            await fs.rename(ROOT, "a", ROOT, "b")  # over a file
            tmp = await lookup(fs, "tmp")
            await fs.rename(ROOT, "c", tmp.inode, "moved")  # into a directory
            await fs.unlink(ROOT, "d")
            await fs.rename(ROOT, "tmp", ROOT, "ckpt")  # a directory and its files
            assert await tree(fs) == want

    async def restarted() -> None:
        async with core(tmp_path) as fs:
            assert await tree(fs) == want
            with pytest.raises(NoEntry):
                await fs.lookup(ROOT, "tmp")
            await fs.wait_all_flushed()

    async def fresh_node() -> None:
        other = tmp_path / "node-b"
        other.mkdir()
        os.symlink(tmp_path / "store", other / "store")
        async with core(other) as fs:
            assert await tree(fs) == want

    run(first)
    run(restarted)
    run(fresh_node)
