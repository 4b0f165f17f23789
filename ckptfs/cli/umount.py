"""`ckptfs umount`: sync, unmount, wait for the daemon, and say whether all is durable."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import time
from typing import TYPE_CHECKING, Any

from ckptfs.cli.control import SyncTimeout, control_socket, status_of, sync
from ckptfs.cli.errors import CliError
from ckptfs.cli.options import add_command
from ckptfs.cli.target import mount_of
from ckptfs.common.errors import JournalError
from ckptfs.daemon import mounts

if TYPE_CHECKING:
    from ckptfs.pipeline.journal import LostFile

# the journal's module is imported where a stopped mount's journal is read: it imports
# sqlite3 (~25 ms), which no other command needs

# what --help says
UMOUNT_DESCRIPTION = (
    "Wait (with progress) until every closed file is in the "
    "store, unmount, and exit 0 only when everything is durable. A mount "
    "whose daemon is gone (killed, crashed) is detached, and what its cache "
    "directory still holds for the next mount is reported.")


def cmd_umount(a: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(a.mountpoint)
    dead = mounts.dead_mount(mountpoint)
    if dead is not None:
        return umount_dead(dead)
    inside = mount_of(mountpoint)
    if inside != os.path.realpath(mountpoint) and inside != mountpoint:
        raise CliError(f"{a.mountpoint} is a path inside the ckptfs mount {inside}: ckptfs "
                       f"umount {shlex.quote(inside)}")
    sock = control_socket(mountpoint)
    st = status_of(mountpoint, sock)
    pid, cache_dir = st["pid"], st["cache_dir"]
    start = time.monotonic()
    try:
        final = sync(mountpoint, a.timeout, sock)
    except SyncTimeout as e:
        raise CliError(f"still mounted: {e}") from None
    except KeyboardInterrupt:
        raise CliError("interrupted: still mounted; pending data stays in the cache") from None
    r = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
    if r.returncode != 0:
        raise CliError(f"cannot unmount {mountpoint}: {r.stderr.strip() or r.returncode}")
    while _alive(pid):  # the daemon flushes what was closed after the sync, then exits
        if a.timeout is not None and time.monotonic() - start > a.timeout:
            raise CliError(f"daemon {pid} still flushing after {a.timeout:g}s; the data is "
                           f"safe in {cache_dir}")
        time.sleep(0.05)
    damage = journal_damage(cache_dir)
    if damage:
        raise CliError(f"unmounted, but not durable: the journal lost committed state "
                       f"({damage}) and the check of the files written here against the "
                       f"store did not finish; mount again with --cache-dir "
                       f"{shlex.quote(cache_dir)} to finish it")
    chunks, ops = journal_counts(cache_dir)
    if chunks or ops:
        raise CliError(f"unmounted, but {chunks} chunks and {ops} metadata ops are not in the "
                       f"store yet; they stay in {cache_dir} for the next mount")
    lost = journal_lost(cache_dir)
    if lost:
        names = sorted({f.path for f in lost})
        raise CliError(f"unmounted, but {len(names)} files lost data that is not in the "
                       f"store (rewrite or delete them): {', '.join(names)}")
    if final.get("problems"):
        raise CliError(f"unmounted, but some data could not be saved: "
                       f"{'; '.join(final['problems'])}")
    print(f"unmounted {mountpoint}: everything is in the store "
          f"({time.monotonic() - start:.1f}s)")
    return 0


def umount_dead(entry: mounts.MountEntry) -> int:
    """Detach a ckptfs mount whose daemon is gone; say what its cache still holds."""
    mp, cache_dir = entry.mountpoint, entry.cache_dir
    for how in (["-u"], ["-u", "-z"]):  # lazily if a process still uses it
        r = subprocess.run(["fusermount3", *how, mp], capture_output=True, text=True)
        if r.returncode == 0:
            break
    else:
        raise CliError(f"cannot detach {mp} (its daemon is gone): "
                       f"{r.stderr.strip() or r.returncode}")
    gone = f"detached {mp}: its ckptfs daemon was gone"
    if cache_dir is None:
        raise CliError(f"{gone}; mount again with the same --cache-dir to resume the uploads "
                       f"it had not finished")
    try:
        damage = journal_damage(cache_dir)
        chunks, ops = (0, 0) if damage else journal_counts(cache_dir)
    except (JournalError, OSError) as e:
        raise CliError(f"{gone}; cannot read the journal in {cache_dir} ({e}); the next mount "
                       f"with --cache-dir {shlex.quote(cache_dir)} resumes what it holds, or "
                       f"checks the files written here against the store") from None
    if damage:
        raise CliError(f"{gone}; its journal in {cache_dir} lost committed state ({damage}): "
                       f"the next mount with --cache-dir {shlex.quote(cache_dir)} checks the "
                       f"files written here against the store")
    if chunks or ops:
        raise CliError(f"{gone}; {chunks} chunks and {ops} metadata ops are not in the store "
                       f"yet: they stay in {cache_dir}, and the next mount with --cache-dir "
                       f"{shlex.quote(cache_dir)} resumes the uploads")
    print(f"{gone}; its journal in {cache_dir} is empty: everything closed before is in the "
          f"store")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process (tests) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def journal_counts(cache_dir: str) -> tuple[int, int]:
    """(chunks, metadata ops) a stopped mount left in its cache directory's journal."""
    from ckptfs.pipeline.journal import read_counts  # sqlite3: see the top

    return read_counts(os.path.join(cache_dir, "journal.sqlite"))


def journal_damage(cache_dir: str) -> str | None:
    """Why the journal a stopped mount left cannot be trusted (journal.py), or None."""
    from ckptfs.pipeline.journal import read_damage, wal_damage  # sqlite3: see the top

    path = os.path.join(cache_dir, "journal.sqlite")
    return wal_damage(path) or read_damage(path)


def journal_lost(cache_dir: str) -> list[LostFile]:
    """The files a stopped mount recorded as having lost data (journal.py)."""
    from ckptfs.pipeline.journal import read_lost  # sqlite3: see the top

    return read_lost(os.path.join(cache_dir, "journal.sqlite"))


def add_umount_parser(sub: Any) -> None:
    """The parser of `ckptfs umount`."""
    u = add_command(sub, "umount", cmd_umount, "flush everything to the store, then unmount",
                    UMOUNT_DESCRIPTION)
    u.add_argument("mountpoint")
    u.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
