"""A shared node: root mounts with --allow-other and a real second user works in it. What
a user creates is theirs (here and on another node), without setuid or setgid bits; they
change and delete their own entries and nobody else's; chown follows POSIX; --uid, --gid,
--file-mode and --dir-mode replace what stat shows."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import Nodes
from users import User, as_user, open_directory, outcome, second_user

from ckptfs.format import manifests
from ckptfs.store.local import LocalStore


@pytest.fixture
def user() -> Iterator[User]:
    with second_user() as u:
        yield u


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """Where the mount points go: a directory the second user may traverse."""
    with open_directory() as d:
        yield d


def owner_mode(path: Path) -> list[object]:
    """[st_uid, st_gid, the mode bits in octal] of `path` itself (lstat)."""
    st = os.lstat(path)
    return [st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))]


def test_a_second_user_owns_what_they_create_and_nothing_else(
        tmp_path: Path, shared_dir: Path, user: User, nodes: Nodes) -> None:
    store = tmp_path / "store"
    store.mkdir()
    a = nodes.mount(str(store), shared_dir, "a", "--allow-other")
    os.chmod(a.path, 0o1777)  # a shared root, as /tmp: kept in the store's root marker
    (a / "secret").write_bytes(b"root only")
    os.chmod(a / "secret", 0o600)
    os.mkdir(a / "roots", 0o755)
    (a / "roots" / "x").write_bytes(b"x")

    def work() -> dict[str, object]:
        mine = a / "mine"
        fd = os.open(mine, os.O_CREAT | os.O_WRONLY, 0o6755)  # setuid, setgid asked
        os.write(fd, b"hers")
        os.close(fd)
        os.mkdir(a / "hers", 0o2775)
        (a / "hers" / "f").write_bytes(b"f")
        os.symlink("f", a / "hers" / "l")
        made = {p.name: owner_mode(p) for p in (mine, a / "hers", a / "hers" / "f")}
        os.chmod(mine, 0o4750)
        os.rename(a / "hers" / "f", a / "hers" / "g")
        return {
            "made": made, "link owner": owner_mode(a / "hers" / "l")[:2],
            "after chmod 4750": owner_mode(mine),
            "read root's 0600 file": outcome(lambda: (a / "secret").read_bytes().decode()),
            "unlink it": outcome(lambda: os.unlink(a / "secret")),
            "rename it": outcome(lambda: os.rename(a / "secret", a / "stolen")),
            "chmod it": outcome(lambda: os.chmod(a / "secret", 0o644)),
            "chown it to me": outcome(lambda: os.chown(a / "secret", user.uid, user.gid)),
            "create in root's 0755 dir": outcome(lambda: os.mknod(a / "roots" / "y")),
            "unlink in it": outcome(lambda: os.unlink(a / "roots" / "x")),
            "chown mine to root": outcome(lambda: os.chown(mine, 0, -1)),
            "chgrp mine to root's group": outcome(lambda: os.chown(mine, -1, 0)),
            "chgrp mine to my other group": outcome(lambda: os.chown(mine, -1,
                                                                      user.extra_gid)),
        }

    u, g = user.uid, user.gid
    assert as_user(user, work) == {
        "made": {"mine": [u, g, "0o755"], "hers": [u, g, "0o775"], "f": [u, g, "0o666"]},
        "link owner": [u, g], "after chmod 4750": [u, g, "0o750"],
        "read root's 0600 file": "EACCES", "unlink it": "EPERM", "rename it": "EPERM",
        "chmod it": "EPERM", "chown it to me": "EPERM",
        "create in root's 0755 dir": "EACCES", "unlink in it": "EACCES",
        "chown mine to root": "EPERM", "chgrp mine to root's group": "EPERM",
        "chgrp mine to my other group": None}
    assert (a / "secret").read_bytes() == b"root only"
    os.chown(a / "secret", u, g)  # root gives anything to anyone
    assert owner_mode(a / "secret") == [u, g, "0o600"]
    record = json.loads(LocalStore(store).get(manifests.file_key("mine")))
    assert (record["uid"], record["gid"], oct(record["mode"])) == (
        u, user.extra_gid, "0o100750")
    a.umount()

    # another node (an empty cache) sees the same owners and modes, and so does the user
    b = nodes.mount(str(store), shared_dir, "b", "--allow-other")
    assert owner_mode(b.path)[2] == "0o1777"
    assert {name: owner_mode(b / name) for name in ("mine", "hers", "hers/g", "secret")} == {
        "mine": [u, user.extra_gid, "0o750"], "hers": [u, g, "0o775"],
        "hers/g": [u, g, "0o666"], "secret": [u, g, "0o600"]}
    assert owner_mode(b / "hers" / "l")[:2] == [u, g]

    def clean_up() -> object:
        read = (b / "secret").read_bytes().decode()  # theirs now
        for name in ("mine", "hers/g", "hers/l"):
            os.unlink(b / name)
        os.rmdir(b / "hers")
        return [read, sorted(os.listdir(b.path))]

    assert as_user(user, clean_up) == ["root only", ["roots", "secret"]]
    b.umount()


def test_uid_gid_file_mode_dir_mode_force_what_stat_shows(tmp_path: Path,
                                                          nodes: Nodes) -> None:
    """What the options fix, stat shows for every entry (a symlink stays 0777) and
    nobody changes (EPERM); the records keep their creator and the mode asked."""
    store = tmp_path / "store"
    store.mkdir()
    a = nodes.mount(str(store), tmp_path, "a", "--uid", "4242", "--gid", "4343",
                    "--file-mode", "0640",
                    env={**os.environ, "CKPTFS_DIR_MODE": "1750"})
    fd = os.open(a / "f", os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    os.mkdir(a / "d", 0o700)
    os.symlink("f", a / "l")
    assert {p: owner_mode(a / p) for p in ("", "f", "d", "l")} == {
        "": [4242, 4343, "0o1750"], "f": [4242, 4343, "0o640"],
        "d": [4242, 4343, "0o1750"], "l": [4242, 4343, "0o777"]}
    os.chown(a / "f", 4242, 4343)  # what it shows already: no change, allowed
    for call in (lambda: os.chmod(a / "f", 0o644), lambda: os.chmod(a / "d", 0o755),
                 lambda: os.chown(a / "f", 0, -1), lambda: os.chown(a / "d", -1, 0)):
        assert outcome(call) == "EPERM"
    record = json.loads(LocalStore(store).get(manifests.file_key("f")))
    assert (record["uid"], record["gid"], oct(record["mode"])) == (
        os.getuid(), os.getgid(), "0o100600")
    a.umount()
