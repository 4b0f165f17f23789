"""Real FUSE mounts for tests: start `ckptfs mount` as a user would, always unmount.

The one way to make a mount in a test: `nodes.mount(store, tmp_path, name, *options)`
with the `nodes` fixture (conftest.py), or a `Mount` appended to `nodes` before it is
mounted; either way it is unmounted and its daemon stopped at the end of the test.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]

CHECKOUT = Path(__file__).resolve().parents[2]


def training(code: str, timeout: float = 120) -> Any:
    """Run `code` in a new Python process, as a training script would (the checkout on
    its path, no store credentials in its environment); what it printed last, as JSON."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "CKPTFS_", "AZURE_", "GOOGLE_"))}
    env["PYTHONPATH"] = str(CHECKOUT)
    r = subprocess.run([sys.executable, "-c", "import json, sys, ckptfs\n" + code],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


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
        self._pid: int | None = None
        self.exit_code: int | None = None  # once known: the daemon's, -N for signal N

    @property
    def pid(self) -> int | None:
        """The daemon's pid (set by mount(), or by a test that mounted it otherwise)."""
        return self._pid

    @pid.setter
    def pid(self, pid: int | None) -> None:
        self._pid = pid
        self.exit_code = None  # a new daemon

    def mount(self, *more: str) -> Mount:
        run_cli("mount", self.store, str(self.path), "--cache-dir", str(self.cache),
                "--node-id", self.path.name, *self.extra, *more, env=self.env)
        assert is_mounted(self.path)
        self.pid = int(str(self.status()["pid"]))
        return self

    def status(self) -> dict[str, Any]:
        """`ckptfs status --json` of the mount."""
        return dict(json.loads(run_cli("status", str(self.path), "--json").stdout))

    def sync(self, timeout: float = 120) -> None:
        """`ckptfs sync` of the mount, in this process (no interpreter started): returns
        when everything closed so far is in the store."""
        from ckptfs.daemon import control
        from ckptfs.daemon.mount import control_socket_path

        for answer in control.request(control_socket_path(str(self.cache)), "sync",
                                      timeout=timeout):
            assert "error" not in answer, answer
            if answer.get("done"):
                return
        raise AssertionError(f"sync of {self.path} ended without an answer")

    def log(self) -> str:
        """The daemon's log (ckptfs.log in the cache directory)."""
        return (self.cache / "ckptfs.log").read_text()

    def umount(self, *more: str) -> subprocess.CompletedProcess[str]:
        """`ckptfs umount` (must exit 0); the daemon must then have exited, with 0."""
        r = run_cli("umount", str(self.path), *more)
        assert not is_mounted(self.path)
        code = self.wait_exit()
        assert code == 0, f"the daemon of {self.path} exited with {code}"
        return r

    def exited(self, timeout: float = 60) -> bool:
        """Wait up to `timeout` seconds for the daemon to exit; whether it did. Its exit
        code is then in `exit_code` when this process could reap it (a child subreaper,
        see conftest.py): 0 when its final flush saved everything, 1 when not, -N when
        signal N killed it."""
        deadline = time.monotonic() + timeout
        while self.pid is not None and self.exit_code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours to reap: only watch it
                pid, status = 0, 0
                if not _alive(self.pid):
                    return True
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def wait_exit(self, timeout: float = 60) -> int | None:
        """Wait for the daemon to exit: AssertionError if it is still running after
        `timeout` seconds. Returns its exit code if known (see `exited`)."""
        assert self.exited(timeout), (
            f"the ckptfs daemon of {self.path} (pid {self.pid}) still runs after {timeout}s")
        return self.exit_code

    def kill(self, sig: int = 9) -> None:
        """Kill the daemon (a crash); the kernel mount is cleaned up lazily."""
        self.kill_daemon(sig)
        lazy_unmount(self.path)

    def kill_daemon(self, sig: int = 9) -> None:
        """Kill the daemon and leave its mount in place: a dead mount (ENOTCONN), as a crash
        leaves it for the user. cleanup() still detaches it."""
        assert self.pid is not None
        os.kill(self.pid, sig)
        code = self.wait_exit()
        assert code == -sig, f"the daemon of {self.path} exited with {code}, not signal {sig}"

    def cleanup(self) -> None:
        """Detach the mount and stop the daemon, whatever state they are in."""
        lazy_unmount(self.path)
        if self.pid is not None and not self.exited(0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 15)
            if not self.exited(10):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, 9)
                self.exited(10)

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


class Nodes(list[Mount]):
    """The mounts a test made (the `nodes` fixture): all cleaned up at its end."""

    def mount(self, store: str, root: Path, name: str, *extra: str,
              env: dict[str, str] | None = None) -> Mount:
        """Mount `store` as node `name` (mount point and cache under `root`)."""
        m = Mount(store, root, name, extra=list(extra), env=env)
        self.append(m)
        return m.mount()

    def cleanup(self) -> None:
        for m in reversed(self):
            m.cleanup()


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the one that orphaned descendants are re-parented to, so that
    the daemons `ckptfs mount` forks (and leaves) are its children: their exit codes can
    then be read (Mount.exited). False where the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


class MountedStore:
    """A store URL plus the CLI options to reach it, and a way to count its chunks (the
    `store` fixture of tests/fuse)."""

    def __init__(self, url: str, extra: list[str], count_chunks: Callable[[], int]) -> None:
        self.url = url
        self.extra = extra
        self.count_chunks = count_chunks  # () -> number of chunk objects

    def node(self, nodes: Nodes, root: Path, name: str, *more: str) -> Mount:
        """A node mounting this store (`nodes.mount`)."""
        return nodes.mount(self.url, root, name, *self.extra, *more)
