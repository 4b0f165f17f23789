"""`ckptfs du`: the space each checkpoint directory uses, and what gc would free."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ckptfs.cli.options import STORE_HELP, add_command, add_store_options, add_target
from ckptfs.cli.output import Column, first_few, human, print_table
from ckptfs.cli.target import Target, open_target

if TYPE_CHECKING:
    from ckptfs.tools.usage import DirUsage, UsageReport

# the usage tool is imported in cmd_du: with the store modules it imports (numpy, trio)
# `ckptfs status --help` would take 0.24 s, not 0.07

#: du's table: the directory, then counts and sizes (the widths of its plain text)
DU_COLUMNS = (Column("directory"), Column("files", right=True, width=7),
              Column("logical", right=True, width=10),
              Column("referenced", right=True, width=10),
              Column("unique", right=True, width=10), Column("dedup", right=True, width=6),
              Column("compr", right=True, width=6))

# what --help says
DU_HELP = "space used by each checkpoint directory, and what gc would free"
DU_DESCRIPTION = (
    "For each directory directly under PATH (the checkpoint directories) "
    "and for PATH as a whole: the number of files, logical bytes (the sum of the file "
    "sizes), referenced bytes (the stored size of the distinct chunks its files name, "
    "as compressed in the store) and unique bytes (those of the chunks that nothing "
    "else names: what deleting the directory lets gc free), and two ratios: dedup "
    "(logical bytes / bytes of the distinct chunks: what identical tensors across "
    "steps, ranks and files save) and compr (those bytes / their stored size: what "
    "compression saves). Then the store's totals: "
    "every chunk object (fossils included) and the unreferenced ones, which ckptfs gc "
    "frees once they are older than its grace. With a fast tier, a pending column and "
    "a fast tier line: the bytes there the store does not have yet. Reads every manifest "
    "of the store and lists chunks/ and fossils/; changes nothing. Exit 0, or 2 with one "
    "line when it cannot be done (a bad URL, not a ckptfs store, no directory PATH). " + STORE_HELP)
DU_EPILOG = (
    "examples: ckptfs du /mnt/ckpt/run7 | ckptfs du s3://bucket/run7 --json | "
    "ckptfs du ./store run7 | ckptfs du gs://bucket/ckpt/run7 (the path run7 of the "
    "store gs://bucket/ckpt)")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


#: with a fast tier, after `unique`: the bytes of the fast tier's chunks the store lacks
PENDING_COLUMN = Column("pending", right=True, width=10)


def du_columns(r: UsageReport) -> tuple[Column, ...]:
    """DU_COLUMNS, and the pending column with a fast tier."""
    if r.fast_url is None:
        return DU_COLUMNS
    return (*DU_COLUMNS[:5], PENDING_COLUMN, *DU_COLUMNS[5:])


def du_rows(r: UsageReport, t: Target) -> list[list[str]]:
    """du's table: a row per checkpoint directory, then PATH as a whole."""
    named: list[tuple[str, DirUsage]] = [(t.show(d.path), d) for d in r.dirs]
    named.append((f"{t.show(r.path)} (all)", r.total))
    pending = r.fast_url is not None
    return [[name, str(d.files), human(d.logical_bytes), human(d.referenced.bytes),
             human(d.unique.bytes), *([human(d.pending.bytes)] if pending else []),
             _ratio(d.dedup_ratio), _ratio(d.compression_ratio)]
            for name, d in named]


def du_totals(r: UsageReport) -> list[str]:
    """The lines under du's table: the store's totals, the trash, what was not counted."""
    fossils = (f", {r.fossils.count} of them fossils ({human(r.fossils.bytes)})"
               if r.fossils.count else "")
    lines = [f"store        {r.url}: {r.stored.count} chunk objects "
             f"({human(r.stored.bytes)}){fossils}; {r.unreferenced.count} "
             f"unreferenced ({human(r.unreferenced.bytes)}): what ckptfs gc frees once "
             f"they are older than its grace"]
    if r.fast_url is not None:
        lines.append(f"fast tier    {r.fast_url}: {r.fast.count} chunk objects "
                     f"({human(r.fast.bytes)}); {r.pending.count} of them not yet in the "
                     f"store ({human(r.pending.bytes)} pending); {r.records} pending "
                     f"records")
    if r.trash.count:
        lines.append(f"trash        {r.trash.count} deleted files ({human(r.trash.bytes)} "
                     f"logical) keep their chunks until their trash time is up "
                     f"(ckptfs trash ls)")
    if r.missing:
        lines.append(f"warning      {r.missing} chunks named by a manifest are in neither "
                     f"chunks/ nor fossils/ and are not counted (run ckptfs fsck)")
    if r.unreadable:
        lines.append(f"warning      {len(r.unreadable)} manifests cannot be parsed and are "
                     f"not counted, so unreferenced bytes may be too high (run ckptfs fsck): "
                     f"{first_few(r.unreadable)}")
    return lines


def cmd_du(a: argparse.Namespace) -> int:
    from ckptfs.tools import usage  # the usage tool: see the top

    t = open_target(a, a.path)
    r = usage.du(t.store, t.path, t.tiers())
    if t.fast is not None:
        from ckptfs.pipeline import fastreport  # the usage tool: see the top

        r.records = fastreport.pending_records(t.fast).records
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0
    print_table(du_columns(r), du_rows(r, t))
    print("\n".join(du_totals(r)))
    return 0


def add_du_parser(sub: Any) -> None:
    """The parser of `ckptfs du`."""
    d = add_command(sub, "du", cmd_du, DU_HELP, DU_DESCRIPTION, DU_EPILOG)
    add_target(d, "mounted directory, or STORE", "path")
    add_store_options(d, fast_tier="what its mounts put there counts too; a pending column "
                      "and a fast tier line say what of it the store does not have yet")
