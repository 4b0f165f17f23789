"""Owners and modes in the core (no FUSE): entries belong to the caller that made them,
kept in their records across a restart (another node); chown follows POSIX; setuid and
setgid bits are never stored nor shown, not even from a record written into the store;
--uid/--gid/--file-mode/--dir-mode replace what is shown."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from corefs import ROOT, core, run

from ckptfs.common.errors import NotPermitted
from ckptfs.format import manifests
from ckptfs.format.manifests import DirMarker, Manifest
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import DirNode, FileNode, Node
from ckptfs.fs.ownership import Caller, Ownership
from ckptfs.store.local import LocalStore

ALICE = Caller(1001, 1001, frozenset({1001, 3000}))
BOB = Caller(1002, 1002)
ROOT_USER = Caller(0, 0)
MOUNTER = (os.getuid(), os.getgid())


def shown(fs: CheckpointFS, node: Node) -> tuple[int, int, str]:
    """(st_uid, st_gid, permission bits in octal) as stat shows them."""
    uid, gid = fs.owners.owner(node)
    return uid, gid, oct(stat.S_IMODE(fs.owners.mode(node)))


async def make_file(fs: CheckpointFS, name: str, mode: int, caller: Caller | None,
                    parent: int = ROOT) -> FileNode:
    fh, node = await fs.create(parent, name, mode, os.O_WRONLY, caller)
    await fs.write(fh, 0, b"weights")
    await fs.flush(fh)
    await fs.release(fh)
    return node


def test_entries_belong_to_their_creator_here_and_after_a_restart(tmp_path: Path) -> None:
    """The uid and gid of the call that made a file, directory or symlink are its owner,
    written in its manifest or marker: a restart (another node) shows the same. Setuid
    and setgid asked at create, mkdir and chmod are dropped; the sticky bit is kept."""
    async def write() -> None:
        async with core(tmp_path) as fs:
            d = await fs.mkdir(ROOT, "alice", 0o6775, ALICE)
            f = await make_file(fs, "run.pt", 0o6755, ALICE, d.inode)
            link = await fs.symlink(d.inode, "last", "run.pt", ALICE)
            shared = await fs.mkdir(ROOT, "shared", 0o1777, ROOT_USER)
            old = await make_file(fs, "old.pt", 0o644, None)  # no caller: nothing recorded
            assert shown(fs, d) == (1001, 1001, "0o775")
            assert shown(fs, f) == (1001, 1001, "0o755")
            assert shown(fs, link)[:2] == (1001, 1001)
            assert shown(fs, shared) == (0, 0, "0o1777")
            assert shown(fs, old) == (*MOUNTER, "0o644")
            await fs.setattr(f.inode, mode=0o4711, caller=ALICE)
            assert shown(fs, f) == (1001, 1001, "0o711")
            await fs.publisher.wait_empty()  # chmod does not wait for the store

    async def read() -> None:
        async with core(tmp_path) as fs:
            d = await fs.lookup(ROOT, "alice")
            assert shown(fs, d) == (1001, 1001, "0o775")
            assert shown(fs, await fs.lookup(d.inode, "run.pt")) == (1001, 1001, "0o711")
            assert shown(fs, await fs.lookup(d.inode, "last"))[:2] == (1001, 1001)
            assert shown(fs, await fs.lookup(ROOT, "shared")) == (0, 0, "0o1777")
            assert shown(fs, await fs.lookup(ROOT, "old.pt")) == (*MOUNTER, "0o644")

    run(write)
    store = LocalStore(tmp_path / "store")
    record = json.loads(store.get(manifests.file_key("alice/run.pt")))
    assert (record["uid"], record["gid"], oct(record["mode"])) == (1001, 1001, "0o100711")
    marker = json.loads(store.get(manifests.dir_key("alice")))
    assert (marker["uid"], marker["gid"], oct(marker["mode"])) == (1001, 1001, "0o40775")
    assert "uid" not in json.loads(store.get(manifests.file_key("old.pt")))
    run(read)


def test_setuid_bits_of_records_written_into_the_store_are_not_shown(tmp_path: Path) -> None:
    """A manifest and a marker put into the store with setuid and setgid bits, owned by
    root (as anyone who can write the store could): shown without those bits."""
    store = LocalStore(tmp_path / "store")

    async def create() -> None:
        async with core(tmp_path):
            pass

    run(create)
    store.put(manifests.file_key("sh"), Manifest(
        size=0, mode=stat.S_IFREG | 0o6755, mtime_ns=1, uid=0, gid=0).to_json())
    store.put(manifests.dir_key("d"), json.dumps(
        {"v": 1, "mode": stat.S_IFDIR | 0o7777, "mtime_ns": 1, "uid": 0, "gid": 0}).encode())

    async def read() -> None:
        async with core(tmp_path) as fs:
            assert shown(fs, await fs.lookup(ROOT, "sh")) == (0, 0, "0o755")
            assert shown(fs, await fs.lookup(ROOT, "d")) == (0, 0, "0o1777")

    run(read)


def test_chown_follows_posix_and_is_kept(tmp_path: Path) -> None:
    """Root gives entries to anyone; the owner changes the group to one of their own
    groups, nothing else; others change nothing. A refused chown changes nothing; an
    allowed one is in the record (a restart shows it)."""
    async def write() -> None:
        async with core(tmp_path) as fs:
            f = await make_file(fs, "f", 0o644, ALICE)
            d = await fs.mkdir(ROOT, "d", 0o755, ALICE)
            for caller, uid, gid in [(ALICE, 1002, None), (ALICE, None, 4000),
                                     (BOB, None, 1002), (BOB, 1002, 1002),
                                     (BOB, None, 3000)]:
                with pytest.raises(NotPermitted):
                    await fs.setattr(f.inode, uid=uid, gid=gid, size=0, caller=caller)
            assert f.size == 7 and shown(fs, f) == (1001, 1001, "0o644")
            with pytest.raises(NotPermitted):
                await fs.setattr(f.inode, mode=0o777, caller=BOB)
            await fs.setattr(f.inode, uid=1001, gid=-1, caller=BOB)  # no change: allowed
            await fs.setattr(f.inode, gid=3000, caller=ALICE)  # a group of hers
            assert shown(fs, f) == (1001, 3000, "0o644")
            await fs.setattr(d.inode, uid=1002, gid=1002, caller=ROOT_USER)
            assert shown(fs, d) == (1002, 1002, "0o755")
            link = await fs.symlink(ROOT, "l", "f", ALICE)
            await fs.setattr(link.inode, uid=1002, gid=1002, caller=ROOT_USER)  # lchown
            await fs.publisher.wait_empty()  # chown does not wait for the store

    async def read() -> None:
        async with core(tmp_path) as fs:
            assert shown(fs, await fs.lookup(ROOT, "f")) == (1001, 3000, "0o644")
            assert shown(fs, await fs.lookup(ROOT, "d")) == (1002, 1002, "0o755")
            assert shown(fs, await fs.lookup(ROOT, "l")) == (1002, 1002, "0o777")
            assert fs.readlink((await fs.lookup(ROOT, "l")).inode) == "f"

    run(write)
    run(read)


def test_chmod_and_chown_of_the_root_are_kept_in_its_marker(tmp_path: Path) -> None:
    """The mount's root shows the mode and owner of the root's marker (files/): `chmod
    1777` of a shared mount's root holds on every later mount."""
    async def write() -> None:
        async with core(tmp_path) as fs:
            await fs.list_root()
            assert shown(fs, fs.root) == (*MOUNTER, "0o755")
            await fs.setattr(ROOT, mode=0o1777, uid=4242, gid=4343, caller=ROOT_USER)
            await fs.publisher.wait_empty()

    async def read() -> None:
        async with core(tmp_path) as fs:
            await fs.list_root()
            assert shown(fs, fs.root) == (4242, 4343, "0o1777")

    run(write)
    assert DirMarker.from_json(LocalStore(tmp_path / "store").get("files/")).uid == 4242
    run(read)


