"""`ckptfs gc`: free the chunks no file needs, with progress, then say what each step did."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ckptfs.cli.options import (
    WHOLE_STORE_HELP,
    add_command,
    add_dry_run,
    add_store_options,
    add_target,
)
from ckptfs.cli.output import ProgressDisplay, human, tally, utc
from ckptfs.cli.target import open_target
from ckptfs.common.units import format_duration, parse_duration

if TYPE_CHECKING:
    from ckptfs.tools.gc import GcReport, Progress

# the collector is imported in cmd_gc: with the store modules it imports (numpy, trio)
# `ckptfs status --help` would take 0.24 s, not 0.07

# what --help says
GC_HELP = "free the chunks that no file needs (safe while mounts write)"
GC_DESCRIPTION = (
    "Garbage-collect the whole store of TARGET in two steps, safe while any "
    "number of mounts on other nodes keep writing: a chunk that no manifest names and "
    "that is older than --grace is first set aside as a fossil (readers still find it), "
    "and freed by a later run if it is still unreferenced after --grace more; a fossil "
    "that a file needs again is restored. Ages are read from the store's clock, never "
    "this machine's. So space comes back over two runs, e.g. daily with the default "
    "grace. Prints what it did (--json: the same as JSON); progress goes to stderr. "
    "Exit status: 0 done, 1 done but a referenced chunk was found missing, 2 the run "
    "could not be done (it can be run again: every step is safe to repeat). With a fast "
    "tier (--fast-tier, or the mount's), the chunks its manifests and pending records name "
    "count as referenced too, and its chunks that nothing names and that are twice the "
    "grace old leave it (copied into the store first where the store lacks them). "
    + WHOLE_STORE_HELP)
GC_EPILOG = (
    "examples: ckptfs gc s3://bucket/run7 --dry-run | ckptfs gc "
    "az://container/run7 | ckptfs gc gs://bucket/run7 --grace 7d | ckptfs gc "
    "file:///data/ckpt | ckptfs gc /mnt/ckpt --grace 7d | ckptfs gc ./store --grace 0 "
    "--no-writers (twice: set aside, then free)")


def gc_progress(display: ProgressDisplay) -> Progress:
    """gc's progress callback: the step, a bar over the chunk names for the scans of
    fossils/ and chunks/ (listed in name order), counts for the reference listing."""

    def show(r: GcReport, fraction: float | None) -> None:
        if r.phase.startswith("references"):
            display.show(f"gc {r.phase}:", f"{r.manifests.count} manifests read, "
                         f"{r.referenced} chunks referenced")
        elif r.phase == "sweep":
            display.show("gc sweep", f"{r.fossils.count} fossils: {r.restored.count} "
                         f"restored, {r.freed.count} freed", fraction or 0.0)
        elif r.phase == "mark":
            display.show("gc mark ", f"{r.chunks.count} chunks ({human(r.chunks.bytes)}): "
                         f"{r.fossilized.count} set aside", fraction or 0.0)

    return show


def format_gc(r: GcReport) -> list[str]:
    """The summary of a gc run, one line per step."""
    would = "would be " if r.dry_run else ""
    grace = format_duration(r.grace)
    lines = [
        f"store        {r.url}: store clock {utc(r.store_time)}; grace {grace}: objects "
        f"written before {utc(r.cutoff)} are old enough",
        f"manifests    {r.manifests.count} read ({human(r.manifests.bytes)}; "
        f"{r.manifests_reread} new or changed at the second listing; "
        f"{r.trash_manifests} in the trash), {r.referenced} chunks referenced",
        f"fossils      {tally(r.fossils)}: {tally(r.restored)} {would}restored (referenced), "
        f"{tally(r.freed)} {would}freed, {tally(r.kept_fossils)} kept for the grace",
        f"chunks       {tally(r.chunks)}: {tally(r.chunks_referenced)} referenced, "
        f"{tally(r.fossilized)} {would}set aside as fossils, {tally(r.kept_chunks)} "
        f"unreferenced kept for the grace",
    ]
    if r.fast_url:
        lines.append(
            f"fast tier    {r.fast_url}: {r.fast_manifests} manifests and {r.fast_records} "
            f"pending records read (their chunks count as referenced); {tally(r.fast_chunks)}"
            f" chunks: {tally(r.fast_freed)} {would}deleted (the store has them), "
            f"{tally(r.fast_moved)} {would}copied into the store and deleted, "
            f"{tally(r.fast_kept)} unreferenced kept (younger than twice the grace)")
    if r.trash_expired.count:
        lines.insert(1, f"trash        {r.trash_expired.count} entries {would}deleted: "
                        f"their trash time was up")
    if r.vanished:
        lines.append(f"note         {r.vanished} objects were moved or deleted by another gc "
                     f"run while this one worked; the next run sees them")
    if r.others:
        lines.append(f"note         {r.others} objects under chunks/ or fossils/ are outside "
                     f"the layout and were left alone (ckptfs fsck lists them)")
    if r.scratch_deleted:
        lines.append(f"note         deleted {r.scratch_deleted} clock probes left by killed "
                     f"gc runs")
    for h in r.lost:
        lines.append(f"ERROR        chunk {h} is named by a manifest but is in neither "
                     f"chunks/ nor fossils/ (run ckptfs fsck)")
    if r.dry_run:
        lines.append(f"dry run      nothing was changed (only a clock probe was written and "
                     f"deleted); {human(r.freed.bytes)} would be freed")
    else:
        aside = (f"; {human(r.fossilized.bytes)} set aside now is freed by a run {grace} or "
                 f"more from now, unless a file needs it by then" if r.fossilized.count else "")
        lines.append(f"done         freed {human(r.freed.bytes)} in {r.seconds:.1f}s{aside}")
    return lines


def cmd_gc(a: argparse.Namespace) -> int:
    from ckptfs.tools import gc  # the collector: see the top

    grace = parse_duration(a.grace, "--grace")
    gc.check_grace(grace, a.no_writers)
    t = open_target(a, whole_store=True)
    fast = None
    if t.fast is not None:
        from ckptfs.pipeline.fasttools import FastGc  # the collector: see the top

        fast = FastGc(t.fast, t.object_store())
    with ProgressDisplay(quiet_start=True) as display:  # a run under 5 s logs no progress
        r = gc.collect(t.object_store(), grace, dry_run=a.dry_run,
                       progress=gc_progress(display), fast=fast)
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
    else:
        print("\n".join(format_gc(r)))
    return 1 if r.lost else 0


def add_gc_parser(sub: Any) -> None:
    """The parser of `ckptfs gc` (exit 2 when the run cannot be done)."""
    g = add_command(sub, "gc", cmd_gc, GC_HELP, GC_DESCRIPTION, GC_EPILOG)
    add_target(g, "STORE, or a mounted path")
    g.add_argument("--grace", default="24h", metavar="DURATION",
                   help="how old an unreferenced chunk must be to be set aside, and a fossil "
                   "to be freed: 30s, 15m, 24h, 7d or 0 (default 24h; below 1h needs "
                   "--no-writers)")
    g.add_argument("--no-writers", action="store_true",
                   help="assert that no mount writes to the store from the start of this run "
                   "to the end of the next one (e.g. all are unmounted): allows a grace "
                   "below 1h, 0 included")
    add_dry_run(g, "done")
    add_store_options(g, fast_tier="its references count too, and its unreferenced old "
                      "chunks leave it")
