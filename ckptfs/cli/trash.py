"""`ckptfs trash ls|restore|empty`: the command line of the trash (trash.py)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from typing import TYPE_CHECKING, Any

from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import STORE_HELP, add_command, add_dry_run, add_store_options, add_target
from ckptfs.cli.output import Column, human, print_table, utc
from ckptfs.cli.target import Target, mounted_path, open_target, store_path
from ckptfs.common.redact import redact

if TYPE_CHECKING:
    from ckptfs.tools.trash import Entry

# the trash tool is imported in the commands: with the store modules it imports (numpy,
# trio) `ckptfs status --help` would take 0.24 s, not 0.07

#: the table of `trash ls`
TRASH_COLUMNS = (Column("deleted (store time)"), Column("expires"), Column("node"),
                 Column("files", right=True), Column("size", right=True),
                 Column("version", right=True), Column("path"))

# what --help says
TRASH_DESCRIPTION = (
    "Deletes through a mount (unlink, rmdir, rm -rf, a rename over an "
    "existing file), overwrites (the version a publish replaces: torch.save over "
    "latest.pt) and ckptfs prune move the manifests to the store's trash, where "
    "they stay for --trash-hours (a mount option, 24 by default; 0 turns the trash "
    "off). While a file is in the trash its chunks stay in the store (ckptfs gc "
    "counts it), so any node can restore it byte for byte; once its time is up, gc "
    "deletes it and then frees the chunks nothing else needs.")
TRASH_EPILOG = (
    "examples: ckptfs trash ls /mnt/ckpt | ckptfs trash restore "
    "/mnt/ckpt/run7/checkpoint-500 | ckptfs trash restore s3://bucket/ckpt run7/step-9 "
    "--to run7/step-9.recovered | ckptfs trash empty s3://bucket/ckpt")
TRASH_LS_DESCRIPTION = (
    "One line per deleted file or directory, and per version of a file "
    "that an overwrite replaced, newest first: when it was set aside (store time, "
    "UTC), when it expires, the node, the files and bytes it holds, and a file's "
    "version number among those of its path (1 is the newest; trash restore "
    "--version takes it). A directory removed with rm -rf is one line, with the "
    "files deleted with it. "
    + STORE_HELP)
TRASH_LS_EPILOG = (
    "example: ckptfs trash ls /mnt/ckpt/run7")
TRASH_RESTORE_DESCRIPTION = (
    "Put back the newest deleted version of PATH and of everything that "
    "was under it, where it was (or at --to), or with --version a chosen version of "
    "the file PATH; each restored entry leaves the trash. A name that exists is "
    "never overwritten (a conditional write, even against another node's publish "
    "meanwhile): it is left in the trash and reported. The files come back byte for "
    "byte, with their mode and mtime; mounts see them within their --metadata-ttl. "
    "With a fast tier (--fast-tier, or the mount's), a name that exists in either tier is "
    "never overwritten, a file comes back into the store, and one that a change still "
    "pending in the fast tier touches is left in the trash; without one, files written "
    "through a fast tier are refused (exit 2). "
    "Exit status: 0 all restored, 1 some left in the trash, 2 nothing to restore or "
    "an error. " + STORE_HELP)
TRASH_RESTORE_EPILOG = (
    "examples: ckptfs trash restore /mnt/ckpt/run7/checkpoint-500 | ckptfs trash "
    "restore s3://bucket/ckpt run7/step-9 --to run7/step-9.recovered --dry-run")
TRASH_EMPTY_DESCRIPTION = (
    "Delete the trash entries at or under PATH (everything by default) "
    "now, instead of when they expire; ckptfs gc then frees their chunks (those no "
    "other file needs, older than its grace). Cannot be undone. " + STORE_HELP)
TRASH_EMPTY_EPILOG = (
    "examples: ckptfs trash empty /mnt/ckpt | ckptfs trash empty "
    "s3://bucket/ckpt run7 --dry-run")


def _where(e: Entry, t: Target) -> str:
    return t.show(e.path) + ("/" if e.is_dir else "")


def _expires(e: Entry) -> str:
    return "when emptied" if math.isinf(e.keep) else utc(e.expires)[:16] + " UTC"


def _target(a: argparse.Namespace) -> Target:
    """The store and PATH of a trash command (PATH as store_path takes it)."""
    from ckptfs.tools import inspection  # the trash tool: see the top

    t = open_target(a, a.path)
    inspection.read_info(t.store)
    return t


def restore_command(a: argparse.Namespace, t: Target, e: Entry) -> str:
    """The command that restores the entry `e` that `trash ls` printed: the path as shown
    when it is in a mount, else the store (cut at its root), the path and its endpoint."""
    if t.mountpoint is not None:
        return f"ckptfs trash restore {shlex.quote(t.show(e.path))}"
    extra = [w for opt in ("endpoint_url", "region") if (v := getattr(a, opt, None))
             for w in (f"--{opt.replace('_', '-')}", redact(v))]
    return shlex.join(["ckptfs", "trash", "restore", t.store_arg or a.target, e.path,
                       *extra])


def cmd_ls(a: argparse.Namespace) -> int:
    from ckptfs.tools import trash  # the trash tool: see the top

    t = _target(a)
    found = trash.entries(t.object_store(), t.path)  # a fast tier keeps no trash
    trash.read_sizes(t.object_store(), found)
    items = trash.items(found)
    if a.json:
        print(json.dumps({"store": t.store.url, "path": t.path,
                          "items": [{**it.to_dict(), "shown": _where(it.head, t),
                                     "entries": [e.to_dict() for e in it.members]}
                                    for it in items]}, indent=1))
        return 0
    if not items:
        print(f"the trash of {t.store.url} holds nothing at {t.show(t.path)}")
        return 0
    rows = [(utc(it.head.deleted), _expires(it.head), it.head.node, str(it.files),
             human(it.bytes), str(it.head.version or "-"), _where(it.head, t))
            for it in items]
    print_table(TRASH_COLUMNS, rows)
    for e in (e for e in found if e.damaged is not None):
        stops = "" if e.is_dir else "; gc stops on it until it is repaired or deleted"
        print(f"DAMAGED  {e.key}: {e.damaged} (restore skips it{stops})")
    files = sum(it.files for it in items)
    print(f"{len(items)} deleted items, {files} files ({human(sum(it.bytes for it in items))})"
          f"; put one back with: {restore_command(a, t, items[0].head)}")
    return 0


def _destination(a: argparse.Namespace, t: Target) -> str | None:
    """--to as a path in the filesystem: a path in the same mount, or one from its root."""
    to: str | None = a.to
    if to is None:
        return None
    store_path(to)  # a '..' is refused before the path is looked at
    mounted = mounted_path(to)
    if t.mountpoint is not None and mounted is not None:
        if os.path.realpath(t.mountpoint) != os.path.realpath(mounted[0]):
            raise CliError(f"--to {to} is in another mount ({mounted[0]}): a restore "
                           f"stays in the filesystem of {t.store.url}")
        return mounted[1]
    return store_path(to)  # from the root of the filesystem: with a '/' or not


def cmd_restore(a: argparse.Namespace) -> int:
    from ckptfs.tools import trash  # the trash tool: see the top

    if a.no_fast_tier and a.fast_tier:
        raise UsageError("give --fast-tier DIR or --no-fast-tier, not both")
    t = _target(a)
    if not t.path:
        raise CliError("name what to restore: a deleted file or directory (ckptfs trash ls "
                       "lists them)")
    store, busy = t.store, None
    if t.fast is not None:  # into the store (every reader sees it), never over a pending change
        from ckptfs.pipeline.fasttools import BothTiers  # the trash tool: see the top

        tiers = BothTiers(t.fast, t.object_store())
        tiers.pending_paths()  # a damaged pending record: nothing is done
        store, busy = tiers.restore_store(), tiers.pending
    elif not a.no_fast_tier:
        refuse_fast_written(a, t)
    r = trash.restore(store, t.path, _destination(a, t), dry_run=a.dry_run,
                      version=a.version, busy=busy)
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 1 if r.skipped else 0
    verb = "would restore" if a.dry_run else "restored"
    for e in r.restored:
        moved = f" to {t.show(r.destination(e))}" if r.to != r.path else ""
        print(f"{verb} {_where(e, t)}{moved}" + (f" ({human(e.size)})" if not e.is_dir
                                                  else ""))
    for e, why in r.skipped:
        dest = r.destination(e)
        print(f"left in the trash {_where(e, t)}: {why.replace(dest, t.show(dest), 1)}")
    files = [e for e in r.restored if not e.is_dir]
    taken = any(why.startswith(f"{r.destination(e)} exists") for e, why in r.skipped)
    print(f"{'dry run: ' if a.dry_run else ''}{verb} {len(files)} files "
          f"({human(sum(e.size for e in files))}) to {t.show(r.to)}"
          + (f"; {len(r.skipped)} left in the trash" if r.skipped else "")
          + ("; a name that exists is never overwritten: restore beside it with --to"
             if taken else ""))
    return 1 if r.skipped else 0


def refuse_fast_written(a: argparse.Namespace, t: Target) -> None:
    """UsageError if a file to restore was written through a fast tier (its manifest has
    a generation, which only fast-tier mounts write): restored in the object store alone,
    a pending change in the fast tier, or a newer version there, would undo it (a listing
    of the trash and one GET)."""
    from ckptfs.common.errors import NotFoundError
    from ckptfs.format import manifests
    from ckptfs.tools import trash  # the trash tool: see the top

    for e in [e for e in trash.newest(trash.entries(t.store, t.path)) if not e.is_dir][:1]:
        try:
            gen = manifests.generation(t.store.get_record(e.key))
        except NotFoundError:
            continue
        if gen:
            words = shlex.join(getattr(a, "argv", []) or ["trash", "restore", a.target])
            raise UsageError(f"{e.path} was written through a fast tier (mounts with "
                             f"--fast-tier): restored in the store alone, a change still "
                             f"pending in the fast tier could undo it; restore with both "
                             f"tiers: ckptfs {words} --fast-tier DIR (the mounts' DIR; or "
                             f"--no-fast-tier if no mount uses one any more)")


def cmd_empty(a: argparse.Namespace) -> int:
    from ckptfs.tools import trash  # the trash tool: see the top

    t = _target(a)
    gone = trash.empty(t.object_store(), t.path, dry_run=a.dry_run)
    files = [e for e in gone if not e.is_dir]
    if a.json:
        print(json.dumps({"store": t.store.url, "path": t.path, "dry_run": a.dry_run,
                          "entries": len(gone), "files": len(files),
                          "bytes": sum(e.size for e in files)}, indent=1))
        return 0
    verb = "would delete" if a.dry_run else "deleted"
    print(f"{verb} {len(gone)} trash entries ({len(files)} files, "
          f"{human(sum(e.size for e in files))}) at {t.show(t.path)}; ckptfs gc frees the "
          f"chunks that nothing else needs once they are older than its grace")
    return 0


def add_trash_parser(sub: Any) -> None:
    """The parser of `ckptfs trash` and its three verbs."""
    tr = sub.add_parser("trash", help="list, restore or empty deleted files (undo rm -rf)",
                        description=TRASH_DESCRIPTION, epilog=TRASH_EPILOG)
    verbs = tr.add_subparsers(dest="verb", metavar="{ls,restore,empty}", required=True)
    under = "with STORE: only what was under this path (default: everything)"

    ls = add_command(verbs, "ls", cmd_ls, "what the trash holds", TRASH_LS_DESCRIPTION,
                     TRASH_LS_EPILOG)
    add_target(ls, "mounted path, or STORE", "path", under)
    add_store_options(ls, fast_tier="taken, and ignored: the trash is in the store alone")

    rs = add_command(verbs, "restore", cmd_restore, "put a deleted file or directory back",
                     TRASH_RESTORE_DESCRIPTION, TRASH_RESTORE_EPILOG)
    add_target(rs, "mounted path, or STORE", "path",
               "with STORE: the deleted file or directory, from the filesystem root")
    add_store_options(rs, fast_tier="a name that exists in either tier is not overwritten, "
                      "and one with changes still pending there is left in the trash (a "
                      "mover would undo the restore)")
    rs.add_argument("--to", metavar="DEST", help="restore there instead: a path from the "
                    "filesystem root (with a leading / or not), or a path inside the "
                    "same mount; never over a file that exists")
    rs.add_argument("--version", metavar="N|TIME", help="restore this version of the file "
                    "PATH: N as trash ls numbers them (1 is the newest in the trash: the "
                    "one the last overwrite or delete set aside), or a UTC time as trash ls "
                    "shows it (the newest set aside at or before it); the file must not "
                    "exist, or give --to")
    rs.add_argument("--no-fast-tier", action="store_true",
                    help="restore into the store alone, even if the files were written "
                    "through a fast tier (when no mount uses one any more)")
    add_dry_run(rs, "restored")

    em = add_command(verbs, "empty", cmd_empty, "delete what the trash holds now",
                     TRASH_EMPTY_DESCRIPTION, TRASH_EMPTY_EPILOG)
    add_target(em, "mounted path, or STORE", "path", under)
    add_store_options(em, fast_tier="taken, and ignored: the trash is in the store alone")
    add_dry_run(em, "deleted")
