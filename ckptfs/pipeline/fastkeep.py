"""Fast-tier retention (--fast-keep): what the object store already has leaves the fast tier.

The fast tier keeps the newest `keep` checkpoint directories of each parent directory, as
`ckptfs prune --keep-last` picks them (tools/retention.py, on both tiers at once: the
newest complete one and everything newer are always kept). A checkpoint directory is one
whose name matches the mount's --keep-pattern, or, without one, a top-level directory.
Of the others, a manifest leaves the fast tier only once the object store holds it at
the same or a higher generation and no pending record names its path; a chunk only once
the object store has it and no manifest left in the fast tier (nor a pending record)
names it. docs/FORMAT.md, "The fast tier", is the specification.
"""

from __future__ import annotations

import fnmatch
import logging
import secrets
from dataclasses import dataclass

from ckptfs.common.errors import (
    CkptfsError,
    FormatError,
    InvalidKeyError,
    NoEntry,
    NotFoundError,
    StoreError,
)
from ckptfs.format import manifests
from ckptfs.format.manifests import Manifest
from ckptfs.pipeline.fasttier import PENDING, Record, newer_manifest
from ckptfs.store.base import Store
from ckptfs.store.tiered import TieredStore
from ckptfs.tools import retention

log = logging.getLogger(__name__)

#: where a manifest is set aside while its removal is checked (never listed, never read)
ASIDE = "trim/"
DEFAULT_KEEP = 2


@dataclass
class Trimmed:
    """What one trim removed from the fast tier."""

    checkpoints: int = 0
    manifests: int = 0
    chunks: int = 0
    chunk_bytes: int = 0


def checkpoint_of(path: str, is_dir: bool, pattern: str | None) -> str | None:
    """The checkpoint directory the entry at `path` lies in (or is, when `is_dir`): its
    nearest ancestor, or itself, whose name matches `pattern`, or without one its
    top-level directory; None if none."""
    parts = path.split("/")
    if pattern is None:
        return parts[0] if is_dir or len(parts) > 1 else None
    for end in range(len(parts) if is_dir else len(parts) - 1, 0, -1):
        if fnmatch.fnmatchcase(parts[end - 1], pattern):
            return "/".join(parts[:end])
    return None


def _pending(fast: Store) -> tuple[set[str], set[str]] | None:
    """The paths and chunks that pending records name; None when one is damaged (what it
    names is unknown, so nothing is removed)."""
    paths: set[str] = set()
    chunks: set[str] = set()
    for key, _ in fast.list(PENDING, delimiter=None).objects:
        try:
            op = Record.from_json(fast.get_record(key)).op
        except NotFoundError:
            continue  # moved meanwhile
        except FormatError:
            return None
        paths.update(p for p in (op.path, op.path2) if p is not None)
        if op.kind == "put_file" and op.body:
            chunks.update(_chunks(op.body))
    return paths, chunks


def _chunks(body: bytes) -> set[str]:
    try:
        return {h for h, _ in Manifest.from_json(body).chunks}
    except FormatError:
        return set()  # a symlink, or damaged: names no chunk


def _touches(cp: str, paths: set[str]) -> bool:
    return any(p == cp or p.startswith(cp + "/") or cp.startswith(p + "/") for p in paths)


def trim(fast: Store, slow: Store, keep: int = DEFAULT_KEEP,
         pattern: str | None = None) -> Trimmed:
    """Remove from the fast tier what the object store holds of the checkpoint
    directories the keep rule does not keep, oldest first. Safe while writers, movers
    and readers work: a manifest is set aside (atomic rename) before its check and put
    back if the check fails; a reader that misses it in the fast tier reads the object
    store's, which the check found as new."""
    done = Trimmed()
    pending = _pending(fast)
    if pending is None:
        log.warning("fast tier not trimmed: a pending record is damaged")
        return done
    pending_paths, pending_chunks = pending
    found: dict[str, dict[str, list[str]]] = {}  # parent -> checkpoint -> fast keys
    for info in fast.scan(manifests.FILES):
        try:
            path = manifests.path_of_key(info.key)
        except InvalidKeyError:
            continue
        cp = checkpoint_of(path, info.key.endswith("/"), pattern)
        if cp is not None:
            parent = cp.rpartition("/")[0]
            found.setdefault(parent, {}).setdefault(cp, []).append(info.key)
    view = TieredStore(fast, slow, manifests.FILES, newer_manifest,
                       fast_only=(manifests.INTENTS,))
    candidates: set[str] = set()
    for parent, cps in sorted(found.items()):
        try:
            result = retention.plan(view, parent, keep, None, pattern or "*")
        except NoEntry:
            continue
        except StoreError:
            raise
        except CkptfsError as e:  # e.g. a damaged record: this directory is left as it is
            log.warning("fast tier not trimmed in %r: %s", parent or "/", e)
            continue
        for c in reversed(result.removed):  # oldest first
            if c.path not in cps or _touches(c.path, pending_paths):
                continue
            done.checkpoints += 1
            for key in sorted(cps[c.path], reverse=True):  # entries before their markers
                candidates |= _trim_key(fast, slow, key, done)
    named = set(pending_chunks)
    for info in fast.scan(manifests.FILES):
        if not info.key.endswith("/"):
            try:
                named |= _chunks(fast.get_record(info.key))
            except NotFoundError:
                continue
    for chunk_hash in sorted(candidates - named):
        key = manifests.chunk_key(chunk_hash)
        size = fast.head(key)
        if size is not None and slow.head(key) is not None:
            fast.delete(key)
            done.chunks += 1
            done.chunk_bytes += size
    if done.checkpoints:
        log.info("fast tier trimmed: %d checkpoint directories, %d manifests, %d chunks "
                 "(%d bytes) the store has", done.checkpoints, done.manifests, done.chunks,
                 done.chunk_bytes)
    return done


def _trim_key(fast: Store, slow: Store, key: str, done: Trimmed) -> set[str]:
    """Remove one files/ key from the fast tier if the object store has it (as new); the
    chunks a removed manifest named."""
    if key.endswith("/"):  # a directory marker (GET: some S3 servers HEAD no "x/" key)
        try:
            slow.get_record(key)
        except NotFoundError:
            return set()
        fast.delete(key)
        return set()
    aside = f"{ASIDE}{secrets.token_hex(8)}"
    try:
        fast.rename(key, aside)
    except NotFoundError:
        return set()
    body = fast.get_record(aside)
    try:
        slow_gen = manifests.generation(slow.get_record(key))
    except NotFoundError:
        slow_gen = -1
    if slow_gen < manifests.generation(body):  # not in the object store yet: back
        fast.put_if_absent(key, body)  # unless a newer version was published meanwhile
        fast.delete(aside)
        return set()
    fast.delete(aside)
    done.manifests += 1
    return _chunks(body)
