"""Another user of a shared node against root's mount: with --cache-dir (or --log-file, or
the control socket's fallback directory) in a world-writable directory, whatever that
user made there first makes the mount refuse in one line, and nothing of root's is
changed, filled, appended to or deleted (docs/OPERATIONS.md, Security)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mounting import Mount, Nodes, is_mounted, run_cli
from users import User

from ckptfs.daemon.mount import control_socket_path

CACHE_FIX = "use a cache directory of your own (--cache-dir)"
INSIDE_FIX = ("remove it (ckptfs never follows a link, nor uses another user's file, in its "
              "cache directory), or use another --cache-dir")
LOG_FIX = "remove it, or give a log file of your own (--log-file)"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A world-writable directory (mode 1777, as /tmp or a shared scratch disk) that every
    user reaches (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="ckptfs-shared-"))
    top.chmod(0o755)
    shared = top / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)
    yield shared
    shutil.rmtree(top, ignore_errors=True)


def tree(*tops: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every path under `tops` (themselves included): mode, owner, a file's bytes."""
    out = {}
    for top in tops:
        for p in [top, *top.rglob("*")]:
            st = p.lstat()
            out[str(p)] = (st.st_mode, st.st_uid, p.read_bytes() if p.is_file() else None)
    return out


def attempt(store: str, mnt: Path, nodes: Nodes, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ckptfs mount STORE MNT ARGS` (the mount is cleaned up at the end if it was made)."""
    m = Mount(store, mnt.parent, mnt.name.removesuffix("-mnt"))
    nodes.append(m)
    return run_cli("mount", store, str(m.path), *args, check=False, timeout=60, env=env)


def one_line(r: subprocess.CompletedProcess[str], mnt: Path) -> str:
    """The mount failed with one line and no traceback: the line."""
    assert not is_mounted(mnt), f"mounted: {r.stderr}"
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), r.stderr
    return lines[0].removeprefix("ckptfs: ")


def their(user: User, fn: Callable[[], object]) -> None:
    """Run `fn` as the other user: it must succeed."""
    assert user.run(fn) is None


# what the other user (or, for a link left inside root's own cache directory, root) made
# before root's mount, and the line that refuses it; {cache}, {scratch}, {uid} filled in
CASES: dict[str, str] = {
    # (a) the cache directory: a link to a directory of root's, which root would chmod
    # 0700 and fill
    "cache-is-a-link": "the cache directory {cache} is a symbolic link: " + CACHE_FIX,
    # (b) the cache directory, made by them, with in it (c) staging/ a link to a
    # directory whose files root would delete at mount and (e) the log a link to a file
    # of root's, which root would append to
    "cache-is-theirs": "the cache directory {cache} is owned by uid {uid}, not by you "
                       "(uid 0): " + CACHE_FIX,
    # (d) in their cache directory, staging/2, a 0666 file of theirs, which root would
    # write a 0600 file's bytes to
    "staging-file-is-theirs": "the cache directory {cache} is owned by uid {uid}, not by "
                              "you (uid 0): " + CACHE_FIX,
    # (c) in root's own cache directory, left writable by all, or private
    "staging-links-in-an-open-cache": "the cache directory {cache} is writable by other "
                                      "users (mode 0777): " + CACHE_FIX,
    "staging-is-a-link": "the staging directory {cache}/staging is a symbolic link: "
                         + INSIDE_FIX,
    # (e) in root's own private cache directory; --log-file in the shared directory, a
    # link or a file of theirs
    "log-is-a-link": "the log file {cache}/ckptfs.log is a symbolic link: " + LOG_FIX,
    "log-file-is-a-link": "the log file {scratch}/ckptfs.log is a symbolic link: " + LOG_FIX,
    "log-file-is-theirs": "the log file {scratch}/ckptfs.log is owned by uid {uid}, not "
                          "by you (uid 0): " + LOG_FIX,
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_another_user_made_first_refuses_the_mount(
        case: str, other_user: User, scratch: Path, local_store_dir: Path,
        tmp_path: Path, nodes: Nodes) -> None:
    victim = tmp_path / "victim"  # root's: a directory of files, and a file
    victim.mkdir(mode=0o755)
    for name in ("1", "2", "weights.bin"):
        (victim / name).write_bytes(b"root's " + name.encode())
        (victim / name).chmod(0o600)
    root_file = tmp_path / "root.log"
    root_file.write_bytes(b"root's own log\n")
    root_file.chmod(0o600)
    before = tree(victim, root_file)
    cache, log_file = scratch / "cache", scratch / "ckptfs.log"
    c, v, r, lf = str(cache), str(victim), str(root_file), str(log_file)

    def their_cache() -> None:
        os.mkdir(c)
        os.chmod(c, 0o777)
        os.symlink(v, f"{c}/staging")
        os.symlink(r, f"{c}/ckptfs.log")

    def their_staging_file() -> None:
        os.mkdir(c)
        os.mkdir(f"{c}/staging")
        for d in (c, f"{c}/staging"):
            os.chmod(d, 0o777)
        fd = os.open(f"{c}/staging/2", os.O_CREAT | os.O_WRONLY, 0o666)
        os.fchmod(fd, 0o666)
        os.close(fd)

    args = ["--cache-dir", c]
    if case == "cache-is-a-link":
        their(other_user, lambda: os.symlink(v, c))
    elif case == "cache-is-theirs":
        their(other_user, their_cache)
    elif case == "staging-file-is-theirs":
        their(other_user, their_staging_file)
    elif case == "staging-links-in-an-open-cache":
        cache.mkdir()
        cache.chmod(0o777)
        their(other_user, lambda: os.symlink(v, f"{c}/staging"))
    elif case == "staging-is-a-link":
        cache.mkdir(mode=0o700)
        (cache / "staging").symlink_to(victim)
    elif case == "log-is-a-link":
        cache.mkdir(mode=0o700)
        (cache / "ckptfs.log").symlink_to(root_file)
    else:  # --log-file in the shared directory; the cache directory root's own
        args = ["--cache-dir", str(tmp_path / "cache"), "--log-file", lf]
        if case == "log-file-is-a-link":
            their(other_user, lambda: os.symlink(r, lf))
        else:
            their(other_user, lambda: os.close(os.open(lf, os.O_CREAT | os.O_WRONLY, 0o666)))
    done = attempt(str(local_store_dir), tmp_path / "a-mnt", nodes, *args)
    assert tree(victim, root_file) == before
    line = one_line(done, tmp_path / "a-mnt")
    assert line == CASES[case].format(cache=cache, scratch=scratch, uid=other_user.uid)
    assert list(local_store_dir.iterdir()) == []  # refused before the store was made
    if case.endswith("theirs"):  # root made nothing in their directory, wrote nothing
        made = [p for p in scratch.rglob("*") if p.lstat().st_uid == 0]
        assert made == [], made
        if case == "staging-file-is-theirs":
            assert (cache / "staging" / "2").read_bytes() == b""


@pytest.mark.parametrize("hostile", ["their-directory", "a-link"])
def test_the_socket_of_a_long_cache_path_is_in_a_private_directory(
        hostile: str, other_user: User, scratch: Path, local_store_dir: Path,
        tmp_path: Path, nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache directory whose path is too long for a socket's has its control socket in
    <tmp>/ckptfs-<uid>/, a directory of its own (0700): one another user made first (or
    made a link) refuses the mount in one line; once it is gone, the mount makes it."""
    deep = tmp_path / ("d" * 90)  # CACHE_DIR/ctl.sock would be over 100 characters
    deep.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    before = tree(victim)
    env = {**os.environ, "TMPDIR": str(scratch)}  # the daemon's <tmp>
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cache = deep / "a-cache"
    sock = control_socket_path(str(cache))
    s, v = sock, str(victim)
    if hostile == "their-directory":  # also: the socket's own path a directory of theirs
        their(other_user, lambda: os.makedirs(s, 0o777))
    else:
        their(other_user, lambda: os.symlink(v, os.path.dirname(s)))
    done = attempt(str(local_store_dir), deep / "a-mnt", nodes, "--cache-dir", str(cache),
                   env=env)
    assert tree(victim) == before
    line = one_line(done, deep / "a-mnt")
    private = scratch / f"ckptfs-{os.getuid()}"
    fix = ("remove it, or use a cache directory whose path is shorter (under 91 "
           "characters): its control socket is then CACHE_DIR/ctl.sock")
    if hostile == "their-directory":
        assert line == (f"the control socket's directory {private} is owned by uid "
                        f"{other_user.uid}, not by you (uid 0): {fix}")
    else:
        assert line == f"the control socket's directory {private} is a symbolic link: {fix}"
    if hostile == "a-link":
        return
    shutil.rmtree(private)  # as root would, told so
    a = Mount(str(local_store_dir), deep, "a", env=env)
    nodes.append(a)
    a.mount()
    assert os.getxattr(a.path, "user.ckptfs.control").decode() == sock
    st = private.lstat()
    assert (oct(st.st_mode & 0o7777), st.st_uid) == ("0o700", 0)
    assert run_cli("status", str(a.path), "--json").returncode == 0
    a.umount()
