"""`ckptfs status` and `ckptfs sync`: what a mount's daemon has uploaded, and waiting for it."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from typing import Any

from ckptfs.cli.control import request, sync
from ckptfs.cli.output import human
from ckptfs.cli.target import mount_of


def format_status(st: dict[str, Any]) -> str:
    """The daemon's status answer as `ckptfs status` prints it: a line per aspect."""
    lines = [
        f"store        {st['store']}",
        f"mountpoint   {st['mountpoint']}   (pid {st['pid']}, cache {st['cache_dir']})",
        f"dirty        {human(st['dirty_bytes'])}   uploading {human(st['uploading_bytes'])}"
        f"   pending chunks {st['pending_chunks']}   pending metadata ops {st['pending_ops']}",
        f"uploaded     {human(st['uploaded_bytes'])}   stored {human(st['stored_bytes'])}"
        f"   deduplicated {human(st['dedup_bytes'])}   rate {human(st['upload_rate'])}/s"
        f"   ETA {st['eta_seconds'] if st['eta_seconds'] is not None else '-'} s",
        f"ratios       compression {st['compression_ratio'] or '-'}   dedup "
        f"{st['dedup_ratio'] or '-'}   logical written {human(st['logical_bytes'])}",
        f"cache        {human(st['cache_bytes'])} of {human(st['cache_limit'])}"
        f"   in memory {human(st.get('memory_bytes', 0))}"
        f"   fetched {human(st['fetched_bytes'])}   open files {st['open_files']}",
        f"state        {state_line(st)}",
    ]
    ap = st.get("autoprune")
    if ap:
        every = f" --keep-every {ap['keep_every']}" if ap["keep_every"] else ""
        lines.append(f"auto-prune   --keep-last {ap['keep_last']}{every} --keep-pattern "
                     f"{shlex.quote(ap['pattern'])}: runs {ap['runs']}, removed "
                     f"{ap['removed']}, errors {ap['errors']}"
                     + (f" (last: {ap['last_error']})" if ap["last_error"] else ""))
    for e in st["errors"]:
        lines.append(f"error        {e}")
    if st.get("retrying_since"):
        lines.append(f"retrying     since {time.ctime(st['retrying_since'])}")
    return "\n".join(lines)


def state_line(st: dict[str, Any]) -> str:
    """Durable, or why not: uploading, files open, a journal being checked, files lost."""
    if st["durable"]:
        return "durable: everything written is in the store"
    why = []
    if st["pending_chunks"] or st["pending_ops"]:
        why.append("uploading")
    if st["open_files"]:
        why.append(f"{st['open_files']} files open with data not yet published")
    files = len(st.get("problems") or ()) - bool(st.get("journal_damage"))
    if st.get("journal_damage"):
        why.append("the journal lost committed state: checking the files written here "
                   "against the store")
    if files:
        why.append(f"{files} files could not be saved (see errors)")
    return "not durable: " + ", ".join(why or ["uploading"])


def cmd_status(a: argparse.Namespace) -> int:
    st = next(request(mount_of(a.mountpoint), "status"))
    print(json.dumps(st, indent=1) if a.json else format_status(st))
    return 0


def cmd_sync(a: argparse.Namespace) -> int:
    sync(mount_of(a.mountpoint), a.timeout)
    print(f"durable: everything closed under {a.mountpoint} is in the store")
    return 0


def add_status_parsers(sub: Any) -> None:
    """The parsers of `ckptfs status` and `ckptfs sync`."""
    s = sub.add_parser("status", help="upload state of a mount")
    s.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    y = sub.add_parser("sync", help="wait until everything closed so far is in the store")
    y.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount (the whole mount is "
                   "synced)")
    y.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    y.set_defaults(func=cmd_sync)
