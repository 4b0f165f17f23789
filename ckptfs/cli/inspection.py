"""`ckptfs verify`, `ls`, `latest` and `fsck`: what a store holds, and whether it is whole."""

from __future__ import annotations

import argparse
import json
import stat
import sys
import time
from typing import TYPE_CHECKING, Any

from ckptfs.cli.options import (
    PATTERN_HELP,
    STORE_HELP,
    WHOLE_STORE_HELP,
    add_command,
    add_store_options,
    add_target,
)
from ckptfs.cli.output import describe_format, first_few, human
from ckptfs.cli.target import open_target
from ckptfs.common.config import check_glob

if TYPE_CHECKING:
    from ckptfs.tools.inspection import FileReport

# the tools are imported in the commands: with the store modules they import (numpy, trio)
# `ckptfs status --help` would take 0.24 s, not 0.07

# what --help says
DEEP_HELP = ("fetch every chunk and re-hash it (finds corrupt chunks; reads all the data) "
             "instead of only checking that it exists")
VERIFY_DESCRIPTION = (
    "Check that every chunk of every file under PATH (a file or a directory, "
    "recursively) is in the store, so that any node can read it. Prints one line per "
    "incomplete file, naming its missing or corrupt chunks and the node that wrote it, "
    "then a summary. With a fast tier, a chunk in either tier counts, and the summary "
    "says how many files are in the fast tier only (fast-durable, not yet durable; "
    "--durable: exit 1 then). Exit status: 0 complete, 1 incomplete, 2 the check could "
    "not be done. " + STORE_HELP)
VERIFY_EPILOG = (
    "examples: ckptfs verify /mnt/ckpt/step-1000 | "
    "ckptfs verify s3://bucket/run7 step-1000 --deep")
LS_DESCRIPTION = (
    "List every file under PATH (recursively) like `ls -l`: mode, size in "
    "bytes, mtime, the node that wrote it, and its state: ok, `missing N` (N chunks not "
    "in the store), `corrupt N` (with --deep), damaged (its manifest) or, with a fast "
    "tier, fast-only (complete there, not yet in the store). Exit 0 when "
    "the listing worked, 2 when not. " + STORE_HELP)
LATEST_DESCRIPTION = (
    "Print the newest COMPLETE checkpoint directory directly under DIR whose "
    "name matches --pattern: relative to the filesystem root with STORE DIR, absolute "
    "when TARGET is a mounted directory. Newest = the largest numbers in the name when "
    "every candidate has one (checkpoint-100 after checkpoint-99), else the latest file "
    "mtime. Directories without files, with missing chunks, or in a directory rename in "
    "flight, or with a damaged manifest (named on stderr) are skipped: resume from what "
    "this prints. With a fast tier, a checkpoint complete there counts (every node that "
    "mounts with it reads it; a note on stderr says so), unless --durable. Exit 1 with a "
    "message when there "
    "is none, 2 when the check could not be done. " + STORE_HELP)
LATEST_EPILOG = (
    "example: ckptfs latest /mnt/ckpt/run7 --pattern 'checkpoint-*'")
FSCK_DESCRIPTION = (
    "Check the whole store: ckptfs.json, every manifest, directory marker, "
    "trash entry and rename intent (damaged ones are listed), every chunk a manifest "
    "names (missing ones are listed with the file and the writer node), interrupted "
    "directory renames, and count the unreferenced chunks (garbage, not an error); "
    "with a fast tier, its chunks and pending records too (a chunk damaged there is "
    "data loss only when the store has no sound copy). Read-only: it repairs nothing. "
    "Exit status: 0 clean, 1 problems found, 2 the check could not be done (e.g. "
    "TARGET is not a ckptfs store: no ckptfs.json and no files/ or chunks/). " + WHOLE_STORE_HELP)
FSCK_EPILOG = (
    "examples: ckptfs fsck s3://bucket/run7 | ckptfs fsck az://container/run7 "
    "--deep | ckptfs fsck gs://bucket/run7 | ckptfs fsck file:///data/ckpt | ckptfs "
    "fsck /mnt/ckpt")


