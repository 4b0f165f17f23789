"""The seeded fault soak (docs/SOAK.md): schedules, nodes, faults, the model and the oracle."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import logging
import os
import random
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import trio

from ckptfs.common.errors import CkptfsError, MissingChunkError, TransientStoreError
from ckptfs.daemon.mount import create_store, read_store_info
from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import DirNode, FileNode
from ckptfs.fs.options import Options
from ckptfs.pipeline import publisher
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.pipeline.uploader import Uploader
from ckptfs.store.base import AsyncStore, Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore
from ckptfs.tools import gc, inspection, retention, trash

KiB = 1024
CHUNK = 64 * KiB
ROOT = 1
#: the confirmation window of every soak node (seconds; manifests.CONFIRM_WINDOW shortened)
WINDOW = 0.1
#: gc's grace while nodes write: 2 windows, plus room for a PUT retried in place
#: (retry.STORE_CALL, about 3 s) after its confirmation and a loaded machine
GRACE = 2 * WINDOW + 6.0
#: how long a sync may take before the soak calls it a hang
SYNC_TIMEOUT = 60.0
TRASH_KEEP = 3600.0
#: the cache of one node in five: its open files have chunks uploaded early and freed
SMALL_CACHE = 8 * CHUNK
NODES = 3
log = logging.getLogger("soak")


class SoakFailure(AssertionError):
    """The oracle found acknowledged data lost or wrong, or a hang."""


# ================================================================== the schedule
@dataclass(frozen=True)
class Op:
    """One step: its kind, the node it runs on, and random numbers it resolves at run
    time against the current state (which file, which size, which content)."""

    kind: str
    node: int
    a: int
    b: int
    c: int

    def __str__(self) -> str:
        return f"{self.kind}(n{self.node}, {self.a}, {self.b}, {self.c})"


#: kind -> weight in a generated schedule
WEIGHTS: dict[str, int] = {
    "save": 16, "save_torch": 5, "save_ckpt": 4, "open": 6, "hwrite": 10, "htrunc": 2,
    "hfsync": 3, "close": 8, "append": 5, "pwrite": 4, "truncate": 3, "read": 10,
    "read_other": 5, "rename": 5, "rename_dir": 3, "unlink": 6, "mkdir": 4, "rmdir": 3,
    "fsync_closed": 1, "sync": 3, "gc": 2, "gc_quiet": 2, "prune": 1, "trash_restore": 2,
    "trash_empty": 1, "crash": 3, "crash_lose_cache": 1, "restart": 2, "store_faults": 2,
    "outage": 1, "latency": 1, "heal": 2, "clock_jump": 1, "check": 1,
}
#: schedule families: kind -> weight. "mixed" is every CI and long-soak schedule;
#: "lost_publish" adds the W3 sequence as one step (op_lost_publish), which a mixed
#: schedule only rarely puts together, to show that a publisher that skips its
#: re-confirmation is caught (docs/SOAK.md)
FAMILIES: dict[str, dict[str, int]] = {
    "mixed": WEIGHTS,
    "lost_publish": {**WEIGHTS, "lost_publish": 12},
    # nodes writing through a shared fast tier, lost for good at random points; movers
    # and drain take over while gc runs (tests/soak/fastsoak.py, its own runner)
    "fast_tier": {"save": 20, "save_shared": 8, "unlink": 3, "rename": 3, "read_other": 6,
                  "sync_fast": 8, "sync": 3, "kill": 2, "kill_after_sync_fast": 2,
                  "kill_mid_move": 3, "gc": 3, "drain": 2, "check": 1},
}
#: the kinds that do not need their node up
NO_NODE = {"crash", "crash_lose_cache", "restart", "outage", "heal", "clock_jump", "gc",
           "check"}
FAULT_KINDS = ("crash", "crash_lose_cache", "store_faults", "outage", "latency",
               "clock_jump", "lost_publish")


def generate(seed: int, n_ops: int, nodes: int = NODES, family: str = "mixed") -> list[Op]:
    """The schedule of one seed: the same seed (and family) always gives the same list."""
    rnd = random.Random(seed)
    table = FAMILIES[family]
    kinds = list(table)
    weights = [table[k] for k in kinds]
    return [Op(rnd.choices(kinds, weights)[0], rnd.randrange(nodes), rnd.getrandbits(30),
               rnd.getrandbits(30), rnd.getrandbits(30)) for _ in range(n_ops)]


def render(ops: list[Op]) -> str:
    return "\n".join(f"  {i:4d} {op}" for i, op in enumerate(ops))


# ================================================================== content
@functools.lru_cache(maxsize=4)
def block_pool(seed: int) -> list[bytes]:
    """Blocks of one chunk shared by every file of a schedule (dedup across nodes)."""
    rnd = random.Random(seed ^ 0x5EED)
    return [rnd.randbytes(CHUNK) for _ in range(12)]


def content(seed: int, spec: int, torch_shaped: bool = False) -> bytes:
    """The bytes of one file: whole shared blocks, then a tail of its own; from bytes to
    several chunks. torch_shaped: a torch.save archive of tensors over those blocks."""
    rnd = random.Random(spec)
    pool = block_pool(seed)
    size_class = rnd.randrange(10)
    if size_class < 3:
        return rnd.randbytes(rnd.randrange(0, 200))
    if size_class < 5:
        return rnd.randbytes(rnd.randrange(200, 20 * KiB))
    n = rnd.randrange(1, 5 if size_class < 9 else 7)
    blocks = [pool[rnd.randrange(len(pool))] for _ in range(n)]
    tail = rnd.randbytes(rnd.randrange(0, CHUNK))
    if torch_shaped:
        return torch_bytes(tuple(blocks) + (tail,))
    return b"".join(blocks) + tail


@functools.lru_cache(maxsize=256)
def torch_bytes(parts: tuple[bytes, ...]) -> bytes:
    import torch  # heavy: only for the schedules that save one

    state = {f"layer{i}.weight": torch.frombuffer(bytearray(p), dtype=torch.uint8)
             for i, p in enumerate(parts) if p}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


# ================================================================== faults in the store
class SoakStore(FaultyStore):
    """FaultyStore plus the faults of a real network: a PUT that lands but whose response
    is lost, a timeout (a long wait, then an error), and an outage window."""

    def __init__(self, inner: Store, seed: int, tally: Counter[str]) -> None:
        super().__init__(inner, seed)
        self.tally = tally
        self.lost_response = 0.0
        self.timeout_rate = 0.0
        self.outage_until = 0.0
        self.refuse_manifests = False
        self._rnd = random.Random(seed ^ 0xFA17)
        self._rlock = threading.Lock()

    def _roll(self, p: float) -> bool:
        with self._rlock:
            return bool(p) and self._rnd.random() < p

    def _enter(self, op: str) -> None:
        if time.monotonic() < self.outage_until:
            self.tally["store: outage error"] += 1
            raise TransientStoreError(f"injected outage ({op})")
        if self._roll(self.timeout_rate):
            self.tally["store: timeout"] += 1
            time.sleep(0.05)
            raise TransientStoreError(f"injected timeout ({op})")
        try:
            super()._enter(op)
        except TransientStoreError:
            self.tally["store: 5xx/throttle"] += 1
            raise

    def put(self, key: str, data: bytes | memoryview) -> None:
        if self.refuse_manifests and key.startswith(manifests.FILES):
            self.tally["store: manifest PUT refused"] += 1
            raise TransientStoreError(f"injected 503 on the manifest PUT of {key}")
        super().put(key, data)
        if self._roll(self.lost_response):
            self.tally["store: lost PUT response"] += 1
            raise TransientStoreError(f"injected lost response of the PUT of {key}")

    def heal(self) -> None:
        super().heal()
        self.lost_response = self.timeout_rate = 0.0
        self.outage_until = 0.0
        self.refuse_manifests = False


# ================================================================== a node
class Node:
    """One mount of the core tier: its own cache directory and journal, the shared store
    behind its own SoakStore; crash() cancels it as a kill would."""

    def __init__(self, index: int, root: Path, store_dir: Path, seed: int,
                 tally: Counter[str], nursery: trio.Nursery, faults: bool = True,
                 cache_size: int = 1 << 30) -> None:
        self.index = index
        self.name = f"n{index}"
        self.root = root
        self.store_dir = store_dir
        self.seed = seed
        self.tally = tally
        self.nursery = nursery
        self.faults = faults
        self.cache_size = cache_size
        self.fs: CheckpointFS | None = None
        self.store: SoakStore | None = None
        self.scope: trio.CancelScope | None = None
        self.op_scope: trio.CancelScope | None = None
        self.stopped = trio.Event()
        self.down = trio.Event()
        self.down.set()
        self.op_idle = trio.Event()
        self.op_idle.set()
        self.incarnation = 0

    @property
    def up(self) -> bool:
        return self.fs is not None

    async def start(self) -> None:
        await self.down.wait()
        self.incarnation += 1
        self.root.mkdir(parents=True, exist_ok=True)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        base = LocalStore(self.store_dir)
        store = SoakStore(base, self.seed * 31 + self.index * 7 + self.incarnation, self.tally)
        info = read_store_info(base) or create_store(base, CHUNK)
        journal = Journal(str(self.root / "journal.sqlite"))
        if journal.get_meta("cache_id") is None:
            journal.set_meta("cache_id", f"c{self.index}x{self.incarnation}")
        cache = LocalCache(str(self.root / "cache"), self.cache_size)
        cache.scan(keep_staging=journal.staging_in_use(),
                   keep_unnamed=journal.damage is not None)
        limiter = trio.CapacityLimiter(1)
        uploader = Uploader(store, cache, journal, limiter, workers=2, codec_name=info.codec,
                            confirm_window=WINDOW)
        fetcher = Fetcher(store, cache, workers=2, missing_timeout=0.3)
        pub = Publisher(store, journal, limiter, f"{self.name}-{journal.get_meta('cache_id')}",
                        cache, trash_keep=TRASH_KEEP, codec_name=info.codec)
        fs = CheckpointFS(AsyncStore(store, trio.CapacityLimiter(8)), cache, uploader, fetcher,
                          pub, info, Options(metadata_ttl=0.2, publish_timeout=0.3,
                                             writer_id=self.name))
        if journal.damage is not None:
            fs.journal_check = JournalCheck(store, journal, limiter, cache, uploader, pub,
                                            self.name, journal.damage)
        await uploader.resume(journal.pending_chunks())
        pub.load(journal.pending_ops())
        self.stopped = trio.Event()
        self.scope = trio.CancelScope()
        self._journal, self._cache = journal, cache
        await self.nursery.start(self._serve, fs)
        self.fs, self.store = fs, store

    async def _serve(self, fs: CheckpointFS, task_status: Any = trio.TASK_STATUS_IGNORED
                     ) -> None:
        assert self.scope is not None
        try:
            with self.scope:
                async with trio.open_nursery() as n:
                    await n.start(fs.uploader.run)
                    await n.start(fs.fetcher.run)
                    await n.start(fs.publisher.run)
                    if fs.journal_check is not None:
                        await n.start(fs.journal_check.run)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self.stopped.set()

    @contextlib.asynccontextmanager
    async def op(self) -> AsyncIterator[trio.CancelScope]:
        """The scope one operation on this node runs in (a crash cancels it too)."""
        with trio.CancelScope() as scope:
            self.op_scope = scope
            self.op_idle = trio.Event()
            try:
                yield scope
            except RuntimeError as e:
                # the crash came between an await's result and the next checkpoint: the
                # op went on to start a task in the node's closed nursery (a kill stops
                # it at once); it counts as cut by the crash
                if not scope.cancel_called or "closed to new arrivals" not in str(e):
                    raise
                await trio.lowlevel.checkpoint()
            finally:
                self.op_scope = None
                self.op_idle.set()

    async def crash(self, lose_cache: bool = False) -> None:
        """kill -9: cancel every task, drop the memory state, keep (or lose) the disk."""
        if self.fs is None:
            return
        assert self.scope is not None
        self.fs = self.store = None
        self.down = trio.Event()
        self.scope.cancel()
        if self.op_scope is not None:
            self.op_scope.cancel()
        await self.stopped.wait()
        await self.op_idle.wait()  # its threads are done (a kill stops them all at once)
        self._cache.close()
        self._journal.close()
        if lose_cache:
            shutil.rmtree(self.root, ignore_errors=True)
        self.down.set()

    async def stop(self) -> bool:
        """A clean unmount: publish leftovers, wait until flushed; -> durable()."""
        if self.fs is None:
            return True
        fs = self.fs
        await fs.publish_leftovers()
        with trio.move_on_after(SYNC_TIMEOUT):
            await fs.wait_all_flushed()
        durable = fs.durable()
        await self.crash()
        return durable


# ================================================================== the model
class Dir:
    """A directory in the model."""

    def __repr__(self) -> str:
        return "DIR"


DIR = Dir()
Value = bytes | Dir | None


#: one call on an open handle (fs, fh)
Call = Callable[[CheckpointFS, int], Any]
#: the calls of one change to an open handle, each with the model's edit once it returned
Steps = list[tuple[Call, Callable[[], None]]]


@dataclass
class Handle:
    node: int
    fh: int
    fid: int
    #: gc ran while it was open on a node with a small cache (chunks it wrote may have
    #: been uploaded early, freed from the cache and then deleted by gc: a file kept
    #: open longer than the grace, an allowed and reported loss, docs/FORMAT.md W2), or
    #: while its file was unlinked (the version it opened may be gone with the trash)
    gc_seen: bool = False


@dataclass
class Model:
    """What each node has acknowledged: tree (path -> file id or DIR), the published
    content of each file id, pending (written, not yet published) content, and the
    trash; uncertain paths (an op cut by a crash, a lost cache) accept several values."""

    tree: dict[str, int | Dir] = field(default_factory=dict)
    files: dict[int, bytes | None] = field(default_factory=dict)
    pending: dict[int, bytearray] = field(default_factory=dict)
    handles: dict[int, Handle] = field(default_factory=dict)
    trash: dict[str, list[bytes]] = field(default_factory=dict)
    trash_uncertain: set[str] = field(default_factory=set)
    #: paths whose trashed versions may name chunks lost with a node's cache directory
    #: (published, then trashed, before their uploads: an allowed loss)
    trash_maybe_lost: set[str] = field(default_factory=set)
    ever: dict[str, set[str]] = field(default_factory=dict)
    uncertain: dict[str, list[Value]] = field(default_factory=dict)
    durable: dict[int, dict[str, Value]] = field(default_factory=dict)
    history: dict[int, dict[str, list[Value]]] = field(default_factory=dict)
    next_id: int = 1
    next_hid: int = 1

    def new_file(self) -> int:
        fid = self.next_id
        self.next_id += 1
        self.files[fid] = None
        return fid

    def value(self, path: str) -> Value:
        """The acknowledged value of a path: bytes, DIR, or None (absent/unpublished)."""
        v = self.tree.get(path)
        if v is None:
            return None
        if isinstance(v, Dir):
            return DIR
        return self.files[v]

    def path_of(self, fid: int) -> str | None:
        for p, v in self.tree.items():
            if v == fid and not isinstance(v, Dir):
                return p
        return None

    def published(self, path: str) -> dict[str, Value]:
        """The visible state under a node root (`path`): files published, dirs."""
        out: dict[str, Value] = {}
        for p in self.tree:
            if p == path or p.startswith(path + "/"):
                v = self.value(p)
                if v is not None:
                    out[p] = v
        return out

    def note(self, node: int, path: str) -> None:
        """Record the current value of `path` in its node's history since durable."""
        v = self.value(path)
        self.history.setdefault(node, {}).setdefault(path, []).append(v)
        if isinstance(v, bytes):
            self.ever.setdefault(path, set()).add(digest(v))

    def to_trash(self, path: str, data: bytes | None) -> None:
        if data is not None:
            self.trash.setdefault(path, []).append(data)


