"""The soak's fast_tier family (docs/SOAK.md): nodes write through a shared fast tier and
are lost for good at random points; movers and drain take over; gc runs meanwhile."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import soaklib
import trio
from soaklib import CHUNK, SYNC_TIMEOUT, TRASH_KEEP, WINDOW, KiB, Op, Result

from ckptfs.common.errors import CkptfsError, NoEntry, NotFoundError
from ckptfs.daemon.mount import create_store, read_store_info
from ckptfs.format import manifests
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.namespace import DirNode, FileNode
from ckptfs.fs.options import Options
from ckptfs.pipeline import fastkeep, fasttier, publisher
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.uploader import Uploader
from ckptfs.store.base import AsyncStore, Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.local import LocalStore
from ckptfs.store.tiered import TieredStore
from ckptfs.tools import gc, inspection

#: the lease time of every mover of a schedule (CKPTFS_FAST_LEASE; 60 s in production):
#: a lost node's queue is taken over this long after its last renewal
LEASE = 1.5
#: the checkpoint directories of each node's subtree (fast-keep 1 trims the older ones
#: from the fast tier once the store has them)
STEPS = 4
KEEP_PATTERN = "step-*"
SHARED = "shared"
#: gc's grace beside the movers: 2 windows and 2 s (the family injects no store errors, so
#: no PUT is retried in place after its HEAD; soaklib.GRACE allows for that), short
#: enough that gc sets aside and frees the chunks of overwritten versions during a schedule
FAST_GRACE = 2 * WINDOW + 2.0


class Killed(BaseException):
    """A store call of a node after its kill: its threads stop there, as a kill -9 stops
    them, so a kill lands between any two store calls (mid-copy, mid-publish)."""


def only_killed(e: BaseException) -> bool:
    """Whether `e` is a kill (or a group of kills and cancellations)."""
    if isinstance(e, BaseExceptionGroup):
        return all(only_killed(x) or isinstance(x, trio.Cancelled) for x in e.exceptions)
    return isinstance(e, Killed)


class Life:
    """A node's kill switch, shared by its stores: once set, every call raises Killed;
    `at_put`, when armed, sets it at the n-th PUT to the object store (a mover's)."""

    def __init__(self) -> None:
        self.killed = False
        self.at_put = 0


class KillableStore(FaultyStore):
    def __init__(self, inner: Store, life: Life, counts_puts: bool) -> None:
        super().__init__(inner)
        self.life = life
        self.counts_puts = counts_puts

    def _enter(self, op: str) -> None:
        life = self.life
        if not life.killed and self.counts_puts and op == "put" and life.at_put:
            life.at_put -= 1
            life.killed = life.at_put == 0
        if life.killed:
            raise Killed(op)
        super()._enter(op)


class FastNode:
    """One mount of the core tier with --fast-tier, wired as mount.Daemon.build wires
    it: writes go to the fast tier, its mover brings its queue (and lost nodes') to the
    store. kill() loses it for good (its cache directory deleted)."""

    def __init__(self, slot: int, incarnation: int, workdir: Path, store_dir: Path,
                 fast_dir: Path, nursery: trio.Nursery) -> None:
        self.slot, self.incarnation = slot, incarnation
        self.name = f"n{slot}i{incarnation}"  # also its subtree's name
        self.root = workdir / f"node-{self.name}"
        self.store_dir, self.fast_dir = store_dir, fast_dir
        self.nursery = nursery
        self.life = Life()
        self.fs: CheckpointFS | None = None
        self.mover: fasttier.Mover | None = None
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        self.op_scope: trio.CancelScope | None = None
        self.op_idle = trio.Event()
        self.op_idle.set()

    async def start(self) -> None:
        self.root.mkdir(parents=True)
        slow: Store = KillableStore(LocalStore(self.store_dir), self.life, counts_puts=True)
        fast: Store = KillableStore(LocalStore(self.fast_dir), self.life, counts_puts=False)
        info = read_store_info(LocalStore(self.store_dir))
        assert info is not None
        journal = Journal(str(self.root / "journal.sqlite"))
        journal.set_meta("cache_id", f"c{self.incarnation}")
        cache = LocalCache(str(self.root / "cache"), 1 << 30)
        cache.scan(keep_staging=journal.staging_in_use(), keep_unnamed=False)
        store = TieredStore(fast, slow, manifests.FILES, fasttier.newer_manifest,
                            fast_only=(manifests.INTENTS,))
        uploads = TieredStore(fast, slow, fast_heads=(manifests.CHUNKS,))
        limiter = trio.CapacityLimiter(1)
        uploader = Uploader(uploads, cache, journal, limiter, workers=2, codec_name=info.codec,
                            confirm_window=WINDOW)
        fetcher = Fetcher(store, cache, workers=2, missing_timeout=0.3)
        fetcher.behind = slow
        pub = Publisher(store, journal, limiter, f"{self.name}-c{self.incarnation}", cache,
                        trash_keep=0.0, codec_name=info.codec)
        mover = fasttier.Mover(fast, slow, pub.node_id, pub.applied, uploader.is_pending,
                               lease=LEASE)
        # half the nodes keep no trash (--trash-hours 0): what they delete is gc's at once
        trash_keep = TRASH_KEEP if self.incarnation % 2 else 0.0
        recorder = fasttier.Recorder(fast, pub.node_id, trash_keep, mover.recorded)
        pub.before_apply = recorder.before_apply
        pub.hold_after_apply = fasttier.held
        pub.on_applied = lambda op: mover.wake()
        mover.on_moved = pub.release_held
        mover.trim = lambda: fastkeep.trim(fast, slow, 1, KEEP_PATTERN)
        fs = CheckpointFS(AsyncStore(store, trio.CapacityLimiter(8)), cache, uploader, fetcher,
                          pub, info, Options(metadata_ttl=0.2, publish_timeout=0.3,
                                             writer_id=self.name))
        await uploader.resume(journal.pending_chunks())
        pub.load(journal.pending_ops())
        self._journal, self._cache = journal, cache
        await self.nursery.start(self._serve, fs, mover)
        self.fs, self.mover = fs, mover

    async def _serve(self, fs: CheckpointFS, mover: fasttier.Mover,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as n:
                    await n.start(mover.run)  # its lease taken before the first record
                    await n.start(fs.uploader.run)
                    await n.start(fs.fetcher.run)
                    await n.start(fs.publisher.run)
                    task_status.started()
                    await trio.sleep_forever()
        except BaseException as e:
            if not only_killed(e):
                raise
        finally:
            self.stopped.set()

    @contextlib.asynccontextmanager
    async def op(self) -> Any:
        """The scope of one operation on this node: a kill cuts it (never an error)."""
        with trio.CancelScope() as scope:
            self.op_scope, self.op_idle = scope, trio.Event()
            try:
                yield scope
            except BaseException as e:
                if not only_killed(e) and not (scope.cancel_called and isinstance(
                        e, RuntimeError) and "closed to new arrivals" in str(e)):
                    raise
            finally:
                self.op_scope = None
                self.op_idle.set()

    async def kill(self) -> None:
        """kill -9, and the node's disk gone: it never comes back."""
        self.life.killed = True
        self.fs = self.mover = None
        self.scope.cancel()
        if self.op_scope is not None:
            self.op_scope.cancel()
        await self.stopped.wait()
        await self.op_idle.wait()
        with contextlib.suppress(Exception):
            self._cache.close()
            self._journal.close()
        shutil.rmtree(self.root, ignore_errors=True)

    async def stop(self) -> bool:
        """A clean unmount (mount.Daemon.final_flush): True when all is in the store."""
        fs, mover = self.fs, self.mover
        assert fs is not None and mover is not None
        await fs.publish_leftovers()
        with trio.move_on_after(SYNC_TIMEOUT):
            await fs.wait_all_flushed()
            await mover.wait_moved()
        durable = fs.durable() and not mover.pending_count()
        await trio.to_thread.run_sync(mover.finish)
        self.fs = self.mover = None
        self.scope.cancel()
        await self.stopped.wait()
        self._cache.close()
        self._journal.close()
        return durable


@dataclass
class Version:
    """One value a path took (None: deleted), in the order the schedule made them."""

    value: bytes | None
    writer: str
    durable: bool = False  # its writer's sync --fast (or sync) returned after it
    lost: bool = False  # its writer was killed before that
    stored: bool = False  # its writer's sync (to the object store) returned after it


class FastRunner:
    """Runs one fast_tier schedule: 3 node slots over one store and one fast tier; a
    killed node's slot gets a new node (a new cache, a new queue, a subtree of its own)."""

    def __init__(self, seed: int, ops: list[Op], workdir: Path, nodes: int = soaklib.NODES
                 ) -> None:
        self.seed, self.ops, self.workdir = seed, ops, workdir
        self.store_dir, self.fast_dir = workdir / "store", workdir / "fast"
        self.n_slots = nodes
        self.result = Result(seed, len(ops), family="fast_tier")
        self.nodes: list[FastNode] = []
        self.incarnations = 0
        self.history: dict[str, list[Version]] = {}
        self.unsynced: dict[str, list[Version]] = {}
        self.unstored: dict[str, list[Version]] = {}
        self.renamed = 0
        self.seen_gen: dict[str, int] = {}  # the highest generation the store showed
        self.trace: list[str] = []
        self.background: list[trio.Event] = []

    def fail(self, what: str) -> NoReturn:
        raise soaklib.SoakFailure(what)

    # ------------------------------------------------------------ nodes
    async def new_node(self, slot: int) -> FastNode:
        self.incarnations += 1
        node = FastNode(slot, self.incarnations, self.workdir, self.store_dir, self.fast_dir,
                        self.nursery)
        await node.start()
        fs = node.fs
        assert fs is not None
        dirs = [node.name] + [f"{node.name}/step-{s}" for s in range(STEPS)]
        if slot == 0 and self.incarnations == 1:
            dirs.append(SHARED)
        for d in dirs:  # made and fast-durable before the node takes part
            parent = await self.resolve(fs, d.rsplit("/", 1)[0]) if "/" in d else fs.root
            await fs.mkdir(parent.inode, d.rsplit("/", 1)[-1], 0o755)
        await self.sync_fast(node)
        self.unsynced[node.name] = []
        if slot < len(self.nodes):
            self.nodes[slot] = node
        else:
            self.nodes.append(node)
        self.trace.append(f"    + {node.name} up (queue {node.name}-c{node.incarnation})")
        return node

    async def resolve(self, fs: CheckpointFS, path: str) -> FileNode | DirNode:
        node: Any = fs.root
        for name in path.split("/"):
            node = await fs.lookup(node.inode, name)
        return node  # type: ignore[no-any-return]

    async def sync_fast(self, node: FastNode) -> bool:
        """`ckptfs sync --fast`: until everything closed so far is in the fast tier."""
        fs = node.fs
        if fs is None:
            return False
        target = fs.sync_target()
        with trio.move_on_after(SYNC_TIMEOUT) as scope:
            while not fs.reached(target):
                with trio.move_on_after(0.1):
                    await fs.uploader.wait_changed()
        if scope.cancelled_caught:
            self.fail(f"{node.name}: sync --fast did not finish in {SYNC_TIMEOUT:g} s")
        for v in self.unsynced.get(node.name, []):
            v.durable = True
        self.unsynced[node.name] = []
        return True

    async def sync_store(self, node: FastNode) -> None:
        """`ckptfs sync`: and until the mover has it all in the store."""
        await self.sync_fast(node)
        mover = node.mover
        if mover is None:
            return
        versions, self.unstored[node.name] = self.unstored.get(node.name, []), []
        last = mover.last_recorded()
        with trio.move_on_after(SYNC_TIMEOUT) as scope:
            while node.mover is not None and not mover.moved_through(last):
                mover.wake()
                await trio.sleep(0.05)
        if scope.cancelled_caught:
            self.fail(f"{node.name}: sync did not finish in {SYNC_TIMEOUT:g} s "
                      f"({mover.statistics()})")
        for v in versions:
            v.stored = True

    async def kill(self, slot: int, why: str) -> None:
        node = self.nodes[slot]
        for v in self.unsynced.pop(node.name, []):
            v.lost = True
        self.unstored.pop(node.name, None)
        self.trace.append(f"    * {node.name} killed {why}; its cache is gone")
        self.result.faults[f"kill {why}"] += 1
        await node.kill()
        await self.new_node(slot)

    # ------------------------------------------------------------ the model
    def note(self, path: str, value: bytes | None, node: FastNode) -> None:
        v = Version(value, node.name)
        self.history.setdefault(path, []).append(v)
        self.unsynced.setdefault(node.name, []).append(v)
        self.unstored.setdefault(node.name, []).append(v)

    def current(self, path: str) -> bytes | None:
        hist = self.history.get(path)
        return hist[-1].value if hist else None

    def allowed(self, path: str, tiered: bool = False) -> list[bytes | None]:
        """What `path` may hold: its last fast-durable value or any later one; before a
        fast-durable one, also nothing. `tiered`: as a mount of the fast tier sees it,
        where a deleted name (and a rename's old name) stays listed until the op is in
        the object store (docs/SEMANTICS.md): also the value a delete not yet known to
        be there removed."""
        hist = self.history.get(path, [])
        durable = [i for i, v in enumerate(hist) if v.durable]
        start = durable[-1] if durable else 0
        out: list[bytes | None] = [v.value for v in hist[start:]]
        if tiered:
            out += [hist[j - 1].value for j in range(max(start, 1), len(hist))
                    if hist[j].value is None and not hist[j].stored]
        return out if durable else [None, *out]

    def may_be_broken(self, path: str) -> bool:
        """Whether a version of `path` after its last fast-durable one was lost with its
        writer: its manifest may have reached the fast tier before all its chunks, and a
        mover then publishes it all the same, logging DATA LOST (docs/FORMAT.md)."""
        hist = self.history.get(path, [])
        durable = [i for i, v in enumerate(hist) if v.durable]
        return any(v.lost for v in hist[durable[-1] if durable else 0:])

    def describe(self, path: str) -> str:
        return ", ".join(f"{soaklib._show(v.value)} by {v.writer}"
                         + (" durable" if v.durable else "") + (" lost" if v.lost else "")
                         + (" stored" if v.stored else "")
                         for v in self.history.get(path, []))

    def own_files(self, node: FastNode) -> list[str]:
        return sorted(p for p in self.history if p.startswith(node.name + "/")
                      and self.current(p) is not None)

    # ------------------------------------------------------------ the run
    async def run(self) -> Result:
        started = time.monotonic()
        saved = (publisher.CONFIRM_WINDOW, manifests.CONFIRM_WINDOW,
                 os.environ.get(fasttier.LEASE_ENV))
        publisher.CONFIRM_WINDOW = manifests.CONFIRM_WINDOW = WINDOW
        os.environ[fasttier.LEASE_ENV] = str(LEASE)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                for d in (self.store_dir, self.fast_dir):
                    d.mkdir(parents=True)
                create_store(LocalStore(self.store_dir), CHUNK)
                try:
                    for k in range(self.n_slots):
                        await self.new_node(k)
                    for i, op in enumerate(self.ops):
                        self.trace.append(f"{i} {op}")
                        self.result.kinds[op.kind] += 1
                        await getattr(self, f"op_{op.kind}")(op)
                        self.watch()
                        self.result.done = i + 1
                    await self.final_check()
                except Exception as e:  # noqa: BLE001 - a failure of the seed, reported
                    self.result.failure = soaklib.failure_text(self.result.done, e)
                finally:
                    for node in self.nodes:
                        if node.fs is not None:
                            await node.kill()
                    nursery.cancel_scope.cancel()
        finally:
            publisher.CONFIRM_WINDOW, manifests.CONFIRM_WINDOW = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop(fasttier.LEASE_ENV, None)
            else:
                os.environ[fasttier.LEASE_ENV] = saved[2]
        self.result.seconds = time.monotonic() - started
        return self.result

    def watch(self) -> None:
        """No older version ever replaces a newer one in the store: the generation of
        each file's manifest there never goes down (rename targets are new names)."""
        store = LocalStore(self.store_dir)
        for path in self.history:
            try:
                gen = manifests.generation(store.get(manifests.file_key(path)))
            except NotFoundError:
                continue
            if gen < self.seen_gen.get(path, -1):
                self.fail(f"{path}: the store went back from generation "
                          f"{self.seen_gen[path]} to {gen}")
            self.seen_gen[path] = gen

    # ------------------------------------------------------------ operations
    async def write(self, node: FastNode, path: str, data: bytes) -> None:
        """A whole-file save (create, or open with O_TRUNC), closed; the model takes it
        unless a kill cut it (then it was never acknowledged: it may or may not be)."""
        fs = node.fs
        assert fs is not None
        exists = self.current(path) is not None
        self.note(path, data, node)
        async with node.op():
            if exists:
                fh, _ = await fs.open((await self.resolve(fs, path)).inode,
                                      os.O_WRONLY | os.O_TRUNC)
            else:
                parent = await self.resolve(fs, path.rsplit("/", 1)[0])
                fh, _ = await fs.create(parent.inode, path.rsplit("/", 1)[1], 0o644,
                                        os.O_WRONLY)
            try:
                for at in range(0, len(data), 64 * KiB):
                    await fs.write(fh, at, data[at:at + 64 * KiB])
                await fs.flush(fh)
            finally:
                await fs.release(fh)

    async def op_save(self, op: Op) -> None:
        node = self.nodes[op.node]
        path = f"{node.name}/step-{op.a % STEPS}/f{op.b % 3}"
        await self.write(node, path, soaklib.content(self.seed, op.c))

    async def op_save_shared(self, op: Op) -> None:
        """A file that nodes write in turn (a handoff: the last writer, if alive, has
        made it fast-durable first, so each version is published after the one before)."""
        node = self.nodes[op.node]
        path = f"{SHARED}/s{op.a % 4}"
        hist = self.history.get(path, [])
        if hist and hist[-1].writer != node.name and not hist[-1].durable:
            writer = next((n for n in self.nodes if n.name == hist[-1].writer), None)
            if writer is not None:
                await self.sync_fast(writer)
        await self.write(node, path, soaklib.content(self.seed, op.c))

    async def op_unlink(self, op: Op) -> None:
        node = self.nodes[op.node]
        files = self.own_files(node)
        if not files:
            return
        path = files[op.a % len(files)]
        fs = node.fs
        assert fs is not None
        self.note(path, None, node)
        async with node.op():
            parent = await self.resolve(fs, path.rsplit("/", 1)[0])
            await fs.unlink(parent.inode, path.rsplit("/", 1)[1])

    async def op_rename(self, op: Op) -> None:
        node = self.nodes[op.node]
        files = self.own_files(node)
        if not files:
            return
        src = files[op.a % len(files)]
        self.renamed += 1
        dst = f"{src.rsplit('/', 1)[0]}/r{self.renamed}"
        fs = node.fs
        assert fs is not None
        value = self.current(src)
        self.note(dst, value, node)
        self.note(src, None, node)
        async with node.op():
            parent = await self.resolve(fs, src.rsplit("/", 1)[0])
            await fs.rename(parent.inode, src.rsplit("/", 1)[1], parent.inode,
                            dst.rsplit("/", 1)[1])

    async def op_read_other(self, op: Op) -> None:
        """A read on another node: a version that was written there, or none, never
        other bytes (it may not see the newest: not fast-durable yet, or cached)."""
        node = self.nodes[op.node]
        paths = sorted(self.history)
        if not paths:
            return
        path = paths[op.a % len(paths)]
        fs = node.fs
        assert fs is not None
        got: bytes | None = None
        async with node.op():
            try:
                got = await read_path(fs, path, self.resolve)
            except CkptfsError:
                return
        written = {v.value for v in self.history[path]}
        if got not in written:
            self.fail(f"{node.name} reads {path}: {soaklib._show(got)}, never written there")

    async def op_sync_fast(self, op: Op) -> None:
        await self.sync_fast(self.nodes[op.node])

    async def op_sync(self, op: Op) -> None:
        await self.sync_store(self.nodes[op.node])

    async def op_kill(self, op: Op) -> None:
        """Killed at once, or 1-40 ms later (in the middle of what its tasks do then)."""
        if op.a % 2:
            await trio.sleep((op.b % 40) / 1000)
        await self.kill(op.node, "at a random point")

    async def save_some(self, op: Op) -> None:
        """A save of the node's own files, or (one in two) of a shared one: a lost node's
        version the other nodes then overwrite before its queue is taken over."""
        await (self.op_save_shared(op) if op.c % 2 else self.op_save(op))

    async def op_kill_after_sync_fast(self, op: Op) -> None:
        """A save, `sync --fast`, and the node is lost before its mover moved it all."""
        await self.save_some(op)
        await self.sync_fast(self.nodes[op.node])
        await self.kill(op.node, "right after sync --fast")

    async def op_kill_mid_move(self, op: Op) -> None:
        """A save, `sync --fast`, then the node is killed at its mover's n-th PUT to the
        store (a chunk copy or a manifest), or after the sync if it needed fewer."""
        await self.save_some(op)
        node = self.nodes[op.node]
        await self.sync_fast(node)
        node.life.at_put = 1 + op.b % 5
        with trio.move_on_after(SYNC_TIMEOUT):
            while not node.life.killed and node.mover is not None and node.mover.own:
                node.mover.wake()
                await trio.sleep(0.005)
        await self.kill(op.node, "mid-move" if node.life.killed else "after its moves")

    async def op_gc(self, op: Op) -> None:
        """gc on the store with the test grace, running meanwhile (not waited for)."""
        done = trio.Event()
        self.background.append(done)

        async def collect() -> None:
            try:
                report = await trio.to_thread.run_sync(gc.collect, LocalStore(self.store_dir),
                                                       FAST_GRACE)
                self.count_gc(report)
            finally:
                done.set()

        self.nursery.start_soon(collect)

    def count_gc(self, report: gc.GcReport) -> None:
        self.result.faults["gc: fossilized"] += report.fossilized.count
        self.result.faults["gc: freed"] += report.freed.count
        self.result.faults["gc: restored"] += report.restored.count

    async def op_drain(self, op: Op) -> None:
        """`ckptfs drain` beside the nodes for up to 2 s (it takes what is lost)."""
        done = trio.Event()
        self.background.append(done)

        async def drain() -> None:
            try:
                await trio.to_thread.run_sync(functools.partial(
                    fasttier.drain, LocalStore(self.fast_dir), LocalStore(self.store_dir),
                    lambda s: None, time.monotonic() + 2.0, LEASE))
            finally:
                done.set()

        self.nursery.start_soon(drain)

    async def op_check(self, op: Op) -> None:
        """Every live node fast-durable; a new node reads each file as allowed."""
        for node in self.nodes:
            await self.sync_fast(node)
        reader = FastNode(9, 90 + self.result.checks, self.workdir, self.store_dir,
                          self.fast_dir, self.nursery)
        self.result.checks += 1
        await reader.start()
        try:
            assert reader.fs is not None
            await self.compare(reader.fs, "a new node of the fast tier", tiered=True)
        finally:
            await reader.stop()
            shutil.rmtree(reader.root, ignore_errors=True)

    async def compare(self, fs: CheckpointFS, who: str, tiered: bool = False) -> None:
        for path in sorted(self.history):
            try:
                got: bytes | None = await read_path(fs, path, self.resolve)
            except NoEntry:
                got = None
            except CkptfsError as e:
                if self.may_be_broken(path):
                    self.result.reported_losses += 1
                    self.trace.append(f"    ~ {who}: {path} unreadable ({type(e).__name__}); "
                                      f"its versions: {self.describe(path)}")
                    continue
                self.fail(f"{who} cannot read {path}: {type(e).__name__}: {e} "
                          f"({self.describe(path)})")
            if got not in self.allowed(path, tiered):
                self.fail(f"{who} reads {path}: {soaklib._show(got)}; its versions: "
                          f"{self.describe(path)}")

    # ------------------------------------------------------------ the end
    async def final_check(self) -> None:
        """Every live node synced to the store and unmounted; gc and drain done; a drain
        finds nothing left once the lost nodes' leases ran out; the fast tier deleted, a
        new node on the store alone reads every file as allowed, also after gc with no
        grace; fsck --deep is clean."""
        for node in self.nodes:
            await self.sync_store(node)
            if not await node.stop():
                self.fail(f"{node.name}: unmount not durable")
        for done in self.background:
            await done.wait()
        fast, slow = LocalStore(self.fast_dir), LocalStore(self.store_dir)
        drained = await trio.to_thread.run_sync(functools.partial(
            fasttier.drain, fast, slow, lambda s: None, time.monotonic() + SYNC_TIMEOUT, LEASE))
        if not drained:
            self.fail("drain left records in the fast tier")
        self.watch()
        shutil.rmtree(self.fast_dir)
        for round_ in range(2):
            await self.plain_read(f"a new node on the store alone (round {round_})")
            await trio.sleep(WINDOW + 0.02)  # every sighting stale: grace 0 is safe
            for _ in range(2):
                self.count_gc(await trio.to_thread.run_sync(gc.collect, slow, 0.0))
        report = await trio.to_thread.run_sync(functools.partial(inspection.fsck, slow,
                                                                 deep=True))
        problems = [p for p in report.problems if not self.may_be_broken(p.path)]
        if problems:
            self.fail("fsck --deep: " + "; ".join(p.describe() for p in problems[:5]))

    async def plain_read(self, who: str) -> None:
        node = soaklib.Node(80 + self.result.checks, self.workdir / f"plain{self.result.checks}",
                            self.store_dir, self.seed, Counter(), self.nursery, faults=False)
        self.result.checks += 1
        await node.start()
        try:
            assert node.fs is not None
            await self.compare(node.fs, who)
        finally:
            await node.crash()
            shutil.rmtree(node.root, ignore_errors=True)


async def read_path(fs: CheckpointFS, path: str, resolve: Any) -> bytes:
    fnode = await resolve(fs, path)
    assert isinstance(fnode, FileNode)
    fh, _ = await fs.open(fnode.inode, os.O_RDONLY)
    try:
        out = bytearray()
        while piece := await fs.read(fh, len(out), 96 * KiB):
            out += piece
        return bytes(out)
    finally:
        await fs.release(fh)


def run(seed: int, ops: list[Op], workdir: Path) -> tuple[Result, list[str]]:
    """Run one fast_tier schedule in `workdir`: its result and its trace."""
    runner = FastRunner(seed, ops, workdir)
    return trio.run(runner.run), runner.trace