def describe_file(f: FileReport, shown: str) -> str:
    """One line saying why a file is not complete, naming its chunks and its writer."""
    from ckptfs.format.manifests import chunk_key  # the tools: see the top

    if f.error is not None:
        return f"DAMAGED     {shown}: {f.error}"
    parts = []
    if f.missing:
        parts.append(f"{len(f.missing)} of {f.n_chunks} chunks missing (" + first_few(
            [f"#{i} {chunk_key(h)}" for i, h in f.missing]) + ")")
    if f.corrupt:
        parts.append(f"{len(f.corrupt)} of {f.n_chunks} chunks corrupt (" + first_few(
            [f"#{i} {chunk_key(h)}: {why}" for i, h, why in f.corrupt]) + ")")
    writer = f.writer or "unknown"
    return f"INCOMPLETE  {shown}: {'; '.join(parts)}; written by node {writer}"


def cmd_verify(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection  # the tools: see the top

    t = open_target(a, a.path)
    inspection.read_info(t.store)
    result = inspection.verify(t.store, t.path, deep=a.deep, tiers=t.tiers())
    ok = result.durable if a.durable else result.complete
    if a.json:
        d = result.to_dict()
        d["target"] = t.show(t.path)
        d["fast_tier"] = t.fast.url if t.fast is not None else None
        print(json.dumps(d, indent=1))
        return 0 if ok else 1
    for f in result.incomplete_files:
        print(describe_file(f, t.show(f.path)))
    if a.durable:
        for f in result.fast_only_files:
            print(f"FAST ONLY   {t.show(f.path)}: in the fast tier, not yet in the store")
    for h, why in result.fast_damaged:
        print(fast_damaged_line(h, why))
    files = {f.path for f in result.files}
    for p in result.problems:
        if p.kind == inspection.RENAMING:
            print(f"RENAMING    {t.show(p.path)}: {p.detail}")
        elif p.kind == inspection.DAMAGED and p.path not in files:  # a rename intent
            print(f"DAMAGED     {p.describe()}")
    size = human(sum(f.size for f in result.files))
    how = "chunks fetched and re-hashed" if a.deep else "chunks present (--deep re-hashes them)"
    where = t.show(result.path)
    fast_only = len(result.fast_only_files)
    tiers = ("" if t.fast is None else "; all of them in the store (durable)"
             if not fast_only else f"; {fast_only} of them in the fast tier only so far "
             f"(fast-durable, not yet durable)")
    if result.complete and ok:
        print(f"complete: {len(result.files)} files, {size} under {where}; {how}{tiers}")
        return 0
    if result.complete:  # --durable
        print(f"NOT DURABLE: {fast_only} of {len(result.files)} files under {where} are in "
              f"the fast tier only (complete there: every node with the fast tier reads "
              f"them); {how}")
        return 1
    bad = len(result.incomplete_files)
    kinds = {k: sum(p.kind == k for p in result.problems) for k in
             (inspection.MISSING, inspection.CORRUPT, inspection.DAMAGED)}
    print(f"INCOMPLETE: {bad} of {len(result.files)} files under {where} "
          f"({kinds['missing']} missing chunks, {kinds['corrupt']} corrupt chunks, "
          f"{kinds['damaged']} damaged records"
          + (", a directory rename in flight" if any(
              p.kind == inspection.RENAMING for p in result.problems) else "") + ")")
    return 1


def fast_damaged_line(chunk_hash: str, why: str, width: int = 11) -> str:
    """A chunk damaged in the fast tier whose copy in the store is sound."""
    from ckptfs.format.manifests import chunk_key  # the tools: see the top

    return (f"{'warning':<{width}} {chunk_key(chunk_hash)} is damaged in the fast tier "
            f"({why}); the store has a sound copy, which readers read: not data loss")


def cmd_ls(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection  # the tools: see the top

    t = open_target(a, a.path)
    inspection.read_info(t.store)
    files = inspection.list_files(t.store, t.path, deep=a.deep, tiers=t.tiers())
    if a.json:
        print(json.dumps([{**f.to_dict(), "shown": t.show(f.path)} for f in files], indent=1))
        return 0
    for f in files:
        shown = t.show(f.path)
        if f.error is not None:
            print(f"?---------  {'?':>12}  {'?':19}  {'?':<12}  {'damaged':<10}  {shown}: "
                  f"{f.error}")
            continue
        state = ("fast-only" if f.complete and f.fast_only else "ok" if f.complete
                 else f"missing {len(f.missing)}" if f.missing else f"corrupt {len(f.corrupt)}")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.mtime_ns / 1e9))
        name = f"{shown} -> {f.target}" if f.target is not None else shown
        print(f"{stat.filemode(f.mode)}  {f.size:>12}  {when}  {f.writer or '-':<12}  "
              f"{state:<10}  {name}")
    return 0


