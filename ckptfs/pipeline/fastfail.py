"""When the fast tier fails: its health as one mount sees it, and its ops applied straight
to the object store meanwhile.

The fast tier is *unusable* when a write into it fails with one of UNUSABLE_ERRNOS (full,
over quota, read-only, no permission, a stale or lost network mount, an I/O error), and
when its ckptfs.json is missing: its file system is not mounted, and DIR is the bare
local directory underneath, which no other node sees. Health.check looks (the marker, a
small write) every PROBE_GAP seconds, and Health.judge at once when a call into the fast
tier fails. While it is unusable the uploader's chunks go to the object store
(TieredStore.writes_follow) and the publisher applies each op there (Direct), as a mount
without a fast tier does, keeping the order of this mount's ops: an op goes straight to
the object store only once this mount has no record left in the fast tier (else it waits
in the journal: Deferred). docs/FORMAT.md, "When the fast tier fails", is the
specification.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ckptfs.common.errors import (
    CorruptChunkError,
    Deferred,
    NotFoundError,
    StoreError,
)
from ckptfs.format import codec, manifests
from ckptfs.pipeline.fasttier import LEASES, Mover, _replace_body, record_key
from ckptfs.pipeline.journal import Op
from ckptfs.pipeline.publisher import RetryingStore
from ckptfs.store import LocalStore
from ckptfs.store.base import Store

log = logging.getLogger(__name__)

#: what a write into the fast tier fails with when the tier cannot take it (retrying
#: soon will not help; the object store can)
UNUSABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                             errno.EPERM, errno.ESTALE, errno.ENOTCONN, errno.EIO})
#: seconds between two probes of the fast tier (its marker and a small write)
PROBE_GAP = 3.0
PROBE_BYTES = 4096
#: free bytes below which a probe finds the fast tier full (else one freed page after a
#: failed chunk write would make it usable again, for the next chunk to fail)
PROBE_FREE = 64 * 2**20
#: op kinds whose old copies in the fast tier a direct apply must delete there first
CLEANED = ("delete_file", "delete_dir", "rename_file", "rename_dir")


def os_errno(error: BaseException) -> int | None:
    """The errno of the OSError behind a StoreError (LocalStore raises `from` it)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


