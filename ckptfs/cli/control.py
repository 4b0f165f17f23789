"""Talking to a mount's daemon over its control socket: a request, and a sync with progress."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Generator
from typing import Any

from ckptfs.cli.errors import CliError
from ckptfs.cli.output import ProgressDisplay, human
from ckptfs.daemon import mounts

#: the xattr of a mount's root that names its control socket
CONTROL_XATTR = "user.ckptfs.control"


def control_socket(mountpoint: str) -> str:
    """The path of the control socket of the mount at `mountpoint`; CliError if there is
    none (not a ckptfs mount, or its daemon is gone)."""
    try:
        return os.getxattr(mountpoint, CONTROL_XATTR).decode()
    except OSError as e:
        if e.errno in mounts.DEAD_ERRNOS:
            raise CliError(daemon_gone(mountpoint)) from None
        raise CliError(f"not a ckptfs mount: {mountpoint}") from None


def daemon_gone(path: str) -> str:
    """The one-line message for a path whose FUSE daemon is gone (ENOTCONN)."""
    entry = mounts.entry_at(path)
    if entry is None:  # a path inside the mount, or another FUSE file system
        return (f"{path}: transport endpoint is not connected (the FUSE daemon behind it is "
                f"gone); for a ckptfs mount, run ckptfs umount MOUNTPOINT")
    mp = entry.mountpoint
    resume = (f"with --cache-dir {shlex.quote(entry.cache_dir)}" if entry.cache_dir
              else "with the same --cache-dir")
    return (f"{mp}: the ckptfs daemon of this mount is gone (killed or crashed); run ckptfs "
            f"umount {shlex.quote(mp)} to detach it, then mount again {resume} to resume its "
            f"uploads")


def request(mountpoint: str, cmd: str, sock: str | None = None, timeout: float | None = 10.0,
            **args: Any) -> Generator[Any, None, None]:
    """The daemon's answers to `cmd` (status, sync, ...) with `args`, one by one; CliError
    when it cannot be reached or refuses."""
    # imported here: the client imports trio (90 ms), which `--help` and the store tools
    # do not need
    from ckptfs.daemon.control import request as control_request

    try:
        for answer in control_request(sock or control_socket(mountpoint), cmd, timeout,
                                      **args):
            if set(answer) == {"error"}:  # e.g. "permission denied": not the mount's owner
                raise CliError(f"the ckptfs daemon of {mountpoint}: {answer['error']}")
            yield answer
    except OSError as e:
        raise CliError(f"cannot reach the ckptfs daemon of {mountpoint}: {e}") from None


def status_of(mountpoint: str, sock: str | None = None) -> dict[str, Any]:
    """The daemon's status answer. The request is closed here, not later by the garbage
    collector: a Ctrl-C that lands while a dropped request closes its socket would be
    ignored there (`status --watch` would not stop)."""
    with contextlib.closing(request(mountpoint, "status", sock)) as answers:
        return dict(next(answers))


class SyncTimeout(CliError):
    """`sync` gave up at its --timeout; nothing is lost, the data stays in the cache."""


def not_durable(timeout: float, st: dict[str, Any] | None) -> SyncTimeout:
    """The one-line timeout message: why (the store's last error) and where the data is."""
    why = f" ({' '.join(str(st['errors'][0]).split())})" if st and st.get("errors") else ""
    where = f" {st['cache_dir']}" if st and st.get("cache_dir") else ""
    return SyncTimeout(f"not durable after {timeout:g}s{why}; the data is safe in the "
                       f"cache{where}")


class SyncProgress:
    """sync's progress from the daemon's status answers: the bytes uploaded since the sync
    began, of those that were dirty."""

    def __init__(self, display: ProgressDisplay) -> None:
        self.display = display
        self.base: int | None = None

    def show(self, st: dict[str, Any]) -> None:
        done_total = st["uploaded_bytes"] + st["dedup_bytes"]
        if self.base is None:
            self.base = done_total
        done = done_total - self.base
        total = done + st["dirty_bytes"]
        eta = st["eta_seconds"]
        why = f"  ({st['errors'][0]})" if st["errors"] else ""
        self.display.show("sync", f"{human(done)}/{human(total)} {human(st['upload_rate'])}/s "
                          f"ETA {eta if eta is not None else '-'}s ops {st['pending_ops']}{why}",
                          done / total if total else 1.0)


def sync(mountpoint: str, timeout: float | None, sock: str | None = None,
         fast: bool = False) -> dict[str, Any]:
    """Stream the daemon's sync progress; the final status, or SyncTimeout on timeout.
    `fast`: until everything closed is in the fast tier (a mount with --fast-tier)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] | None = None
    with ProgressDisplay() as display:
        progress = SyncProgress(display)
        try:
            for answer in request(mountpoint, "sync", sock, timeout=None if timeout is None
                                  else max(timeout, 1.0), **({"fast": True} if fast else {})):
                if "progress" in answer:
                    last = answer["progress"]
                    progress.show(answer["progress"])
                elif answer.get("done"):
                    progress.show(answer["status"])
                    return dict(answer["status"])
                elif "error" in answer:
                    raise CliError(answer["error"])
                if deadline is not None and time.monotonic() > deadline:
                    raise not_durable(timeout or 0.0, last)
        except TimeoutError:
            raise not_durable(timeout or 0.0, last) from None
    raise CliError("the ckptfs daemon closed the connection before the sync finished")