def owner(path: str) -> int:
    return int(path.split("/")[0][1:])


# ================================================================== observing the store
def read_manifest_bytes(store: Store, m: Manifest) -> bytes:
    """A file's bytes straight from chunks/ (or fossils/), each checked against its hash."""
    out = bytearray()
    for h, _ in m.chunks:
        try:
            blob = store.get(manifests.chunk_key(h))
        except CkptfsError:
            blob = store.get(manifests.fossil_key(h))
        out += codec.decode_chunk(blob, h)
    return bytes(out)


class Broken:
    """An observed file whose chunks are not all in the store."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"BROKEN({self.why})"


def observe(store: Store, prefix: str) -> dict[str, bytes | Dir | Broken]:
    """What the store holds under the directory `prefix`: files (bytes), dirs."""
    out: dict[str, bytes | Dir | Broken] = {}
    base = manifests.FILES + prefix + "/"
    for key, _ in store.list(base, delimiter=None).objects:
        rel = key[len(manifests.FILES):]
        is_dir = rel.endswith("/")
        rel = rel.rstrip("/")
        parts = rel.split("/")
        for i in range(1, len(parts) - (0 if is_dir else 1) + 1):
            out.setdefault("/".join(parts[:i]), DIR)
        if is_dir:
            continue
        m = Manifest.from_json(store.get(key))
        try:
            out[rel] = read_manifest_bytes(store, m)
        except CkptfsError as e:
            out[rel] = Broken(str(e))
    out.pop(prefix, None)
    return out


# ================================================================== the runner
@dataclass
class Result:
    seed: int
    ops: int
    done: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    times: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    reported_losses: int = 0
    checks: int = 0
    seconds: float = 0.0
    family: str = "mixed"


@contextlib.contextmanager
def short_windows() -> Iterator[None]:
    """The documented test window: the confirmation window shortened for the soak."""
    saved = publisher.CONFIRM_WINDOW
    publisher.CONFIRM_WINDOW = WINDOW
    try:
        yield
    finally:
        publisher.CONFIRM_WINDOW = saved


@contextlib.contextmanager
def wall_clock() -> Iterator[Callable[[float], None]]:
    """time.time and time.time_ns with an offset the schedule can jump (the monotonic
    clock is left alone: it never goes back)."""
    real, real_ns = time.time, time.time_ns
    offset = [0.0]

    def jump(seconds: float) -> None:
        offset[0] += seconds

    time.time = lambda: real() + offset[0]
    time.time_ns = lambda: real_ns() + int(offset[0] * 1e9)
    try:
        yield jump
    finally:
        time.time, time.time_ns = real, real_ns


class Runner:
    """Runs one schedule against nodes over one store and checks it against the model."""

    def __init__(self, seed: int, ops: list[Op], workdir: Path, nodes: int = NODES,
                 check_every: int = 0) -> None:
        self.seed = seed
        self.ops = ops
        self.workdir = workdir
        self.n_nodes = nodes
        self.store_dir = workdir / "store"
        self.model = Model()
        self.result = Result(seed, len(ops))
        self.check_every = check_every
        self.nodes: list[Node] = []
        self.fresh = 0
        self.jump: Callable[[float], None] = lambda s: None
        self.trace: list[str] = []
        self.pending_crashes = 0
        self.crashes_done = trio.Event()
        self.step_before: dict[str, Value] = {}

    # ------------------------------------------------------------ plumbing
    def fail(self, what: str) -> NoReturn:
        raise SoakFailure(what)

    async def up(self, k: int) -> Node:
        node = self.nodes[k]
        if not node.up:
            await self.restart(k)
        return node

    def fs(self, k: int) -> CheckpointFS:
        fs = self.nodes[k].fs
        assert fs is not None
        return fs

    async def resolve(self, fs: CheckpointFS, path: str) -> FileNode | DirNode:
        node: Any = fs.root
        for name in path.split("/"):
            node = await fs.lookup(node.inode, name)
        return node  # type: ignore[no-any-return]

    def files_of(self, k: int) -> list[str]:
        return sorted(p for p, v in self.model.tree.items()
                      if owner(p) == k and not isinstance(v, Dir)
                      and self.model.files[v] is not None and p not in self.model.uncertain)

    def dirs_of(self, k: int) -> list[str]:
        return sorted(p for p, v in self.model.tree.items()
                      if owner(p) == k and isinstance(v, Dir) and "/" in p
                      and p not in self.model.uncertain and not p.startswith(f"n{k}/ckpt"))

    def pick(self, items: list[str], r: int) -> str | None:
        return items[r % len(items)] if items else None

    def new_name(self, k: int, r: int, r2: int) -> str:
        dirs = [f"n{k}"] + self.dirs_of(k)
        d = dirs[r % len(dirs)]
        return f"{d}/f{r2 % 12}"

    # ------------------------------------------------------------ the run
    async def run(self) -> Result:
        started = time.monotonic()
        with short_windows(), wall_clock() as jump:
            self.jump = jump
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.nodes = [Node(k, self.workdir / f"node{k}", self.store_dir, self.seed,
                                   self.result.faults, nursery,
                                   cache_size=(SMALL_CACHE if (self.seed + k) % 5 == 0
                                               else 1 << 30))
                              for k in range(self.n_nodes)]
                for k in range(self.n_nodes):
                    await self.nodes[k].start()
                    fs = self.fs(k)
                    async with self.nodes[k].op():
                        await fs.mkdir(ROOT, f"n{k}", 0o755)
                    self.model.tree[f"n{k}"] = DIR
                try:
                    for i, op in enumerate(self.ops):
                        self.trace.append(f"{i} {op}")
                        await self.step(op)
                        self.result.done = i + 1
                        if self.check_every and (i + 1) % self.check_every == 0:
                            await self.full_check()
                    t = time.monotonic()
                    await self.full_check(final=True)
                    self.result.times["final check"] = time.monotonic() - t
                except Exception as e:  # noqa: BLE001 - a failure of the seed, reported
                    self.result.failure = failure_text(self.result.done, e)
                finally:
                    for node in self.nodes:
                        if node.up:
                            await node.crash()
                    nursery.cancel_scope.cancel()
        self.result.seconds = time.monotonic() - started
        return self.result

    async def step(self, op: Op) -> None:
        self.result.kinds[op.kind] += 1
        handler = getattr(self, f"op_{op.kind}")
        if op.kind in FAULT_KINDS:
            self.result.faults[op.kind] += 1
        t = time.monotonic()
        if op.kind not in NO_NODE:
            if not self.nodes[op.node].up and op.a % 3:
                return  # the node stays down a while (gc may run meanwhile)
            await self.up(op.node)  # restarted (and observed) before the model moves on
        # the state before the op: what an op cut by a crash may have left instead
        self.step_before = {p: self.model.value(p) for p in self.model.tree}
        await handler(op)
        self.result.times[op.kind] = (self.result.times.get(op.kind, 0.0)
                                      + time.monotonic() - t)

    async def guarded(self, k: int, paths: list[str], body: Callable[[], Any]) -> bool:
        """Run `body` on node k. If the node crashes during it or the store fails it, the
        paths it touches are uncertain (before or after) until observed. -> done?"""
        node = await self.up(k)
        before = {p: {q: v for q, v in self.step_before.items()
                      if q == p or q.startswith(p + "/")} for p in paths}
        ok = False
        async with node.op() as scope:
            try:
                await body()
                ok = True
            except CkptfsError as e:
                self.trace.append(f"    ! {type(e).__name__}: {e}")
        self.trace.append(f"    {' '.join(paths)}" + ("" if ok else " failed")
                          + (" cut by the crash" if scope.cancelled_caught else ""))
        if scope.cancelled_caught or not ok:
            self.uncertain_from(before, paths)
            if not ok and node.up:
                await self.settle(k)
        return ok and not scope.cancelled_caught

    def snapshot_under(self, path: str) -> dict[str, Value]:
        return {p: self.model.value(p) for p in list(self.model.tree)
                if p == path or p.startswith(path + "/")}

    def uncertain_from(self, before: dict[str, dict[str, Value]], paths: list[str]) -> None:
        """The model holds the state as if the op had been done; before it, the state
        the op started from: each path that differs may be either."""
        for p in paths:
            after = self.snapshot_under(p)
            for q in set(before[p]) | set(after):
                b, a = before[p].get(q), after.get(q)
                if b != a or q in self.model.uncertain:
                    self.model.uncertain.setdefault(q, []).extend([b, a])
                    self.model.trash_uncertain.add(q)

    async def settle(self, k: int) -> None:
        """After an op failed on a live node: heal, sync it, and observe what it did."""
        for node in self.nodes:
            if node.store is not None:
                node.store.heal()
        await self.sync(k)
        await self.observe_node(k, reason="a failed op")

    async def sync(self, k: int) -> None:
        await self.flush_crashes()
        node = self.nodes[k]
        if not node.up:
            return
        fs = self.fs(k)
        with trio.move_on_after(SYNC_TIMEOUT) as scope:
            await fs.wait_all_flushed()
        if scope.cancelled_caught:
            self.fail(f"n{k}: sync did not finish in {SYNC_TIMEOUT:g} s "
                      f"(pending chunks {fs.uploader.pending_count()}, ops "
                      f"{fs.publisher.pending_count}; {fs.statistics().errors})")
        self.model.durable[k] = self.model.published(f"n{k}")
        self.model.history[k] = {}
        self.check_reported(k)

    def check_reported(self, k: int) -> None:
        """Files the node says lost are allowed to be unreadable (they are reported)."""
        fs = self.fs(k)
        for lost in fs.uploader.lost_files():
            self.result.reported_losses += 1
            self.model.uncertain.setdefault(lost.path, []).append(LOST)

    async def sync_all(self) -> None:
        for node in self.nodes:
            if node.store is not None:
                node.store.heal()
        for k in range(self.n_nodes):
            await self.sync(k)

    async def quiesce(self, stale: bool = False, down_stay_down: bool = False) -> None:
        """Every node up (or, down_stay_down, the live ones), healed and flushed, its
        uploads idle, its sightings stale."""
        await self.flush_crashes()
        for k in range(self.n_nodes):
            if not down_stay_down:
                await self.up(k)
        await self.sync_all()
        for k in range(self.n_nodes):
            if not self.nodes[k].up:
                continue
            fs = self.fs(k)
            with trio.move_on_after(SYNC_TIMEOUT):
                while fs.uploader.busy():
                    await trio.sleep(0.02)
        if stale:
            await trio.sleep(WINDOW + 0.02)

    # ------------------------------------------------------------ restart and observe
    async def restart(self, k: int) -> None:
        await self.flush_crashes()
        node = self.nodes[k]
        lost_cache = not (node.root / "journal.sqlite").exists()
        await node.start()
        fs = self.fs(k)
        if lost_cache or fs.dir_at(f"n{k}") is None:
            # a node that lost its cache directory starts empty: its root is in the store
            # unless nothing of it ever got there
            async with node.op():
                try:
                    await fs.mkdir(ROOT, f"n{k}", 0o755)
                except CkptfsError:
                    pass
        await self.sync(k)
        await self.observe_node(k, reason="a restart")

    async def observe_node(self, k: int, reason: str) -> None:
        """Resolve every uncertain path of node k from the store, after its sync."""
        prefix = f"n{k}"
        if not any(owner(p) == k for p in self.model.uncertain):
            return
        base = LocalStore(self.store_dir)
        seen = observe(base, prefix)
        fs = self.fs(k)
        lost = {f.path for f in fs.uploader.lost_files()}
        model = self.model
        expected = model.published(prefix)
        expected.pop(prefix, None)
        for p in sorted(set(seen) | set(expected) | {q for q in model.uncertain
                                                      if owner(q) == k}):
            got = seen.get(p)
            want = expected.get(p)
            allowed = model.uncertain.get(p)
            if isinstance(got, Broken):
                if p in lost or (allowed is not None and LOST in allowed):
                    continue  # reported as lost: allowed
                self.fail(f"{p}: chunks missing after {reason} and not reported: {got.why}")
            if _same(got, want):
                continue
            if allowed is not None and any(_same(got, a) for a in allowed):
                continue
            if p.startswith(prefix + "/") and any(
                    _same(got, a) for a in model.history.get(k, {}).get(p, [])) and \
                    self.nodes[k].incarnation and k in self.lost_cache_nodes:
                continue
            self.fail(f"{p}: after {reason} the store holds {_show(got)}, the model "
                      f"allows {_show(want)}" + (f" or {[_show(a) for a in allowed]}"
                                                 if allowed else ""))
        # handles still open on the live node (after a failed op or at a check; a crash
        # dropped its own) keep what they show: the node's buffer stays open through it
        kept = {hid: (model.path_of(hd.fid), bytes(model.pending[hd.fid])
                      if hd.fid in model.pending else model.files.get(hd.fid))
                for hid, hd in model.handles.items() if hd.node == k}
        # the model adopts what is there
        for p in [q for q in model.tree if q.startswith(prefix + "/")]:
            del model.tree[p]
        for p, v in sorted(seen.items()):
            if isinstance(v, Broken):
                LocalStore(self.store_dir).delete(manifests.file_key(p))
                continue
            if isinstance(v, Dir):
                model.tree[p] = DIR
            else:
                fid = model.new_file()
                model.files[fid] = v
                model.tree[p] = fid
        for p in [q for q in model.uncertain if owner(q) == k]:
            del model.uncertain[p]
        self.keep_handles(kept)
        self.lost_cache_nodes.discard(k)
        await fs.refresh_dir(prefix)
        for p in sorted(model.tree):
            if owner(p) == k and isinstance(model.tree[p], Dir):
                await fs.refresh_dir(p)
        for p in sorted(model.tree):
            val = model.value(p)
            if owner(p) == k and isinstance(val, bytes):
                d = fs.dir_at(p.rsplit("/", 1)[0])
                c = d.children.get(p.rsplit("/", 1)[1]) if d is not None else None
                if isinstance(c, FileNode) and c.size != len(val):
                    self.trace.append(f"    ! after {reason}: n{k} shows {p} with {c.size} "
                                      f"bytes, the store {len(val)} (pending "
                                      f"{fs.publisher.is_pending(p)}, key size "
                                      f"{c.manifest_key_size})")

    lost_cache_nodes: set[int] = set()

    def keep_handles(self, kept: dict[int, tuple[str | None, bytes | None]]) -> None:
        """After the model adopted the store's files (new file ids), each kept handle
        follows its path, and shows what it showed before: a version it wrote that the
        store does not hold (yet) stays pending there, and a close publishes it."""
        model = self.model
        pending = {h.fid: model.pending[h.fid] for hid, h in model.handles.items()
                   if hid not in kept and h.fid in model.pending}  # of the other nodes
        for hid, (path, shows) in kept.items():
            h = model.handles[hid]
            v = model.tree.get(path) if path is not None else None
            if path is None or isinstance(v, Dir):
                del model.handles[hid]  # unlinked while open: nothing names it any more
                continue
            if v is None:  # a new file not published yet: the node still has it
                model.tree[path] = h.fid
                if h.fid in model.pending:
                    pending[h.fid] = model.pending[h.fid]
                continue
            h.fid = v
            if shows is not None and shows != model.files[v]:
                pending[v] = bytearray(shows)
        model.pending = pending

    # ------------------------------------------------------------ file operations
    async def write_all(self, fs: CheckpointFS, fh: int, data: bytes, piece: int) -> None:
        for off in range(0, len(data), piece):
            await fs.write(fh, off, data[off:off + piece])

    async def save(self, op: Op, data: bytes, where: str | None = None) -> None:
        k = op.node
        model = self.model
        files = self.files_of(k)
        picked = where if where is not None else (
            self.pick(files, op.a) if op.b % 2 and files else self.new_name(k, op.a, op.b))
        if picked is None or picked in model.uncertain:
            return
        path: str = picked
        cur = model.tree.get(path)
        if isinstance(cur, Dir) or (cur is not None and model.files[cur] is None):
            return
        if cur is not None and any(h.fid == cur for h in model.handles.values()):
            return  # open for writing here: not saved over (the model keeps it simple)
        parent = path.rsplit("/", 1)[0]
        if not isinstance(model.tree.get(parent), Dir):
            return
        fsync = op.c % 5 == 0
        piece = [4 * KiB, 16 * KiB, 64 * KiB, 100 * KiB][op.c % 4]

        async def body() -> None:
            fs = self.fs(k)
            if cur is None:
                pnode = await self.resolve(fs, parent)
                fh, _ = await fs.create(pnode.inode, path.rsplit("/", 1)[1], 0o644,
                                        os.O_WRONLY)
            else:
                fnode = await self.resolve(fs, path)
                fh, _ = await fs.open(fnode.inode, os.O_WRONLY | os.O_TRUNC)
            try:
                await self.write_all(fs, fh, data, piece)
                if fsync:
                    await fs.fsync(fh)
                await fs.flush(fh)
            finally:
                await fs.release(fh)

        fid = cur if isinstance(cur, int) else None
        old = model.files[fid] if fid is not None else None
        if fid is None:
            fid = model.new_file()
            model.tree[path] = fid
        model.files[fid] = data
        model.to_trash(path, old)
        model.note(k, path)
        await self.guarded(k, [path], body)

    async def op_save(self, op: Op) -> None:
        await self.save(op, content(self.seed, op.c))

    async def op_save_torch(self, op: Op) -> None:
        await self.save(op, content(self.seed, op.c | 1 << 31 if op.c % 10 < 5 else op.c,
                                    torch_shaped=True))

    async def op_save_ckpt(self, op: Op) -> None:
        """A checkpoint directory n<k>/ckpt/step-<N>/ with a torch file (for prune)."""
        k = op.node
        ckpt = f"n{k}/ckpt"
        steps = sorted(int(p.rsplit("-", 1)[1]) for p in self.model.tree
                       if p.startswith(ckpt + "/step-") and p.count("/") == 2)
        step = (steps[-1] if steps else 0) + 1 + op.a % 3
        for d in (ckpt, f"{ckpt}/step-{step}"):
            if d in self.model.uncertain:
                return
            if d not in self.model.tree:
                parent, name = d.rsplit("/", 1)
                if not await self.mkdir(k, parent, name):
                    return
        data = content(self.seed, op.c | 1, torch_shaped=True)
        await self.save(op, data, f"{ckpt}/step-{step}/model.pt")

    async def mkdir(self, k: int, parent: str, name: str) -> bool:
        path = f"{parent}/{name}"
        if path in self.model.tree or not isinstance(self.model.tree.get(parent), Dir):
            return False

        async def body() -> None:
            fs = self.fs(k)
            pnode = await self.resolve(fs, parent)
            await fs.mkdir(pnode.inode, name, 0o755)

        self.model.tree[path] = DIR
        self.model.note(k, path)
        return await self.guarded(k, [path], body)

    async def op_mkdir(self, op: Op) -> None:
        k = op.node
        dirs = [f"n{k}"] + self.dirs_of(k)
        parent = dirs[op.a % len(dirs)]
        if parent.count("/") >= 3:
            return
        await self.mkdir(k, parent, f"d{op.b % 6}")

    async def op_rmdir(self, op: Op) -> None:
        k = op.node
        path = self.pick(self.dirs_of(k), op.a)
        if path is None or path in self.open_paths():
            return
        if any(q.startswith(path + "/") for q in self.model.tree) or any(
                q.startswith(path + "/") for q in self.model.uncertain):
            # not empty: ENOTEMPTY, nothing changes
            node = await self.up(k)
            async with node.op():
                fs = self.fs(k)
                try:
                    parent = await self.resolve(fs, path.rsplit("/", 1)[0])
                    await fs.rmdir(parent.inode, path.rsplit("/", 1)[1])
                    self.fail(f"rmdir {path}: not empty in the model, but it succeeded")
                except CkptfsError:
                    pass
            return
        if any(self.model.path_of(h.fid) is None and False for h in self.model.handles.values()):
            return

        async def body() -> None:
            fs = self.fs(k)
            parent = await self.resolve(fs, path.rsplit("/", 1)[0])
            await fs.rmdir(parent.inode, path.rsplit("/", 1)[1])

        del self.model.tree[path]
        self.model.note(k, path)
        await self.guarded(k, [path], body)

    def open_paths(self) -> set[str]:
        out = set()
        for h in self.model.handles.values():
            p = self.model.path_of(h.fid)
            if p is not None:
                out.add(p)
        return out

    async def op_open(self, op: Op) -> None:
        """Open a file for writing (a new one, or an existing one, with O_TRUNC or not)
        and keep the handle."""
        k = op.node
        model = self.model
        if sum(1 for h in model.handles.values() if h.node == k) >= 4:
            return
        files = self.files_of(k)
        node = await self.up(k)
        fs = self.fs(k)
        if op.b % 3 == 0 or not files:
            path = self.new_name(k, op.a, op.b)
            if path in model.tree or path in model.uncertain:
                return
            parent = path.rsplit("/", 1)[0]
            if not isinstance(model.tree.get(parent), Dir):
                return
            fid = model.new_file()
            trunc = True
        else:
            path = files[op.a % len(files)]
            v = model.tree[path]
            assert isinstance(v, int)
            fid, trunc = v, op.c % 2 == 0
        fh = 0
        incarnation = node.incarnation
        async with node.op() as scope:
            try:
                if fid not in model.files or model.files[fid] is None and path not in \
                        model.tree:
                    pnode = await self.resolve(fs, path.rsplit("/", 1)[0])
                    fh, _ = await fs.create(pnode.inode, path.rsplit("/", 1)[1], 0o644,
                                            os.O_RDWR)
                    model.tree[path] = fid
                else:
                    fnode = await self.resolve(fs, path)
                    fh, _ = await fs.open(fnode.inode, os.O_RDWR | (os.O_TRUNC if trunc
                                                                    else 0))
            except CkptfsError as e:
                self.trace.append(f"    ! open {path}: {e}")
                if model.files.get(fid) is None and model.tree.get(path) == fid:
                    del model.tree[path]
                return
        if scope.cancelled_caught or not fh or not node.up or node.incarnation != incarnation:
            if model.files.get(fid) is None and model.tree.get(path) == fid:
                del model.tree[path]
            return
        if trunc:
            model.pending[fid] = bytearray()
        hid = model.next_hid
        model.next_hid += 1
        model.handles[hid] = Handle(k, fh, fid)
        self.trace.append(f"    handle h{hid} = {path}")

    def pick_handle(self, k: int, r: int) -> tuple[int, Handle] | None:
        hs = sorted((hid, h) for hid, h in self.model.handles.items() if h.node == k)
        return hs[r % len(hs)] if hs else None

    def handle_content(self, h: Handle) -> bytearray:
        model = self.model
        if h.fid not in model.pending:
            model.pending[h.fid] = bytearray(model.files[h.fid] or b"")
        return model.pending[h.fid]

    async def handle_op(self, op: Op, what: str,
                        change: Callable[[bytearray], Steps]) -> None:
        """One change to an open handle: `change` plans its calls on the handle's content,
        each with the model's edit that follows it once the call has returned. A call
        that fails with an error leaves the file exactly as it was (writebuffer copies
        every stored chunk in first), so the model keeps the content from before it."""
        picked = self.pick_handle(op.node, op.a)
        if picked is None:
            return
        hid, h = picked
        node = await self.up(op.node)
        had_pending = h.fid in self.model.pending
        buf = self.handle_content(h)
        steps = change(buf)
        done = 0
        fs = self.fs(op.node)  # a crash landing between two calls cancels the next one
        async with node.op():
            try:
                for call, edit in steps:
                    await call(fs, h.fh)
                    edit()
                    done += 1
            except CkptfsError as e:
                freed = h.gc_seen and isinstance(e, MissingChunkError)
                if not self.faulty(op.node) and "injected" not in str(e) and not freed:
                    self.fail(f"{what} on h{hid}: {type(e).__name__}: {e}")
                self.trace.append(f"    ! {what} on h{hid} failed after {done} of "
                                  f"{len(steps)} calls, the file as before: "
                                  f"{type(e).__name__}: {e}")
                self.result.faults[f"{what} failed, nothing changed"] += 1
                shown = fs.handle(h.fh).node.current_size if node.up else len(buf)
                if shown != len(buf):
                    self.fail(f"{what} on h{hid} failed ({type(e).__name__}), but the file "
                              f"shows {shown} bytes where it had {len(buf)}")
        if not done and not had_pending and hid in self.model.handles:
            # nothing was written through this handle yet: it still holds the published
            # version, as before
            self.model.pending.pop(h.fid, None)

    async def op_hwrite(self, op: Op) -> None:
        data = content(self.seed, op.c)[:3 * CHUNK]

        def change(buf: bytearray) -> Steps:
            where = op.b % 4
            off = len(buf) if where < 2 or not buf else op.b % (len(buf) + 1)
            if len(buf) + len(data) > 8 * CHUNK:
                off = 0
            # from offset 0 in pieces of 32 KiB (as a checkpoint writer does), else one call
            piece = 32 * KiB if off == 0 else max(len(data), 1)
            pieces = [(o, data[o - off:o - off + piece])
                      for o in range(off, off + len(data), piece)]
            if not pieces and off:
                pieces = [(off, b"")]

            def step(at: int, part: bytes) -> tuple[Call, Callable[[], None]]:
                async def call(fs: CheckpointFS, fh: int) -> None:
                    await fs.write(fh, at, part)

                def edit() -> None:
                    end = at + len(part)
                    if len(buf) < end:
                        buf.extend(b"\0" * (end - len(buf)))
                    buf[at:end] = part
                return call, edit
            return [step(at, part) for at, part in pieces]

        await self.handle_op(op, "write", change)

    async def op_htrunc(self, op: Op) -> None:
        def change(buf: bytearray) -> Steps:
            size = op.b % (len(buf) + CHUNK + 1)

            async def call(fs: CheckpointFS, fh: int) -> None:
                await fs.setattr(fs.handle(fh).node.inode, size=size)

            def edit() -> None:
                if size < len(buf):
                    del buf[size:]
                else:
                    buf.extend(b"\0" * (size - len(buf)))
            return [(call, edit)]

        await self.handle_op(op, "ftruncate", change)

    def publish_pending(self, fid: int) -> str | None:
        """A close or fsync published the pending version of `fid`: its path, if any."""
        model = self.model
        data = model.pending.pop(fid, None)
        path = model.path_of(fid)
        if data is None:
            return path
        if path is not None:
            model.to_trash(path, model.files[fid])
        # (unlinked while open: nothing names it, but its other handles show this version)
        model.files[fid] = bytes(data)
        if path is not None:
            model.note(owner(path), path)
        return path

    async def close_like(self, op: Op, close: bool) -> None:
        picked = self.pick_handle(op.node, op.a)
        if picked is None:
            return
        hid, h = picked
        model = self.model
        path = model.path_of(h.fid)
        before = {path: self.snapshot_under(path)} if path else {}
        pending = h.fid in model.pending
        if pending:
            self.publish_pending(h.fid)
        if close:
            del model.handles[hid]

        async def body() -> None:
            fs = self.fs(op.node)
            try:
                if close:
                    await fs.flush(h.fh)
                else:
                    await fs.fsync(h.fh)
            finally:
                if close:
                    await fs.release(h.fh)

        node = await self.up(op.node)
        ok = False
        async with node.op() as scope:
            try:
                await body()
                ok = True
            except CkptfsError as e:
                self.trace.append(f"    ! {type(e).__name__}: {e}")
        if (scope.cancelled_caught or not ok) and path:
            self.uncertain_from(before, [path])
            if not ok and node.up:
                await self.settle(op.node)

    async def op_close(self, op: Op) -> None:
        await self.close_like(op, close=True)

    async def op_hfsync(self, op: Op) -> None:
        await self.close_like(op, close=False)

    async def modify_closed(self, op: Op, what: str,
                            change: Callable[[bytes], tuple[bytes, int, bytes | None, int]]
                            ) -> None:
        """Open an existing closed file, change it (append, pwrite or truncate), close."""
        k = op.node
        open_ids = {h.fid for h in self.model.handles.values()}
        files = [p for p in self.files_of(k) if self.model.tree[p] not in open_ids]
        path = self.pick(files, op.a)
        if path is None:
            return
        fid = self.model.tree[path]
        assert isinstance(fid, int)
        old = self.model.files[fid]
        assert old is not None
        new, off, data, size = change(old)

        async def body() -> None:
            fs = self.fs(k)
            fnode = await self.resolve(fs, path)
            if isinstance(fnode, FileNode) and fnode.size != len(old):
                self.trace.append(f"    ! {path}: the node has {fnode.size} bytes, the model "
                                  f"{len(old)}")
            if data is None:
                await fs.setattr(fnode.inode, size=size)
                return
            fh, _ = await fs.open(fnode.inode, os.O_WRONLY)
            try:
                await fs.write(fh, off, data)
                await fs.flush(fh)
            finally:
                await fs.release(fh)

        self.model.files[fid] = new
        if new != old or data is not None or size != len(old):
            self.model.to_trash(path, old)
        self.model.note(k, path)
        await self.guarded(k, [path], body)

    async def op_append(self, op: Op) -> None:
        data = content(self.seed, op.c)[:2 * CHUNK + 5]
        await self.modify_closed(op, "append",
                                 lambda old: (old + data, len(old), data, 0))

    async def op_pwrite(self, op: Op) -> None:
        data = random.Random(op.c).randbytes(op.c % 5000 + 1)

        def change(old: bytes) -> tuple[bytes, int, bytes | None, int]:
            off = op.b % (len(old) + 1)
            new = bytearray(old)
            if len(new) < off + len(data):
                new.extend(b"\0" * (off + len(data) - len(new)))
            new[off:off + len(data)] = data
            return bytes(new), off, data, 0

        await self.modify_closed(op, "pwrite", change)

    async def op_truncate(self, op: Op) -> None:
        def change(old: bytes) -> tuple[bytes, int, bytes | None, int]:
            size = op.b % (len(old) + CHUNK + 1)
            new = old[:size] + b"\0" * max(0, size - len(old))
            return new, 0, None, size

        await self.modify_closed(op, "truncate", change)

    async def op_fsync_closed(self, op: Op) -> None:
        """fsync through a read-only descriptor: of a file open for writing here, it
        publishes what was written (the buffer is the node's, not the descriptor's)."""
        k = op.node
        path = self.pick(self.files_of(k), op.a)
        if path is None:
            return
        fid = self.model.tree[path]
        assert isinstance(fid, int)
        if fid in self.model.pending:
            before = {path: self.snapshot_under(path)}
            self.publish_pending(fid)
            self.model.trash_uncertain.add(path)
            self.uncertain_from(before, [path])  # a crash or a store error may cut it
        node = await self.up(k)
        async with node.op():
            fs = self.fs(k)
            try:
                fnode = await self.resolve(fs, path)
                fh, _ = await fs.open(fnode.inode, os.O_RDONLY)
                try:
                    await fs.fsync(fh)
                finally:
                    await fs.release(fh)
            except CkptfsError as e:
                self.trace.append(f"    ! fsync {path}: {e}")

    # ------------------------------------------------------------ reads
    async def read_path(self, fs: CheckpointFS, path: str) -> bytes:
        fnode = await self.resolve(fs, path)
        assert isinstance(fnode, FileNode)
        fh, _ = await fs.open(fnode.inode, os.O_RDONLY)
        try:
            out = bytearray()
            while True:
                piece = await fs.read(fh, len(out), 96 * KiB)
                if not piece:
                    break
                out += piece
            return bytes(out)
        finally:
            await fs.release(fh)

    async def op_read(self, op: Op) -> None:
        """Read back a file on its own node: exactly what was acknowledged (or, while
        it is open for writing there, the latest writes). An error only while the store
        fails: after a restart the node holds only what is not uploaded, and fetches the
        rest."""
        k = op.node
        path = self.pick(self.files_of(k), op.a)
        if path is None:
            return
        fid = self.model.tree[path]
        assert isinstance(fid, int)
        want = bytes(self.model.pending[fid]) if fid in self.model.pending else \
            self.model.files[fid]
        node = await self.up(k)
        got: bytes | None = None
        start = time.monotonic()
        async with node.op():
            try:
                got = await self.read_path(self.fs(k), path)
            except CkptfsError as e:
                if self.faulty(k, start) or path in self.lost_paths(k) or (
                        isinstance(e, MissingChunkError) and self.gc_seen(fid)):
                    return
                self.fail(f"read {path} on its writer n{k}: {type(e).__name__}: {e}")
        if got is not None and got != want:
            self.fail(f"read {path} on n{k}: {_show(got)}, acknowledged {_show(want)}"
                      + _diff(got, want or b""))

    def gc_seen(self, fid: int) -> bool:
        return any(h.gc_seen for h in self.model.handles.values() if h.fid == fid)

    def note_gc(self) -> None:
        """gc ran: the handles open on a node with a small cache may lose early chunks,
        and those of a file unlinked while open the chunks of the version they opened
        once the trash no longer holds it (docs/SEMANTICS.md)."""
        for h in self.model.handles.values():
            if (self.nodes[h.node].cache_size <= SMALL_CACHE
                    or self.model.path_of(h.fid) is None):
                h.gc_seen = True

    def faulty(self, k: int, since: float | None = None) -> bool:
        """Whether node k's store fails calls now, or had an outage at any moment since
        `since` (time.monotonic() at the start of the op: a window can end between a
        call failing in it and this check)."""
        store = self.nodes[k].store
        return store is not None and (store._fail_rates or store.outage_until
                                      or store.timeout_rate or store._latency
                                      or store._failures) != 0 and bool(
            store._fail_rates or store.timeout_rate or store._failures
            or (time.monotonic() if since is None else since) < store.outage_until)

    def lost_paths(self, k: int) -> set[str]:
        fs = self.nodes[k].fs
        return {f.path for f in fs.uploader.lost_files()} if fs else set()

    async def op_read_other(self, op: Op) -> None:
        """Read another node's file: it must be a version ever written at that path (or
        not visible yet, or a chunk not uploaded yet: an error, never wrong bytes)."""
        k = op.node
        other = (k + 1 + op.b % (self.n_nodes - 1)) % self.n_nodes
        path = self.pick(self.files_of(other), op.a)
        if path is None:
            return
        node = await self.up(k)
        got: bytes | None = None
        async with node.op():
            try:
                got = await self.read_path(self.fs(k), path)
            except CkptfsError:
                return
        if got is None:
            return
        if digest(got) not in self.model.ever.get(path, set()):
            # also fine: a version of the file under a name it had before a rename
            if not any(digest(got) in s for s in self.model.ever.values()):
                cur = self.model.value(path)
                self.fail(f"n{k} read {path} of n{other}: {_show(got)}, never written"
                          + (_diff(got, cur) + " against its acknowledged version"
                             if isinstance(cur, bytes) else ""))

    # ------------------------------------------------------------ namespace
    async def op_rename(self, op: Op) -> None:
        k = op.node
        model = self.model
        src = self.pick(self.files_of(k), op.a)
        if src is None:
            return
        if op.b % 2:
            dst = self.pick(self.files_of(k), op.b)  # over an existing name
        else:
            dst = self.new_name(k, op.b, op.c)
        if dst is None or dst == src or dst in model.uncertain:
            return
        cur = model.tree.get(dst)
        if isinstance(cur, Dir) or not isinstance(model.tree.get(dst.rsplit("/", 1)[0]), Dir):
            return
        if isinstance(cur, int) and (model.files[cur] is None or cur in {
                h.fid for h in model.handles.values()}):
            return

        async def body() -> None:
            fs = self.fs(k)
            sp = await self.resolve(fs, src.rsplit("/", 1)[0])
            dp = await self.resolve(fs, dst.rsplit("/", 1)[0])
            await fs.rename(sp.inode, src.rsplit("/", 1)[1], dp.inode, dst.rsplit("/", 1)[1])

        fid = model.tree.pop(src)
        if isinstance(cur, int):
            model.to_trash(dst, model.files[cur])
        model.tree[dst] = fid
        model.note(k, src)
        model.note(k, dst)
        await self.guarded(k, [src, dst], body)

    async def op_rename_dir(self, op: Op) -> None:
        k = op.node
        model = self.model
        dirs = [d for d in self.dirs_of(k) if not d.startswith(f"n{k}/ckpt")]
        src = self.pick(dirs, op.a)
        if src is None:
            return
        parents = [f"n{k}"] + [d for d in self.dirs_of(k) if d != src and
                               not d.startswith(src + "/")]
        parent = parents[op.b % len(parents)]
        dst = f"{parent}/d{op.c % 6}"
        if dst == src or dst.startswith(src + "/") or dst.count("/") > 3:
            return
        if any(p == dst or p.startswith(dst + "/") for p in model.uncertain) or any(
                p.startswith(src + "/") for p in model.uncertain):
            return
        cur = model.tree.get(dst)
        if cur is not None:
            if not isinstance(cur, Dir) or any(p.startswith(dst + "/") for p in model.tree):
                return  # over a file or a non-empty dir: errors, not exercised

        async def body() -> None:
            fs = self.fs(k)
            sp = await self.resolve(fs, src.rsplit("/", 1)[0])
            dp = await self.resolve(fs, parent)
            await fs.rename(sp.inode, src.rsplit("/", 1)[1], dp.inode, dst.rsplit("/", 1)[1])

        moved = {p: v for p, v in model.tree.items() if p == src or p.startswith(src + "/")}
        for p in moved:
            del model.tree[p]
        model.tree.pop(dst, None)
        for p, v in moved.items():
            model.tree[dst + p[len(src):]] = v
        for p in list(moved) + [dst + p[len(src):] for p in moved]:
            model.note(k, p)
        await self.guarded(k, [src, dst], body)

    async def op_unlink(self, op: Op) -> None:
        k = op.node
        model = self.model
        path = self.pick(self.files_of(k), op.a)
        if path is None:
            return
        fid = model.tree[path]
        assert isinstance(fid, int)

        async def body() -> None:
            fs = self.fs(k)
            parent = await self.resolve(fs, path.rsplit("/", 1)[0])
            await fs.unlink(parent.inode, path.rsplit("/", 1)[1])

        del model.tree[path]
        model.to_trash(path, model.files[fid])
        model.note(k, path)
        await self.guarded(k, [path], body)

    # ------------------------------------------------------------ sync, gc, tools
    async def op_sync(self, op: Op) -> None:
        await self.up(op.node)
        store = self.nodes[op.node].store
        assert store is not None
        store.heal()
        await self.sync(op.node)

    async def op_gc(self, op: Op) -> None:
        """gc beside writers, with the short test grace."""
        base = LocalStore(self.store_dir)
        try:
            self.note_gc()
            report = await trio.to_thread.run_sync(gc.collect, base, GRACE)
        except gc.GcError as e:
            self.fail(f"gc: {e}")
        self.result.faults["gc: fossilized"] += report.fossilized.count
        self.result.faults["gc: freed"] += report.freed.count
        self.result.faults["gc: restored"] += report.restored.count

    async def op_gc_quiet(self, op: Op) -> None:
        """gc with no grace where nothing writes: every node flushed, sightings stale
        (then two runs: the chunks nothing names are set aside, then freed). A node that
        is down stays down: its journaled manifests are confirmed again at its restart."""
        await self.quiesce(stale=True, down_stay_down=True)
        base = LocalStore(self.store_dir)
        self.note_gc()
        for _ in range(2):
            report = await trio.to_thread.run_sync(gc.collect, base, 0.0)
            self.result.faults["gc: fossilized"] += report.fossilized.count
            self.result.faults["gc: freed"] += report.freed.count
            self.result.faults["gc: restored"] += report.restored.count

    async def op_prune(self, op: Op) -> None:
        k = op.node
        ckpt = f"n{k}/ckpt"
        if not isinstance(self.model.tree.get(ckpt), Dir) or any(
                p.startswith(ckpt) for p in self.model.uncertain):
            return
        await self.quiesce()
        if any(p.startswith(ckpt + "/") for p in self.open_paths()):
            return
        base = LocalStore(self.store_dir)
        keep_last = 1 + op.a % 2
        result = await trio.to_thread.run_sync(functools.partial(
            retention.prune, base, ckpt, keep_last, trash_keep=TRASH_KEEP, node="soak-cli"))
        steps = sorted((p for p in self.model.tree
                        if p.startswith(ckpt + "/step-") and p.count("/") == 2),
                       key=lambda p: int(p.rsplit("-", 1)[1]))
        removed = {cp.path for cp in result.removed}
        want = set(steps[:-keep_last])
        if not removed <= want:
            self.fail(f"prune {ckpt} --keep-last {keep_last} removed {sorted(removed)}; "
                      f"the model expected (a subset of) {sorted(want)}")
        for d in removed:
            for p in sorted(q for q in self.model.tree if q == d or q.startswith(d + "/")):
                v = self.model.tree.pop(p)
                if isinstance(v, int):
                    self.model.to_trash(p, self.model.files[v])
        await self.fs(k).refresh_dir(ckpt)

    async def op_trash_restore(self, op: Op) -> None:
        k = op.node
        model = self.model
        candidates = sorted(p for p, vs in model.trash.items()
                            if owner(p) == k and vs and p not in model.tree
                            and p not in model.uncertain
                            and isinstance(model.tree.get(p.rsplit("/", 1)[0]), Dir))
        path = self.pick(candidates, op.a)
        if path is None:
            return
        await self.quiesce()
        base = LocalStore(self.store_dir)
        try:
            result = await trio.to_thread.run_sync(trash.restore, base, path)
        except CkptfsError as err:
            if path in model.trash_uncertain and "nothing at" in str(err):
                # the op that would have trashed it was cut by a crash, or its node lost
                # its cache directory before the op reached the store: allowed
                del model.trash[path]
                self.result.faults["trash: a version not trashed after a cut op"] += 1
                return
            self.fail(f"trash restore {path}: {err} (the model holds "
                      f"{len(model.trash[path])} versions)")
        for e in result.restored:
            if e.is_dir:
                if e.path not in model.tree:
                    model.tree[e.path] = DIR
                    model.note(k, e.path)
                continue
            m = Manifest.from_json(base.get(manifests.file_key(e.path)))
            versions = model.trash.get(e.path, [])
            try:
                data = read_manifest_bytes(base, m)
            except CkptfsError as err:
                if e.path not in model.trash_maybe_lost:
                    self.fail(f"trash restore {e.path}: the restored file names a chunk "
                              f"that is gone from the store: {err}")
                # a version trashed before its chunks left a cache directory that was
                # then lost: allowed (fsck names the chunks); the harness drops it
                base.delete(manifests.file_key(e.path))
                if versions:
                    versions.pop()
                self.result.faults["trash: restored a version lost with a cache"] += 1
                continue
            if data not in versions:
                self.fail(f"trash restore {e.path}: {_show(data)} was never trashed there "
                          f"({len(versions)} versions in the model)")
            if data != versions[-1] and e.path not in model.trash_uncertain:
                self.fail(f"trash restore {e.path}: got version "
                          f"{versions.index(data) + 1} of {len(versions)}, not the newest")
            versions.remove(data)
            fid = model.new_file()
            model.files[fid] = data
            model.tree[e.path] = fid
            parts = e.path.split("/")
            for i in range(1, len(parts)):
                model.tree.setdefault("/".join(parts[:i]), DIR)
            # in the store at once, not through the node: a version its lost cache
            # directory cannot take back (the node's later ops on it can be lost)
            model.note(k, e.path)
        for e, why in result.skipped:
            if e.path == path:
                self.fail(f"trash restore {path} skipped it: {why}")
        fs = self.fs(k)
        parent = path.rsplit("/", 1)[0]
        for d in sorted({q.rsplit("/", 1)[0] for q in [path]} | {parent}):
            await fs.refresh_dir(d)
        await fs.refresh_dir(f"n{k}")

    async def op_trash_empty(self, op: Op) -> None:
        await self.quiesce()
        base = LocalStore(self.store_dir)
        await trio.to_thread.run_sync(trash.empty, base, "")
        self.model.trash.clear()
        self.model.trash_uncertain.clear()
        self.model.trash_maybe_lost.clear()

    # ------------------------------------------------------------ faults
    async def op_crash(self, op: Op, lose_cache: bool = False) -> None:
        """Crash node k after a random delay (in the middle of what runs then), or at
        once; it stays down until an op needs it (or, half the time, restarts at once)."""
        k = op.node
        node = self.nodes[k]
        if not node.up:
            return
        delay = (op.b % 40) / 1000.0 if op.b % 3 else 0.0

        async def later() -> None:
            await trio.sleep(delay)
            await self.crash_now(k, lose_cache)

        if delay:
            self.pending_crashes += 1
            self.nursery.start_soon(later)
            await trio.sleep(0)  # the next ops run while it is armed
        else:
            self.pending_crashes += 1
            await self.crash_now(k, lose_cache)
        if op.c % 2:
            await self.flush_crashes()
            await self.restart(k)

    async def crash_now(self, k: int, lose_cache: bool) -> None:
        try:
            node = self.nodes[k]
            if not node.up:
                return
            if lose_cache:
                self.mark_cache_lost(k)
            else:
                for hid in [h for h, hd in self.model.handles.items() if hd.node == k]:
                    self.drop_handle(hid)
            self.trace.append(f"    * n{k} crashed" + (" and lost its cache" if lose_cache
                                                      else ""))
            await node.crash(lose_cache)
        finally:
            self.pending_crashes -= 1
            if not self.pending_crashes:
                self.crashes_done.set()

    async def flush_crashes(self) -> None:
        """Let the crashes armed so far happen (before the harness's own steps)."""
        while self.pending_crashes:
            self.crashes_done = trio.Event()
            await self.crashes_done.wait()

    def drop_handle(self, hid: int) -> None:
        """A crash: the handle's unpublished version is gone (and a new file with it)."""
        model = self.model
        h = model.handles.pop(hid)
        model.pending.pop(h.fid, None)
        if model.files.get(h.fid) is None:
            p = model.path_of(h.fid)
            if p is not None:
                del model.tree[p]

    def mark_cache_lost(self, k: int) -> None:
        """Everything node k did since its last sync may be lost (an allowed loss: what
        is found missing must be reported by fsck/readers, nothing wrong may be read)."""
        model = self.model
        for hid in [h for h, hd in model.handles.items() if hd.node == k]:
            self.drop_handle(hid)
        durable = model.durable.get(k, {})
        now = model.published(f"n{k}")
        hist = model.history.get(k, {})
        for p in set(durable) | set(now) | set(hist):
            if p == f"n{k}":
                continue
            allowed = [durable.get(p), now.get(p)] + hist.get(p, []) + [None, LOST]
            model.uncertain.setdefault(p, []).extend(allowed)
            model.trash_uncertain.add(p)
            model.trash_maybe_lost.add(p)
        self.lost_cache_nodes.add(k)
        self.result.faults["cache dir lost"] += 1

    async def op_lost_publish(self, op: Op) -> None:
        """The W3 sequence (docs/FORMAT.md) as one step: a save on node k whose manifest
        PUTs are refused while its chunks upload; k crashes and stays down while gc with
        no grace frees those chunks (no manifest names them yet); k restarts and replays
        its journal, and must re-confirm the chunks (upload them again from its cache)
        before it publishes the manifest. A publisher that skips that leaves a manifest
        naming freed chunks, which the fresh node's read of every file then fails."""
        k = op.node
        node = await self.up(k)
        assert node.store is not None
        node.store.refuse_manifests = True
        await self.op_save(dataclasses.replace(op, b=op.b & ~1))  # a new name (save())
        fs = self.fs(k) if self.nodes[k].up else None
        if fs is None:
            return
        with trio.move_on_after(SYNC_TIMEOUT):
            while fs.uploader.pending_count():
                await trio.sleep(0.02)
        self.pending_crashes += 1
        await self.crash_now(k, lose_cache=False)
        await self.op_gc_quiet(op)
        await self.restart(k)

    async def op_crash_lose_cache(self, op: Op) -> None:
        await self.op_crash(op, lose_cache=True)

    async def op_restart(self, op: Op) -> None:
        if not self.nodes[op.node].up:
            await self.restart(op.node)

    async def op_store_faults(self, op: Op) -> None:
        """5xx and throttling at a rate, PUT responses lost, timeouts."""
        node = await self.up(op.node)
        store = node.store
        assert store is not None
        rate = 0.02 + (op.a % 10) / 100.0
        for name in ("put", "get", "head", "list", "copy", "delete", "stat", "rename"):
            if op.b >> (len(name) % 8) & 1:
                store.fail_rate(name, rate)
        store.lost_response = 0.05 if op.c % 2 else 0.0
        store.refuse_manifests = op.c % 4 == 1  # closes journal, manifests wait
        store.timeout_rate = 0.02 if op.c % 3 == 0 else 0.0

    async def op_outage(self, op: Op) -> None:
        """Every store call fails for a short window, on every node."""
        until = time.monotonic() + 0.1 + (op.a % 5) / 10.0
        for node in self.nodes:
            if node.store is not None:
                node.store.outage_until = until

    async def op_latency(self, op: Op) -> None:
        node = await self.up(op.node)
        assert node.store is not None
        for name in ("put", "get", "head"):
            node.store.set_latency(name, (op.a % 30) / 1000.0)

    async def op_heal(self, op: Op) -> None:
        for node in self.nodes:
            if node.store is not None:
                node.store.heal()

    async def op_clock_jump(self, op: Op) -> None:
        """The wall clock steps (back or forward, up to a day)."""
        seconds = (op.a % 86400) * (-1 if op.b % 2 else 1)
        self.jump(seconds)

    # ------------------------------------------------------------ the oracle's check
    async def op_check(self, op: Op) -> None:
        await self.full_check()

    async def full_check(self, final: bool = False) -> None:
        """Every node up and synced; the store holds exactly the model (byte-exact, read
        by a fresh node through ckptfs and straight from the store); fsck --deep clean."""
        self.result.checks += 1
        await self.flush_crashes()
        for k in range(self.n_nodes):
            await self.up(k)
        await self.sync_all()
        if final:
            for k in range(self.n_nodes):
                for hid in sorted(h for h, hd in self.model.handles.items() if hd.node == k):
                    hs = sorted(h for h, hd in self.model.handles.items() if hd.node == k)
                    await self.close_like(Op("close", k, hs.index(hid), 0, 0), close=True)
            await self.sync_all()
        for k in range(self.n_nodes):
            await self.observe_node(k, reason="a check")
        base = LocalStore(self.store_dir)
        for k in range(self.n_nodes):
            seen = observe(base, f"n{k}")
            want = self.model.published(f"n{k}")
            want.pop(f"n{k}", None)
            for p in sorted(set(seen) | set(want)):
                got = seen.get(p)
                if isinstance(got, Broken) and p in self.lost_paths(k):
                    continue
                if not _same(got, want.get(p)):
                    self.fail(f"{p}: the store holds {_show(got)}, acknowledged "
                              f"{_show(want.get(p))}")
        await self.fresh_read()
        report = await trio.to_thread.run_sync(functools.partial(inspection.fsck, base,
                                                                 deep=True))
        lost = set().union(*(self.lost_paths(k) for k in range(self.n_nodes)))
        problems = [p for p in report.problems if p.path not in lost]
        if problems:
            self.fail("fsck --deep: " + "; ".join(p.describe() for p in problems[:5]))
        if final:
            for k in range(self.n_nodes):
                node = self.nodes[k]
                fs = node.fs
                assert fs is not None
                problems_k = fs.problems()
                # handles an op cut by a crash left open (the model lost them) keep a
                # buffer: status reports them as open files, and umount as not durable
                open_k = fs.open_buffers()
                durable = await node.stop()
                lost_k = {f.path for f in fs.uploader.lost_files()}
                if not durable and not lost_k and not open_k:
                    self.fail(f"n{k}: unmount not durable: {fs.statistics().errors}")
                if lost_k and not any("DATA LOST" in p for p in problems_k):
                    self.fail(f"n{k}: files lost but not reported: {sorted(lost_k)}")

    async def fresh_read(self) -> None:
        """A new node, with an empty cache and no faults, reads every file of the model."""
        self.fresh += 1
        node = Node(90 + self.fresh, self.workdir / f"fresh{self.fresh}", self.store_dir,
                    self.seed, Counter(), self.nursery, faults=False)
        await node.start()
        try:
            fs = node.fs
            assert fs is not None
            lost = set().union(*(self.lost_paths(k) for k in range(self.n_nodes)))
            for p in sorted(self.model.tree):
                v = self.model.value(p)
                if not isinstance(v, bytes) or p in lost:
                    continue
                try:
                    got = await self.read_path(fs, p)
                except CkptfsError as e:
                    self.fail(f"a fresh node cannot read {p}: {type(e).__name__}: {e}")
                if got != v:
                    self.fail(f"a fresh node reads {p}: {_show(got)}, acknowledged {_show(v)}")
            # nothing deleted reappears: the fresh node lists exactly the model's names
            for k in range(self.n_nodes):
                await self.compare_listing(fs, f"n{k}")
        finally:
            await node.crash()
            shutil.rmtree(node.root, ignore_errors=True)

    async def compare_listing(self, fs: CheckpointFS, path: str) -> None:
        dnode = await self.resolve(fs, path)
        entries = {name for name, _ in await fs.readdir(dnode.inode)}
        want = {p.rsplit("/", 1)[1] for p in self.model.tree
                if "/" in p and p.rsplit("/", 1)[0] == path and self.model.value(p) is not None
                and p not in self.lost_paths(owner(p))}
        if entries != want:
            self.fail(f"a fresh node lists {path}: extra {sorted(entries - want)}, "
                      f"missing {sorted(want - entries)}")
        for name in sorted(entries):
            if isinstance(self.model.tree.get(f"{path}/{name}"), Dir):
                await self.compare_listing(fs, f"{path}/{name}")


class _Lost:
    def __repr__(self) -> str:
        return "LOST(reported)"


LOST: Any = _Lost()


def _same(a: object, b: object) -> bool:
    if isinstance(a, Dir) or isinstance(b, Dir):
        return isinstance(a, Dir) and isinstance(b, Dir)
    return a == b


def _diff(got: bytes, want: bytes) -> str:
    """Where two byte strings first differ, and what each holds there."""
    n = min(len(got), len(want))
    at = next((i for i in range(n) if got[i] != want[i]), n)
    return (f" (first difference at offset {at} of {len(got)}/{len(want)}: got "
            f"{got[at:at + 8].hex()}, want {want[at:at + 8].hex()})")


def _show(v: object) -> str:
    if isinstance(v, bytes | bytearray):
        return f"{len(v)} bytes {digest(bytes(v))}"
    return repr(v)


# ================================================================== entry points
def scratch(fallback: Path) -> Path:
    """Where a schedule's store and caches go: tmpfs when there is one (the journal's
    fsyncs cost nothing there: the soak runs many more schedules), else `fallback`."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"ckptfs-soak-{os.getpid()}" / fallback.name
    return fallback


def run_one(seed: int, n_ops: int, workdir: Path, ops: list[Op] | None = None,
            check_every: int = 0, family: str = "mixed") -> Result:
    """Run the schedule of `seed` in `family` (or `ops`) in `workdir` (emptied first)."""
    workdir = scratch(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    schedule = ops if ops is not None else generate(seed, n_ops, family=family)
    if family == "fast_tier":
        import fastsoak  # its own runner and model (it imports this module)

        result, trace = fastsoak.run(seed, schedule, workdir)
    else:
        runner = Runner(seed, schedule, workdir, check_every=check_every)
        runner.lost_cache_nodes = set()
        result = trio.run(runner.run)
        trace = runner.trace
    result.family = family
    if result.failure is not None:
        result.failure += "\n  trace:\n" + "\n".join("    " + t for t in trace[-40:])
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            workdir.parent.rmdir()  # the process's tmpfs directory, once empty
    return result


def shrink(seed: int, ops: list[Op], workdir: Path, budget: float = 120.0
           ) -> list[Op]:
    """A shorter schedule that still fails (delta debugging within `budget` seconds)."""
    deadline = time.monotonic() + budget
    first = run_one(seed, 0, workdir, ops).failure
    if first is None:
        return list(ops)  # it passed this time (interleavings differ)
    kind = failure_kind(first)
    cur = list(ops)
    n = 2
    while len(cur) >= 2 and time.monotonic() < deadline:
        size = max(1, len(cur) // n)
        reduced = False
        for start in range(0, len(cur), size):
            if time.monotonic() >= deadline:
                break
            cand = cur[:start] + cur[start + size:]
            got = run_one(seed, 0, workdir, cand).failure
            if got is not None and failure_kind(got) == kind:
                cur, n, reduced = cand, max(n - 1, 2), True
                break
        if not reduced:
            if size == 1:
                break
            n = min(len(cur), n * 2)
    return cur


def failure_text(done: int, e: Exception) -> str:
    """A schedule's failure after `done` ops: the oracle's words, or an unexpected error
    with the end of its traceback."""
    if isinstance(e, SoakFailure):
        return f"at op {done}: {e}"
    import traceback

    return (f"at op {done}: unexpected {type(e).__name__}: {e}\n"
            + traceback.format_exc(limit=-8))


def failure_kind(failure: str) -> str:
    """A failure's class, for shrinking: its first line without the op number, paths,
    sizes and hashes (a shorter schedule must fail the same way, not just fail)."""
    line = failure.split("\n")[0].split(": ", 1)[-1]
    return re.sub(r"[\w/.-]*\d[\w/.-]*", "#", line)[:60]


def describe(result: Result, ops: list[Op] | None = None) -> str:
    family = f" --family {result.family}" if result.family != "mixed" else ""
    text = (f"soak seed {result.seed} failed ({result.done}/{result.ops} ops done; replay: "
            f"pytest tests/soak --seed {result.seed} --ops {result.ops}{family}):\n"
            f"{result.failure}")
    if ops is not None:
        text += "\n  schedule:\n" + render(ops)
    return text


