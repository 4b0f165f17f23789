"""Applies journaled metadata operations to the store, strictly in order.

Kinds of op (journal.Op):

    put_file    path, body      PUT the manifest files/<path>
    put_dir     path, body      PUT the directory marker files/<path>/
    delete_file path            DELETE files/<path>
    delete_dir  path            DELETE files/<path>/
    rename_file path -> path2   copy the manifest, then delete the old key
    rename_dir  path -> path2   PUT an intent record, copy every key under files/<path>/,
                                delete the old keys, delete the intent record
    keep_version path, body     PUT the manifest the put_file after it replaces (body)
                                into the trash (trash/<batch>/<path>), unless the trash
                                is off

A put_file that replaces a version this node knew is journaled with a keep_version op
before it, in the same transaction: the old manifest goes to the trash before the new
one replaces it, so that some key always names the old version's chunks (a gc while
this node is down between the two PUTs could otherwise free them), and a replay PUTs
the journaled bytes again (never the store's manifest, which may be the new version by
then). A crash between the two leaves the old version in files/ and in the trash: the
trash copy is one more version to restore, nothing more.

Every op is idempotent, so replaying the journal after a crash (at any point of an op)
rolls it forward on this node. A directory rename is also recorded in the store
(intents/<node>-<seq>.json) while it runs, so that if this node is lost halfway, the next
mount on ANY node rolls it forward (roll_forward_intents). Runs of deletes are sent as
one batched delete.

A manifest names chunks that `ckptfs gc` may set aside (chunks/ -> fossils/) or delete
once no manifest references them and they are older than its grace period. A chunk
uploaded (or found by a HEAD) at a file's close is safe because its manifest follows
within moments. A put_file op is re-confirmed before its PUT (docs/FORMAT.md, rule W3)
when it was journaled by an earlier process (replayed from the journal: whatever time
it bears, since a wall clock can be stepped), or by this one more than CONFIRM_WINDOW
ago on the monotonic clock (a node cut off from the store for long): every chunk of its
manifest not journaled for upload here is HEADed; a missing one is copied back from
fossils/, or else uploaded again from the version's staging file, which the cache keeps
until the op is applied (StagingFile.unpublished); a chunk that neither holds is
recorded as lost in the journal (status, the log and umount name the file) and the
manifest is published all the same. An op that is young still has the chunks that its
seal found stale re-confirmed so (a file kept open longer than the window: chunks
uploaded early and freed from the cache, filesystem.py), and those only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    CkptfsError,
    Deferred,
    FormatError,
    InvalidKeyError,
    JournalError,
    NotFoundError,
    StoreError,
)
from ckptfs.common.retry import BACKGROUND, STORE_CALL, retried, retrying
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest, RenameIntent
from ckptfs.pipeline.cache import LocalCache, pread_scratch
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.store.base import Store
from ckptfs.tools import retention, trash

log = logging.getLogger(__name__)

DELETES = ("delete_file", "delete_dir")
#: seconds between two looks at a Deferred batch (fastfail.py: it waits for the mover)
DEFER_WAIT = 0.2
#: seconds: a put_file op applied later than this after it was journaled (monotonic
#: clock) has its chunks re-confirmed first (module docstring): manifests.CONFIRM_WINDOW,
#: the window gc's grace rests on (a module attribute here, so that tests can shorten it)
CONFIRM_WINDOW = manifests.CONFIRM_WINDOW
LOST_REASON = ("it is gone from the store (ckptfs gc?) and no copy is left (no fossil, "
               "not in this node's staging file): the manifest waited too long to be "
               "published")
STALE_LOST_REASON = ("it is gone from the store (ckptfs gc?) and no copy is left: it was "
                     "uploaded while the file was open and freed from the cache, and the "
                     "file stayed open longer than gc's grace")


class RetryingStore:
    """A store whose every call is retried over transient errors, in the calling thread
    (retry.STORE_CALL). A directory rename is hundreds of calls; retrying the whole op
    because one of them was throttled would rarely finish on a busy store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)
        return retrying(fn, STORE_CALL) if callable(fn) else fn