def test_forced_owner_and_modes_are_what_stat_shows() -> None:
    """--uid, --gid, --file-mode, --dir-mode replace what every entry shows (a symlink
    stays 0777); what they fix cannot be changed, the rest follows the rules."""
    owners = Ownership(5, 6, force_uid=1000, force_gid=100, file_mode=0o640,
                       dir_mode=0o1770)
    root = DirNode(1, "", None, stat.S_IFDIR | 0o755, 0)
    f = FileNode(2, "f", root, stat.S_IFREG | 0o600, 0, uid=1001, gid=1001)
    link = FileNode(3, "l", root, stat.S_IFLNK | 0o777, 0)
    assert (owners.owner(root), oct(owners.mode(root))) == ((1000, 100), "0o41770")
    assert (owners.owner(f), oct(owners.mode(f))) == ((1000, 100), "0o100640")
    assert oct(owners.mode(link)) == "0o120777"
    with pytest.raises(NotPermitted, match="--uid"):
        owners.chown(f, 0, None, ROOT_USER)
    with pytest.raises(NotPermitted, match="--file-mode"):
        owners.check_chmod(f, ROOT_USER)
    assert owners.chown(f, 1000, 100, ROOT_USER) is None  # what it shows: no change
    half = Ownership(5, 6, force_uid=1000)
    assert half.owner(f) == (1000, 1001) and oct(half.mode(f)) == "0o100600"
    assert half.chown(f, None, 7, ROOT_USER) == (1001, 7)
    half.check_chmod(f, Caller(1000, 1))  # the owner it shows may chmod
