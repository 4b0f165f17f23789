"""The Python API for training code: state(), wait_durable(), latest_complete() on a mount."""

# Everything goes through the mount (the user.ckptfs.state xattr) and its daemon's control
# socket: the training process needs no store credentials, and this module imports none
# of the store, FUSE or async libraries. docs/OPERATIONS.md "Python API" shows it in use.

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from typing import Any

from ckptfs.common.config import check_glob
from ckptfs.common.errors import CkptfsError, ConfigError
from ckptfs.daemon import client, mounts

__all__ = ["STATES", "CkptfsError", "DaemonGoneError", "DataLostError", "NotCkptfsError",
           "NotDurableError", "latest_complete", "state", "wait_durable"]

#: what state() returns: written and not yet closed; closed, some of it still uploading;
#: every chunk known by this mount to be in the store; written by another node or before
#: this mount started (nothing of it left for this mount to upload)
STATES = ("open", "pending", "durable", "remote")
#: the states that wait_durable() waits through
NOT_YET = frozenset({"open", "pending"})
STATE_XATTR = "user.ckptfs.state"
CONTROL_XATTR = "user.ckptfs.control"  # of a mount's root: its control socket's path
#: how often wait_durable() looks again at files still open (written, not yet closed)
POLL_SECONDS = 0.2
#: files a NotDurableError message names (all are in its `files`)
NAMED = 5


class NotCkptfsError(CkptfsError):
    """The path is not on a ckptfs mount."""


class DaemonGoneError(CkptfsError):
    """The mount's daemon is gone (killed, crashed) or does not answer."""


class NotDurableError(CkptfsError, TimeoutError):
    """wait_durable() timed out; `files` maps each file not yet durable to its state."""

    def __init__(self, message: str, files: dict[str, str]) -> None:
        super().__init__(message)
        self.files = files


