"""Real FUSE mounts for tests: start `ckptfs mount` as a user would, always unmount."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def run_cli(*args: str, check: bool = True, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ckptfs command line; returns the completed process (text output)."""
    r = subprocess.run([*CKPTFS, *args], capture_output=True, text=True, timeout=timeout,
                       env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"ckptfs {' '.join(args)} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def is_mounted(path: Path | str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def lazy_unmount(path: Path | str) -> None:
    """Best-effort cleanup: detach the mount even if the daemon is stuck."""
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


class Mount:
    """One `ckptfs mount STORE MOUNTPOINT --cache-dir CACHE`, a node of the cluster."""

    def __init__(self, store: str, root: Path, name: str = "node", extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.store = store
        self.path = root / f"{name}-mnt"
        self.cache = root / f"{name}-cache"
        self.extra = list(extra or [])
        self.env = env
        self.path.mkdir(parents=True, exist_ok=True)
        self.pid: int | None = None

    def mount(self, *more: str) -> Mount:
        run_cli("mount", self.store, str(self.path), "--cache-dir", str(self.cache),
                "--node-id", self.path.name, *self.extra, *more, env=self.env)
        assert is_mounted(self.path)
        self.pid = int(self.status()["pid"])
        return self

    def status(self) -> dict[str, object]:
        import json
        return dict(json.loads(run_cli("status", str(self.path), "--json").stdout))

    def umount(self, *more: str) -> subprocess.CompletedProcess[str]:
        r = run_cli("umount", str(self.path), *more)
        assert not is_mounted(self.path)
        self.wait_exit()
        return r

    def wait_exit(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.pid is not None and _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill(self, sig: int = 9) -> None:
        """Kill the daemon (a crash); the kernel mount is cleaned up lazily."""
        self.kill_daemon(sig)
        lazy_unmount(self.path)

    def kill_daemon(self, sig: int = 9) -> None:
        """Kill the daemon and leave its mount in place: a dead mount (ENOTCONN), as a crash
        leaves it for the user. cleanup() still detaches it."""
        assert self.pid is not None
        os.kill(self.pid, sig)
        self.wait_exit()

    def cleanup(self) -> None:
        lazy_unmount(self.path)
        if self.pid is not None and _alive(self.pid):
            os.kill(self.pid, 15)
            self.wait_exit(10)
            if _alive(self.pid):
                os.kill(self.pid, 9)

    def __truediv__(self, other: str) -> Path:
        return self.path / other


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False
