"""`ckptfs warmup`: a mount's daemon fetches a checkpoint into this node's cache early."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ckptfs.cli.control import request
from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import PATTERN_HELP, add_command
from ckptfs.cli.output import ProgressDisplay, human
from ckptfs.cli.target import mounted_path
from ckptfs.common.config import check_glob

DESCRIPTION = (
    "Have the daemon of the mount that PATH lies in fetch every chunk of PATH (a file, or "
    "a directory recursively) from the store into this node's cache, so that the first "
    "read after a restart runs at local-disk speed. Chunks the node holds already are "
    "skipped; each fetched chunk is verified against its name as every read's is. Files "
    "are warmed in path order, at most --cache-size less this node's staging files (data "
    "written here, never evicted): a checkpoint that does not fit is warmed up to there, "
    "with a one-line warning, and the rest is fetched when read. The daemon does the work: "
    "with --no-wait the command returns at once and the warm-up goes on (its end is logged "
    "in the mount's log). Progress (bytes held of bytes needed) is shown on stderr. Exit "
    "status: 0 warmed (also when it did not all fit: the warning says so), or started with "
    "--no-wait; 1 PATH is not in a ckptfs mount, no such file or directory in the store, "
    "no complete checkpoint matches --pattern, or a chunk could not be fetched; 2 bad "
    "usage.")
EPILOG = (
    "examples: ckptfs warmup /mnt/ckpt/run7/step-1000 | "
    "ckptfs warmup /mnt/ckpt/run7 --latest --pattern 'step-*' --no-wait "
    "(the first line of a job script or a SLURM prolog)")


def cmd_warmup(a: argparse.Namespace) -> int:
    if a.pattern is not None and not a.latest:
        raise UsageError("--pattern chooses among checkpoint directories: it needs --latest")
    mounted = mounted_path(a.path)
    if mounted is None:
        raise CliError(f"not in a ckptfs mount: {a.path}")
    mountpoint, inside = mounted
    shown = a.path
    if a.latest:
        pattern = a.pattern or "*"
        check_glob(pattern, "--pattern")
        found = latest_checkpoint(mountpoint, inside, pattern, a.path)
        if found is None:
            raise CliError(f"no complete checkpoint directory matching {pattern!r} in "
                           f"{a.path}")
        inside, shown = found, os.path.join(mountpoint, found)
    elif not os.path.lexists(a.path):
        raise CliError(f"no such file or directory: {a.path}")
    if a.no_wait:
        for answer in request(mountpoint, "warmup", target=inside, wait=False):
            job = answer["started"]
            print(f"warming {shown}: {human(job['total_bytes'])} in {job['files']} files, "
                  f"in the background")
            return 0
        raise CliError("the ckptfs daemon closed the connection before the warm-up started")
    job = wait(mountpoint, inside)
    if job["state"] == "failed":
        raise CliError(f"warm-up of {shown} failed: {job['error']}")
    if job["warning"]:
        print(f"ckptfs: warning: {job['warning']}", file=sys.stderr)
    print(f"warmed {shown}: {human(job['done_bytes'])} of {human(job['total_bytes'])} in "
          f"this node's cache ({human(job['fetched_bytes'])} fetched, "
          f"{human(job['skipped_bytes'])} held already)")
    return 0


def latest_checkpoint(mountpoint: str, inside: str, pattern: str, shown: str) -> str | None:
    """The newest complete checkpoint directory under `inside` whose name matches
    `pattern`, found by the daemon as `ckptfs latest` finds it; None if there is none."""
    for answer in request(mountpoint, "latest", timeout=None, dir=inside, pattern=pattern):
        if "error" in answer:
            raise CliError(f"{shown}: {answer['error']}")
        found = answer.get("latest")
        return None if found is None else str(found)
    raise CliError("the ckptfs daemon closed the connection before it answered")


def wait(mountpoint: str, inside: str) -> dict[str, Any]:
    """Stream the warm-up's progress; its final state."""
    started = time.monotonic()
    with ProgressDisplay(quiet_start=True) as display:  # a short warm-up prints none
        for answer in request(mountpoint, "warmup", timeout=None, target=inside, wait=True):
            job = answer.get("progress") or answer.get("warmup")
            if job is None:
                raise CliError(f"unexpected answer from the ckptfs daemon: {answer}")
            rate = job["fetched_bytes"] / max(time.monotonic() - started, 1e-3)
            total = job["total_bytes"]
            display.show("warmup", f"{human(job['done_bytes'])}/{human(total)} "
                         f"{human(rate)}/s", job["done_bytes"] / total if total else 1.0)
            if answer.get("done"):
                return dict(job)
    raise CliError("the ckptfs daemon closed the connection before the warm-up ended")


def add_warmup_parser(sub: Any) -> None:
    """The parser of `ckptfs warmup`."""
    w = add_command(sub, "warmup", cmd_warmup, "fetch a checkpoint into this node's cache "
                    "before it is read", DESCRIPTION, EPILOG)
    w.add_argument("path", metavar="PATH", help="a file or directory in a ckptfs mount; with "
                   "--latest, the directory holding the checkpoint directories")
    w.add_argument("--latest", action="store_true", help="warm the newest complete "
                   "checkpoint directory directly under PATH whose name matches --pattern, "
                   "found as `ckptfs latest` finds it")
    w.add_argument("--pattern", help=PATTERN_HELP + "; with --latest only")
    w.add_argument("--no-wait", action="store_true", help="return once the daemon has "
                   "started the warm-up; it goes on in the background")
