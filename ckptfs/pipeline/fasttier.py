"""The fast tier's pending records and leases, and the mover that brings them to the store.

A mount with `--fast-tier DIR` publishes every metadata op to the fast tier (a directory
store every node shares, same layout), after first writing the op there as a *pending
record* `pending/<queue>/<seq>` (queue: the publishing mount's node id and cache id; seq:
its journal sequence number). A *mover* replays each queue's records on the object store
strictly in seq order, a put_file's chunks copied first and its manifest PUT only when the
object store's manifest at that path has a lower generation (`gen`, which fast-tier
mounts add to manifests), then deletes the record. A queue is moved by the mount that
owns it while that mount renews its *lease* `leases/<queue>` (the record's store time is
the renewal); any mount of the fast tier, or `ckptfs drain`, takes over a queue whose
lease is older than the lease time, by an atomic rename of the old lease and a create-
exclusive of its own. docs/FORMAT.md, "The fast tier", is the specification.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    CkptfsError,
    ConfigError,
    CorruptChunkError,
    Deferred,
    FormatError,
    NotFoundError,
    StoreError,
)
from ckptfs.common.retry import BACKGROUND
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest
from ckptfs.pipeline.journal import Journal, Op
from ckptfs.pipeline.publisher import Publisher, RetryingStore
from ckptfs.store import LocalStore, open_store
from ckptfs.store.base import Store
from ckptfs.store.tiered import TieredStore

log = logging.getLogger(__name__)

PENDING = "pending/"
LEASES = "leases/"
#: seconds a lease lasts unless renewed (the test-only CKPTFS_FAST_LEASE shortens it)
DEFAULT_LEASE = 60.0
LEASE_ENV = "CKPTFS_FAST_LEASE"
RECORD_VERSION = 1
#: seconds at least between two trims of the fast tier by one mover (Mover.trim)
TRIM_GAP = 2.0


def lease_seconds() -> float:
    """The lease time: DEFAULT_LEASE, or CKPTFS_FAST_LEASE (seconds) where set."""
    text = os.environ.get(LEASE_ENV, "")
    try:
        value = float(text) if text else DEFAULT_LEASE
    except ValueError:
        value = DEFAULT_LEASE
    return value if value > 0 else DEFAULT_LEASE


def record_key(queue: str, seq: int) -> str:
    return f"{PENDING}{queue}/{seq:012d}"


def lease_key(queue: str) -> str:
    return f"{LEASES}{queue}"


@dataclass(frozen=True)
class Record:
    """One pending record: the op as its mount journaled it, and the trash time of that
    mount (the object store's delete keeps what it removes as the mount would have)."""

    queue: str
    op: Op
    trash_keep: float = 0.0

    def to_json(self) -> bytes:
        op = self.op
        return json.dumps({
            "v": RECORD_VERSION, "queue": self.queue, "seq": op.seq, "kind": op.kind,
            "path": op.path, "path2": op.path2,
            "body": None if op.body is None else base64.b64encode(op.body).decode(),
            "journaled_at": op.journaled_at, "trash_keep": self.trash_keep,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> Record:
        try:
            d = json.loads(blob)
            if not isinstance(d, dict) or d.get("v") != RECORD_VERSION:
                raise ValueError("not a version 1 pending record")
            body = d.get("body")
            op = Op(int(d["seq"]), str(d["kind"]), str(d["path"]),
                    None if d.get("path2") is None else str(d["path2"]),
                    None if body is None else base64.b64decode(body),
                    None if d.get("journaled_at") is None else float(d["journaled_at"]))
            return cls(str(d["queue"]), op, float(d.get("trash_keep") or 0.0))
        except (ValueError, KeyError, TypeError, UnicodeError) as e:
            raise FormatError(f"damaged pending record: {e}") from None

    @property
    def key(self) -> str:
        return record_key(self.queue, self.op.seq)


def record_file_bytes(record: Record) -> int:
    """The size of the file a put_file record publishes (0 for other ops, or a manifest
    that does not parse): what the record still holds back from the object store."""
    if record.op.kind != "put_file" or not record.op.body:
        return 0
    try:
        m = Manifest.from_json(record.op.body)
    except FormatError:
        return 0
    return 0 if m.is_symlink else m.size


def held(op: Op) -> bool:
    """Whether a mount keeps an op's paths pending after the fast tier has it, until the
    object store has it too: deletes and renames (the object store still shows the old
    names until then)."""
    return op.kind in ("delete_file", "delete_dir", "rename_file", "rename_dir")


def newer_manifest(fast: bytes, slow: bytes) -> bool:
    """TieredStore's choice between two copies of one manifest: the fast tier's unless
    the object store's has a higher generation."""
    return manifests.generation(fast) >= manifests.generation(slow)


def attach(url: str, store: Store, create: bool = True) -> Store:
    """The fast tier at `url` (a directory store) for `store`: its ckptfs.json a copy of
    the store's, written at first use (unless not `create`: a tool that only looks);
    ConfigError when it is not a directory, holds another store's, or (not `create`)
    holds none."""
    try:
        fast = open_store(url)
    except ConfigError as e:
        raise ConfigError(f"--fast-tier {url}: {e}") from None
    if not isinstance(fast, LocalStore):
        fast.close()
        raise ConfigError(f"--fast-tier {url}: want a directory (on a file system every "
                          f"node shares), not an object store")
    info = store.get_record(manifests.INFO_KEY)
    try:  # read first: a full or read-only fast tier is mounted all the same (fastfail.py)
        present: bytes | None = fast.get_record(manifests.INFO_KEY)
    except NotFoundError:
        present = None
    if present is None and not create:
        fast.close()
        raise ConfigError(f"--fast-tier {url} is not a fast tier of {store.url} (no "
                          f"{manifests.INFO_KEY} there): give the --fast-tier its mounts use")
    if present is None and not fast.put_if_absent(manifests.INFO_KEY, info):
        present = fast.get_record(manifests.INFO_KEY)
    if present is not None and present != info:
        fast.close()
        raise ConfigError(f"--fast-tier {url} belongs to another store (its ckptfs.json "
                          f"differs from {store.url}'s): give each store its own")
    return fast


def view(fast: Store, slow: Store) -> TieredStore:
    """What readers see of a store with a fast tier: both tiers, a manifest both hold at
    its higher generation, rename intents from the fast tier alone."""
    return TieredStore(fast, slow, manifests.FILES, newer_manifest,
                       fast_only=(manifests.INTENTS,))


# -- the fast tier's side of a publish ---------------------------------------------------


class Recorder:
    """Writes the pending record of each op before the publisher applies it to the fast
    tier (Publisher.before_apply), giving a put_file's manifest its generation."""

    def __init__(self, fast: Store, queue: str, trash_keep: float,
                 recorded: Callable[[Record], None]) -> None:
        self.fast = fast
        self.queue = queue
        self.trash_keep = trash_keep
        self.recorded = recorded  # told of each record (the mover's own queue)
        #: whether an error of the fast tier says it is unusable (fastfail.Health.judge)
        self.fast_failed: Callable[[StoreError], bool] = lambda e: False
        #: whether its ckptfs.json is there (fastfail.Health.marker): checked before and
        #: after each batch's records, so that none is left unknown in the bare directory
        #: of an unmounted fast tier
        self.mounted: Callable[[], bool] = lambda: True
        #: path -> a generation the next one must exceed (fastfail.Direct.generations:
        #: published straight to the object store while the fast tier was unusable)
        self.floor: dict[str, int] = {}

    def before_apply(self, batch: list[Op]) -> list[Op]:
        """In the publisher's thread: the batch with each put_file's body given a `gen`,
        each op recorded in the fast tier first (a replay reuses the record it finds).
        Deferred when the fast tier fails (the publisher routes the batch again)."""
        try:
            return self._record(batch)
        except StoreError as e:
            if isinstance(e, Deferred) or not self.fast_failed(e):
                raise
            raise Deferred(f"the fast tier failed: {e}") from e

    def _record(self, batch: list[Op]) -> list[Op]:
        if not self.mounted():
            raise Deferred("the fast tier is not mounted")
        out = []
        for op in batch:
            key = record_key(self.queue, op.seq)
            try:
                record = Record.from_json(self.fast.get_record(key))
            except (NotFoundError, FormatError):
                if op.kind == "put_file" and op.body:
                    op = _replace_body(op, manifests.with_generation(
                        op.body, self._next_generation(op.path)))
                record = Record(self.queue, op, self.trash_keep)
                self.fast.put(key, record.to_json())
            crash_point("fast_recorded")
            self.recorded(record)
            out.append(record.op)
        if not self.mounted():  # unmounted meanwhile: a record may be in the bare directory
            raise Deferred("the fast tier is not mounted")  # kept in own: later ops wait
        return out

    def _next_generation(self, path: str) -> int:
        """Above the present time (ns), the fast tier's current version's and the floor."""
        try:
            current = manifests.generation(self.fast.get_record(manifests.file_key(path)))
        except NotFoundError:
            current = 0
        return max(time.time_ns(), current + 1, self.floor.get(path, 0) + 1)


def _replace_body(op: Op, body: bytes) -> Op:
    return Op(op.seq, op.kind, op.path, op.path2, body, op.journaled_at, op.staging_id)


# -- moving one record -------------------------------------------------------------------


@dataclass
class Moved:
    """What moves did, for progress lines."""

    records: int = 0
    chunks: int = 0
    chunk_bytes: int = 0
    lost: int = 0
    file_bytes: int = 0  # the sizes of the put_file records moved (metrics, status)


class Replayer:
    """Applies pending records to the object store, one at a time (blocking)."""

    def __init__(self, fast: Store, slow: Store) -> None:
        self.fast = fast
        self.slow: Store = RetryingStore(slow)  # type: ignore[assignment]
        self._publishers: dict[tuple[str, float], Publisher] = {}
        self.moved = Moved()
        #: called between chunk copies: the caller renews the lease it moves under
        self.keep_alive: Callable[[], object] = lambda: None

    def _publisher(self, record: Record) -> Publisher:
        """The op applier of the record's mount (its node id names trash batches and
        rename intents as that mount would have)."""
        key = (record.queue, record.trash_keep)
        if key not in self._publishers:
            # only _apply_sync and present_or_restored are used: no journal, no task
            self._publishers[key] = Publisher(self.slow, cast(Journal, None),
                                              trio.CapacityLimiter(1), record.queue,
                                              trash_keep=record.trash_keep)
        return self._publishers[key]

    def read(self, key: str) -> Record | None:
        """The record at `key`; None if it is gone (moved meanwhile) or damaged (logged,
        and left for the operator: it is never taken for "nothing to move")."""
        try:
            return Record.from_json(self.fast.get_record(key))
        except NotFoundError:
            return None
        except FormatError as e:
            log.error("pending record %s left alone: %s", key, e)
            return None

    def move(self, record: Record) -> None:
        """Bring the record's op into the object store, then delete the record. StoreError
        when a store fails (retry later); an op that can never be applied is dropped."""
        op = record.op
        try:
            if op.kind == "put_file":
                self._put_file(record)
            else:
                self._publisher(record)._apply_sync([op])
        except StoreError:
            raise
        except (CkptfsError, UnicodeError) as e:
            log.error("pending %s %r of %s can never be applied to the store, dropped: %s",
                      op.kind, op.path, record.queue, e)
        crash_point("fast_moved")
        self.fast.delete(record.key)
        self.moved.records += 1
        self.moved.file_bytes += record_file_bytes(record)

    def _put_file(self, record: Record) -> None:
        body = record.op.body or b""
        try:
            manifest: Manifest | None = Manifest.from_json(body)
        except FormatError:
            manifest = None
        if manifest is not None and manifest.chunks:
            start = time.monotonic()
            chunks = sorted({h for h, _ in manifest.chunks})
            self._copy_chunks(record, chunks)
            if time.monotonic() - start > manifests.CONFIRM_WINDOW:  # rule W3: see again
                self._copy_chunks(record, chunks)
        key = manifests.file_key(record.op.path)
        gen = manifests.generation(body)
        for _ in range(3):  # PUT, then look again: a mover's late PUT of an older version
            if self._slow_generation(key) >= gen:  # may have landed over this one
                return
            self.slow.put(key, body)
            crash_point("fast_manifest_put")
        log.warning("%s: the store's manifest keeps changing under the mover", record.op.path)

    def _slow_generation(self, key: str) -> int:
        try:
            return manifests.generation(self.slow.get_record(key))
        except NotFoundError:
            return -1

    def _copy_chunks(self, record: Record, chunks: list[str]) -> None:
        publisher = self._publisher(record)
        results = []
        with ThreadPoolExecutor(LIMITS.confirm_threads) as pool:
            for how in pool.map(lambda h: self._copy_chunk(publisher, h), chunks):
                results.append(how)
                self.keep_alive()  # a large file takes longer than a lease
        for chunk_hash, how in zip(chunks, results, strict=True):
            if how is None:
                self.moved.lost += 1
                log.error("DATA LOST: %s (pending record of %s): chunk %s is neither in the "
                          "fast tier nor in the store; the manifest is published all the "
                          "same", record.op.path, record.queue, chunk_hash)

    def _copy_chunk(self, publisher: Publisher, chunk_hash: str) -> str | None:
        """'present', 'fossil' (copied back in the store) or 'copied' (from the fast
        tier); None if it is nowhere."""
        how = publisher.present_or_restored(chunk_hash)  # a HEAD: rule W1 to W3
        if how is not None:
            return how
        key = manifests.chunk_key(chunk_hash)
        try:
            blob = self.fast.get(key, codec.MAX_OBJECT_SIZE)
            with codec.decoded(blob, chunk_hash):  # never a damaged copy into the store
                pass
        except NotFoundError:
            return None
        except CorruptChunkError as e:
            log.error("chunk %s is damaged in the fast tier: %s", chunk_hash, e)
            return None
        self.slow.put(key, blob)
        self.moved.chunks += 1
        self.moved.chunk_bytes += len(blob)
        return "copied"

    def queue_keys(self, queue: str) -> list[str]:
        """The keys of the queue's records, in seq order."""
        return sorted(k for k, _ in self.fast.list(f"{PENDING}{queue}/", delimiter=None).objects)


def queues(fast: Store) -> list[str]:
    """The queues that hold pending records."""
    return sorted(p[len(PENDING):].rstrip("/") for p in fast.list(PENDING).prefixes)


# -- leases ------------------------------------------------------------------------------


class Leases:
    """The leases of the fast tier's queues, as seen by one mover (`owner`)."""

    def __init__(self, fast: Store, owner: str, lease: float) -> None:
        self.fast = fast
        self.owner = owner
        self.lease = lease

    def _body(self) -> bytes:
        return json.dumps({"v": 1, "owner": self.owner}).encode()

    def owner_of(self, queue: str) -> str | None:
        try:
            d = json.loads(self.fast.get_record(lease_key(queue)))
            return str(d.get("owner")) if isinstance(d, dict) else ""
        except NotFoundError:
            return None
        except (ValueError, FormatError):
            return ""

    def renew(self, queue: str) -> bool:
        """Renew the lease on `queue` if this mover holds it, or take it if nobody does;
        False when another mover holds it."""
        owner = self.owner_of(queue)
        if owner is None:
            return self.fast.put_if_absent(lease_key(queue), self._body())
        if owner != self.owner:
            return False
        self.fast.put(lease_key(queue), self._body())
        return True

    def store_now(self) -> float:
        """The fast tier's present time (its file system's clock): a probe's mtime."""
        key = f"{LEASES}clock-{self.owner}"
        self.fast.put(key, b"")
        info = self.fast.stat(key)
        self.fast.delete(key)
        return info.mtime if info is not None else time.time()

    def age(self, queue: str, now: float) -> float | None:
        """Seconds since the queue's lease was renewed; None if there is none."""
        info = self.fast.stat(lease_key(queue))
        return None if info is None else now - info.mtime

    def take_over(self, queue: str, now: float) -> bool:
        """Take the queue's lease: renew() if this mover may; else, when the lease is
        older than the lease time, claim that lease (a create-exclusive of a key named
        after it: of the movers that found it run out, one wins) and replace it. A claim
        older than the lease time is one whose mover died before replacing the lease:
        it is claimed the same way (a key named after that claim), else the queue would
        stay blocked for good."""
        if self.renew(queue):
            return True
        key = lease_key(queue)
        info = self.fast.stat(key)
        if info is None or now - info.mtime <= self.lease:
            return False  # held; or released meanwhile: renew() takes it next time
        lease_token, stale = info.token, []
        while True:
            claim = f"{key}.claim-{hashlib.sha256(info.token.encode()).hexdigest()[:16]}"
            if self.fast.put_if_absent(claim, self._body()):
                break
            found = self.fast.stat(claim)
            if found is None or now - found.mtime <= self.lease:
                return False  # another mover claimed this lease first
            stale.append(claim)
            info = found
        current = self.fast.stat(key)
        if current is None or current.token != lease_token:
            self.fast.delete(claim)  # a claim deleted by the mover that won it, made again
            return False
        self.fast.put(key, self._body())
        for done in (claim, *stale):
            self.fast.delete(done)
        return True

    def release(self, queue: str) -> None:
        """Drop the lease if this mover holds it."""
        if self.owner_of(queue) == self.owner:
            self.fast.delete(lease_key(queue))


def mover_id(kind: str = "drain") -> str:
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def move_queue(replayer: Replayer, leases: Leases, queue: str,
               ready: Callable[[Record], bool] | None = None,
               stop: Callable[[], bool] | None = None) -> bool:
    """Move the queue's records in order while this mover holds its lease (renewed
    between records); stop at the first that is not `ready`, or when `stop()` says so.
    True when the queue was found empty."""
    renewed = time.monotonic()

    def keep_alive() -> None:
        nonlocal renewed
        if time.monotonic() - renewed > leases.lease / 3:
            leases.renew(queue)
            renewed = time.monotonic()

    replayer.keep_alive = keep_alive
    for key in replayer.queue_keys(queue):
        if stop is not None and stop():
            return False
        record = replayer.read(key)
        if record is None:
            continue
        if ready is not None and not ready(record):
            return False
        if time.monotonic() - renewed > leases.lease / 3:
            if not leases.renew(queue):
                return False  # taken over: this mover was thought dead
            renewed = time.monotonic()
        replayer.move(record)
    return not replayer.queue_keys(queue)


# -- the mount's mover -------------------------------------------------------------------


class Mover:
    """A fast-tier mount's task: its own queue moved as soon as each op is applied to the
    fast tier (and a put_file's chunks are there), other queues once their lease ran out."""

    def __init__(self, fast: Store, slow: Store, queue: str,
                 applied: Callable[[int], bool], chunk_pending: Callable[[str], bool],
                 lease: float | None = None) -> None:
        self.fast = fast
        self.queue = queue
        self.applied = applied  # the publisher's: is op seq applied to the fast tier?
        self.chunk_pending = chunk_pending  # the uploader's: not in the fast tier yet
        self.replayer = Replayer(fast, slow)
        self.leases = Leases(fast, queue, lease or lease_seconds())
        self.own: dict[int, Record] = {}  # recorded, not yet moved
        self._own_lock = threading.Lock()  # own: the publisher's thread adds to it
        self._lease_at = -float("inf")  # when this mount last renewed its own lease
        self._wake = trio.Event()
        self.healthy = True
        self.last_error: str | None = None
        #: told of each own record moved (publisher: its paths may be listed again)
        self.on_moved: Callable[[Op], None] | None = None
        #: the fast tier's retention (fastkeep.trim), run in a thread once this mount's
        #: records are all moved, after it moved some or another queue was looked at
        self.trim: Callable[[], object] | None = None
        self._trim_due = True
        self._trim_at = -float("inf")
        #: the fast tier's health (fastfail.Health), where it can fail: whether it is
        #: usable, whether an error of it says it is not, whether its ckptfs.json is
        #: there (a thread's check: an unmounted tier's bare directory lacks it)
        self.fast_usable: Callable[[], bool] = lambda: True
        self.fast_failed: Callable[[StoreError], bool] = lambda e: False
        self.fast_mounted: Callable[[], bool] = lambda: True
        self._sizes: dict[int, int] = {}  # seq -> file size, of pending_files()

    def recorded(self, record: Record) -> None:
        """Recorder's callback, from the publisher's thread."""
        with self._own_lock:
            self.own[record.op.seq] = record

    def own_seqs(self) -> list[int]:
        """The seqs of this mount's records not yet moved."""
        with self._own_lock:
            return sorted(self.own)

    def forget(self, seq: int) -> None:
        """A record of this mount deleted unmoved: its op went straight to the store."""
        with self._own_lock:
            self.own.pop(seq, None)

    def wake(self) -> None:
        self._wake.set()

    def pending_count(self) -> int:
        return len(self.own)

    def last_recorded(self) -> int:
        """The highest seq of this mount's records not yet moved (0: none)."""
        with self._own_lock:
            return max(self.own, default=0)

    def moved_through(self, seq: int) -> bool:
        """No record of this mount with a seq at or below `seq` is left to move."""
        with self._own_lock:
            return not any(s <= seq for s in self.own)

    def _ready(self, record: Record) -> bool:
        op = record.op
        if not self.applied(op.seq):
            return False
        if op.kind == "put_file" and op.body:
            try:
                m = Manifest.from_json(op.body)
            except FormatError:
                return True
            return not any(self.chunk_pending(h) for h, _ in m.chunks)
        return True

    def _load_own(self) -> None:
        for key in self.replayer.queue_keys(self.queue):
            record = self.replayer.read(key)
            if record is not None:
                with self._own_lock:
                    self.own.setdefault(record.op.seq, record)

    def _hold_own(self) -> bool:
        """Renew (or take back) the lease on this mount's queue when a third of the lease
        time has passed since it last did; whether this mount holds it."""
        if time.monotonic() - self._lease_at < self.leases.lease / 3:
            return True
        try:
            if not self.leases.take_over(self.queue, self.leases.store_now()):
                return False  # another mover holds it (this mount was thought dead): wait
        except StoreError as e:
            # a full fast tier takes no renewal, but deletes: this mount may go on moving
            # while its lease is surely not run out (renewed within 2/3 of the lease time)
            if self.fast_failed(e) and (time.monotonic() - self._lease_at
                                        < self.leases.lease * 2 / 3):
                return True
            raise
        self._lease_at = time.monotonic()
        return True

    async def _move_own(self) -> None:
        """Move this mount's records that are ready, in order: which ones is decided here,
        in trio (the publisher's and uploader's state is trio's); the moves run in a
        thread; the publisher hears of each moved op here too."""
        with self._own_lock:
            todo = sorted(self.own.items())
        ready = []
        for _, record in todo:
            if not self._ready(record):
                break
            ready.append(record)
        if not ready:
            return
        moved: list[Op] = []
        try:
            await trio.to_thread.run_sync(self._move_records, ready, moved)
        finally:
            if self.on_moved is not None:
                for op in moved:
                    self.on_moved(op)

    def _move_records(self, records: list[Record], moved: list[Op]) -> None:
        """In a thread: move `records` (this mount's, ready, in order) while this mount
        holds its queue's lease; each moved op is appended to `moved`."""
        if not self.fast_usable():
            if not self.fast_mounted():
                return  # its records are hidden: never taken for moved
            # this mount may not renew its lease (a read-only tier): another node's mover
            # may have taken the queue and moved some, in order, meanwhile
            while records and self.replayer.read(records[0].key) is None:
                if not self.fast_mounted():
                    return
                self._moved(records.pop(0), moved)
        if not records or not self._hold_own():
            return
        self.replayer.keep_alive = self._hold_own
        for record in records:
            current = self.replayer.read(record.key)  # None: another mover moved it
            if current is None and not self.fast_mounted():
                return  # or the tier was unmounted meanwhile
            if current is not None:
                self.replayer.move(current)
            self._moved(record, moved)

    def _moved(self, record: Record, moved: list[Op]) -> None:
        with self._own_lock:
            del self.own[record.op.seq]
        moved.append(record.op)
        self._trim_due = True

    def _move_others(self) -> None:
        now = self.leases.store_now()
        for queue in queues(self.fast):
            if queue == self.queue:
                continue
            age = self.leases.age(queue, now)
            if age is not None and age <= self.leases.lease:
                continue
            if self.leases.take_over(queue, now):
                log.warning("moving the pending records of %s (its lease ran out)", queue)
                if move_queue(self.replayer, self.leases, queue):
                    self.leases.release(queue)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Move forever; cancel to stop."""
        try:
            await trio.to_thread.run_sync(self._hold_own)  # before the first record
            await trio.to_thread.run_sync(self._load_own)
        except StoreError as e:
            if not self.fast_failed(e):
                raise  # an unusable fast tier: the publisher goes straight to the store
        task_status.started()
        delays = BACKGROUND.delays()
        others_at = 0.0
        while True:
            self._wake = trio.Event()
            try:
                await self._move_own()
                if not self.fast_usable():
                    pass  # other queues and trimming wait until it is usable again
                elif time.monotonic() - others_at > self.leases.lease / 3:
                    others_at = time.monotonic()
                    await trio.to_thread.run_sync(self._hold_own)
                    await trio.to_thread.run_sync(self._move_others)
                    self._trim_due = True
                if (self.trim is not None and self._trim_due and not self.own
                        and self.fast_usable()
                        and time.monotonic() - self._trim_at >= TRIM_GAP):
                    self._trim_due, self._trim_at = False, time.monotonic()
                    await trio.to_thread.run_sync(self.trim)
                self.healthy, self.last_error = True, None
                delays = BACKGROUND.delays()
                with trio.move_on_after(0.2 if self.own else self.leases.lease / 3):
                    await self._wake.wait()
            except StoreError as e:
                self.healthy = False
                self.last_error = f"{type(e).__name__}: {e}"
                if not self.fast_failed(e):  # else said once, by the fast tier's health
                    log.warning("moving pending records to the store failed (retrying): %s",
                                e)
                await trio.sleep(next(delays))

    async def wait_moved(self) -> None:
        """Until this mount's records are all in the object store."""
        while self.own:
            self.wake()
            await trio.sleep(0.1)

    def finish(self) -> None:
        """At unmount, once nothing of this mount is pending: its lease goes."""
        if not self.own:
            self.leases.release(self.queue)

    def statistics(self) -> dict[str, object]:
        moved = self.replayer.moved
        return {"fast_pending_records": len(self.own), "fast_moved_records": moved.records,
                "fast_last_error": self.last_error,
                # what `status` and the metrics show of what is left to move
                "fast_pending_bytes": sum(size for _, size in self.pending_files()),
                "fast_moved_bytes": moved.file_bytes, "fast_moved_chunks": moved.chunks,
                "fast_copied_bytes": moved.chunk_bytes, "fast_lost_chunks": moved.lost}

    def pending_files(self) -> list[tuple[str, int]]:
        """(path, size) of this mount's put_file records not yet moved, in seq order:
        files in the fast tier that the object store does not have yet (fast-durable,
        not durable). Each record's manifest is parsed once (status asks every second)."""
        with self._own_lock:
            own = sorted(self.own.items())
        sizes = {seq: self._sizes.get(seq) for seq, _ in own}
        out = []
        for seq, record in own:
            if record.op.kind != "put_file":
                continue
            size = sizes[seq]
            if size is None:
                size = record_file_bytes(record)
            sizes[seq] = size
            out.append((record.op.path, size))
        self._sizes = {seq: size for seq, size in sizes.items() if size is not None}
        return out


# -- ckptfs drain ------------------------------------------------------------------------


@dataclass
class DrainState:
    """What a drain has done and what is left, for its progress lines."""

    moved: Moved
    left: int  # records still pending
    waiting: dict[str, float]  # queue -> seconds since its lease was renewed (held)
    error: str | None = None


def drain(fast: Store, slow: Store, progress: Callable[[DrainState], None],
          deadline: float | None = None, lease: float | None = None) -> bool:
    """Move every pending record of the fast tier into the store, waiting for the leases
    that live movers hold (a mount moves its own queue meanwhile); True once none is
    left, False at `deadline` (time.monotonic()). Store errors are retried."""
    replayer = Replayer(fast, slow)
    leases = Leases(fast, mover_id(), lease or lease_seconds())
    delays = BACKGROUND.delays()
    while True:
        error = None
        waiting: dict[str, float] = {}
        try:
            now = leases.store_now()
            for queue in queues(fast):
                if leases.take_over(queue, now):
                    try:
                        move_queue(replayer, leases, queue,
                                   stop=lambda: deadline is not None
                                   and time.monotonic() > deadline)
                    finally:
                        leases.release(queue)
                else:
                    waiting[queue] = leases.age(queue, now) or 0.0
            left = sum(len(replayer.queue_keys(q)) for q in queues(fast))
        except StoreError as e:
            error, left = f"{type(e).__name__}: {e}", -1
        progress(DrainState(replayer.moved, left, waiting, error))
        if left == 0:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(next(delays) if error else min(1.0, leases.lease / 4))
        if not error:
            delays = BACKGROUND.delays()
