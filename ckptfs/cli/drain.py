"""`ckptfs drain`: move what a fast tier still holds for the store into it, with no mount."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import add_command, add_store_options, add_target
from ckptfs.cli.output import ProgressDisplay, human
from ckptfs.cli.target import open_target

if TYPE_CHECKING:
    from ckptfs.pipeline.fasttier import DrainState

# the mover is imported in cmd_drain (with the store modules, trio and numpy)

DRAIN_HELP = "move what a fast tier holds for the store into it (no mount needed)"
DRAIN_DESCRIPTION = (
    "Bring every file and change that mounts with --fast-tier DIR published to the fast "
    "tier, and that is not yet in the store of TARGET, into the store: what a node that "
    "died left, or what is still moving. A queue that a live mount (or another drain) "
    "holds the lease of is left to it until it is done or its lease runs out (60 s after "
    "its holder stopped). Progress goes to stderr. Exit status: 0 when nothing is left "
    "to move, 1 at --timeout with records left, 2 when it cannot start.")
DRAIN_EPILOG = ("example (a SLURM epilog): ckptfs drain s3://bucket/run7 --fast-tier "
                "/lustre/ckptfs/run7 --timeout 3600")


def cmd_drain(a: argparse.Namespace) -> int:
    from ckptfs.common.config import check_glob
    from ckptfs.common.errors import ConfigError
    from ckptfs.common.units import parse_size
    from ckptfs.pipeline import fastkeep, fasttier

    try:
        size = None if a.fast_size is None else parse_size(a.fast_size, "--fast-size")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    target = open_target(a, whole_store=True, create_fast_tier=True)
    fast, store = target.fast, target.object_store()
    if fast is None:
        raise UsageError("give the fast tier: --fast-tier DIR (or CKPTFS_FAST_TIER)")
    if a.fast_keep < 1:
        raise UsageError(f"--fast-keep must be 1 or more, not {a.fast_keep}")
    if a.keep_pattern is not None:
        try:
            check_glob(a.keep_pattern, "--keep-pattern")
        except ConfigError as e:
            raise UsageError(str(e)) from None
    deadline = None if a.timeout is None else time.monotonic() + a.timeout
    with ProgressDisplay(interval=a.interval) as display:

        def show(s: DrainState) -> None:
            waiting = (f"; waiting for the lease of {', '.join(sorted(s.waiting))}"
                       if s.waiting else "")
            left = "?" if s.left < 0 else str(s.left)
            display.show("drain", f"{s.moved.records} records moved ({s.moved.chunks} "
                         f"chunks, {human(s.moved.chunk_bytes)}), {left} left{waiting}"
                         + (f"  ({s.error})" if s.error else ""))
            last.append(s)

        last: list[Any] = []
        try:
            done = fasttier.drain(fast, store, show, deadline)
            trimmed = (fastkeep.trim(fast, store, a.fast_keep, a.keep_pattern, size)
                       if done else None)
        finally:
            fast.close()
    s = last[-1]
    if not done:
        raise CliError(f"drain: {s.left} records still in the fast tier after "
                       f"{a.timeout:g}s; run it again")
    print(f"drained: {s.moved.records} records moved ({s.moved.chunks} chunks, "
          f"{human(s.moved.chunk_bytes)}); everything in {fast.url} is in {store.url}"
          + (f"; {s.moved.lost} chunks were lost (see above)" if s.moved.lost else ""))
    if trimmed is not None and trimmed.checkpoints:
        print(f"removed from the fast tier: {trimmed.manifests} manifests and "
              f"{trimmed.chunks} chunks ({human(trimmed.chunk_bytes)}) of "
              f"{trimmed.checkpoints} checkpoint directories the store has")
    if trimmed is not None and trimmed.over:
        print(f"the fast tier still holds {human(trimmed.held)}, more than --fast-size "
              f"{a.fast_size}: the newest complete checkpoints, newer ones and files outside "
              f"checkpoint directories stay")
    return 0


def add_drain_parser(sub: Any) -> None:
    p = add_command(sub, "drain", cmd_drain, DRAIN_HELP, DRAIN_DESCRIPTION, DRAIN_EPILOG)
    add_target(p, "the store (its URL, or a path in a mount of it)")
    p.add_argument("--fast-keep", type=int, default=2, metavar="N", help="then remove from "
                   "the fast tier what the store has, but for the newest N checkpoint "
                   "directories (and the newest complete one), as a mount's --fast-keep "
                   "(default 2)")
    p.add_argument("--fast-size", metavar="SIZE", help="then also remove what the store "
                   "has of the checkpoints --fast-keep keeps, oldest first, while the fast "
                   "tier holds more than SIZE (e.g. 500G), as a mount's --fast-size; never "
                   "the newest complete checkpoint nor a newer one (default: no limit)")
    p.add_argument("--keep-pattern", metavar="GLOB", help="the names of the checkpoint "
                   "directories, as a mount's --keep-pattern (default: the top-level "
                   "directories)")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after this many "
                   "seconds (exit 1)")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="seconds "
                   "between two progress lines when stderr is not a terminal (default 5)")
    add_store_options(p, json=False, fast_tier="the one to drain")
    p.set_defaults(error_exit=2)
