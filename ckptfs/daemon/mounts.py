"""The ckptfs mounts of this machine (from /proc/mounts): where, which cache, dead or alive.

A mount's source field (`fsname`) is `ckptfs:<cache dir>`, so that the cache directory of
a mount whose daemon is gone can still be found (`ckptfs umount` names it, `df` shows it).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

#: the file system type of a ckptfs mount in /proc/mounts (fuse.<subtype>)
MOUNT_FSTYPE = "fuse.ckptfs"
#: the source field of a mount whose cache directory cannot be recorded in it
FSNAME = "ckptfs"
#: errnos of every call on a FUSE mount whose daemon is gone (aborted: `fusectl` abort)
DEAD_ERRNOS = frozenset({errno.ENOTCONN, errno.ECONNABORTED})


@dataclass(frozen=True)
class MountEntry:
    """One ckptfs line of /proc/mounts."""

    mountpoint: str
    cache_dir: str | None  # None: not recorded (a cache path with ',' or '\' in it)


def fsname(cache_dir: str) -> str:
    """The `fsname=` mount option naming `cache_dir`, or plain `ckptfs` when the path has a
    character that the mount option syntax would need escaped (',' or '\\')."""
    if "," in cache_dir or "\\" in cache_dir or not cache_dir.isprintable():
        return FSNAME
    return f"{FSNAME}:{cache_dir}"


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes ('\\040' for a blank) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def ckptfs_mounts() -> list[MountEntry]:
    """Every ckptfs mount on this machine, in mount order (later ones stack on top)."""
    try:
        with open("/proc/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == MOUNT_FSTYPE:
            source = _unescape(fields[0])
            cache_dir = source[len(FSNAME) + 1:] if source.startswith(FSNAME + ":") else None
            found.append(MountEntry(_unescape(fields[1]), cache_dir or None))
    return found


def containing(path: str) -> tuple[str, str] | None:
    """(mount point, path inside the filesystem, '' for its root) of the topmost ckptfs
    mount that `path` (made absolute, symlinks resolved) lies in, else None."""
    real = os.path.realpath(path)
    inside = [m.mountpoint for m in ckptfs_mounts()
              if real == m.mountpoint or real.startswith(m.mountpoint.rstrip("/") + "/")]
    if not inside:
        return None
    mountpoint = max(inside, key=len)
    rel = os.path.relpath(real, mountpoint)
    return mountpoint, "" if rel == "." else rel


def entry_at(path: str) -> MountEntry | None:
    """The topmost ckptfs mount whose mount point is `path` (made absolute), if any."""
    path = os.path.realpath(path)  # non-strict: a dead mount point resolves as it is
    at = [m for m in ckptfs_mounts() if m.mountpoint == path]
    return at[-1] if at else None


def is_dead(path: str) -> bool:
    """Whether `path` is a FUSE mount whose daemon is gone (ENOTCONN). statfs always asks
    the daemon, where stat may be answered from the kernel's attribute cache."""
    try:
        os.statvfs(path)
    except OSError as e:
        return e.errno in DEAD_ERRNOS
    return False


def dead_mount(path: str) -> MountEntry | None:
    """The ckptfs mount at `path` if its daemon is gone (killed, crashed), else None."""
    if not is_dead(path):
        return None
    return entry_at(path)


def users_of_cache(cache_dir: str) -> list[str]:
    """Mount points of the ckptfs mounts that use `cache_dir` (as recorded in fsname)."""
    return [m.mountpoint for m in ckptfs_mounts() if m.cache_dir == cache_dir]
