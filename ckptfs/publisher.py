"""Applies journaled metadata operations to the store, strictly in order.

Kinds of op (journal.Op):

    put_file    path, body      PUT the manifest files/<path>
    put_dir     path, body      PUT the directory marker files/<path>/
    delete_file path            DELETE files/<path>
    delete_dir  path            DELETE files/<path>/
    rename_file path -> path2   copy the manifest, then delete the old key
    rename_dir  path -> path2   PUT an intent record, copy every key under files/<path>/,
                                delete the old keys, delete the intent record

Every op is idempotent, so replaying the journal after a crash (at any point of an op)
rolls it forward on this node. A directory rename is also recorded in the store
(intents/<node>-<seq>.json) while it runs, so that if this node is lost halfway, the next
mount on ANY node rolls it forward (roll_forward_intents). Runs of deletes are sent as
one batched delete.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from . import manifests
from .crashpoints import crash_point
from .errors import (
    CkptfsError,
    FormatError,
    InvalidKeyError,
    JournalError,
    NotFoundError,
    StoreError,
)
from .journal import Journal, Op
from .retry import BACKGROUND, STORE_CALL, retrying
from .store.base import Store

log = logging.getLogger(__name__)

DELETES = ("delete_file", "delete_dir")
RENAME_THREADS = 16


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
                 journal_limiter: trio.CapacityLimiter, node_id: str = "") -> None:
        self.store: Store = RetryingStore(store)  # type: ignore[assignment]
        self.node_id = node_id or "node"
        self.journal = journal
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

    def load(self, ops: list[Op]) -> None:
        """Queue ops found in the journal at startup."""
        for op in ops:
            self.enqueue(op)
            self.recovered_seq = max(self.recovered_seq, op.seq)

    def enqueue(self, op: Op) -> None:
        """Queue an op already in the journal."""
        self._queue.append(op)
        self.last_seq = max(self.last_seq, op.seq)
        for p in (op.path, op.path2):
            if p is not None:
                self._pending_paths[p] += 1

    async def add(self, op: Op) -> None:
        """Queue an op already in the journal and wake the applier."""
        self.enqueue(op)
        async with self._changed:
            self._changed.notify_all()

    def is_pending(self, path: str) -> bool:
        """Whether an unapplied op touches `path` or one of its ancestors."""
        if not self._pending_paths:
            return False
        while True:
            if self._pending_paths.get(path):
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

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
            try:
                await trio.to_thread.run_sync(self._apply_sync, batch, limiter=self.limiter)
                self.last_error = None
            except StoreError as e:
                self.healthy = False
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("metadata op %s %s failed (retrying): %s", batch[0].kind,
                            batch[0].path, e)
                async with self._changed:
                    self._changed.notify_all()
                await trio.sleep(next(delays))
                continue
            except (CkptfsError, UnicodeError) as e:  # this op can never succeed: drop it
                self.last_error = f"dropped {batch[0].kind} {batch[0].path!r}: {e}"
                log.error("metadata op %s %r can never be applied, dropped: %s",
                          batch[0].kind, batch[0].path, e)
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
                for p in (op.path, op.path2):
                    if p is not None:
                        self._pending_paths[p] -= 1
                        if not self._pending_paths[p]:
                            del self._pending_paths[p]
                self.applied_seq = max(self.applied_seq, op.seq)
            self.applied_ops += len(batch)
            self.healthy = True
            async with self._changed:
                self._changed.notify_all()

    def statistics(self) -> dict[str, object]:
        return {"pending_ops": len(self._queue), "applied_ops": self.applied_ops,
                "last_error": self.last_error}

    # -- in a thread ---------------------------------------------------------------------
    def _apply_sync(self, batch: list[Op]) -> None:
        if batch[0].kind in DELETES:
            keys = [manifests.file_key(op.path) if op.kind == "delete_file"
                    else manifests.dir_key(op.path) for op in batch]
            self.store.delete_many(keys)
            return
        op = batch[0]
        if op.kind == "put_file":
            self.store.put(manifests.file_key(op.path), op.body or b"")
        elif op.kind == "put_dir":
            self.store.put(manifests.dir_key(op.path), op.body or b"")
        elif op.kind == "rename_file":
            assert op.path2 is not None
            self._rename_file(op.path, op.path2)
        elif op.kind == "rename_dir":
            assert op.path2 is not None
            intent = f"{manifests.INTENTS}{self.node_id}-{op.seq}.json"
            self.store.put(intent, json.dumps({
                "v": 1, "op": "rename_dir", "src": op.path, "dst": op.path2,
                "writer": self.node_id, "time": time.time()}).encode())
            crash_point("rename_dir_intent")
            try:
                self._rename_dir(op.path, op.path2)
            except InvalidKeyError:  # refused before any copy (check_length): never doable
                self.store.delete(intent)
                raise
            self.store.delete(intent)
        else:
            log.error("unknown op kind %r in journal, skipped", op.kind)

    def _rename_file(self, src: str, dst: str) -> None:
        try:
            self.store.copy(manifests.file_key(src), manifests.file_key(dst))
        except NotFoundError:
            if self.store.head(manifests.file_key(dst)) is None:
                log.warning("rename %s -> %s: source is gone from the store", src, dst)
            return  # replay after the copy and delete were done
        self.store.delete(manifests.file_key(src))

    def _rename_dir(self, src: str, dst: str) -> None:
        start = time.monotonic()
        old_prefix, new_prefix = manifests.dir_key(src), manifests.dir_key(dst)
        keys = [k for k, _ in self.store.list(old_prefix, delimiter=None).objects]
        for key in keys:  # a key too long for the store fails the rename before any copy
            self.store.check_length(new_prefix + key[len(old_prefix):])
        with ThreadPoolExecutor(RENAME_THREADS) as pool:
            list(pool.map(lambda k: self._copy_if_present(k, new_prefix + k[len(old_prefix):]),
                          keys))
        crash_point("rename_dir_copied")
        # children before their directory's marker: some stores (SeaweedFS) keep a marker
        # deleted while its directory still has entries
        self.store.delete_many(sorted(keys, reverse=True))
        # a directory without a marker of its own still gets one; but on a replay the old
        # marker may already have been moved: keep that one (its mode and mtime)
        if old_prefix not in keys and self.store.head(new_prefix) is None:
            self.store.put(new_prefix, b"")
        log.info("renamed directory %s -> %s (%d keys) in %.2fs", src, dst, len(keys),
                 time.monotonic() - start)

    def roll_forward_intents(self) -> int:
        """Finish directory renames that a lost or killed node left half done.

        Safe to run while the renaming node is still alive: every step is idempotent.
        """
        done = 0
        for key, _ in self.store.list(manifests.INTENTS, delimiter=None).objects:
            try:
                intent = json.loads(self.store.get(key))
                src = manifests.check_path(str(intent["src"]))
                dst = manifests.check_path(str(intent["dst"]))
                if intent.get("op") != "rename_dir":
                    raise FormatError(f"unknown intent {intent.get('op')!r}")
            except NotFoundError:
                continue  # its owner finished it meanwhile
            except (ValueError, KeyError, TypeError, FormatError, InvalidKeyError) as e:
                log.error("unreadable rename intent %s left alone: %s", key, e)
                continue
            log.warning("rolling forward the interrupted rename %s -> %s (by node %s)",
                        src, dst, intent.get("writer", "?"))
            try:
                self._rename_dir(src, dst)
            except InvalidKeyError as e:  # checked before any copy: nothing was changed
                log.error("rename intent %s can never be done, deleted: %s", key, e)
            self.store.delete(key)
            done += 1
        return done

    def _copy_if_present(self, src_key: str, dst_key: str) -> None:
        try:
            self.store.copy(src_key, dst_key)
        except NotFoundError:
            pass