class Publisher:
    """The single task that makes local metadata changes visible in the store."""

    def __init__(self, store: Store, journal: Journal,
                 journal_limiter: trio.CapacityLimiter, node_id: str = "",
                 cache: LocalCache | None = None, trash_keep: float = 0.0,
                 codec_name: str = "lz4") -> None:
        self.store: Store = RetryingStore(store)  # type: ignore[assignment]
        self.codec_name = codec_name  # for chunks PUT again from a staging file
        self.node_id = node_id or "node"
        self.trash_keep = trash_keep  # seconds deleted manifests stay in trash/ (0: none)
        self.journal = journal
        self.cache = cache  # where the staging files of put_file ops are (None: nowhere)
        self.journal_limiter = journal_limiter
        self.limiter = trio.CapacityLimiter(1)
        self.limiter.name = "publish"  # type: ignore[attr-defined]
        self._queue: deque[Op] = deque()
        self._pending_paths: Counter[str] = Counter()
        self._changed = trio.Condition()
        self.applied_seq = 0
        self.last_seq = 0  # highest seq queued so far
        self.recovered_seq = 0  # highest seq of the ops found in the journal at startup
        self.healthy = True
        self.last_error: str | None = None
        self.applied_ops = 0
        self._reported: set[tuple[int, str]] = set()  # (op seq, chunk) recorded as lost
        #: put_file op seq -> when (time.monotonic()) this process journaled it; an op
        #: missing here was journaled by an earlier process (replayed)
        self._journaled_at: dict[int, float] = {}
        #: put_file op seq -> the chunks its seal found stale (filesystem._publish)
        self._stale: dict[int, frozenset[str]] = {}
        #: told of every op once it is in the store (not of an op dropped as undoable):
        #: the auto-prune's trigger (autoprune.py)
        self.on_applied: Callable[[Op], None] | None = None
        #: with a fast tier (fasttier.py): called in the applying thread with each batch
        #: before it is applied, returns the ops to apply (each recorded first)
        self.before_apply: Callable[[list[Op]], list[Op]] | None = None
        #: with a fast tier: whether an op's paths stay pending (is_pending) once applied,
        #: until release(op): a delete or rename is in the object store only then
        self.hold_after_apply: Callable[[Op], bool] | None = None
        #: with a fast tier (fastfail.py): called in trio's thread with each batch, the
        #: store to apply it to instead of `store` (the fast tier is unusable: straight to
        #: the object store), None for `store`; raises Deferred when the batch must wait
        self.route: Callable[[list[Op]], Store | None] | None = None
        #: with a fast tier: a routed batch's ops before (in the applying thread; returns
        #: the ops to apply) and after it is applied so
        self.before_direct: Callable[[list[Op]], list[Op]] | None = None
        self.after_direct: Callable[[list[Op]], None] | None = None
        self.direct_trash_keep = 0.0  # trash_keep of the batches applied so
        self._held: set[int] = set()  # seqs of the ops held so
        self._held_paths: Counter[str] = Counter()  # and their paths

    def load(self, ops: list[Op]) -> None:
        """Queue ops found in the journal at startup."""
        for op in ops:
            self.enqueue(op)
            self.recovered_seq = max(self.recovered_seq, op.seq)

    def enqueue(self, op: Op, journaled_at: float | None = None,
                stale: frozenset[str] = frozenset()) -> None:
        """Queue an op already in the journal: journaled by this process at monotonic
        time `journaled_at` (None: by an earlier one, or unknown), naming the `stale`
        chunks (see the module docstring)."""
        if journaled_at is not None:
            self._journaled_at[op.seq] = journaled_at
        if stale:
            self._stale[op.seq] = stale
        self._queue.append(op)
        self.last_seq = max(self.last_seq, op.seq)
        for p in (op.path, op.path2):
            if p is not None:
                self._pending_paths[p] += 1
        self._hold_staging(op, 1)

    def _hold_staging(self, op: Op, delta: int) -> None:
        """Keep the staging file of a put_file op from eviction until the op is applied
        (delta 1), or let it go (delta -1)."""
        if op.staging_id is None or self.cache is None:
            return
        st = self.cache.staging.get(op.staging_id)
        if st is None:
            return
        if delta > 0:
            self.cache.hold(st)
        else:
            self.cache.let_go(st)

    async def add(self, op: Op, journaled_at: float | None = None,
                  stale: frozenset[str] = frozenset()) -> None:
        """Queue an op already in the journal (see enqueue) and wake the applier."""
        self.enqueue(op, journaled_at, stale)
        async with self._changed:
            self._changed.notify_all()

    def applied(self, seq: int) -> bool:
        """Whether op `seq` (journaled by this mount's cache) is no longer waiting here:
        applied (or dropped), by this process or an earlier one."""
        return seq <= self.applied_seq or all(op.seq != seq for op in self._queue)

    def release_held(self, op: Op) -> None:
        """A held op (hold_after_apply) is in the object store: its paths are free."""
        if op.seq in self._held:
            self._held.discard(op.seq)
            self.release(op, self._held_paths)

    def release(self, op: Op, paths: Counter[str] | None = None) -> None:
        """The op's paths are no longer pending (in `paths`: the unapplied ops' paths,
        or the held ones')."""
        counter = self._pending_paths if paths is None else paths
        for p in (op.path, op.path2):
            if p is not None:
                counter[p] -= 1
                if not counter[p]:
                    del counter[p]

    def is_pending(self, path: str, held: bool = True) -> bool:
        """Whether an unapplied op touches `path` or one of its ancestors (`held`: or an
        op held after it was applied, see hold_after_apply)."""
        if not self._pending_paths and not (held and self._held_paths):
            return False  # the common case, on every lookup: no list made
        counters = [c for c in (self._pending_paths, self._held_paths if held else None) if c]
        while True:
            if any(c.get(path) for c in counters):
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

    def pending_under(self, path: str) -> bool:
        """Whether an unapplied op touches `path`, one of its ancestors, or anything
        below it (is_pending, and the directory's whole subtree)."""
        below = f"{path}/" if path else ""
        return self.is_pending(path) or any(
            p.startswith(below) for p in (*self._pending_paths, *self._held_paths))

    @property
    def pending_count(self) -> int:
        return len(self._queue)

    async def wait_applied(self, seq: int, timeout: float) -> bool:
        """Wait until op `seq` is in the store; False after `timeout` or while unhealthy."""
        with trio.move_on_after(timeout):
            async with self._changed:
                while self.applied_seq < seq and self.healthy:
                    await self._changed.wait()
        return self.applied_seq >= seq

    async def wait_settled(self, path: str, timeout: float) -> bool:
        """Wait until no unapplied op touches `path` or an ancestor (is_pending); False
        after `timeout` or while unhealthy, and while a held op does (not waited for: the
        mover may be far behind)."""
        with trio.move_on_after(timeout):
            async with self._changed:
                while self.is_pending(path, held=False) and self.healthy:
                    await self._changed.wait()
        return not self.is_pending(path)

    async def wait_empty(self) -> None:
        async with self._changed:
            while self._queue:
                await self._changed.wait()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply ops forever, retrying failures with backoff; cancel to stop."""
        task_status.started()
        try:
            await trio.to_thread.run_sync(self.roll_forward_intents, limiter=self.limiter)
        except StoreError as e:
            log.warning("could not check for interrupted directory renames: %s", e)
        delays = BACKGROUND.delays()
        while True:
            async with self._changed:
                while not self._queue:
                    await self._changed.wait()
            batch = [self._queue[0]]
            if batch[0].kind in DELETES:
                for op in list(self._queue)[1:1000]:
                    if op.kind not in DELETES:
                        break
                    batch.append(op)
            direct: Store | None = None
            try:
                direct = self.route(batch) if self.route is not None else None
                if direct is not None:
                    await self._apply_direct(batch, direct)
                else:
                    to_confirm = self._to_confirm(batch[0])
                    if to_confirm is None or to_confirm:
                        await self._confirm_chunks(batch[0], to_confirm)
                    to_apply = batch
                    if self.before_apply is not None:
                        to_apply = await trio.to_thread.run_sync(self.before_apply, batch,
                                                                 limiter=self.limiter)
                    await trio.to_thread.run_sync(self._apply_sync, to_apply,
                                                  limiter=self.limiter)
                self.last_error = None
            except Deferred as e:  # not a failure: said once by whoever defers it
                self.last_error = str(e)
                await trio.sleep(DEFER_WAIT)
                continue
            except StoreError as e:
                self.healthy = False
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("metadata op %s %s failed (retrying): %s", batch[0].kind,
                            batch[0].path, e)
                async with self._changed:
                    self._changed.notify_all()
                retried("metadata op")
                await trio.sleep(next(delays))
                continue
            except (CkptfsError, UnicodeError) as e:  # this op can never succeed: drop it
                self.last_error = f"dropped {batch[0].kind} {batch[0].path!r}: {e}"
                log.error("metadata op %s %r can never be applied, dropped: %s",
                          batch[0].kind, batch[0].path, e)
                applied = False
            else:
                applied = True
            delays = BACKGROUND.delays()
            crash_point("op_applied")
            try:
                await trio.to_thread.run_sync(self.journal.remove_ops,
                                              [op.seq for op in batch],
                                              limiter=self.journal_limiter)
            except JournalError as e:  # disk full: the ops replay (idempotently) next mount
                log.warning("could not update the journal (cache disk full?): %s", e)
            for op in batch:
                self._queue.popleft()
                self.release(op)
                if (applied and direct is None and self.hold_after_apply is not None
                        and self.hold_after_apply(op)):
                    self._held.add(op.seq)
                    self._held_paths.update(p for p in (op.path, op.path2) if p is not None)
                self.applied_seq = max(self.applied_seq, op.seq)
                self._hold_staging(op, -1)
                self._journaled_at.pop(op.seq, None)
                self._stale.pop(op.seq, None)
            self.applied_ops += len(batch)
            self.healthy = True
            if applied and self.on_applied is not None:
                for op in batch:
                    self.on_applied(op)
            async with self._changed:
                self._changed.notify_all()

    async def _apply_direct(self, batch: list[Op], store: Store) -> None:
        """Apply the batch to `store` (route): a put_file's chunks are each confirmed in
        it first (rule W3), the journaled ones too, since they may go to the fast tier
        (once it is back) with no record to bring them here."""
        if batch[0].kind == "put_file":
            await self._confirm_chunks(batch[0], None, store)
        to_apply = batch
        if self.before_direct is not None:
            to_apply = await trio.to_thread.run_sync(self.before_direct, batch,
                                                     limiter=self.limiter)
        await trio.to_thread.run_sync(self._apply_sync, to_apply, store, limiter=self.limiter)
        if self.after_direct is not None:
            await trio.to_thread.run_sync(self.after_direct, to_apply, limiter=self.limiter)

    def statistics(self) -> dict[str, object]:
        return {"pending_ops": len(self._queue), "applied_ops": self.applied_ops,
                "last_error": self.last_error}

    # -- re-confirming an old manifest's chunks -------------------------------------------
    def _to_confirm(self, op: Op) -> frozenset[str] | None:
        """Which chunks of op's manifest to re-confirm before it is applied: None for
        all of them (a put_file replayed from the journal, or journaled here more than
        CONFIRM_WINDOW ago on the monotonic clock), else those its seal found stale
        (usually none). Never the wall clock: it can be stepped back or forward."""
        if op.kind != "put_file":
            return frozenset()
        since = self._journaled_at.get(op.seq)
        if since is None or time.monotonic() - since > CONFIRM_WINDOW:
            return None
        return self._stale.get(op.seq, frozenset())

    async def _confirm_chunks(self, op: Op, only: frozenset[str] | None = None,
                              store: Store | None = None) -> None:
        """Make sure every chunk (or each of `only`) of the manifest of a put_file op is
        in the store (module docstring), or in `store` (then the chunks journaled for
        upload here too); StoreError if the store fails (the op is retried)."""
        manifest = manifest_of(op)
        if manifest is None or not manifest.chunks:
            return
        spans: dict[str, list[tuple[int, int]]] = {}  # chunk -> (file offset, length)s
        for (chunk_hash, length), offset in zip(manifest.chunks, manifest.chunk_offsets(),
                                                strict=False):
            if only is None or chunk_hash in only:
                spans.setdefault(chunk_hash, []).append((offset, length))
        try:  # journaled chunks are this node's uploader's to put in the store
            journaled = set() if store is not None else await trio.to_thread.run_sync(
                self.journal.journaled_among, spans, limiter=self.journal_limiter)
        except JournalError as e:
            log.warning("could not read the journal (cache disk full?): %s", e)
            journaled = set()
        todo = {h: s for h, s in spans.items() if h not in journaled}
        st = (self.cache.staging.get(op.staging_id)
              if self.cache is not None and op.staging_id is not None else None)
        fd = st.fd if st is not None else -1  # kept open: _hold_staging
        why = ("before its publish straight to the store (the fast tier is unusable)"
               if store is not None else "before its late publish" if only is None
               else "freed from the cache while it was open, before its publish")
        lost = await trio.to_thread.run_sync(self._confirm_sync, op.path, todo, fd, why,
                                             store, limiter=self.limiter)
        stale = self._stale.get(op.seq, frozenset())
        for chunk_hash in lost:
            if (op.seq, chunk_hash) not in self._reported:
                await self._record_lost(op, chunk_hash, STALE_LOST_REASON
                                        if chunk_hash in stale else LOST_REASON)

    async def _record_lost(self, op: Op, chunk_hash: str, reason: str) -> None:
        """Record (in the journal) and log the file that lost this chunk."""
        try:
            path = await trio.to_thread.run_sync(self.journal.mark_lost_file, op.seq,
                                                 op.path, chunk_hash, reason,
                                                 limiter=self.journal_limiter)
        except JournalError as e:
            log.error("DATA LOST: %s: chunk %s is not in the store: %s; and the journal "
                      "cannot record it: %s", op.path, chunk_hash, reason, e)
            return
        self._reported.add((op.seq, chunk_hash))
        log.error("DATA LOST: %s: chunk %s is not in the store: %s", path or
                  f"{op.path} (since deleted or rewritten)", chunk_hash, reason)

    # -- in a thread ---------------------------------------------------------------------
    def _confirm_sync(self, path: str, spans: dict[str, list[tuple[int, int]]],
                      fd: int, why: str, store: Store | None = None) -> list[str]:
        """HEAD each chunk; put back a missing one from fossils/, else from the staging
        file `fd` (-1: none) at one of its `spans`. Returns the chunks still missing.
        `why` ends the log line."""
        start = time.monotonic()
        with ThreadPoolExecutor(LIMITS.confirm_threads) as pool:
            found = dict(zip(spans, pool.map(
                lambda h: self.present_or_restored(h, store), spans), strict=True))
        missing = [h for h, how in found.items() if how is None]
        with ThreadPoolExecutor(LIMITS.confirm_uploads) as pool:
            uploaded = dict(zip(missing, pool.map(
                lambda h: self.upload_from_staging(h, fd, spans[h], store), missing),
                strict=True))
        lost = [h for h, ok in uploaded.items() if not ok]
        restored = sum(1 for how in found.values() if how == "fossil")
        # straight to the store, chunks still to upload are expected: put from staging
        log.log(logging.WARNING if restored or (lost if store is not None else missing)
                else logging.INFO,
                "re-confirmed the %d chunks of %s %s in %.2fs: %d copied back from "
                "fossils/, %d uploaded again from staging, %d lost",
                len(spans), path, why, time.monotonic() - start, restored,
                len(missing) - len(lost), len(lost))
        return lost

    def present_or_restored(self, chunk_hash: str, store: Store | None = None) -> str | None:
        """'present' if the chunk is in the store (or `store`), 'fossil' if it was just
        copied back from fossils/, None if neither."""
        store = self.store if store is None else store
        size = store.head(manifests.chunk_key(chunk_hash))
        if size is not None and size >= codec.HEADER_SIZE:  # not a PUT torn by a crash
            return "present"
        try:
            store.copy(manifests.fossil_key(chunk_hash), manifests.chunk_key(chunk_hash))
        except NotFoundError:
            return None
        return "fossil"  # the fossil stays: gc deletes it, or restores it, later

    def upload_from_staging(self, chunk_hash: str, fd: int,
                            spans: list[tuple[int, int]], store: Store | None = None) -> bool:
        """PUT the chunk from the staging file (into the store, or `store`) if it holds it
        at one of `spans` (only the chunks that were local in the version are there: the
        hash decides)."""
        if fd < 0:
            return False
        for offset, length in spans:
            try:
                data = pread_scratch(fd, length, offset)
            except OSError as e:
                log.warning("cannot read staging file (fd %d): %s", fd, e)
                return False
            if len(data) == length and codec.chunk_hash(data) == chunk_hash:
                parts, _ = codec.encode_chunk_parts(data, self.codec_name)
                (self.store if store is None else store).put_parts(
                    manifests.chunk_key(chunk_hash), parts)
                return True
        return False

    def _apply_sync(self, batch: list[Op], to: Store | None = None) -> None:
        """Apply the batch to the store (or `to`, keeping the trash for direct_trash_keep)."""
        store = self.store if to is None else to
        keep = self.trash_keep if to is None else self.direct_trash_keep
        if batch[0].kind in DELETES:
            keys = [manifests.file_key(op.path) if op.kind == "delete_file"
                    else manifests.dir_key(op.path) for op in batch]
            if keep:  # entries before their directory's marker, as rm -rf does
                trash.keep_all(store, keys, self._trash_batch(batch[0], keep))
            store.delete_many(keys)
            return
        op = batch[0]
        if op.kind == "put_file":
            store.put(manifests.file_key(op.path), op.body or b"")
        elif op.kind == "keep_version":
            if keep:  # the batch from the op: the same key on a replay
                trash.keep_version(store, op.path, op.body or b"", self._trash_batch(op, keep))
        elif op.kind == "put_dir":
            store.put(manifests.dir_key(op.path), op.body or b"")
        elif op.kind == "rename_file":
            assert op.path2 is not None
            self._rename_file(op.path, op.path2, op, store, keep)
        elif op.kind == "rename_dir":
            assert op.path2 is not None
            intent = f"{manifests.INTENTS}{self.node_id}-{op.seq}.json"
            store.put(intent, RenameIntent(op.path, op.path2, self.node_id,
                                           time.time()).to_json())
            crash_point("rename_dir_intent")
            try:
                self._rename_dir(op.path, op.path2, store)
            except InvalidKeyError:  # refused before any copy (check_length): never doable
                store.delete(intent)
                raise
            store.delete(intent)
        else:
            log.error("unknown op kind %r in journal, skipped", op.kind)

    def _trash_batch(self, op: Op, keep: float | None = None) -> str:
        """The trash batch of the ops applied with `op` first: the same on a replay."""
        return trash.batch_id(self.trash_keep if keep is None else keep, op.seq,
                              self.node_id, op.journaled_at)

    def _rename_file(self, src: str, dst: str, op: Op | None = None,
                     store: Store | None = None, keep: float | None = None) -> None:
        store = self.store if store is None else store
        keep = self.trash_keep if keep is None else keep
        if op is not None and keep and (
                store.head(manifests.file_key(src)) is not None):
            # the file it replaces, if any, goes to the trash (not on a replay after the
            # rename was done: the source is gone then, and dst holds the renamed file)
            trash.keep(store, manifests.file_key(dst), self._trash_batch(op, keep))
        try:
            store.copy(manifests.file_key(src), manifests.file_key(dst))
        except NotFoundError:
            if store.head(manifests.file_key(dst)) is None:
                log.warning("rename %s -> %s: source is gone from the store", src, dst)
            return  # replay after the copy and delete were done
        store.delete(manifests.file_key(src))

    def _rename_dir(self, src: str, dst: str, store: Store | None = None) -> None:
        store = self.store if store is None else store
        start = time.monotonic()
        old_prefix, new_prefix = manifests.dir_key(src), manifests.dir_key(dst)
        keys = [k for k, _ in store.list(old_prefix, delimiter=None).objects]
        for key in keys:  # a key too long for the store fails the rename before any copy
            store.check_length(new_prefix + key[len(old_prefix):])
        with ThreadPoolExecutor(LIMITS.rename_threads) as pool:
            list(pool.map(lambda k: self._copy_if_present(
                k, new_prefix + k[len(old_prefix):], store), keys))
        crash_point("rename_dir_copied")
        # a directory without a marker of its own still gets one; but on a replay the old
        # marker may already have been moved: keep that one (its mode and mtime)
        had_marker = old_prefix in keys
        # children before their directory's marker, depth by depth, and the markers of
        # directories without one: else some stores (SeaweedFS) keep the emptied
        # directories, and list them as common prefixes (seen with Orbax's commit)
        retention.delete_tree(store, old_prefix, keys)
        if not had_marker and store.head(new_prefix) is None:
            store.put(new_prefix, b"")
        log.info("renamed directory %s -> %s (%d keys) in %.2fs", src, dst, len(keys),
                 time.monotonic() - start)

    def roll_forward_intents(self) -> int:
        """Finish directory renames that a lost or killed node left half done.

        Safe to run while the renaming node is still alive: every step is idempotent.
        """
        done = 0
        for key, _ in self.store.list(manifests.INTENTS, delimiter=None).objects:
            try:
                intent = RenameIntent.from_json(self.store.get_record(key))
            except NotFoundError:
                continue  # its owner finished it meanwhile
            except FormatError as e:
                log.error("damaged rename intent %s left alone: %s", key, e)
                continue
            src, dst = intent.src, intent.dst
            log.warning("rolling forward the interrupted rename %s -> %s (by node %s)",
                        src, dst, intent.writer or "?")
            try:
                self._rename_dir(src, dst)
            except InvalidKeyError as e:  # checked before any copy: nothing was changed
                log.error("rename intent %s can never be done, deleted: %s", key, e)
            self.store.delete(key)
            done += 1
        return done

    def _copy_if_present(self, src_key: str, dst_key: str, store: Store | None = None) -> None:
        try:
            (self.store if store is None else store).copy(src_key, dst_key)
        except NotFoundError:
            pass


def manifest_of(op: Op) -> Manifest | None:
    """The file manifest a put_file op publishes; None for a symlink or a body that is not
    a manifest (it is PUT as it is: there are no chunks to confirm)."""
    try:
        m = Manifest.from_json(op.body or b"")
    except FormatError:
        return None
    return None if m.is_symlink else m
