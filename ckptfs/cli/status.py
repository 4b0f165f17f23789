"""`ckptfs status` and `ckptfs sync`: what a mount's daemon has uploaded, and waiting for it."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any, TextIO

from ckptfs.cli.control import control_socket, status_of, sync
from ckptfs.cli.errors import UsageError
from ckptfs.cli.output import human
from ckptfs.cli.target import mount_of
from ckptfs.common.redact import redacted


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
    if st.get("fast_tier"):
        lines.append(f"fast tier    {fast_tier_line(st)}")
        lines.append(moving_line(st))
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
    if st.get("retries"):
        lines.append(f"retries      {retries_text(st['retries'])}")
    return "\n".join(lines)


def fast_tier_line(st: dict[str, Any]) -> str:
    """The fast tier, usable or not, and what went straight to the store meanwhile."""
    direct = (f"{st.get('fast_direct_ops', 0)} changes and "
              f"{human(st.get('fast_direct_bytes', 0))} written straight to the store")
    if st.get("fast_usable", True):
        return f"{st['fast_tier']} usable" + (
            f" ({direct} while it was not)" if st.get("fast_unusable_episodes") else "")
    since = st.get("fast_unusable_since")
    return (f"{st['fast_tier']} UNUSABLE since {time.ctime(since) if since else '?'} "
            f"({st.get('fast_unusable_reason')}): {direct}")


def moving_line(st: dict[str, Any]) -> str:
    """A mount with --fast-tier: what its pending records still hold back from the object
    store, and what its mover has moved (a daemon of before has no byte counts)."""
    moved = st.get("fast_moved_bytes")
    error = st.get("fast_last_error")
    return (f"moving       {st.get('fast_pending_records', 0)} pending records "
            f"({human(st.get('fast_pending_bytes', 0))} of files) from the fast tier to the "
            f"store   moved {st.get('fast_moved_records', 0)}"
            + (f" ({human(moved)})" if moved is not None else "")
            + (f"   error: {error}" if error else ""))


def retries_text(retries: dict[str, int]) -> str:
    """"12 (upload 10, metadata 2)": the tries made again, by what."""
    parts = ", ".join(f"{what} {n}" for what, n in sorted(retries.items(), key=lambda i: -i[1]))
    return f"{sum(retries.values())} ({parts})"


def state_line(st: dict[str, Any]) -> str:
    """Durable, or why not: uploading, files open, a journal being checked, files lost."""
    if st["durable"]:
        return "durable: everything written is in the store"
    why = []
    if st["pending_chunks"] or st["pending_ops"]:
        why.append("uploading")
    elif st.get("fast_pending_records"):
        why.append(f"fast-durable, {st['fast_pending_records']} changes moving from the fast "
                   f"tier to the store")
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
    mountpoint = mount_of(a.mountpoint)
    if a.watch:
        if not a.interval > 0:
            raise UsageError(f"--interval must be more than 0 seconds, not {a.interval:g}")
        return watch(mountpoint, sys.stdout, a.interval, a.json)
    st = redacted(status_of(mountpoint))  # the daemon's are; a daemon of before, too
    print(json.dumps(st, indent=1) if a.json else format_status(st))
    return 0


def watch(mountpoint: str, out: TextIO, interval: float, as_json: bool = False) -> int:
    """`status --watch`: the status again every `interval` seconds until Ctrl-C (exit 0),
    drawn in place by rich on a terminal, else one line per sample (watch_line, or the
    JSON object with `as_json`)."""
    rates = FileRates()
    # found once: each sample then goes straight to the socket, with no request through
    # the mount (whose answer a busy daemon could hold back past a Ctrl-C)
    sock = control_socket(mountpoint)
    try:
        if as_json or not out.isatty():
            while True:
                st = status_of(mountpoint, sock)
                out.write((json.dumps(st) if as_json else watch_line(st)) + "\n")
                out.flush()
                time.sleep(interval)
        from rich.console import Console  # on a terminal only: rich costs ~40 ms to import
        from rich.live import Live

        with Live(console=Console(file=out), auto_refresh=False) as live:
            while True:
                st = status_of(mountpoint, sock)
                live.update(watch_view(st, rates.update(st)), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0


class FileRates:
    """Per-file upload rates from two samples of the files in flight, bytes/s."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, int]] = {}

    def update(self, st: dict[str, Any]) -> dict[str, float]:
        now, rates, seen = time.monotonic(), {}, {}
        for f in st.get("files") or ():
            path, left = f["path"], int(f["left_bytes"])
            before = self.last.get(path)
            if before is not None and now > before[0]:
                rates[path] = max(0.0, (before[1] - left) / (now - before[0]))
            seen[path] = (now, left)
        self.last = seen
        return rates


