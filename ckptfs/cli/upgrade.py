"""`ckptfs upgrade`: move a store to the current store format (ckptfs.json only)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ckptfs.cli import EXIT_ERROR, TOOL_ENDPOINT_HELP, WHOLE_STORE_HELP, human, open_target
from ckptfs.format import manifests
from ckptfs.format.manifests import StoreInfo
from ckptfs.tools import inspection


def describe(info: StoreInfo) -> str:
    """One store format in a few words: 'format 1: 16 MiB fixed chunks, lz4'."""
    if info.chunking == "records":
        cut = (f"chunks cut at tensor boundaries (records of {human(info.min_record)} or "
               f"more get their own, none over {human(info.chunk_size)})")
    else:
        cut = f"fixed {human(info.chunk_size)} chunks"
    return f"format {info.format}: {cut}, {info.codec}"


def cmd_upgrade(a: argparse.Namespace) -> int:
    t = open_target(a, whole_store=True)
    info = inspection.read_info(t.store)
    new = info.upgraded(a.codec)
    if a.json:
        print(json.dumps({"store": t.store.url, "from": info.format, "to": new.format,
                          "changed": new != info and a.yes}))
    elif new == info:
        print(f"{t.store.url} is already at the current {describe(info)}")
    else:
        verb = "upgraded" if a.yes else "would upgrade (run again with --yes to do it)"
        print(f"{verb} {t.store.url}\n  from {describe(info)}\n  to   {describe(new)}\n"
              "Files already stored stay as they are (every ckptfs that reads this format "
              "reads both); files written after each mount's next start use the new "
              "format. A ckptfs older than this one refuses the store from then on, so "
              "upgrade every node first.")
    if a.yes and new != info:
        t.store.put(manifests.INFO_KEY, new.to_json())
    return 0


def add_upgrade_parser(sub: Any) -> None:
    """The parser of `ckptfs upgrade`."""
    u = sub.add_parser(
        "upgrade", help="move a store to the current format (asks for --yes)",
        description="A store keeps the format it was created with: a store made by an "
        "older ckptfs (format 1: fixed chunks, lz4) is read and written as format 1 by "
        "this one, so older nodes can still mount it. This command rewrites the store's "
        "ckptfs.json only: mounts started after it cut new files at tensor boundaries "
        "and compress them with zstd4; stored chunks are not rewritten. Without --yes it "
        "only says what it would change. " + WHOLE_STORE_HELP,
        epilog="example: ckptfs upgrade s3://bucket/ckpt --yes")
    u.add_argument("target", metavar="TARGET", help="STORE, or a mounted path")
    u.add_argument("--yes", action="store_true", help="do it (default: only say what "
                   "would change)")
    u.add_argument("--codec", choices=("zstd4", "lz4"), help="how new chunks are "
                   "compressed from then on (default zstd4; see ckptfs mount --help)")
    u.add_argument("--json", action="store_true", help="machine-readable output")
    u.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
    u.add_argument("--region", help="S3 region (default: the AWS config chain)")
    u.set_defaults(func=cmd_upgrade, error_exit=EXIT_ERROR)
