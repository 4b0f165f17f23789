"""Fast-tier retention (--fast-keep, --fast-size): what the store has leaves the fast tier.

The fast tier keeps the newest `keep` checkpoint directories of each parent directory, as
`ckptfs prune --keep-last` picks them (tools/retention.py, on both tiers at once: the
newest complete one and everything newer are always kept). A checkpoint directory is one
whose name matches the mount's --keep-pattern, or, without one, a top-level directory.
With a `size`, the kept ones too leave, oldest first, while the fast tier holds more than
that many bytes (chunks and manifests), but never the newest complete one nor a newer
one. Of the others, a manifest leaves the fast tier only once the object store holds it
at the same or a higher generation and no pending record names its path; a chunk only
once the object store has it and no manifest left in the fast tier (nor a pending record)
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
    #: with a size: the bytes of the fast tier's chunks and manifests after the trim, and
    #: how far above the size that is (what must stay: not in the object store yet,
    #: pending, the newest complete checkpoint and newer, files outside checkpoints)
    held: int = 0
    over: int = 0


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


def pending_names(fast: Store) -> tuple[set[str], set[str]] | None:
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


def touches(cp: str, paths: set[str]) -> bool:
    return any(p == cp or p.startswith(cp + "/") or cp.startswith(p + "/") for p in paths)


def trim(fast: Store, slow: Store, keep: int = DEFAULT_KEEP,
         pattern: str | None = None, size: int | None = None) -> Trimmed:
    """Remove from the fast tier what the object store holds of the checkpoint
    directories the keep rule does not keep, oldest first; then, with a `size`, of the
    kept ones too, oldest first, until the fast tier holds at most `size` bytes (never the
    newest complete checkpoint nor a newer one). Safe while writers, movers and readers
    work: a manifest is set aside (atomic rename) before its check and put back if the
    check fails; a reader that misses it in the fast tier reads the object store's, which
    the check found as new."""
    done = Trimmed()
    pending = pending_names(fast)
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
    by_keep: list[str] = []  # the checkpoints the keep rule removes, oldest first
    by_size: list[tuple[int, str]] = []  # (-rank from the newest, checkpoint): the others
    for parent, cps in sorted(found.items()):
        try:  # keep_last=1: what it removes is all but the newest complete and newer
            result = retention.plan(view, parent, 1, None, pattern or "*")
        except NoEntry:
            continue
        except StoreError:
            raise
        except CkptfsError as e:  # e.g. a damaged record: this directory is left as it is
            log.warning("fast tier not trimmed in %r: %s", parent or "/", e)
            continue
        for rank, c in reversed(list(enumerate(result.checkpoints))):  # oldest first
            if c.keep or c.path not in cps or touches(c.path, pending_paths):
                continue
            if rank >= keep:
                by_keep.append(c.path)
            else:
                by_size.append((-rank, c.path))
    keys = {cp: k for cps in found.values() for cp, k in cps.items()}
    candidates: set[str] = set()
    for cp in by_keep:
        candidates |= _trim_checkpoint(fast, slow, keys[cp], done)
    named = _named(fast)
    named_anywhere = set(named) | pending_chunks
    for chunk_hash in sorted(candidates - named_anywhere):
        _trim_chunk(fast, slow, chunk_hash, done)
    if size is not None:
        _trim_to_size(fast, slow, size, sorted(by_size), keys, pending_chunks, done)
    if done.checkpoints:
        log.info("fast tier trimmed: %d checkpoint directories, %d manifests, %d chunks "
                 "(%d bytes) the store has", done.checkpoints, done.manifests, done.chunks,
                 done.chunk_bytes)
    return done


def _named(fast: Store) -> dict[str, int]:
    """How many of the fast tier's manifests name each chunk."""
    counts: dict[str, int] = {}
    for info in fast.scan(manifests.FILES):
        if not info.key.endswith("/"):
            try:
                for h in _chunks(fast.get_record(info.key)):
                    counts[h] = counts.get(h, 0) + 1
            except NotFoundError:
                continue
    return counts


def _held(fast: Store) -> tuple[int, dict[str, int]]:
    """The bytes of the fast tier's manifests and chunks, and each chunk's size."""
    sizes = {}
    for info in fast.scan(manifests.CHUNKS):
        h = manifests.chunk_name(info.key)
        if h is not None:
            sizes[h] = info.size
    return sum(i.size for i in fast.scan(manifests.FILES)) + sum(sizes.values()), sizes


def _trim_to_size(fast: Store, slow: Store, size: int, order: list[tuple[int, str]],
                  keys: dict[str, list[str]], pending_chunks: set[str],
                  done: Trimmed) -> None:
    """Trim the checkpoints of `order` (oldest first) while the fast tier holds more than
    `size` bytes; what it still holds above it is `done.over`."""
    held, sizes = _held(fast)
    named = _named(fast) if held > size and order else {}
    for _, cp in order:
        if held <= size:
            break
        before = (done.manifests, done.chunk_bytes)
        held -= sum(fast.head(k) or 0 for k in keys[cp])
        gone = _trim_checkpoint(fast, slow, keys[cp], done)
        held += sum(fast.head(k) or 0 for k in keys[cp])  # what stayed, or was put back
        for h in gone:
            named[h] = named.get(h, 1) - 1
        for h in sorted(gone):
            if named.get(h, 0) <= 0 and h not in pending_chunks:
                _trim_chunk(fast, slow, h, done)
        held -= done.chunk_bytes - before[1]
    done.held = held
    done.over = max(0, held - size)


def _trim_checkpoint(fast: Store, slow: Store, keys: list[str], done: Trimmed) -> set[str]:
    """Trim one checkpoint directory's keys; the chunks its removed manifests named."""
    done.checkpoints += 1
    gone: set[str] = set()
    for key in sorted(keys, reverse=True):  # entries before their markers
        gone |= _trim_key(fast, slow, key, done)
    return gone


def _trim_chunk(fast: Store, slow: Store, chunk_hash: str, done: Trimmed) -> None:
    """Delete a chunk from the fast tier if the object store has it."""
    key = manifests.chunk_key(chunk_hash)
    size = fast.head(key)
    if size is not None and slow.head(key) is not None:
        fast.delete(key)
        done.chunks += 1
        done.chunk_bytes += size


class Retention:
    """A mount's trim (Mover.trim): fastkeep.trim with its options, and one log line when
    the fast tier cannot be brought under --fast-size (and one when it fits again), not
    one per trim."""

    def __init__(self, fast: Store, slow: Store, keep: int | None, size: int | None,
                 pattern: str | None) -> None:
        self.fast, self.slow = fast, slow
        self.keep = DEFAULT_KEEP if keep is None else keep
        self.size, self.pattern = size, pattern
        self.over = False

    def __call__(self) -> Trimmed:
        done = trim(self.fast, self.slow, self.keep, self.pattern, self.size)
        if done.over and not self.over:
            log.warning("the fast tier holds %d bytes, more than --fast-size %d: the rest "
                        "must stay (not yet in the store, pending, or the newest complete "
                        "checkpoint and newer)", done.held, self.size)
        elif self.over and not done.over:
            log.info("the fast tier is within --fast-size again (%d bytes)", done.held)
        self.over = done.over > 0
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