class Health:
    """Whether the fast tier is usable, as this mount last found it; one warning line
    when it becomes unusable, one when it is usable again."""

    def __init__(self, fast: Store, url: str, owner: str) -> None:
        self.fast = fast
        self.url = url
        self.probe_key = f"{LEASES}probe-{owner}"
        self.usable = True
        self.mounted = True  # its ckptfs.json was there at the last look
        self.reason: str | None = None
        self.since: float | None = None  # time.time() it became unusable
        self.episodes = 0
        self.direct_ops = 0  # ops applied straight to the object store
        self._direct_bytes = 0  # bytes PUT there instead of into the fast tier
        self._lock = threading.Lock()
        #: told (in trio's thread) when a probe finds it usable again
        self.changed: Callable[[], object] = lambda: None

    def is_usable(self) -> bool:
        return self.usable

    def judge(self, error: StoreError) -> bool:
        """Whether `error`, raised by the fast tier, says that it is unusable (then it is
        marked so)."""
        number = os_errno(error)
        if number not in UNUSABLE_ERRNOS:
            return False
        self.down(f"{errno.errorcode.get(number or 0, number)}: {error}")
        return True

    def down(self, reason: str, mounted: bool = True) -> None:
        with self._lock:
            self.mounted = self.mounted and mounted
            if not self.usable:
                return
            self.usable, self.reason, self.since = False, reason, time.time()
            self.episodes += 1
        log.warning("fast tier %s unusable (%s): writing straight to the object store "
                    "until a probe finds it usable again", self.url, reason)

    def up(self) -> None:
        with self._lock:
            self.mounted = True
            if self.usable:
                return
            took = time.time() - (self.since or time.time())
            self.usable, self.reason, self.since = True, None, None
        log.warning("fast tier %s usable again after %.0f s: writing to it again",
                    self.url, took)

    def marker(self) -> bool:
        """Whether the fast tier's ckptfs.json is there (else it is marked unusable:
        DIR is the bare directory its file system was mounted on)."""
        try:
            if self.fast.head(manifests.INFO_KEY) is not None:
                self.mounted = True
                return True
        except StoreError as e:
            if not self.judge(e):
                self.down(f"{type(e).__name__}: {e}")
            return False
        self.down(f"{manifests.INFO_KEY} is missing: its file system is not mounted?",
                  mounted=False)
        return False

    def check(self) -> bool:
        """In a thread: the marker, then a small write and its delete; whether the fast
        tier is usable (and marked so)."""
        if not self.marker():
            return False
        free = self._free()
        if free is not None and free < PROBE_FREE:
            self.down(f"full: {free // 2**20} MiB free, under {PROBE_FREE // 2**20} MiB")
            return False
        try:
            self.fast.put(self.probe_key, bytes(PROBE_BYTES))
            self.fast.delete(self.probe_key)
        except StoreError as e:
            if not self.judge(e):
                self.down(f"{type(e).__name__}: {e}")
            return False
        if not self.marker():  # unmounted during the probe: the write went underneath
            return False
        self.up()
        return True

    def _free(self) -> int | None:
        """Bytes free to this user on the fast tier's file system (None: not known)."""
        if not isinstance(self.fast, LocalStore):
            return None
        try:
            st = os.statvfs(self.fast.root)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe every PROBE_GAP seconds; cancel to stop."""
        task_status.started()
        while True:
            await trio.sleep(PROBE_GAP)
            was = self.usable
            if await trio.to_thread.run_sync(self.check) and not was:
                self.changed()

    def count_direct(self, nbytes: int, ops: int = 0) -> None:
        with self._lock:
            self._direct_bytes += nbytes
            self.direct_ops += ops

    @property
    def direct_bytes(self) -> int:
        return self._direct_bytes

    def statistics(self) -> dict[str, Any]:
        return {"fast_usable": self.usable, "fast_unusable_reason": self.reason,
                "fast_unusable_since": self.since, "fast_unusable_episodes": self.episodes,
                "fast_direct_ops": self.direct_ops, "fast_direct_bytes": self.direct_bytes}


class DirectStore:
    """The object store as a directly applied op sees it: a HEAD of a chunk it lacks
    copies the chunk from the fast tier first where that has it (verified against its
    name), so that a manifest published here never names a chunk left in the fast tier."""

    def __init__(self, slow: Store, fast: Store, health: Health) -> None:
        self.slow = slow
        self.fast = fast
        self.health = health

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slow, name)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.slow.put(key, data)
        self.health.count_direct(len(data))

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.slow.put_parts(key, parts)  # chunks PUT from the staging file
        self.health.count_direct(sum(len(p) for p in parts))

    def head(self, key: str) -> int | None:
        size = self.slow.head(key)
        if size is not None or not key.startswith(manifests.CHUNKS):
            return size
        chunk_hash = manifests.chunk_name(key)
        try:
            blob = self.fast.get(key, codec.MAX_OBJECT_SIZE)
            with codec.decoded(blob, chunk_hash or ""):
                pass
        except (NotFoundError, CorruptChunkError):
            return None  # the publisher puts it from the staging file, or reports it lost
        except StoreError as e:
            if self.health.judge(e):
                return None
            raise
        self.slow.put(key, blob)
        self.health.count_direct(len(blob))
        return len(blob)


class Direct:
    """The publisher's hooks for an unusable fast tier (Publisher.route, before_direct,
    after_direct): which batches go straight to the object store, and what that takes."""

    def __init__(self, fast: Store, slow: Store, health: Health, mover: Mover) -> None:
        self.fast = fast
        self.slow = slow
        self.health = health
        self.mover = mover
        self.store: Store = RetryingStore(DirectStore(slow, fast, health))  # type: ignore
        #: path -> the generation of the manifest last published here (the Recorder's
        #: floor once the fast tier is back: its copy there may be older)
        self.generations: dict[str, int] = {}
        self._waiting: str | None = None  # why the batch waits, said once

    def route(self, batch: list[Op]) -> Store | None:
        """In trio's thread: None while the fast tier is usable; else the object store
        once no record of this mount is left in the fast tier but the batch's own
        (written before the tier failed, and only while it is mounted); else Deferred."""
        if self.health.usable:
            self._waiting = None
            return None
        seqs = {op.seq for op in batch}
        left = [s for s in self.mover.own_seqs() if s not in seqs]
        if left:
            self._defer(f"{len(left)} earlier changes of this mount are still in the fast "
                        f"tier: they go to the object store first")
        if len(left) < len(self.mover.own_seqs()) and not self.health.mounted:
            self._defer("this change's record is in the fast tier, which is not mounted")
        self._waiting = None
        return self.store

    def _defer(self, why: str) -> None:
        if why != self._waiting:
            log.info("metadata ops wait in the journal: %s", why)
            self._waiting = why
        raise Deferred(why)

    def before(self, batch: list[Op]) -> list[Op]:
        """In the publisher's thread, before the batch is applied to the object store
        (Deferred where a step cannot be done: nothing is applied then): a delete's or
        rename's old copies deleted from the fast tier (else its listing would show them
        again); this mount's records of the batch (written before the tier failed)
        deleted from it (else a mover would apply them again after a later op; the
        journal holds the ops until they are applied); each put_file's manifest given a
        generation above both tiers' copies."""
        for op in batch:
            if op.kind in CLEANED:
                self._clean(op)
        self._drop_records(batch)
        out = []
        for op in batch:
            if op.kind == "put_file" and op.body:
                gen = self._generation(op.path)
                op = _replace_body(op, manifests.with_generation(op.body, gen))
                self.generations[op.path] = gen
            out.append(op)
        return out

    def after(self, batch: list[Op]) -> None:
        """In the publisher's thread, once the batch is in the object store: counted (its
        bytes were, as the store took them)."""
        self.health.count_direct(0, len(batch))

    def _drop_records(self, batch: list[Op]) -> None:
        own = set(self.mover.own_seqs())
        for op in batch:
            if op.seq not in own:
                continue
            if not self.health.marker():
                self._defer("this change's record is in the fast tier, which is not mounted")
            try:
                self.fast.delete(record_key(self.mover.queue, op.seq))
            except NotFoundError:
                pass
            except StoreError as e:
                self.health.judge(e)
                self._defer(f"cannot delete this change's record from the fast tier ({e}): "
                            f"it waits until the tier is back")
            self.mover.forget(op.seq)

    def _clean(self, op: Op) -> None:
        """Delete from the fast tier its copies of the keys the op removes or replaces."""
        keys = []
        for path in (op.path, op.path2):
            if path is None:
                continue
            if op.kind in ("delete_dir", "rename_dir"):
                prefix = manifests.dir_key(path)
                keys.append(prefix)
                try:
                    keys += [k for k, _ in self.fast.list(prefix, delimiter=None).objects]
                except StoreError as e:
                    self.health.judge(e)
                    self._defer(f"cannot list {path} in the fast tier ({e})")
            else:
                keys.append(manifests.file_key(path))
        if not self.health.marker():
            self._defer(f"a {op.kind.replace('_', ' ')} waits until the fast tier is "
                        f"mounted again (its copies there must go first)")
        try:
            self.fast.delete_many(sorted(set(keys), reverse=True))
        except StoreError as e:
            self.health.judge(e)
            self._defer(f"a {op.kind.replace('_', ' ')} waits until the fast tier takes "
                        f"deletes again ({e})")

    def _generation(self, path: str) -> int:
        """Above the present time (ns) and the generations of both tiers' copies (the
        fast tier's where it can be read)."""
        current = self.generations.get(path, 0)
        tiers = [self.slow] + ([self.fast] if self.health.mounted else [])
        for tier in tiers:
            try:
                current = max(current, manifests.generation(
                    tier.get_record(manifests.file_key(path))))
            except NotFoundError:
                pass
            except StoreError as e:
                if tier is self.slow or not self.health.judge(e):
                    raise
        return max(time.time_ns(), current + 1)
