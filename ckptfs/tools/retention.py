"""Checkpoint retention (`ckptfs prune`): which checkpoint directories to keep, and
removing the others from the store (manifests and markers; gc frees their chunks)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ckptfs.common.errors import FormatError, NoEntry, NotFoundError
from ckptfs.format import manifests
from ckptfs.format.manifests import DirMarker
from ckptfs.store.base import Store
from ckptfs.tools import trash
from ckptfs.tools.inspection import (
    NUMBER,
    ChunkChecker,
    FileReport,
    Intent,
    checkpoint_names,
    checkpoint_order_key,
    list_files,
    read_intents,
)

log = logging.getLogger(__name__)

#: why a checkpoint is kept (Checkpoint.reasons)
NEWEST = "newest"              # one of the newest --keep-last
EVERY = "every"                # its step is a multiple of --keep-every
LATEST = "latest"              # the newest complete checkpoint (`ckptfs latest`)
NEWER = "newer"                # newer than the newest complete checkpoint
NO_COMPLETE = "no-complete"    # there is no complete checkpoint at all: nothing is removed
RENAMING = "renaming"          # a directory rename in flight touches it
UNORDERED = "unordered"        # no number, no file and no marker mtime: cannot be ordered
BUSY = "busy"                  # the caller's `keep` said so (a mount's local changes)


@dataclass
class Checkpoint:
    """One candidate directory, what the policy decided for it, and why."""

    path: str                      # relative to the filesystem root
    complete: bool | None = None  # None: not checked (older than the newest complete)
    step: int | None = None        # the last number in its name
    mtime_ns: int = 0              # newest file (or, without files, its marker) mtime
    reasons: list[str] = field(default_factory=list)   # empty: removed
    detail: list[str] = field(default_factory=list)    # the reasons, as sentences
    keys: int = 0                  # manifests and markers deleted (or to be)

    @property
    def keep(self) -> bool:
        return bool(self.reasons)

    def kept_for(self, reason: str, sentence: str) -> None:
        self.reasons.append(reason)
        self.detail.append(sentence)


@dataclass
class PruneResult:
    """plan() and prune(): every candidate, newest first, and what was (or would be) done."""

    dir: str
    pattern: str
    keep_last: int
    keep_every: int | None
    dry_run: bool = True
    order: str = "number"          # "number" or "mtime", as `ckptfs latest` orders
    newest_complete: str | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    deleted_keys: int = 0

    @property
    def kept(self) -> list[Checkpoint]:
        return [c for c in self.checkpoints if c.keep]

    @property
    def removed(self) -> list[Checkpoint]:
        return [c for c in self.checkpoints if not c.keep]

    def to_dict(self) -> dict[str, object]:
        return {"dir": self.dir, "pattern": self.pattern, "keep_last": self.keep_last,
                "keep_every": self.keep_every, "dry_run": self.dry_run,
                "order": self.order, "newest_complete": self.newest_complete,
                "kept": [c.path for c in self.kept],
                "removed": [c.path for c in self.removed],
                "deleted_keys": self.deleted_keys,
                "checkpoints": [{"path": c.path, "keep": c.keep, "complete": c.complete,
                                 "step": c.step, "reasons": c.reasons, "why": c.detail,
                                 "keys": c.keys} for c in self.checkpoints]}


class PolicyError(ValueError):
    """--keep-last or --keep-every out of range."""


def check_policy(keep_last: int, keep_every: int | None) -> None:
    if keep_last < 1:
        raise PolicyError(f"--keep-last must be 1 or more, not {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise PolicyError(f"--keep-every must be 1 or more, not {keep_every}")


def _step(name: str) -> int | None:
    numbers = NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def _marker_mtime(store: Store, path: str) -> int:
    try:
        return DirMarker.from_json(store.get_record(manifests.dir_key(path))).mtime_ns
    except (NotFoundError, FormatError):
        return 0


def _complete(files: list[FileReport], path: str, intents: list[Intent]) -> bool:
    """Complete as `ckptfs latest` means it: files, all chunks there, no rename in flight."""
    return (bool(files) and all(f.complete for f in files)
            and not any(i.touches(path) for i in intents))


def plan(store: Store, dir_path: str, keep_last: int, keep_every: int | None = None,
         pattern: str = "*", deep: bool = False) -> PruneResult:
    """Decide, changing nothing, which checkpoint directories directly under `dir_path`
    whose name matches `pattern` are kept and why; the others are to be removed.

    Ordered as inspection.latest() orders (the numbers in the names when every candidate
    has one, else the newest file mtime). Kept: the newest `keep_last`; with
    `keep_every`, those whose last number in the name is a multiple of it; the newest
    complete checkpoint (as latest() defines it) and everything newer; when none is
    complete, everything; and every directory that a rename in flight touches.
    NoEntry if the store has no directory `dir_path`.
    """
    check_policy(keep_last, keep_every)
    dir_path, names = checkpoint_names(store, dir_path, pattern)
    result = PruneResult(dir_path, pattern, keep_last, keep_every)
    intents = read_intents(store)
    checker = ChunkChecker(store, deep)
    cps = [Checkpoint(manifests.join(dir_path, n), step=_step(n)) for n in names]

    def examine(cp: Checkpoint) -> list[FileReport]:
        try:
            files = list_files(store, cp.path, checker=checker)
        except NoEntry:
            files = []  # removed meanwhile
        cp.complete = _complete(files, cp.path, intents)
        return files

    if cps and all(NUMBER.search(n) for n in names):
        cps.sort(key=lambda c: (checkpoint_order_key(c.path.rpartition("/")[2]), c.path),
                 reverse=True)
        for cp in cps:  # newest first, until the newest complete one (as latest() does)
            examine(cp)
            if cp.complete:
                break
    else:
        result.order = "mtime"
        for cp in cps:
            files = examine(cp)
            cp.mtime_ns = max((f.mtime_ns for f in files), default=0) or _marker_mtime(
                store, cp.path)
        cps.sort(key=lambda c: (c.mtime_ns, c.path), reverse=True)
    result.checkpoints = cps

    newest = next((i for i, c in enumerate(cps) if c.complete), None)
    if newest is not None:
        result.newest_complete = cps[newest].path
    for i, cp in enumerate(cps):
        if i < keep_last:
            cp.kept_for(NEWEST, f"among the newest {keep_last} (--keep-last {keep_last})")
        if keep_every is not None and cp.step is not None and cp.step % keep_every == 0:
            cp.kept_for(EVERY, f"step {cp.step} is a multiple of {keep_every} "
                               f"(--keep-every {keep_every})")
        if newest is None:
            cp.kept_for(NO_COMPLETE, "no checkpoint here is complete: nothing is removed")
        elif i == newest:
            cp.kept_for(LATEST, "the newest complete checkpoint (ckptfs latest)")
        elif i < newest:
            cp.kept_for(NEWER, "newer than the newest complete checkpoint "
                               "(incomplete, or being written)")
        touching = [x for x in intents if x.touches(cp.path)]
        if touching:
            x = touching[0]
            cp.kept_for(RENAMING, f"a directory rename {x.src or '?'} -> {x.dst or '?'} by "
                                  f"node {x.writer} is in flight ({x.key})")
        if result.order == "mtime" and not cp.mtime_ns and not cp.keep:
            cp.kept_for(UNORDERED, "no files and no mtime: cannot be placed in the order")
    return result


def _deletion_order(keys: Iterable[str]) -> list[list[str]]:
    """The keys of a tree in groups, deepest first: every entry goes before the marker of
    its directory (a marker's key ends in '/', one segment above its entries)."""
    by_depth: dict[int, list[str]] = {}
    for key in keys:
        by_depth.setdefault(key.rstrip("/").count("/"), []).append(key)
    return [sorted(by_depth[d], reverse=True) for d in sorted(by_depth, reverse=True)]


def remove_tree(store: Store, path: str, batch: str | None = None) -> int:
    """Delete every manifest and marker under directory `path` and its own marker, entries
    before their directory's marker, in batches; the chunks stay (gc frees them). With a
    trash `batch`, each key is first copied to the trash. Returns how many keys were
    deleted."""
    prefix = manifests.dir_prefix(manifests.check_path(path))
    keys = [k for k, _ in store.list(prefix, delimiter=None).objects]
    if batch is not None:
        trash.keep_all(store, sorted(set(keys) | {prefix}), batch)
    delete_tree(store, prefix, keys)
    return len(keys)


def delete_tree(store: Store, prefix: str, keys: Iterable[str]) -> None:
    """Delete `keys`, all under the directory marker `prefix`, and the markers of every
    directory on their way, deepest first: one delete_many per depth (in batches), so
    that no marker goes before the entries of its directory. The markers of directories
    that have none are deleted too (absent keys are ignored): some stores (SeaweedFS)
    keep an emptied directory until its marker key is deleted, and list it as a common
    prefix meanwhile; and within one batch delete they may remove a marker before the
    entries below it, keeping that directory too."""
    keys = set(keys)
    implicit = {prefix} | {k[:i + 1] for k in keys
                           for i in range(len(prefix), len(k) - 1) if k[i] == "/"}
    for group in _deletion_order(keys | implicit):
        for i in range(0, len(group), trash.DELETE_BATCH):
            store.delete_many(group[i:i + trash.DELETE_BATCH])


def prune(store: Store, dir_path: str, keep_last: int, keep_every: int | None = None,
          pattern: str = "*", dry_run: bool = False, deep: bool = False,
          trash_keep: float = 0.0, node: str = "",
          keep: Callable[[str], str | None] | None = None,
          remove: Callable[[str, str | None], int] | None = None,
          check: Callable[[list[Checkpoint]], None] | None = None) -> PruneResult:
    """plan(), then remove the checkpoints it does not keep (unless `dry_run`): into the
    trash for `trash_keep` seconds (one batch per directory, named after `node`), or for
    good when it is 0.

    The intents are read again just before the removals: a directory that a rename
    started meanwhile is kept. So is one for which `keep(path)`, asked just before its
    removal, returns a sentence (reason BUSY): a mount's own changes not yet in the
    store (autoprune.py), or changes still pending in a fast tier. `remove(path, batch)`
    removes one (default: remove_tree in `store`; with a fast tier, from both tiers);
    `check(doomed)`, called before the first removal, may raise to refuse them all.
    """
    result = plan(store, dir_path, keep_last, keep_every, pattern, deep)
    result.dry_run = dry_run
    doomed = result.removed
    if dry_run:
        for cp in doomed:
            cp.keys = len(store.list(manifests.dir_prefix(cp.path), delimiter=None).objects)
        return result
    if doomed:
        intents = read_intents(store)
        for cp in doomed:
            touching = [x for x in intents if x.touches(cp.path)]
            if touching:
                x = touching[0]
                cp.kept_for(RENAMING, f"a directory rename {x.src or '?'} -> "
                                      f"{x.dst or '?'} by node {x.writer} started ({x.key})")
    if check is not None and result.removed:
        check(result.removed)
    for i, cp in enumerate(result.removed):
        why = keep(cp.path) if keep is not None else None
        if why:
            cp.kept_for(BUSY, why)
            continue
        batch = (trash.batch_id(trash_keep, i, node or trash.this_node())
                 if trash_keep else None)
        cp.keys = (remove_tree(store, cp.path, batch) if remove is None
                   else remove(cp.path, batch))
        result.deleted_keys += cp.keys
        log.debug("pruned %s (%d manifests and markers)", cp.path, cp.keys)
    return result
