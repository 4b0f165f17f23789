"""A second, unprivileged local user for the tests of a shared node (the `other_user`
fixture, conftest.py): made with useradd, removed with userdel -r, and code run as them."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class OtherUser:
    """A throwaway local user: not root, in no group of root's."""

    name: str
    uid: int
    gid: int

    def run(self, fn: Callable[[], object]) -> object:
        """Run `fn` in a forked child as this user (its uid and gid, no other group);
        what it returns, through JSON; {"child error": ...} if it raised."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
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


def cannot_make_user() -> str | None:
    """Why this machine cannot make a second user, or None if it can."""
    if os.geteuid() != 0:
        return "making a second local user needs root"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "useradd/userdel are not installed (Debian package passwd)"
    return None


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    """useradd/userdel, again while another process holds the lock of /etc/passwd
    (exit 10 or 1 with 'lock': parallel test workers add users too)."""
    for _ in range(50):
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or "lock" not in r.stderr:
            return r
        time.sleep(0.1)
    return r


def made_user() -> Iterator[OtherUser]:
    """Make a user (its own group, a home directory, no login shell), yield it, remove it
    (userdel -r) even when the tests fail."""
    name = f"ckt{os.getpid() % 100000}{uuid.uuid4().hex[:6]}"
    r = _tool("useradd", "--create-home", "--user-group", "--shell", "/usr/sbin/nologin",
              name)
    if r.returncode != 0:
        raise RuntimeError(f"useradd {name} failed ({r.returncode}): {r.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        _tool("userdel", "--remove", name)
