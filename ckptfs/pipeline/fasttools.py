"""prune, trash restore and gc on both tiers of a store whose mounts use a fast tier.

Through the view of both tiers alone they would be wrong: it writes to the fast tier only,
so a prune would leave the object store's copy readable (readers list the union) and a
restore would land where no mover takes it. Here a checkpoint directory leaves both tiers
(the object store's copy into its trash), and none is touched while a pending record
names a path in it or the fast tier holds a file of it that the object store lacks or
holds at a lower generation; a restore writes to the object store, checks names in both
tiers, and leaves alone a name a pending record touches (a mover would undo it); gc
counts what the fast tier's manifests and pending records name, and removes from the
fast tier the old chunks nothing names. docs/FORMAT.md, "The fast tier", is the
specification.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from ckptfs.common.errors import CorruptChunkError, FormatError, NotFoundError
from ckptfs.common.retry import retrying
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest
from ckptfs.pipeline.fastkeep import ASIDE, pending_names, touches
from ckptfs.pipeline.fasttier import PENDING, Record, newer_manifest
from ckptfs.store.base import Store
from ckptfs.store.tiered import TieredStore
from ckptfs.tools import gc, retention
from ckptfs.tools.gc import GcError, GcReport, References

log = logging.getLogger(__name__)

#: what a tool tells the user to wait for before it touches a path with pending changes
WAIT = ("once the mounts have moved them to the store (ckptfs drain waits for that), run "
        "this again")


class BothTiers:
    """A store and its fast tier, as the tools that change the store see them."""

    def __init__(self, fast: Store, slow: Store) -> None:
        self.fast = fast
        self.slow = slow

    def pending_paths(self) -> set[str]:
        """The paths the pending records name; FormatError when one is damaged."""
        names = pending_names(self.fast)
        if names is None:
            raise FormatError(f"a pending record in the fast tier {self.fast.url} is "
                              f"damaged (under {PENDING}): what it changes is unknown, so "
                              f"nothing is changed")
        return names[0]

    def pending(self, path: str) -> str | None:
        """Why `path` must not be changed now: pending records touch it (or an ancestor,
        or something in it); None if none does."""
        n = sum(1 for p in self.pending_paths() if touches(path, {p}))
        if not n:
            return None
        return (f"a mount's changes to it are pending in the fast tier, not yet in the "
                f"store ({n} pending records); {WAIT}")

    def busy(self, path: str) -> str | None:
        """Why the directory `path` must not be removed now: pending records touch it, or
        the fast tier holds a file in it that the object store lacks or holds older."""
        why = self.pending(path)
        if why is not None:
            return why
        ahead = self.fast_only(path)
        if not ahead:
            return None
        return (f"files in it are in the fast tier only, or newer there ({len(ahead)}: "
                f"{ahead[0]}{', ...' if len(ahead) > 1 else ''}); {WAIT}")

    def fast_only(self, path: str) -> list[str]:
        """The files under directory `path` whose fast-tier manifest the object store
        lacks or holds at a lower generation."""
        out = []
        for info in self.fast.scan(manifests.dir_prefix(path)):
            if info.key.endswith("/"):
                continue
            try:
                fast_gen = manifests.generation(self.fast.get_record(info.key))
            except NotFoundError:
                continue  # trimmed or deleted meanwhile
            try:
                slow_gen = manifests.generation(self.slow.get_record(info.key))
            except NotFoundError:
                slow_gen = -1
            if slow_gen < fast_gen:
                out.append(manifests.path_of_key(info.key))
        return sorted(out)

    def remove_tree(self, path: str, batch: str | None) -> int:
        """Remove the directory `path` from both tiers: the fast tier's keys, then the
        object store's (into its trash with a `batch`), then the fast tier's again (what
        a trim put back meanwhile: it puts back a manifest the object store lacks).
        How many keys went."""
        prefix = manifests.dir_prefix(manifests.check_path(path))
        fast_keys = self._delete_fast(prefix)
        slow_keys = {k for k, _ in self.slow.list(prefix, delimiter=None).objects}
        retention.remove_tree(self.slow, path, batch)
        fast_keys |= self._delete_fast(prefix)
        return len(fast_keys | slow_keys)

    def _delete_fast(self, prefix: str) -> set[str]:
        keys = {k for k, _ in self.fast.list(prefix, delimiter=None).objects}
        retention.delete_tree(self.fast, prefix, keys)
        return keys

    def restore_store(self) -> Store:
        """What a trash restore works on: reads from both tiers, writes to the store."""
        return _WritesToStore(self.fast, self.slow, manifests.FILES, newer_manifest,
                              fast_only=(manifests.INTENTS,))

    def gc(self) -> FastGc:
        return FastGc(self.fast, self.slow)


class _WritesToStore(TieredStore):
    """The view of both tiers, with every write to the object store (a restore lands
    where every reader sees it and no mover has to take it)."""

    def __init__(self, fast: Store, slow: Store, *args: object, **kwargs: object) -> None:
        super().__init__(fast, slow, *args, **kwargs)  # type: ignore[arg-type]
        self.atomic_create = slow.atomic_create

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.slow.put(key, data)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self.slow.put_if_absent(key, data)

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.slow.put_parts(key, parts)

    def delete(self, key: str) -> None:
        self.slow.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.slow.delete_many(keys)

    def copy(self, src: str, dst: str) -> None:
        self.slow.copy(src, dst)

    def rename(self, src: str, dst: str) -> None:
        self.slow.rename(src, dst)


class FastGc:
    """gc's fast tier (tools/gc.FastTier): the chunks the fast tier's manifests (files/,
    and those a trim set aside) and pending records name are references; after the
    store's run, a fast-tier chunk nothing names that is twice the grace old by the fast
    tier's clock (the earliest age at which the store's gc frees one) leaves the fast
    tier, copied into the store first if the store lacks it (in chunks/ and fossils/;
    the store's gc then frees it as any unreferenced chunk)."""

    def __init__(self, fast: Store, slow: Store) -> None:
        self.fast = fast
        self.slow = slow
        self._read: dict[str, str] = {}  # key -> token of the version read

    def add_references(self, refs: References, report: GcReport) -> None:
        report.fast_url = self.fast.url
        for key, _ in self.fast.list(PENDING, delimiter=None).objects:
            try:  # first: a record moved meanwhile has its manifest in the store already
                op = Record.from_json(self.fast.get_record(key)).op
            except NotFoundError:
                continue
            except FormatError as e:
                raise GcError(f"pending record {key} in the fast tier {self.fast.url}: {e}; "
                              f"gc stopped, since it cannot tell which chunks it needs") from None
            if op.kind == "put_file" and op.body:
                self._add(refs, key, op.body)
                report.fast_records += key not in self._read
                self._read[key] = ""
        for prefix in (manifests.FILES, ASIDE):
            for info in self.fast.scan(prefix):
                if info.key.endswith("/") or self._read.get(info.key) == info.token:
                    continue
                try:
                    blob = self.fast.get_record(info.key)
                except NotFoundError:
                    continue
                self._add(refs, info.key, blob)
                self._read[info.key] = info.token
                report.fast_manifests += 1

    def _add(self, refs: References, key: str, blob: bytes) -> None:
        try:
            m = Manifest.from_json(blob)
        except FormatError as e:
            raise GcError(f"unreadable manifest {key} in the fast tier {self.fast.url}: {e}; "
                          f"gc stopped, since it cannot tell which chunks that file needs "
                          f"(repair or delete it, then run gc again)") from None
        for h, _ in m.chunks:
            refs.add(h)

    def clean(self, refs: References, report: GcReport) -> None:
        cutoff = gc.store_time(self.fast) - 2 * report.grace
        for info in self.fast.scan(manifests.CHUNKS):
            h = manifests.chunk_name(info.key)
            if h is None:
                continue
            report.fast_chunks.add(info.size)
            if h in refs:
                continue
            if info.mtime > cutoff:
                report.fast_kept.add(info.size)
            elif self._in_store(h):
                if not report.dry_run:
                    self.fast.delete(info.key)
                report.fast_freed.add(info.size)
            elif self._move(info.key, h, report.dry_run):
                report.fast_moved.add(info.size)
            else:
                report.fast_kept.add(info.size)

    def _in_store(self, chunk_hash: str) -> bool:
        """The store has the chunk, or has it set aside (readers fall back to the fossil,
        and a mover that needs it restores it)."""
        head = retrying(self.slow.head)
        return (head(manifests.chunk_key(chunk_hash)) is not None
                or head(manifests.fossil_key(chunk_hash)) is not None)

    def _move(self, key: str, chunk_hash: str, dry_run: bool) -> bool:
        """Copy a chunk the store lacks into it (verified first: a damaged one is left
        alone, logged), then delete it from the fast tier."""
        try:
            blob = self.fast.get(key, codec.MAX_OBJECT_SIZE)
            with codec.decoded(blob, chunk_hash):
                pass
        except NotFoundError:
            return False
        except CorruptChunkError as e:
            log.error("chunk %s is damaged in the fast tier, left there: %s", chunk_hash, e)
            return False
        if not dry_run:
            retrying(self.slow.put)(key, blob)
            self.fast.delete(key)
        return True
