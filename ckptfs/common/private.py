"""Files and directories private to the user ckptfs runs as: never reached through a link.

The cache directory (and what it holds), the control socket's directory and the log are
made 0700 / 0600 by ckptfs, opened with O_NOFOLLOW, and refused, with one line that says
why and what to do (ConfigError), when they are a symbolic link, not a directory or a
regular file, another user's, or (a directory) writable by other users: on a shared node
another user could otherwise pre-create them to read what is written there, or to have
ckptfs write, change or delete their targets (docs/OPERATIONS.md, Security).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from ckptfs.common.errors import ConfigError

#: what to do when the cache directory is refused
CACHE_FIX = "use a cache directory of your own (--cache-dir)"
#: ... when something in it is: only ckptfs puts anything there
INSIDE_FIX = ("remove it (ckptfs never follows a link, nor uses another user's file, in its "
              "cache directory), or use another --cache-dir")
#: how a private directory is opened: the directory itself, never a link to one
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: added to every private file's open: no link followed; a FIFO never blocks the open
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def problem(st: os.stat_result, directory: bool) -> str | None:
    """What makes the thing `st` (an lstat or fstat) unsafe as a private directory (or,
    `directory` False, a private file) of this user, as the end of a sentence; None when
    it is safe."""
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if directory and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not directory and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by you (uid {uid})"
    if directory and st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refusal(what: str, shown: str, why: str, fix: str) -> ConfigError:
    return ConfigError(f"{what} {shown} {why}: {fix}")


def _why_not(path: str, dir_fd: int | None, directory: bool, e: OSError) -> str:
    """Why opening `path` failed with `e`: what is there (lstat), else the OS's reason."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return f"cannot be opened ({e.strerror})"
    return problem(st, directory) or f"cannot be opened ({e.strerror})"


def open_dir(path: str, what: str, fix: str, *, dir_fd: int | None = None,
             create: bool = True, shown: str | None = None) -> int:
    """An fd of the directory `path` (relative to `dir_fd` if given), made with mode
    0700 when missing (`create`; its parent must exist). ConfigError `{what} {shown}
    {why}: {fix}` unless it is a directory of this user, not a symbolic link, that no
    other user can write; read and search bits of others are dropped (chmod 0700, on
    the fd). The caller closes the fd."""
    shown = shown or path
    if create:
        try:
            os.mkdir(path, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise _refusal(what, shown, f"cannot be made ({e.strerror})", fix) from None
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise _refusal(what, shown, _why_not(path, dir_fd, True, e), fix) from None
    try:
        st = os.fstat(fd)
        why = problem(st, directory=True)
        if why is not None:
            raise _refusal(what, shown, why, fix)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str, flags: int, what: str, fix: str, *, dir_fd: int | None = None,
              shown: str | None = None) -> int:
    """os.open(path, flags) (relative to `dir_fd` if given) never through a symbolic
    link, a new file with mode 0600; ConfigError `{what} {shown} {why}: {fix}` unless it
    is a regular file of this user. (With O_EXCL in `flags`, a file already there is
    refused as well.) The caller closes the fd."""
    shown = shown or path
    try:
        fd = os.open(path, flags | FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        raise _refusal(what, shown, "already exists", fix) from None
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES,
                           errno.EPERM, errno.ENOTDIR):
            raise
        raise _refusal(what, shown, _why_not(path, dir_fd, False, e), fix) from None
    try:
        why = problem(os.fstat(fd), directory=False)
        if why is not None:
            raise _refusal(what, shown, why, fix)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_file(path: str, what: str, fix: str) -> bool:
    """Whether a private file is at `path` (for a library that opens it by path, SQLite):
    False when nothing is there; ConfigError when something is there that open_file
    would refuse."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    why = problem(st, directory=False)
    if why is not None:
        raise _refusal(what, path, why, fix)
    return True
