"""`ckptfs upgrade`: move a store to the current store format, or give a directory store
the mode of its files (ckptfs.json only)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ckptfs.cli.errors import UsageError
from ckptfs.cli.options import WHOLE_STORE_HELP, add_command, add_store_options, add_target
from ckptfs.cli.output import describe_format
from ckptfs.cli.target import open_target
from ckptfs.common.config import STORE_MODES, dir_mode, parse_store_mode

# the store's format and tools are imported in cmd_upgrade: with the store modules they
# import (numpy, trio) `ckptfs status --help` would take 0.24 s, not 0.07

# what --help says
UPGRADE_DESCRIPTION = (
    "A store keeps the format it was created with: a store made by an "
    "older ckptfs (format 1: fixed chunks, lz4) is read and written as format 1 by "
    "this one, so older nodes can still mount it. This command rewrites the store's "
    "ckptfs.json only: mounts started after it cut new files at tensor boundaries "
    "and compress them with zstd4; stored chunks are not rewritten. --store-mode "
    "gives a directory store the mode of the files written from then on (a store made "
    "before ckptfs recorded one writes 0644). Without --yes it "
    "only says what it would change. " + WHOLE_STORE_HELP)
UPGRADE_EPILOG = (
    "examples: ckptfs upgrade s3://bucket/ckpt --yes | ckptfs upgrade /shared/ckpt "
    "--store-mode 0600 --yes")


def cmd_upgrade(a: argparse.Namespace) -> int:
    from ckptfs.format import manifests  # the store's format and tools: see the top
    from ckptfs.tools import inspection

    t = open_target(a, whole_store=True)
    info = inspection.read_info(t.store)
    new = info.upgraded(a.codec)
    if a.store_mode is not None:
        if getattr(t.store, "set_file_mode", None) is None:
            raise UsageError(f"--store-mode applies to directory stores only, not "
                             f"{t.store.url} (a bucket's access is its own policy's)")
        try:
            new = dataclasses.replace(new, store_mode=parse_store_mode(a.store_mode))
        except ValueError as e:
            raise UsageError(f"--store-mode {e}") from None
    if a.json:
        print(json.dumps({"store": t.store.url, "from": info.format, "to": new.format,
                          "store_mode": mode_text(new.store_mode),
                          "changed": new != info and a.yes}))
    elif new == info:
        print(f"{t.store.url} is already at the current {describe_format(info)}")
    else:
        verb = "upgraded" if a.yes else "would upgrade (run again with --yes to do it)"
        print(f"{verb} {t.store.url}\n  from {describe_format(info)}\n"
              f"  to   {describe_format(new)}")
        if new.format != info.format or new.codec != info.codec:
            print("Files already stored stay as they are (every ckptfs that reads this "
                  "format reads both); files written after each mount's next start use the "
                  "new format. A ckptfs older than this one refuses the store from then "
                  "on, so upgrade every node first.")
        if new.store_mode != info.store_mode and new.store_mode is not None:
            print(f"Files and directories written after each mount's next start (and by "
                  f"the store tools) get modes {new.store_mode:04o} and "
                  f"{dir_mode(new.store_mode):04o}; those already there keep theirs: "
                  f"chmod them (docs/OPERATIONS.md, \"Security\"). A ckptfs older than "
                  f"this one ignores the mode, so upgrade every node first.")
    if a.yes and new != info:
        t.store.put(manifests.INFO_KEY, new.to_json())
    return 0


def add_upgrade_parser(sub: Any) -> None:
    """The parser of `ckptfs upgrade`."""
    u = add_command(sub, "upgrade", cmd_upgrade, "move a store to the current format (asks "
                    "for --yes)", UPGRADE_DESCRIPTION, UPGRADE_EPILOG)
    add_target(u, "STORE, or a mounted path")
    u.add_argument("--yes", action="store_true", help="do it (default: only say what "
                   "would change)")
    u.add_argument("--codec", choices=("zstd4", "lz4"), help="how new chunks are "
                   "compressed from then on (default zstd4; see ckptfs mount --help)")
    u.add_argument("--store-mode", metavar="MODE", help="directory stores: the mode of "
                   "the files written from then on, one of " + ", ".join(
                       f"{m:04o}" for m in STORE_MODES) + " (see ckptfs mount --help)")
    add_store_options(u)


def mode_text(mode: int | None) -> str | None:
    """A store_mode as ckptfs.json writes it (None: the store records none)."""
    return None if mode is None else f"{mode:04o}"
