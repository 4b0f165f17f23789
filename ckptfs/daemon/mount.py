"""Mount lifecycle: open the store and cache, replay the journal, serve FUSE, flush, exit.

    prepare()      store reachable? format known? cache dir free? journal replayed
    serve()        Daemon(...).run(): trio.run(Daemon.main), then Daemon.close
    Daemon.build   the uploader, fetcher, publisher, CheckpointFS, control socket, and
                   the auto-prune (with --keep-last), wired together
    Daemon.main    pyfuse3.init, one nursery with those services and the signal handler,
                   pyfuse3.main() until the file system is unmounted (ckptfs umount,
                   fusermount3 -u, SIGTERM); then Daemon.final_flush: everything closed
                   goes to the store, then the prunes still waiting run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio

from ckptfs import __version__
from ckptfs.common import private
from ckptfs.common.config import (
    LIMITS,
    NEW_STORE_CHUNK_SIZE,
    NEW_STORE_CODEC,
    NEW_STORE_MIN_RECORD,
    NEW_STORE_MODE,
    MountConfig,
    check_glob,
    default_cache_dir,
    parse_store_mode,
    trash_seconds,
)
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import ConfigError, NotFoundError, StoreError
from ckptfs.common.latency import FUSE_BUCKETS, STORE_BUCKETS, LatencyTable
from ckptfs.common.redact import redact, redacted
from ckptfs.daemon import mounts
from ckptfs.daemon.control import ControlServer
from ckptfs.daemon.fuseops import FuseOps
from ckptfs.daemon.locate import mount_refusal
from ckptfs.daemon.logs import open_log
from ckptfs.format import codec, manifests
from ckptfs.format.chunking import check_chunk_size
from ckptfs.format.manifests import StoreInfo
from ckptfs.fs.autoprune import AutoPruner, Policy
from ckptfs.fs.filesystem import CheckpointFS
from ckptfs.fs.options import Options
from ckptfs.pipeline import fastfail, fastkeep, fasttier
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.pipeline.journal import Journal
from ckptfs.pipeline.publisher import Publisher
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.pipeline.uploader import Uploader
from ckptfs.pipeline.warmup import Warmer, WarmupProgress
from ckptfs.store import LocalStore, open_store
from ckptfs.store.base import AsyncStore, Store
from ckptfs.store.tiered import TieredStore
from ckptfs.store.timed import TimedStore
from ckptfs.tools import inspection

if TYPE_CHECKING:  # with --metrics-addr only (Daemon.build): prometheus_client is not light
    from ckptfs.daemon.metrics import MetricsServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notice:
    """A line for the user at mount time: `ckptfs mount` prints it, the daemon logs it."""

    level: int  # logging.INFO or logging.WARNING
    text: str

    def line(self) -> str:
        """The text as printed after `ckptfs: ` on the terminal."""
        return f"warning: {self.text}" if self.level >= logging.WARNING else self.text


def size_text(n: int) -> str:
    """A chunk size as a user writes it: '16 MiB', '64 KiB', '70000 bytes'."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def read_store_info(store: Store) -> StoreInfo | None:
    """<prefix>/ckptfs.json (its version checked), or None where there is no store yet;
    a directory store then writes with the mode it records (inspection.use_store_mode)."""
    try:
        info = StoreInfo.from_json(store.get_record(manifests.INFO_KEY))
    except NotFoundError:
        return None
    inspection.use_store_mode(store, info)
    return info


def create_store(store: Store, chunk_size: int, min_record: int = NEW_STORE_MIN_RECORD,
                 codec: str = NEW_STORE_CODEC, store_mode: int = NEW_STORE_MODE) -> StoreInfo:
    """Initialise a new store: ckptfs.json, then the root directory's marker; a directory
    store records `store_mode`, the mode of its files, and writes both with it."""
    info = StoreInfo(chunk_size=chunk_size, min_record=min_record, codec=codec,
                     store_mode=store_mode if isinstance(store, LocalStore) else None)
    inspection.use_store_mode(store, info)
    store.put(manifests.INFO_KEY, info.to_json())
    store.put(manifests.dir_key(""), manifests.DirMarker().to_json())
    return info