class DataLostError(CkptfsError):
    """A file's data could not be saved (a chunk lost before it reached the store, or a
    publish that failed); `problems` has the daemon's line for each."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


def state(path: str | os.PathLike[str]) -> str:
    """The state of the file at `path` on a ckptfs mount, one of STATES: 'open',
    'pending', 'durable' or 'remote'.

    Raises NotCkptfsError (not on a mount), DaemonGoneError, IsADirectoryError (a
    directory has no state: wait_durable() takes one), FileNotFoundError.
    """
    path = os.fspath(path)
    mountpoint, _ = _mount_of(path)
    try:
        return os.getxattr(path, STATE_XATTR).decode()
    except OSError as e:
        if e.errno in mounts.DEAD_ERRNOS:
            raise DaemonGoneError(_gone(mountpoint)) from None
        if e.errno == errno.ENODATA and os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "a directory has no ckptfs state; "
                                    "wait_durable() takes one", path) from None
        raise


def wait_durable(path: str | os.PathLike[str], timeout: float | None = None) -> None:
    """Return once the file at `path` is durable in the store: for a directory, every file
    below it; for the mount point, everything written on the mount (`ckptfs sync`, and
    no file left open with unsaved data).

    Files written by another node ('remote') count as done: this mount has nothing of
    theirs to upload. Waits through 'open' files (the writer has not closed them yet) and
    'pending' ones (uploading). Raises NotDurableError (a TimeoutError) after `timeout`
    seconds, naming the files not durable and their states; DataLostError when a file
    below `path` lost data; NotCkptfsError, DaemonGoneError, FileNotFoundError.
    """
    path = os.fspath(path)
    mountpoint, inside = _mount_of(path)
    sock = _control_socket(mountpoint)
    deadline = None if timeout is None else time.monotonic() + timeout
    whole_mount = inside == ""
    while True:
        st = _status(mountpoint, sock)
        lost = [p for p in st.get("problems", []) if _names(p, inside)]
        if lost:
            raise DataLostError(f"{path}: data lost: {_one_line(lost[0])}"
                                + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""),
                                lost)
        # the whole mount: the daemon knows (walking every file would list the store)
        files = {} if whole_mount else _not_durable(path)
        if (st.get("durable") if whole_mount else not files):
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise _timed_out(path, timeout or 0.0, _not_durable(path) if whole_mount
                             else files, st)
        uploading = (st.get("pending_chunks") or st.get("pending_ops") if whole_mount
                     else "pending" in files.values())
        if uploading:
            _sync(mountpoint, sock, deadline)  # returns when what is closed is stored
        else:  # only files still open: their writer has to close them first
            time.sleep(POLL_SECONDS if left is None else min(POLL_SECONDS, left))


def latest_complete(dir: str | os.PathLike[str], pattern: str = "*") -> str | None:
    """The newest complete checkpoint directory directly under `dir` (on a ckptfs mount)
    whose name matches the shell pattern `pattern`, as an absolute path, or None.

    The daemon checks in the store as `ckptfs latest` does: newest by the numbers in
    the names (checkpoint-100 after checkpoint-99) when every candidate has one, else by
    the files' mtime; directories with no files or with a chunk not in the store are
    skipped. Raises ValueError (a bad pattern), NotCkptfsError, DaemonGoneError,
    CkptfsError (the daemon could not check: its store's error).
    """
    dir = os.fspath(dir)
    try:
        check_glob(pattern, "pattern")
    except ConfigError as e:
        raise ValueError(str(e)) from None
    mountpoint, inside = _mount_of(dir)
    sock = _control_socket(mountpoint)
    for answer in _ask(mountpoint, sock, "latest", None, dir=inside, pattern=pattern):
        if "error" in answer:
            raise CkptfsError(f"latest checkpoint in {dir}: {_one_line(answer['error'])}")
        found = answer.get("latest")
        return None if found is None else os.path.join(mountpoint, str(found))
    raise DaemonGoneError(f"{mountpoint}: the ckptfs daemon closed the connection without "
                          f"an answer")


# ---------------------------------------------------------------------------- helpers
def _mount_of(path: str) -> tuple[str, str]:
    """(mount point, path inside the filesystem) of `path`; NotCkptfsError if none."""
    found = mounts.containing(path)
    if found is None:
        raise NotCkptfsError(f"not on a ckptfs mount: {path}")
    return found


def _gone(mountpoint: str) -> str:
    return (f"{mountpoint}: the ckptfs daemon of this mount is gone (killed or crashed); "
            f"run ckptfs umount {mountpoint}, then mount again with the same --cache-dir")


def _control_socket(mountpoint: str) -> str:
    try:
        return os.getxattr(mountpoint, CONTROL_XATTR).decode()
    except OSError as e:
        if e.errno in mounts.DEAD_ERRNOS:
            raise DaemonGoneError(_gone(mountpoint)) from None
        raise NotCkptfsError(f"not a ckptfs mount (no {CONTROL_XATTR}): {mountpoint}"
                             ) from None


def _ask(mountpoint: str, sock: str, cmd: str, timeout: float | None, **args: Any
         ) -> Iterator[dict[str, Any]]:
    """The daemon's answers; DaemonGoneError when it cannot be reached."""
    try:
        yield from client.request(sock, cmd, timeout, **args)
    except TimeoutError:
        raise
    except OSError as e:
        raise DaemonGoneError(f"{mountpoint}: cannot reach the ckptfs daemon: {e}") from None


def _status(mountpoint: str, sock: str) -> dict[str, Any]:
    for answer in _ask(mountpoint, sock, "status", 30.0):
        if set(answer) == {"error"}:
            raise DaemonGoneError(f"{mountpoint}: the ckptfs daemon: {answer['error']}")
        return answer
    raise DaemonGoneError(f"{mountpoint}: the ckptfs daemon closed the connection")


def _sync(mountpoint: str, sock: str, deadline: float | None) -> None:
    """`ckptfs sync` until it is done or `deadline` has passed."""
    try:
        for answer in _ask(mountpoint, sock, "sync", None if deadline is None else 5.0):
            if answer.get("done") or "error" in answer:
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
    except TimeoutError:
        return


def _names(problem: str, inside: str) -> bool:
    """Whether the daemon's problem line (reporting.problems) says that a file at or below
    `inside` (a path relative to the filesystem root; '' for all) lost data."""
    for prefix in ("DATA LOST: ", "could not publish "):
        if problem.startswith(prefix):
            named = problem[len(prefix):]
            return not inside or any(named.startswith(inside + end) for end in "/:;")
    return False


def _not_durable(path: str) -> dict[str, str]:
    """Each file at or below `path` whose state is 'open' or 'pending', with its state."""
    found: dict[str, str] = {}

    def look(file: str) -> None:
        try:
            s = os.getxattr(file, STATE_XATTR).decode()
        except FileNotFoundError:  # removed meanwhile (a temporary file renamed)
            return
        except OSError as e:
            if e.errno in mounts.DEAD_ERRNOS:
                raise DaemonGoneError(_gone(path)) from None
            raise
        if s in NOT_YET:
            found[file] = s

    if not os.path.isdir(path):
        look(path)
        return found
    for top, _, names in os.walk(path):
        for name in names:
            file = os.path.join(top, name)
            if not os.path.islink(file):  # Linux gives no user.* xattr of a symlink
                look(file)
    return found


def _timed_out(path: str, timeout: float, files: dict[str, str], st: dict[str, Any]
               ) -> NotDurableError:
    named = ", ".join(f"{f} ({s})" for f, s in sorted(files.items())[:NAMED])
    more = f" and {len(files) - NAMED} more" if len(files) > NAMED else ""
    what = (f"{len(files)} file{'s' if len(files) != 1 else ''} not durable: {named}{more}"
            if files else "the mount is not durable")
    errors = st.get("errors") or []
    why = f"; the store's last error: {_one_line(errors[0])}" if errors else ""
    return NotDurableError(f"{path}: not durable after {timeout:g}s: {what}{why}", files)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())