def watch_line(st: dict[str, Any]) -> str:
    """One sample as a plain line: time, what is left, the rate, the busiest file."""
    eta = st["eta_seconds"]
    files = st.get("files") or []
    busiest = (f"   {files[0]['path']} {human(files[0]['left_bytes'])} left"
               if files else "")
    return (f"{time.strftime('%H:%M:%S')} dirty {human(st['dirty_bytes'])}   uploading "
            f"{human(st['uploading_bytes'])}   rate {human(st['upload_rate'])}/s   ETA "
            f"{'-' if eta is None else f'{eta:.0f} s'}   uploaded "
            f"{human(st['uploaded_bytes'])}   cache {human(st['cache_bytes'])} of "
            f"{human(st['cache_limit'])}   {'durable' if st['durable'] else 'not durable'}"
            + (f"   retries {sum(st['retries'].values())}" if st.get("retries") else "")
            + (f"   fast tier pending {st.get('fast_pending_records', 0)} "
               f"({human(st.get('fast_pending_bytes', 0))})" if st.get("fast_tier") else "")
            + f"{busiest}" + "".join(f"   error: {e}" for e in st["errors"]))


def watch_view(st: dict[str, Any], rates: dict[str, float]) -> Any:
    """One sample for rich: the status lines, then a row per file still being saved
    with how much of it is in the store, its rate and ETA."""
    from rich.console import Group  # imported by watch() already
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    tiers = bool(st.get("fast_tier"))  # a column saying which files are fast-durable
    files = Table("file", "state", *(["durable"] if tiers else []), "size", "in the store",
                  "", "rate", "ETA", title="files being saved", title_justify="left",
                  expand=False)
    for f in st.get("files") or ():
        size, left = int(f["size"]), int(f["left_bytes"])
        done = 1.0 - left / size if size else 1.0
        rate = rates.get(f["path"])
        eta = f"{left / rate:.0f} s" if rate else "-"
        durable = ["fast tier" if f.get("fast_durable") else "no"] if tiers else []
        files.add_row(Text(f["path"]), f["state"], *durable, human(size),
                      ProgressBar(total=1.0, completed=done, width=20), f"{done:.0%}",
                      f"{human(rate)}/s" if rate is not None else "-", eta)
    parts: list[Any] = [Text(format_status(st))]
    if st.get("files"):
        parts.append(files)
    parts.append(Text("Ctrl-C to stop", style="dim"))
    return Group(*parts)


def cmd_sync(a: argparse.Namespace) -> int:
    st = sync(mount_of(a.mountpoint), a.timeout, fast=a.fast)
    if a.fast and st.get("fast_tier"):
        print(f"fast-durable: everything closed under {a.mountpoint} is in the fast tier "
              f"{st['fast_tier']}" + ("" if st.get("fast_usable", True) else
                                      " or (while it is unusable) in the store"))
    else:
        print(f"durable: everything closed under {a.mountpoint} is in the store")
    return 0


def add_status_parsers(sub: Any) -> None:
    """The parsers of `ckptfs status` and `ckptfs sync`."""
    s = sub.add_parser("status", help="upload state of a mount")
    s.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount")
    s.add_argument("--json", action="store_true", help="machine-readable output (with "
                   "--watch: one JSON object per line)")
    s.add_argument("--watch", action="store_true", help="show it again every second (live "
                   "on a terminal, with each file being saved; one line per second "
                   "otherwise) until Ctrl-C")
    s.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between two samples of --watch (default 1)")
    s.set_defaults(func=cmd_status)

    y = sub.add_parser("sync", help="wait until everything closed so far is in the store")
    y.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount (the whole mount is "
                   "synced)")
    y.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    y.add_argument("--fast", action="store_true", help="a mount with --fast-tier: return once "
                   "everything closed is in the fast tier (every node reads it, any node "
                   "finishes its way to the store), not waiting for the store")
    y.set_defaults(func=cmd_sync)
