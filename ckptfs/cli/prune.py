"""`ckptfs prune`: remove the older checkpoint directories, keeping the last N."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING, Any

from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import (
    PATTERN_HELP,
    STORE_HELP,
    add_command,
    add_dry_run,
    add_store_options,
    add_target,
)
from ckptfs.cli.target import Target, open_target
from ckptfs.common.config import check_glob, trash_seconds
from ckptfs.common.units import format_duration

if TYPE_CHECKING:
    from ckptfs.store.base import Store
    from ckptfs.tools.retention import Checkpoint, PruneResult

# the tools are imported in cmd_prune: with the store modules they import (numpy, trio)
# `ckptfs status --help` would take 0.24 s, not 0.07

# what --help says
PRUNE_HELP = "remove old checkpoint directories, keeping the last N"
PRUNE_DESCRIPTION = (
    "Remove the older checkpoint directories directly under DIR whose name "
    "matches --pattern, ordered as `ckptfs latest` orders them (the numbers in the name "
    "when every candidate has one, else the newest file mtime). Kept: the newest "
    "--keep-last N; with --keep-every K, every checkpoint whose step (the LAST number "
    "in its name) is a multiple of K; always the newest COMPLETE checkpoint (what "
    "`ckptfs latest` prints) and everything newer, so an incomplete newest checkpoint "
    "keeps its complete predecessor; everything when none is complete; and every "
    "directory in a directory rename in flight. Removing a directory moves its "
    "manifests and directory markers to the store's trash for --trash-hours (ckptfs "
    "trash restore undoes it); the chunks stay until `ckptfs gc` frees those no file "
    "needs, after the trash time and its grace. Prints one line per directory, removed or kept "
    "and why, then a summary (--json: the same as JSON). Do not prune a directory that "
    "a mount is still writing into. With a fast tier (--fast-tier, or the mount's), a "
    "directory leaves both tiers, and one with changes still pending in the fast tier (not "
    "yet in the store) is kept, with the reason; without one, a store whose files were "
    "written through a fast tier is refused (a prune of the store alone would leave them "
    "readable in the fast tier). Exit status: 0 done, 2 it could not be done. "
    + STORE_HELP)
PRUNE_EPILOG = (
    "examples: ckptfs prune /mnt/ckpt/run7 --keep-last 3 --pattern "
    "'checkpoint-*' --dry-run | ckptfs prune s3://bucket/run7 ckpt --keep-last 5 "
    "--keep-every 10000 | ckptfs prune az://container/run7/ckpt --keep-last 3 (the same "
    "DIR given in the URL)")


def format_prune(r: PruneResult, t: Target, keep: float = 0.0) -> list[str]:
    """One line per checkpoint directory (newest first), then the summary."""
    lines = []
    for c in r.checkpoints:
        if c.keep:
            lines.append(f"kept         {t.show(c.path)}: {'; '.join(c.detail)}")
        else:
            verb = "would remove" if r.dry_run else "removed     "
            lines.append(f"{verb} {t.show(c.path)} ({c.keys} manifests and markers)")
    removed = len(r.removed)
    trashed = f"in the trash for {format_duration(keep)}, then " if keep else ""
    where = f"{t.show(r.dir)} matching {r.pattern!r}, ordered by {r.order}"
    if r.dry_run:
        lines.append(f"dry run      {removed} of {len(r.checkpoints)} checkpoint directories "
                     f"in {where} would be removed, {len(r.kept)} kept; nothing was changed")
    else:
        lines.append(f"done         removed {removed} of {len(r.checkpoints)} checkpoint "
                     f"directories in {where} ({r.deleted_keys} manifests and markers), "
                     f"kept {len(r.kept)}; {trashed}ckptfs gc frees their chunks after "
                     f"its grace")
    return lines


def cmd_prune(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection, retention  # the tools: see the top

    try:
        retention.check_policy(a.keep_last, a.keep_every)
    except retention.PolicyError as e:
        raise CliError(str(e)) from None
    check_glob(a.pattern, "--pattern")
    keep = trash_seconds(a.trash_hours)
    if a.no_fast_tier and a.fast_tier:
        raise UsageError("give --fast-tier DIR or --no-fast-tier, not both")
    t = open_target(a, a.dir)
    inspection.read_info(t.store)
    if t.fast is not None:
        from ckptfs.pipeline.fasttools import BothTiers  # the tools: see the top

        tiers = BothTiers(t.fast, t.object_store())
        tiers.pending_paths()  # a damaged pending record: nothing is done
        r = retention.prune(t.store, t.path, a.keep_last, a.keep_every, a.pattern,
                            dry_run=a.dry_run, deep=a.deep, trash_keep=keep,
                            keep=tiers.busy, remove=tiers.remove_tree)
    else:
        store = t.object_store()
        check = None if a.no_fast_tier else (lambda doomed: refuse_fast_written(a, store,
                                                                                doomed))
        r = retention.prune(store, t.path, a.keep_last, a.keep_every, a.pattern,
                            dry_run=a.dry_run, deep=a.deep, trash_keep=keep, check=check)
    if a.json:
        d = r.to_dict()
        d["target"] = t.show(r.dir)
        print(json.dumps(d, indent=1))
    else:
        print("\n".join(format_prune(r, t, keep)))
    return 0


def refuse_fast_written(a: argparse.Namespace, store: Store, doomed: list[Checkpoint]) -> None:
    """UsageError if a checkpoint about to be removed was written through a fast tier (a
    manifest with a generation, which only fast-tier mounts write): removed from the
    object store alone, it would stay readable in the fast tier (one listing and one GET
    per checkpoint)."""
    from ckptfs.common.errors import NotFoundError
    from ckptfs.format import manifests

    for cp in doomed:
        prefix = manifests.dir_prefix(cp.path)
        key = next((k for k, _ in store.list(prefix, delimiter=None).objects
                    if not k.endswith("/")), None)
        try:
            gen = 0 if key is None else manifests.generation(store.get_record(key))
        except NotFoundError:
            continue
        if gen:
            words = shlex.join(getattr(a, "argv", []) or ["prune", a.target])
            raise UsageError(f"{cp.path} was written through a fast tier (mounts with "
                             f"--fast-tier): pruned in the store alone, it would stay "
                             f"readable there; prune both tiers: ckptfs {words} --fast-tier "
                             f"DIR (the mounts' DIR; or --no-fast-tier if no mount uses one "
                             f"any more)")


def add_prune_parser(sub: Any) -> None:
    """Parser of prune (exit 2 when it cannot work)."""
    pr = add_command(sub, "prune", cmd_prune, PRUNE_HELP, PRUNE_DESCRIPTION, PRUNE_EPILOG)
    add_target(pr, "mounted directory, or STORE", "dir")
    pr.add_argument("--keep-last", type=int, required=True, metavar="N",
                    help="keep the newest N checkpoints (1 or more)")
    pr.add_argument("--keep-every", type=int, metavar="K",
                    help="also keep every checkpoint whose step, the last number in its "
                    "name, is a multiple of K (checkpoint-5000 with K=1000)")
    pr.add_argument("--pattern", default="*", help=PATTERN_HELP)
    add_dry_run(pr, "removed")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.add_argument("--trash-hours", type=float, default=24.0, metavar="H",
                    help="keep what is removed in the store's trash for H hours (ckptfs "
                    "trash restore brings it back); 0 deletes at once (default 24)")
    pr.add_argument("--deep", action="store_true",
                    help="fetch and re-hash the chunks of the checkpoints checked for "
                    "completeness instead of only checking that they exist")
    pr.add_argument("--no-fast-tier", action="store_true",
                    help="prune the store alone, even if its files were written through a "
                    "fast tier (when no mount uses one any more)")
    add_store_options(pr, json=False, fast_tier="the directories leave both tiers; one with "
                      "changes still pending there is kept")