def control_socket_path(cache_dir: str) -> str:
    """CACHE_DIR/ctl.sock; for a cache directory whose path is too long for a socket's
    (108 bytes), <tmp>/ckptfs-<uid>/<hash of the cache directory>.sock (socket_dir())."""
    path = os.path.join(cache_dir, "ctl.sock")
    if len(path) < 100:
        return path
    digest = hashlib.sha256(cache_dir.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ckptfs-{os.getuid()}", f"{digest}.sock")


def socket_dir(cache_dir: str) -> None:
    """Make the private directory of the control socket of a cache directory whose path
    is too long (control_socket_path), or check it is one: ConfigError, one line,
    when another user made it first, or made it a link (a name anyone can take in /tmp)."""
    path = control_socket_path(cache_dir)
    if os.path.dirname(path) == cache_dir:
        return  # in the cache directory, checked as such
    fix = (f"remove it, or use a cache directory whose path is shorter (under "
           f"{100 - len('/ctl.sock')} characters): its control socket is then "
           f"CACHE_DIR/ctl.sock")
    os.close(private.open_dir(os.path.dirname(path), "the control socket's directory", fix))


def same_store(known: str, url: str) -> bool:
    """Whether the store a cache directory's journal names, `known`, is the one at
    `url`: the same URL, or as an older ckptfs recorded it, with the credential now kept
    out of it (a SAS token in the query of an Azure endpoint, a password in an
    --endpoint-url)."""
    return known == url or redact(known) == url or (
        known.startswith("az://") and known.partition("?")[0].rstrip("/") == url)


@dataclass
class Prepared:
    """Everything opened before FUSE starts; closed by serve()."""

    cfg: MountConfig
    store: Store
    info: StoreInfo
    journal: Journal
    cache: LocalCache
    lock_fd: int
    notices: list[Notice]
    #: the log file (log_path), opened for `ckptfs mount` to send the daemon's output
    #: to; None in the foreground (the log goes to stderr)
    log_fd: int | None = None
    #: the fast tier (--fast-tier), None without one
    fast: Store | None = None


def check_mountpoint(path: str) -> None:
    if not os.path.exists("/dev/fuse"):
        raise ConfigError("/dev/fuse is missing: load the fuse module or run with --device "
                          "/dev/fuse in containers")
    if mounts.is_dead(path):
        if mounts.entry_at(path) is not None:
            raise ConfigError(f"{path} is a ckptfs mount whose daemon is gone; run ckptfs "
                              f"umount {shlex.quote(path)} first")
        raise ConfigError(f"{path}: transport endpoint is not connected (a FUSE mount whose "
                          f"daemon is gone); run fusermount3 -u on its mount point first")
    if not os.path.exists(path):
        raise ConfigError(f"mount point does not exist: {path}")
    if not os.path.isdir(path):
        raise ConfigError(f"mount point is not a directory: {path}")
    if os.path.ismount(path):
        raise ConfigError(f"already mounted: {path}")
    if os.listdir(path):
        raise ConfigError(f"mount point is not empty: {path}")


def prepare(cfg: MountConfig) -> Prepared:
    """Open and check everything; ConfigError/StoreError/FormatError with one-line messages."""
    check_mountpoint(cfg.mountpoint)
    store = open_store(cfg.store, endpoint_url=cfg.endpoint_url, region=cfg.region,
                       max_pool_connections=cfg.upload_threads + cfg.fetch_threads
                       + LIMITS.spare_connections,
                       storage_class=cfg.storage_class, storage_class_prefix=manifests.CHUNKS)
    check = getattr(store, "check", None)
    if check is not None:
        check()
    check_storage_class = getattr(store, "check_storage_class", None)
    if check_storage_class is not None:
        check_storage_class()
    if cfg.chunk_size is not None:
        try:
            check_chunk_size(cfg.chunk_size)
        except ValueError as e:
            raise ConfigError(f"--chunk-size: {e}") from None
    low, high = manifests.MIN_RECORD_RANGE
    if cfg.min_record is not None and not low <= cfg.min_record <= high:
        raise ConfigError(f"--min-record must be in [{size_text(low)}, {size_text(high)}]")
    notices: list[Notice] = []
    info = read_store_info(store)
    if info is None:  # a new store: created last, once nothing else can refuse the mount
        mount_refusal(store, cfg.store, cfg.mountpoint)  # a store inside a store
        chunk_size = cfg.chunk_size or NEW_STORE_CHUNK_SIZE
    else:
        chunk_size = info.chunk_size
        if cfg.chunk_size is not None and cfg.chunk_size != info.chunk_size:
            notices.append(Notice(logging.WARNING, (
                f"--chunk-size {size_text(cfg.chunk_size)} is ignored: the store at "
                f"{store.url} exists and has chunk size {size_text(info.chunk_size)}")))
        if cfg.codec is not None and cfg.codec != info.codec:
            notices.append(Notice(logging.WARNING, (
                f"--codec {cfg.codec} is ignored: the store at {store.url} exists and "
                f"compresses with {info.codec}")))
        if cfg.store_mode is not None and parse_store_mode(cfg.store_mode) != info.store_mode:
            has = ("0644 less the umask: it records none" if info.store_mode is None
                   else f"{info.store_mode:04o}")
            notices.append(Notice(logging.WARNING, (
                f"--store-mode {cfg.store_mode} is ignored: the store at {store.url} exists "
                f"and writes its files with mode {has}")))
        if cfg.min_record is not None and cfg.min_record != info.min_record:
            notices.append(Notice(logging.WARNING, (
                f"--min-record {size_text(cfg.min_record)} is ignored: the store at "
                f"{store.url} exists and has min record {size_text(info.min_record)}")))
        if info.format < manifests.FORMAT_VERSION:
            notices.append(Notice(logging.INFO, (
                f"the store at {store.url} is format {info.format} (fixed chunks, lz4) and "
                f"stays so: ckptfs upgrade {store.url} --yes moves it to format "
                f"{manifests.FORMAT_VERSION} (chunks cut at tensor boundaries, zstd4), "
                f"once every node runs this ckptfs")))
    if cfg.keep_last == 1:
        notices.append(Notice(logging.WARNING, (
            "--keep-last 1: while a save is in progress, the checkpoint being written can "
            "look complete between two of its files, and the previous one is then removed; "
            "--keep-last 2 always keeps one checkpoint whose save has ended")))
    if cfg.cache_size < 4 * chunk_size:
        raise ConfigError(f"--cache-size must be at least 4 chunks of this store "
                          f"({4 * chunk_size} bytes)")
    cfg.cache_dir = os.path.abspath(cfg.cache_dir or default_cache_dir(store.url))
    lock_fd = open_cache_dir(cfg.cache_dir)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        users = mounts.users_of_cache(cfg.cache_dir)
        by = f"the ckptfs mount on {users[0]}" if users else "another ckptfs mount"
        raise ConfigError(f"cache directory {cfg.cache_dir} is in use by {by}; give a second "
                          "mount of the same store its own: --cache-dir DIR") from None
    socket_dir(cfg.cache_dir)
    log_fd = None if cfg.foreground else open_log(log_path(cfg))  # refused before any change
    journal = Journal(os.path.join(cfg.cache_dir, "journal.sqlite"))
    known = journal.get_meta("store")
    if known is not None and not same_store(known, store.url):
        raise ConfigError(f"cache directory {cfg.cache_dir} belongs to store "
                          f"{redact(known)}; use another --cache-dir")
    # its staging/ and chunks/ checked (private.py): the last refusal, before any change
    cache = LocalCache(cfg.cache_dir, cfg.cache_size, cfg.read_memory)
    if info is None:
        info = create_store(store, chunk_size, cfg.min_record or NEW_STORE_MIN_RECORD,
                            cfg.codec or NEW_STORE_CODEC,
                            parse_store_mode(cfg.store_mode) if cfg.store_mode else NEW_STORE_MODE)
        mode = "" if info.store_mode is None else f", files {info.store_mode:04o}"
        notices.append(Notice(logging.INFO, f"initialised a new ckptfs store at {store.url} "
                                            f"(chunk size {size_text(chunk_size)}{mode})"))
    if known != store.url:  # a new cache, or one whose record held a credential
        journal.set_meta("store", store.url)
    if journal.get_meta("cache_id") is None:  # names this cache's intent records uniquely
        journal.set_meta("cache_id", uuid.uuid4().hex[:8])
    damage = journal.damage
    if damage is not None:
        notices.append(Notice(logging.WARNING, (
            f"the journal in {cfg.cache_dir} lost committed state ({damage}); the mount "
            f"checks the files this node wrote against the store, and is not durable "
            f"until that is done (ckptfs status)")))
    cache.scan(keep_staging=journal.staging_in_use(), keep_unnamed=damage is not None)
    fast = fasttier.attach(cfg.fast_tier, store) if cfg.fast_tier is not None else None
    return Prepared(cfg, store, info, journal, cache, lock_fd, notices, log_fd, fast)


def log_path(cfg: MountConfig) -> str:
    """Where the daemon of a mount in the background logs: --log-file, else
    CACHE_DIR/ckptfs.log."""
    return cfg.log_file or os.path.join(cfg.cache_dir, "ckptfs.log")


def open_cache_dir(path: str) -> int:
    """Make the cache directory (its parents as needed) or check it (private.open_dir:
    this user's, no link, no one else may write it); the fd of its lock file, which is
    checked the same way. ConfigError, one line, when either is refused."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    root = private.open_dir(path, "the cache directory", private.CACHE_FIX)
    try:
        return private.open_file("lock", os.O_RDWR | os.O_CREAT, "the lock file",
                                 private.INSIDE_FIX, dir_fd=root,
                                 shown=os.path.join(path, "lock"))
    finally:
        os.close(root)


def fuse_options(cfg: MountConfig) -> set[str]:
    opts = set(pyfuse3.default_options)
    opts |= {f"fsname={mounts.fsname(cfg.cache_dir)}", "subtype=ckptfs",
             "default_permissions", "noatime"}
    if cfg.allow_other:
        opts.add("allow_other")
    return opts


def tune_readahead(mountpoint: str, kib: int = 4096) -> None:
    """Raise the mount's read_ahead_kb so the kernel sends 1 MiB+ READs (best effort)."""
    try:
        dev = os.stat(mountpoint).st_dev
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(path, "w") as f:
            f.write(str(kib))
    except OSError as e:
        log.debug("could not raise read_ahead_kb: %s", e)


def serve(p: Prepared, ready: Callable[[str | None], None]) -> int:
    """Run the mount until unmounted; returns 0 when everything is durable in the store."""
    return Daemon(p, ready).run()


@dataclass
class Parts:
    """The running pieces of one mount, built from its Prepared state by Daemon.build."""

    uploader: Uploader
    fetcher: Fetcher
    publisher: Publisher
    fs: CheckpointFS
    control: ControlServer
    autoprune: AutoPruner | None
    metrics: MetricsServer | None  # with --metrics-addr
    fuse_requests: LatencyTable | None  # with --metrics-addr: FUSE requests timed
    warmer: Warmer  # `ckptfs warmup` jobs
    mover: fasttier.Mover | None = None  # with --fast-tier
    health: fastfail.Health | None = None  # with --fast-tier


class Daemon:
    """One mount's life, top to bottom: build the parts, serve FUSE until the file system
    is unmounted, flush what is left to the store, close everything (run)."""

    def __init__(self, p: Prepared, ready: Callable[[str | None], None]) -> None:
        self.p = p
        self.cfg = p.cfg
        self.ready = ready  # called once: None when mounted, or the reason it failed
        self.fuse_started = False  # pyfuse3.init ran: close() must call pyfuse3.close
        self.mounted = False  # the kernel mount is up: pyfuse3.close must unmount it
        self.started = time.time()
        self.flush_scope: trio.CancelScope | None = None  # the final flush, once it runs
        self.metrics: MetricsServer | None = None  # with --metrics-addr, once built
        self.view: Store = p.store  # what the mount reads: with a fast tier, both tiers
        self.mover: fasttier.Mover | None = None  # with --fast-tier, once built
        self.health: fastfail.Health | None = None  # with --fast-tier, once built

    def run(self) -> int:
        for notice in self.p.notices:  # printed by `ckptfs mount` before the log was open
            log.log(notice.level, "%s", notice.text)
        try:
            return trio.run(self.main)
        except BaseException as e:
            if not self.fuse_started:
                self.ready(f"cannot mount {self.cfg.mountpoint}: {e}")
            else:
                log.exception("ckptfs failed")
            raise
        finally:
            self.close()

    def build(self) -> Parts:
        """The pipeline, the file system and its helpers, wired together (no task runs yet)."""
        p, cfg = self.p, self.cfg
        store: Store = p.store
        store_requests = fuse_requests = None
        if cfg.metrics_addr is not None:  # every store call timed, in its own thread
            store_requests = LatencyTable(STORE_BUCKETS)
            fuse_requests = LatencyTable(FUSE_BUCKETS, one_thread=True)
            store = TimedStore(p.store, store_requests)
        slow = uploads = store
        health = None
        if p.fast is not None:  # everything written goes to the fast tier first
            assert cfg.fast_tier is not None
            health = fastfail.Health(p.fast, cfg.fast_tier,
                                     f"{cfg.node_id}-{p.journal.get_meta('cache_id')}")
            view = fasttier.view(p.fast, slow)
            # the uploader deduplicates against the fast tier alone: every chunk a pending
            # manifest adds is there for the mover, whatever gc does meanwhile; while the
            # fast tier is unusable, its chunks go to the object store (fastfail.py)
            uploads = TieredStore(p.fast, slow, fast_heads=(manifests.CHUNKS,))
            uploads.writes_follow = True
            uploads.wrote_slow = health.count_direct
            for tiered in (view, uploads):
                tiered.fast_usable, tiered.fast_failed = health.is_usable, health.judge
            store = view
        self.view = store
        journal_limiter = trio.CapacityLimiter(1)
        uploader = Uploader(uploads, p.cache, p.journal, journal_limiter, cfg.upload_threads,
                            cfg.uploads_while_writing, codec_name=p.info.codec)
        fetcher = Fetcher(store, p.cache, cfg.fetch_threads, cfg.missing_chunk_timeout)
        fetcher.behind = slow if p.fast is not None else None
        publisher = Publisher(store, p.journal, journal_limiter,
                              f"{cfg.node_id}-{p.journal.get_meta('cache_id')}", p.cache,
                              trash_keep=0.0 if p.fast is not None else
                              trash_seconds(cfg.trash_hours), codec_name=p.info.codec)
        mover = None
        if p.fast is not None and health is not None:  # the mover keeps the store's trash
            mover = self.fast_mover(p.fast, slow, uploader, publisher, health)
        meta_limiter = trio.CapacityLimiter(LIMITS.metadata_threads)
        meta_limiter.name = "metadata"  # type: ignore[attr-defined]
        fs = CheckpointFS(AsyncStore(store, meta_limiter), p.cache, uploader, fetcher,
                          publisher, p.info,
                          Options.of(cfg, control_socket_path(cfg.cache_dir)))
        autoprune: AutoPruner | None = None
        if cfg.keep_last is not None:
            autoprune = AutoPruner(store, Policy(cfg.keep_last, cfg.keep_every,
                                                   cfg.keep_pattern or "*"), fs,
                                   trash_keep=trash_seconds(cfg.trash_hours),
                                   node=publisher.node_id)
            publisher.on_applied = autoprune.notify
        damage = p.journal.damage
        if damage is not None:  # checked against the store once the nursery runs
            fs.journal_check = JournalCheck(store, p.journal, journal_limiter, p.cache,
                                            uploader, publisher, cfg.node_id, damage)
        sync_target: Callable[[], Any] = fs.sync_target
        reached: Callable[[Any], bool] = fs.reached
        reached_fast: Callable[[Any], bool] = fs.reached
        if mover is not None:  # durable: in the object store, not only the fast tier
            def sync_target() -> tuple[tuple[int, frozenset[str]], int]:
                target = fs.sync_target()  # and this mount's records, of earlier runs too
                return target, max(target[0], mover.last_recorded())

            def reached(target: tuple[tuple[int, frozenset[str]], int]) -> bool:
                return fs.reached(target[0]) and mover.moved_through(target[1])

            def reached_fast(target: tuple[tuple[int, frozenset[str]], int]) -> bool:
                return fs.reached(target[0])
        warmer = Warmer(fetcher, p.cache)
        control = ControlServer(fs.opt.control_socket,
                                functools.partial(self.status, fs, autoprune),
                                sync_target, reached, uploader.wait_changed,
                                self.latest, reached_fast=reached_fast,
                                warmup=functools.partial(self.warmup, warmer))
        metrics = None
        if cfg.metrics_addr is not None and store_requests is not None and fuse_requests:
            from ckptfs.daemon.metrics import MetricsServer

            metrics = MetricsServer(cfg.metrics_addr, fs, store_requests, fuse_requests,
                                    __version__, p.store.url, fast_statistics(health, mover))
        return Parts(uploader, fetcher, publisher, fs, control, autoprune, metrics,
                     fuse_requests, warmer, mover, health)

    def fast_mover(self, fast: Store, slow: Store, uploader: Uploader,
                   publisher: Publisher, health: fastfail.Health) -> fasttier.Mover:
        """The fast tier's mover, and the publisher's hooks: each op recorded in the fast
        tier before it is applied there; a delete or rename stays pending here until the
        mover has it in the object store (else a listing would show the old name again);
        while the fast tier is unusable, each op applied straight to the object store once
        this mount's records are (fastfail.py)."""
        mover = fasttier.Mover(fast, slow, publisher.node_id, publisher.applied,
                               uploader.is_pending)
        mover.fast_usable, mover.fast_failed = health.is_usable, health.judge
        mover.fast_mounted = health.marker
        trash_keep = trash_seconds(self.cfg.trash_hours)
        recorder = fasttier.Recorder(fast, publisher.node_id, trash_keep, mover.recorded)
        recorder.fast_failed, recorder.mounted = health.judge, health.marker
        direct = fastfail.Direct(fast, slow, health, mover)
        recorder.floor = direct.generations
        publisher.before_apply = recorder.before_apply
        publisher.route, publisher.direct_trash_keep = direct.route, trash_keep
        publisher.before_direct, publisher.after_direct = direct.before, direct.after
        publisher.hold_after_apply = fasttier.held
        publisher.on_applied = lambda op: mover.wake()
        health.changed = mover.wake
        mover.on_moved = publisher.release_held
        mover.trim = fastkeep.Retention(fast, slow, self.cfg.fast_keep, self.cfg.fast_size,
                                        self.cfg.keep_pattern)
        return mover

    async def main(self) -> int:
        parts = self.build()
        self.mover, self.health = parts.mover, parts.health
        fs = parts.fs
        await parts.uploader.resume(self.p.journal.pending_chunks())
        for problem in fs.problems():  # said at every mount until the file is rewritten
            log.error("%s", problem)
        parts.publisher.load(self.p.journal.pending_ops())
        await fs.list_root()
        pyfuse3.init(FuseOps(fs, parts.fuse_requests), self.cfg.mountpoint, fuse_options(self.cfg))
        self.fuse_started = self.mounted = True
        unmounted = trio.Event()
        async with trio.open_nursery() as nursery:
            if parts.health is not None:  # before the first record: the marker, a write
                await trio.to_thread.run_sync(parts.health.check)
                await nursery.start(parts.health.run)
            if parts.mover is not None:  # its lease taken before the first record
                await nursery.start(parts.mover.run)
            for service in (parts.uploader.run, parts.fetcher.run, parts.publisher.run,
                            parts.warmer.run, parts.control.serve):
                await nursery.start(service)
            if fs.journal_check is not None:
                await nursery.start(fs.journal_check.run)
            if parts.autoprune is not None:
                await nursery.start(parts.autoprune.run)
            if parts.metrics is not None:
                await nursery.start(parts.metrics.watch_durable)
                parts.metrics.start()
                self.metrics = parts.metrics
            nursery.start_soon(self.on_signals, unmounted)
            nursery.start_soon(functools.partial(trio.to_thread.run_sync, tune_readahead,
                                                 self.cfg.mountpoint))
            self.ready(None)
            nursery.start_soon(trio.to_thread.run_sync, codec.preload)  # once it answers
            log.info("mounted %s on %s (cache %s)", self.p.store.url, self.cfg.mountpoint,
                     self.cfg.cache_dir)
            await pyfuse3.main()  # until unmounted: ckptfs umount, fusermount3 -u, a signal
            unmounted.set()
            self.mounted = False
            try:
                durable = await self.final_flush(parts)
            finally:  # a scrape needs trio's loop: the server stops before it ends
                if parts.metrics is not None:
                    parts.metrics.stop()
            nursery.cancel_scope.cancel()
        return 0 if durable else 1

    async def final_flush(self, parts: Parts) -> bool:
        """Everything closed goes to the store, then the prunes still waiting run; a
        second signal cuts it short. True when everything is durable in the store."""
        fs = parts.fs
        log.info("unmounted; flushing %d chunks and %d metadata ops to the store",
                 parts.uploader.pending_count(), parts.publisher.pending_count)
        crash_point("unmounted")
        with trio.CancelScope() as self.flush_scope:
            await fs.publish_leftovers()
            await fs.wait_all_flushed()
            if parts.mover is not None:  # and from the fast tier to the object store
                await parts.mover.wait_moved()
            if parts.autoprune is not None and fs.flushed():
                await parts.autoprune.finish()
        durable = fs.durable()
        if parts.mover is not None:
            durable = durable and not parts.mover.pending_count()
            with contextlib.suppress(StoreError):
                await trio.to_thread.run_sync(parts.mover.finish)
        for problem in fs.problems():
            log.error("%s", problem)
        log.info("flush %s", "complete: everything is in the store" if durable else
                 "interrupted: the rest stays in the cache for the next mount"
                 if not fs.flushed() else "complete, but some data could not be saved")
        return durable

    async def on_signals(self, unmounted: trio.Event) -> None:
        """SIGTERM, SIGINT, SIGHUP: a lazy unmount (then the final flush runs); during the
        final flush: stop it, leaving what is pending in the cache for the next mount."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            async for signum in sigs:
                if not unmounted.is_set():
                    log.info("signal %d: unmounting (lazy), then flushing", signum)
                    await trio.to_thread.run_sync(_lazy_unmount, self.cfg.mountpoint)
                else:
                    log.warning("signal %d during the final flush: stopping now; pending "
                                "data stays in the cache for the next mount", signum)
                    if self.flush_scope is not None:
                        self.flush_scope.cancel()

    def status(self, fs: CheckpointFS, autoprune: AutoPruner | None) -> dict[str, Any]:
        """What `ckptfs status` shows, answered on the control socket."""
        cfg = self.cfg
        st = dataclasses.asdict(fs.statistics())
        st.update(pid=os.getpid(), store=self.p.store.url, store_arg=cfg.store,
                  endpoint_url=cfg.endpoint_url, mountpoint=cfg.mountpoint,
                  cache_dir=cfg.cache_dir, version=__version__,
                  uptime=round(time.time() - self.started, 1),
                  metrics_addr=self.metrics.address if self.metrics is not None else None,
                  autoprune=autoprune.statistics() if autoprune is not None else None,
                  files=fs.files_in_flight())
        if self.mover is not None:  # durable: in the object store, not only the fast tier
            st.update(self.mover.statistics(), fast_tier=self.p.fast.url if self.p.fast
                      else None, fast_durable=st["durable"])
            if self.health is not None:
                st.update(self.health.statistics())
            st["durable"] = st["durable"] and not self.mover.pending_count()
            st["files"] = files_by_tier(st["files"], self.mover.pending_files())
        return redacted(st)  # printed by status, returned by the Python API

    async def latest(self, dir_path: str, pattern: str) -> str | None:
        """`ckptfs latest` in the store for the control socket (the Python API's
        latest_complete): the training process needs no store credentials."""
        check_glob(pattern, "pattern")

        def damaged(problem: inspection.Problem) -> None:
            log.warning("latest: skipped, DAMAGED %s", problem.describe())

        return await trio.to_thread.run_sync(
            functools.partial(inspection.latest, self.view, dir_path.strip("/"), pattern,
                              damaged=damaged))

    async def warmup(self, warmer: Warmer, path: str) -> WarmupProgress:
        """Start `ckptfs warmup` of the file or directory `path` (from the filesystem
        root): its manifests read from the store (a damaged one is skipped, with a log
        line), its chunks fetched by `warmer`. NoEntry if the store has no such path."""
        path = path.strip("/")
        tree = await trio.to_thread.run_sync(inspection.read_tree, self.view, path)
        for name, _, why in tree:
            if why is not None:
                log.warning("warmup: skipped, DAMAGED %s: %s", name, why)
        return warmer.start(path, [m.chunks for _, m, _ in tree if m is not None])

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self.fuse_started:
            pyfuse3.close(unmount=self.mounted)
        self.p.cache.close()
        self.p.journal.close()
        self.p.store.close()
        if self.p.fast is not None:
            self.p.fast.close()
        os.close(self.p.lock_fd)


def fast_statistics(health: fastfail.Health | None, mover: fasttier.Mover | None
                    ) -> Callable[[], dict[str, Any]] | None:
    """What the metrics read of a fast tier at each scrape: its health and its mover's
    counts (None without one)."""
    if health is None or mover is None:
        return None
    return lambda: {**health.statistics(), **mover.statistics()}


def files_by_tier(saving: list[dict[str, Any]], moving: list[tuple[str, int]],
                  limit: int = 20) -> list[dict[str, Any]]:
    """status `files` with a fast tier: those still being saved (in neither tier yet),
    then those in the fast tier only (state `moving`: fast-durable, not yet durable), each
    saying `fast_durable` and `durable`; largest first within each, at most `limit`."""
    out = [{**f, "fast_durable": False, "durable": False} for f in saving]
    newest = dict(moving)  # a path published twice: its last version's size
    out += [{"path": path, "state": "moving", "size": size, "left_bytes": size,
             "fast_durable": True, "durable": False}
            for path, size in sorted(newest.items(), key=lambda f: -f[1])]
    return out[:limit]


def _lazy_unmount(mountpoint: str) -> None:
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