def cmd_latest(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection  # the tools: see the top

    check_glob(a.pattern, "--pattern")
    t = open_target(a, a.dir)
    inspection.read_info(t.store)
    found = inspection.latest_checkpoint(
        t.store, t.path, a.pattern, deep=a.deep, tiers=t.tiers(), durable=a.durable,
        damaged=lambda p: print(f"ckptfs: skipped, DAMAGED {p.describe()}", file=sys.stderr))
    durable = found is not None and all(f.durable for f in found[1])
    if a.json:
        print(json.dumps({"path": found[0] if found else None,
                          "shown": t.show(found[0]) if found else None,
                          "files": len(found[1]) if found else 0,
                          "fast_durable": found is not None, "durable": durable,
                          "fast_tier": t.fast.url if t.fast is not None else None}, indent=1))
    if found is None:
        what = "durable" if a.durable and t.fast is not None else "complete"
        print(f"ckptfs: no {what} checkpoint directory matching {a.pattern!r} in "
              f"{t.show(t.path)}", file=sys.stderr)
        return 1
    if not a.json:
        print(t.show(found[0]))
    if not durable:
        print(f"ckptfs: {t.show(found[0])} is in the fast tier only so far (every node "
              f"with the fast tier reads it; --durable: the newest in the store)",
              file=sys.stderr)
    return 0


def cmd_fsck(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection  # the tools: see the top

    t = open_target(a, whole_store=True)
    inspection.check_is_store(t.store)  # else one line and exit 2, like verify, ls, latest
    r = inspection.fsck(t.store, deep=a.deep, tiers=t.tiers())
    records = None
    if t.fast is not None:
        from ckptfs.pipeline import fastreport  # the tools: see the top

        records = fastreport.pending_records(t.fast, read=True)
    clean = r.clean and not (records and records.damaged)
    if a.json:
        d = r.to_dict()
        d["clean"] = clean
        if isinstance(d["fast_tier"], dict) and records is not None:
            d["fast_tier"] = {"url": t.fast.url if t.fast else None, **d["fast_tier"],
                              "pending_records": records.to_dict()}
        print(json.dumps(d, indent=1))
        return 0 if clean else 1
    if r.info is not None:
        print(f"store        {r.url}: {describe_format(r.info)}; created by "
              f"{r.info.created_by}")
    else:
        print(f"ERROR        {r.info_error}")
    for p in r.problems:
        print(f"{p.kind.upper():<12} {p.describe()}")
    for key, why in records.damaged if records else ():
        print(f"DAMAGED      {key}: pending record: {why}; its op is never moved to the "
              f"store and the fast tier is not trimmed (repair or delete it)")
    for h, why, good in r.fast_damaged:
        if good:  # else the files naming it are CORRUPT above
            print(fast_damaged_line(h, why, width=12))
    for h, why in r.corrupt_garbage:
        print(f"CORRUPT      unreferenced chunk {h}: {why} (a writer deduplicating against "
              f"it would trust it; delete the object)")
    for i in (i for i in r.intents if i.error is None):  # damaged ones are problems
        print(f"warning      directory rename {i.src or '?'} -> {i.dst or '?'} by node "
              f"{i.writer} is in flight or was interrupted ({i.key}); the next mount "
              f"finishes it")
    for key in r.strays[:20]:
        print(f"warning      object outside the store layout: {key}")
    if len(r.strays) > 20:
        print(f"warning      ... and {len(r.strays) - 20} more objects outside the layout")
    print(f"files        {r.files} ({human(r.file_bytes)}), {r.symlinks} symlinks, "
          f"{r.dir_markers} directory markers")
    print(f"chunks       {r.chunks_referenced} referenced, {r.chunks_stored} stored "
          f"({human(r.stored_bytes)}), {r.garbage_chunks} unreferenced "
          f"({human(r.garbage_bytes)}, garbage for gc, not an error)")
    if r.trash_files:
        print(f"trash        {r.trash_files} deleted files whose chunks stay until their "
              f"trash time is up (ckptfs trash ls)")
    if t.fast is not None and records is not None:
        queues = len(records.queues)
        print(f"fast tier    {t.fast.url}: {r.fast_chunks} chunk objects "
              f"({human(r.fast_bytes)}), {r.pending_chunks} of them not yet in the store "
              f"({human(r.pending_bytes)} pending); {records.records} pending records "
              f"({records.files} files, {human(records.file_bytes)}) in {queues} "
              f"queue{'s' if queues != 1 else ''}")
    if r.fossils:
        named = (f"; {r.referenced_fossils} of them named by a file: readable, and the next "
                 f"gc run restores them" if r.referenced_fossils else "")
        print(f"fossils      {r.fossils} ({human(r.fossil_bytes)}) set aside by gc: freed by "
              f"a later gc run unless a file needs them{named}")
    how = "every stored chunk fetched and re-hashed" if r.deep else (
        "chunks checked for presence; --deep re-hashes them")
    damaged = len(records.damaged) if records else 0
    print(f"{'clean' if clean else 'PROBLEMS':<12} "
          f"{len(r.problems) + len(r.corrupt_garbage) + (r.info is None) + damaged} "
          f"problems; {how}")
    return 0 if clean else 1


def _deep_and_store_options(p: argparse.ArgumentParser, fast_tier: str,
                            deep: str = DEEP_HELP) -> None:
    p.add_argument("--deep", action="store_true", help=deep)
    add_store_options(p, json=False, fast_tier=fast_tier)


def _tree_arguments(p: argparse.ArgumentParser, verb: str, fast_tier: str) -> None:
    """TARGET [PATH] --json --deep and the store options (verify, ls)."""
    add_target(p, "mounted path, or STORE", "path",
               f"with STORE: the file or directory to {verb} (default: everything)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _deep_and_store_options(p, fast_tier)


def add_inspection_parsers(sub: Any) -> None:
    """Parsers of verify, ls, latest and fsck (exit 2 when the tool cannot work)."""
    v = add_command(sub, "verify", cmd_verify, "is a checkpoint completely in the store?",
                    VERIFY_DESCRIPTION, VERIFY_EPILOG)
    _tree_arguments(v, "check", "a file complete there counts, and the summary says how "
                    "many are there alone")
    v.add_argument("--durable", action="store_true", help="with a fast tier: exit 1 too "
                   "when a file is complete in the fast tier only (not yet in the store), "
                   "naming it")
    ls = add_command(sub, "ls", cmd_ls, "list files in a store with size, mtime, writer and "
                     "completeness", LS_DESCRIPTION)
    _tree_arguments(ls, "list", "its files are listed too, `fast-only` where the store does "
                    "not have them yet")

    la = add_command(sub, "latest", cmd_latest, "the newest complete checkpoint directory",
                     LATEST_DESCRIPTION, LATEST_EPILOG)
    add_target(la, "mounted directory, or STORE", "dir")
    la.add_argument("--pattern", default="*", help=PATTERN_HELP)
    la.add_argument("--durable", action="store_true", help="with a fast tier: the newest "
                    "checkpoint the store has all of, leaving out those in the fast tier "
                    "only (which every node with the fast tier reads)")
    la.add_argument("--json", action="store_true", help="machine-readable output: path, "
                    "shown (as printed), files, fast_durable, durable, fast_tier")
    _deep_and_store_options(la, "a checkpoint complete there counts, as every node "
                            "with the fast tier reads it")

    fk = add_command(sub, "fsck", cmd_fsck, "check a whole store", FSCK_DESCRIPTION,
                     FSCK_EPILOG)
    add_target(fk, "STORE, or a mounted path")
    fk.add_argument("--json", action="store_true", help="machine-readable output")
    _deep_and_store_options(fk, "it is checked too: a chunk in either tier counts, its "
                            "pending records are read, and a chunk damaged there is data "
                            "loss only when the store has no sound copy",
                            "fetch and re-hash every stored chunk, referenced or not "
                            "(reads the whole store, and the fast tier) instead of only "
                            "checking that referenced chunks exist")
