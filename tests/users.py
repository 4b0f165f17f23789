"""A real second user for tests of a shared node: made with useradd for one test, removed
after; calls run as that user in a forked child, their results (or errnos) as JSON."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class User:
    """A throwaway unprivileged user: its name, uid, primary gid, and one more group of
    its own (`extra_gid`, a supplementary group)."""

    name: str
    uid: int
    gid: int
    extra_gid: int

    def run(self, fn: Callable[[], object]) -> object:
        """as_user(self, fn)."""
        return as_user(self, fn)


def _run_locked(*cmd: str) -> None:
    """Run useradd, groupadd, userdel...: retried while another process holds the lock
    of /etc/passwd or /etc/group (tests in parallel); AssertionError if it fails."""
    for _ in range(40):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return
        if "lock" not in r.stderr.lower():
            break
        time.sleep(0.25)
    raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")


def why_no_second_user() -> str | None:
    """Why this machine cannot make a second user for a test, or None."""
    if os.geteuid() != 0:
        return "needs root: a second user is made with useradd"
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("groupadd")):
        return "useradd, userdel or groupadd is missing"
    return None


@contextlib.contextmanager
def second_user() -> Iterator[User]:
    """A new user (no home, no login shell) with its own group and one more group;
    removed with its groups at the end, even on failure. Skips the test (with why) where
    the machine cannot make one."""
    why = why_no_second_user()
    if why:
        pytest.skip(why)
    name = f"ckt{uuid.uuid4().hex[:8]}"
    extra = f"{name}x"
    _run_locked("groupadd", extra)
    try:
        _run_locked("useradd", "--no-create-home", "--user-group", "--groups", extra,
                    "--shell", "/usr/sbin/nologin", name)
        try:
            pw = pwd.getpwnam(name)
            yield User(name, pw.pw_uid, pw.pw_gid, grp.getgrnam(extra).gr_gid)
        finally:
            _run_locked("userdel", name)  # it has no home to remove
            with contextlib.suppress(KeyError):  # gone with the user (USERGROUPS_ENAB)
                grp.getgrnam(name)
                _run_locked("groupdel", name)
    finally:
        _run_locked("groupdel", extra)


def as_user(user: User, fn: Callable[[], object]) -> object:
    """Run `fn` in a forked child as `user` (its uid, gid and both its groups; umask 0,
    so that modes are what the calls ask); what it returned, through JSON."""
    return run_as(user.uid, user.gid, [user.gid, user.extra_gid], fn, umask=0)


def run_as(uid: int, gid: int, groups: list[int], fn: Callable[[], object],
           umask: int | None = None) -> object:
    """Run `fn` in a forked child with that uid, gid and groups (and `umask`, if given);
    what it returned, through JSON; {"child error": ...} if it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            if umask is not None:
                os.umask(umask)
            out = json.dumps(fn()).encode()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = json.dumps({"child error": repr(e)}).encode()
            code = 1
        try:
            os.write(w, out)
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def outcome(fn: Callable[[], object]) -> object:
    """What a call gave: its value, or the name of the errno it failed with."""
    try:
        return fn()
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e.errno))


@contextlib.contextmanager
def open_directory() -> Iterator[Path]:
    """A directory every user may traverse (pytest's tmp_path is private to root), for
    mount points; removed at the end (after the mounts in it are unmounted)."""
    from mounting import lazy_unmount

    d = Path(tempfile.mkdtemp(prefix="ckptfs-users-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        for p in d.glob("*-mnt"):
            lazy_unmount(p)  # never remove files through a mount left behind
        shutil.rmtree(d, ignore_errors=True)
