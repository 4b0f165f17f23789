"""The `ckptfs` command: mount, umount, status, sync; verify, ls, latest, fsck, gc, du, prune
on a store."""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shlex
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptfs import __version__
from ckptfs.common.config import MountConfig, check_glob, trash_seconds
from ckptfs.common.errors import (
    CkptfsError,
    CliError,
    ConfigError,
    JournalError,
    NoEntry,
    UsageError,
)
from ckptfs.common.units import format_duration, parse_duration, parse_size
from ckptfs.daemon import mounts

if TYPE_CHECKING:
    from ckptfs.pipeline.journal import LostFile
    from ckptfs.store.base import Store
    from ckptfs.tools.gc import GcReport, Tally
    from ckptfs.tools.inspection import FileReport
    from ckptfs.tools.retention import PruneResult
    from ckptfs.tools.usage import UsageReport

log = logging.getLogger("ckptfs")

CONTROL_XATTR = "user.ckptfs.control"
#: how the daemon marks a line for the user (mount.Notice) on the pipe to `ckptfs mount`
NOTICE = "notice: "


def human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


#: --endpoint-url means the endpoint of whatever store the URL names
ENDPOINT_HELP = ("endpoint of the store the URL names: an S3-compatible server for s3:// "
                 "(default $AWS_ENDPOINT_URL, else AWS), an Azure blob endpoint for az:// "
                 "(Azurite, sovereign clouds; default: the connection string's, else "
                 "https://ACCOUNT.blob.core.windows.net), a GCS endpoint for gs:// (default "
                 "$STORAGE_EMULATOR_HOST, else Google)")
TOOL_ENDPOINT_HELP = ENDPOINT_HELP[:-1] + "; or the mount's when TARGET is a mounted path)"


def default_endpoint(url: str) -> str | None:
    """The endpoint the environment names for the store at `url` (store.default_endpoint)."""
    from ckptfs.store import default_endpoint as from_env

    return from_env(url)


# ---------------------------------------------------------------------------- mount
def cmd_mount(a: argparse.Namespace) -> int:
    cfg = MountConfig(
        store=a.store, mountpoint=os.path.abspath(a.mountpoint), cache_dir=a.cache_dir or "",
        cache_size=parse_size(a.cache_size, "--cache-size"),
        read_memory=parse_size(a.read_memory, "--read-memory"),
        endpoint_url=a.endpoint_url or default_endpoint(a.store), region=a.region,
        chunk_size=None if a.chunk_size is None else parse_size(a.chunk_size, "--chunk-size"),
        min_record=None if a.min_record is None else parse_size(a.min_record, "--min-record"),
        codec=a.codec,
        upload_threads=a.upload_threads, fetch_threads=a.fetch_threads,
        uploads_while_writing=a.uploads_while_writing,
        metadata_ttl=a.metadata_ttl, missing_chunk_timeout=a.missing_chunk_timeout,
        fsync_to_store=a.fsync_to_store, allow_other=a.allow_other,
        foreground=a.foreground, debug=a.debug, node_id=a.node_id or "",
        storage_class=a.storage_class, keep_last=a.keep_last, keep_every=a.keep_every,
        keep_pattern=a.keep_pattern, trash_hours=a.trash_hours)
    check_mount_store(cfg)
    if cfg.keep_last is not None:
        from ckptfs.tools import retention

        try:
            retention.check_policy(cfg.keep_last, cfg.keep_every)
        except retention.PolicyError as e:
            raise CliError(str(e)) from None
    from ckptfs.daemon import mount  # imports pyfuse3: only for this command

    if cfg.foreground:
        prepared = mount.prepare(cfg)
        setup_logging(cfg.debug, None)
        return mount.serve(prepared, lambda err: None)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_fd)
        os.setsid()
        code = 1
        try:
            prepared = mount.prepare(cfg)
            for notice in prepared.notices:
                os.write(write_fd, f"{NOTICE}{notice.line()}\n".encode())
            log_path = os.path.join(cfg.cache_dir, "ckptfs.log")
            _detach_stdio(log_path)
            setup_logging(cfg.debug, log_path)

            def ready(err: str | None) -> None:
                os.write(write_fd, (err or "ok").encode() + b"\n")

            code = mount.serve(prepared, ready)
        except CkptfsError as e:
            os.write(write_fd, str(e).encode() + b"\n")
        except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit
            os.write(write_fd, f"{type(e).__name__}: {e}".encode() + b"\n")
        finally:
            os._exit(code)
    os.close(write_fd)
    line = ""
    with os.fdopen(read_fd, "rb") as answers:  # notices, then "ok" or the error
        for raw in answers:
            line = raw.decode(errors="replace").strip()
            if not line.startswith(NOTICE):
                break
            print(f"ckptfs: {line[len(NOTICE):]}", file=sys.stderr)
            line = ""
    if line != "ok":
        os.waitpid(pid, 0)
        raise CliError(line or "the ckptfs daemon exited before the mount was ready")
    return 0


def check_mount_store(cfg: MountConfig) -> None:
    """Before the daemon starts: UsageError (exit 2) for a malformed endpoint; CliError for
    a directory store that does not exist but lies inside a store, with the mount that
    works."""
    from ckptfs.daemon.locate import missing_directory_hint
    from ckptfs.store import check_endpoint

    if cfg.endpoint_url and "://" in cfg.store and not cfg.store.lower().startswith(
            "file://"):
        try:
            check_endpoint(cfg.endpoint_url, cfg.store)
        except ConfigError as e:
            raise UsageError(str(e)) from None
    hint = missing_directory_hint(cfg.store, cfg.mountpoint)
    if hint is not None:
        raise CliError(f"store directory does not exist: {cfg.store}; {hint}")


def _detach_stdio(log_path: str) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    logfd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(devnull)
    os.close(logfd)


def setup_logging(debug: bool, path: str | None) -> None:
    handler: logging.Handler = (logging.FileHandler(path) if path
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---------------------------------------------------------------------------- control
def control_socket(mountpoint: str) -> str:
    try:
        return os.getxattr(mountpoint, CONTROL_XATTR).decode()
    except OSError as e:
        if e.errno in mounts.DEAD_ERRNOS:
            raise CliError(daemon_gone(mountpoint)) from None
        raise CliError(f"not a ckptfs mount: {mountpoint}") from None


def daemon_gone(path: str) -> str:
    """The one-line message for a path whose FUSE daemon is gone (ENOTCONN)."""
    entry = mounts.entry_at(path)
    if entry is None:  # a path inside the mount, or another FUSE file system
        return (f"{path}: transport endpoint is not connected (the FUSE daemon behind it is "
                f"gone); for a ckptfs mount, run ckptfs umount MOUNTPOINT")
    mp = entry.mountpoint
    resume = (f"with --cache-dir {shlex.quote(entry.cache_dir)}" if entry.cache_dir
              else "with the same --cache-dir")
    return (f"{mp}: the ckptfs daemon of this mount is gone (killed or crashed); run ckptfs "
            f"umount {shlex.quote(mp)} to detach it, then mount again {resume} to resume its "
            f"uploads")


def request(mountpoint: str, cmd: str, sock: str | None = None, timeout: float | None = 10.0
            ) -> Any:
    from ckptfs.daemon.control import request as control_request

    try:
        for answer in control_request(sock or control_socket(mountpoint), cmd, timeout):
            if set(answer) == {"error"}:  # e.g. "permission denied": not the mount's owner
                raise CliError(f"the ckptfs daemon of {mountpoint}: {answer['error']}")
            yield answer
    except OSError as e:
        raise CliError(f"cannot reach the ckptfs daemon of {mountpoint}: {e}") from None


def format_status(st: dict[str, Any]) -> str:
    lines = [
        f"store        {st['store']}",
        f"mountpoint   {st['mountpoint']}   (pid {st['pid']}, cache {st['cache_dir']})",
        f"dirty        {human(st['dirty_bytes'])}   uploading {human(st['uploading_bytes'])}"
        f"   pending chunks {st['pending_chunks']}   pending metadata ops {st['pending_ops']}",
        f"uploaded     {human(st['uploaded_bytes'])}   stored {human(st['stored_bytes'])}"
        f"   deduplicated {human(st['dedup_bytes'])}   rate {human(st['upload_rate'])}/s"
        f"   ETA {st['eta_seconds'] if st['eta_seconds'] is not None else '-'} s",
        f"ratios       compression {st['compression_ratio'] or '-'}   dedup "
        f"{st['dedup_ratio'] or '-'}   logical written {human(st['logical_bytes'])}",
        f"cache        {human(st['cache_bytes'])} of {human(st['cache_limit'])}"
        f"   in memory {human(st.get('memory_bytes', 0))}"
        f"   fetched {human(st['fetched_bytes'])}   open files {st['open_files']}",
        f"state        {state_line(st)}",
    ]
    ap = st.get("autoprune")
    if ap:
        every = f" --keep-every {ap['keep_every']}" if ap["keep_every"] else ""
        lines.append(f"auto-prune   --keep-last {ap['keep_last']}{every} --keep-pattern "
                     f"{shlex.quote(ap['pattern'])}: runs {ap['runs']}, removed "
                     f"{ap['removed']}, errors {ap['errors']}"
                     + (f" (last: {ap['last_error']})" if ap["last_error"] else ""))
    for e in st["errors"]:
        lines.append(f"error        {e}")
    if st.get("retrying_since"):
        lines.append(f"retrying     since {time.ctime(st['retrying_since'])}")
    return "\n".join(lines)


def state_line(st: dict[str, Any]) -> str:
    if st["durable"]:
        return "durable: everything written is in the store"
    why = []
    if st["pending_chunks"] or st["pending_ops"]:
        why.append("uploading")
    if st["open_files"]:
        why.append(f"{st['open_files']} files open with data not yet published")
    files = len(st.get("problems") or ()) - bool(st.get("journal_damage"))
    if st.get("journal_damage"):
        why.append("the journal lost committed state: checking the files written here "
                   "against the store")
    if files:
        why.append(f"{files} files could not be saved (see errors)")
    return "not durable: " + ", ".join(why or ["uploading"])


def mount_of(path: str) -> str:
    """The mount point of the ckptfs mount `path` lies in (status and sync take any path
    inside a mount, as the store tools do), else `path` itself."""
    mounted = mounted_path(path)
    return mounted[0] if mounted is not None else path


def cmd_status(a: argparse.Namespace) -> int:
    st = next(request(mount_of(a.mountpoint), "status"))
    print(json.dumps(st, indent=1) if a.json else format_status(st))
    return 0


class ProgressLine:
    """One line of progress on stderr: redrawn in place on a terminal (at most every
    `redraw` seconds), a new line every `interval` seconds otherwise."""

    def __init__(self, interval: float = 5.0, redraw: float = 0.0) -> None:
        self.tty = sys.stderr.isatty()
        self.interval = interval
        self.redraw = redraw
        self.last_line = 0.0
        self.drawn = False

    def emit(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            if force or now - self.last_line >= self.redraw:
                sys.stderr.write("\r" + text[:150].ljust(150))
                sys.stderr.flush()
                self.last_line = now
                self.drawn = True
        elif force or now - self.last_line > self.interval:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            self.last_line = now

    def end(self) -> None:
        if self.tty and self.drawn:
            sys.stderr.write("\n")


def bar(fraction: float, width: int = 30) -> str:
    return f"[{'#' * int(fraction * width):<{width}}] {fraction * 100:5.1f}%"


class Progress(ProgressLine):
    """sync's progress: a bar on a terminal, a line every 5 s otherwise."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.base: int | None = None

    def show(self, st: dict[str, Any]) -> None:
        done_total = st["uploaded_bytes"] + st["dedup_bytes"]
        if self.base is None:
            self.base = done_total
        done = done_total - self.base
        total = done + st["dirty_bytes"]
        frac = done / total if total else 1.0
        eta = st["eta_seconds"]
        why = f"  ({st['errors'][0]})" if st["errors"] else ""
        self.emit(f"{self.label} {bar(frac)} {human(done)}/{human(total)} "
                  f"{human(st['upload_rate'])}/s ETA {eta if eta is not None else '-'}s"
                  f" ops {st['pending_ops']}{why}")


class SyncTimeout(CliError):
    """`sync` gave up at its --timeout; nothing is lost, the data stays in the cache."""


def not_durable(timeout: float, st: dict[str, Any] | None) -> SyncTimeout:
    """The one-line timeout message: why (the store's last error) and where the data is."""
    why = f" ({' '.join(str(st['errors'][0]).split())})" if st and st.get("errors") else ""
    where = f" {st['cache_dir']}" if st and st.get("cache_dir") else ""
    return SyncTimeout(f"not durable after {timeout:g}s{why}; the data is safe in the "
                       f"cache{where}")


def sync(mountpoint: str, timeout: float | None, sock: str | None = None) -> dict[str, Any]:
    """Stream the daemon's sync progress; the final status, or SyncTimeout on timeout."""
    progress = Progress("sync")
    deadline = None if timeout is None else time.monotonic() + timeout
    last: dict[str, Any] | None = None
    try:
        for answer in request(mountpoint, "sync", sock, timeout=None if timeout is None
                              else max(timeout, 1.0)):
            if "progress" in answer:
                last = answer["progress"]
                progress.show(answer["progress"])
            elif answer.get("done"):
                progress.show(answer["status"])
                return dict(answer["status"])
            elif "error" in answer:
                raise CliError(answer["error"])
            if deadline is not None and time.monotonic() > deadline:
                raise not_durable(timeout or 0.0, last)
    except TimeoutError:
        raise not_durable(timeout or 0.0, last) from None
    finally:
        progress.end()
    raise CliError("the ckptfs daemon closed the connection before the sync finished")


def cmd_sync(a: argparse.Namespace) -> int:
    sync(mount_of(a.mountpoint), a.timeout)
    print(f"durable: everything closed under {a.mountpoint} is in the store")
    return 0


def cmd_umount(a: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(a.mountpoint)
    dead = mounts.dead_mount(mountpoint)
    if dead is not None:
        return umount_dead(dead)
    inside = mount_of(mountpoint)
    if inside != os.path.realpath(mountpoint) and inside != mountpoint:
        raise CliError(f"{a.mountpoint} is a path inside the ckptfs mount {inside}: ckptfs "
                       f"umount {shlex.quote(inside)}")
    sock = control_socket(mountpoint)
    st = next(request(mountpoint, "status", sock))
    pid, cache_dir = st["pid"], st["cache_dir"]
    start = time.monotonic()
    try:
        final = sync(mountpoint, a.timeout, sock)
    except SyncTimeout as e:
        raise CliError(f"still mounted: {e}") from None
    except KeyboardInterrupt:
        raise CliError("interrupted: still mounted; pending data stays in the cache") from None
    r = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
    if r.returncode != 0:
        raise CliError(f"cannot unmount {mountpoint}: {r.stderr.strip() or r.returncode}")
    while _alive(pid):  # the daemon flushes what was closed after the sync, then exits
        if a.timeout is not None and time.monotonic() - start > a.timeout:
            raise CliError(f"daemon {pid} still flushing after {a.timeout:g}s; the data is "
                           f"safe in {cache_dir}")
        time.sleep(0.05)
    damage = journal_damage(cache_dir)
    if damage:
        raise CliError(f"unmounted, but not durable: the journal lost committed state "
                       f"({damage}) and the check of the files written here against the "
                       f"store did not finish; mount again with --cache-dir "
                       f"{shlex.quote(cache_dir)} to finish it")
    chunks, ops = journal_counts(cache_dir)
    if chunks or ops:
        raise CliError(f"unmounted, but {chunks} chunks and {ops} metadata ops are not in the "
                       f"store yet; they stay in {cache_dir} for the next mount")
    lost = journal_lost(cache_dir)
    if lost:
        names = sorted({f.path for f in lost})
        raise CliError(f"unmounted, but {len(names)} files lost data that is not in the "
                       f"store (rewrite or delete them): {', '.join(names)}")
    if final.get("problems"):
        raise CliError(f"unmounted, but some data could not be saved: "
                       f"{'; '.join(final['problems'])}")
    print(f"unmounted {mountpoint}: everything is in the store "
          f"({time.monotonic() - start:.1f}s)")
    return 0


def umount_dead(entry: mounts.MountEntry) -> int:
    """Detach a ckptfs mount whose daemon is gone; say what its cache still holds."""
    mp, cache_dir = entry.mountpoint, entry.cache_dir
    for how in (["-u"], ["-u", "-z"]):  # lazily if a process still uses it
        r = subprocess.run(["fusermount3", *how, mp], capture_output=True, text=True)
        if r.returncode == 0:
            break
    else:
        raise CliError(f"cannot detach {mp} (its daemon is gone): "
                       f"{r.stderr.strip() or r.returncode}")
    gone = f"detached {mp}: its ckptfs daemon was gone"
    if cache_dir is None:
        raise CliError(f"{gone}; mount again with the same --cache-dir to resume the uploads "
                       f"it had not finished")
    try:
        damage = journal_damage(cache_dir)
        chunks, ops = (0, 0) if damage else journal_counts(cache_dir)
    except (JournalError, OSError) as e:
        raise CliError(f"{gone}; cannot read the journal in {cache_dir} ({e}); the next mount "
                       f"with --cache-dir {shlex.quote(cache_dir)} resumes what it holds, or "
                       f"checks the files written here against the store") from None
    if damage:
        raise CliError(f"{gone}; its journal in {cache_dir} lost committed state ({damage}): "
                       f"the next mount with --cache-dir {shlex.quote(cache_dir)} checks the "
                       f"files written here against the store")
    if chunks or ops:
        raise CliError(f"{gone}; {chunks} chunks and {ops} metadata ops are not in the store "
                       f"yet: they stay in {cache_dir}, and the next mount with --cache-dir "
                       f"{shlex.quote(cache_dir)} resumes the uploads")
    print(f"{gone}; its journal in {cache_dir} is empty: everything closed before is in the "
          f"store")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process (tests) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def journal_counts(cache_dir: str) -> tuple[int, int]:
    """(chunks, metadata ops) a stopped mount left in its cache directory's journal."""
    from ckptfs.pipeline.journal import read_counts

    return read_counts(os.path.join(cache_dir, "journal.sqlite"))


def journal_damage(cache_dir: str) -> str | None:
    """Why the journal a stopped mount left cannot be trusted (journal.py), or None."""
    from ckptfs.pipeline.journal import read_damage, wal_damage

    path = os.path.join(cache_dir, "journal.sqlite")
    return wal_damage(path) or read_damage(path)


def journal_lost(cache_dir: str) -> list[LostFile]:
    """The files a stopped mount recorded as having lost data (journal.py)."""
    from ckptfs.pipeline.journal import read_lost

    return read_lost(os.path.join(cache_dir, "journal.sqlite"))


# ---------------------------------------------------------------------------- store tools
#: exit status of verify/ls/latest/fsck/gc when the check (or the run) could not be done
EXIT_ERROR = 2


def mounted_path(arg: str) -> tuple[str, str] | None:
    """(mount point, path inside the filesystem) if `arg` lies in a ckptfs mount, else None."""
    if "://" in arg:
        return None
    real = os.path.realpath(arg)
    inside = [m.mountpoint for m in mounts.ckptfs_mounts()
              if real == m.mountpoint or real.startswith(m.mountpoint.rstrip("/") + "/")]
    if not inside:
        return None
    mountpoint = max(inside, key=len)
    rel = os.path.relpath(real, mountpoint)
    return mountpoint, "" if rel == "." else rel


@dataclass
class Target:
    """What a store tool works on: a store, a path in its filesystem, how to show paths."""

    store: Store
    path: str
    mountpoint: str | None = None  # set when the user named a path inside a mount
    store_arg: str = ""  # the store as the user named it, cut at its root (hints)

    def show(self, path: str) -> str:
        """`path` (relative to the filesystem root) as the user would name it."""
        if self.mountpoint is not None:
            return os.path.join(self.mountpoint, path) if path else self.mountpoint
        return path or "."

    def names(self, path: str) -> str:
        """The TARGET [PATH] words of a command that names `path` (as show() prints it):
        the mounted path, or the store and the path."""
        if self.mountpoint is not None:
            return shlex.quote(path)
        return f"{shlex.quote(self.store_arg)} {shlex.quote(path)}"


def store_path(arg: str, base: str = "") -> str:
    """The path in the filesystem that PATH `arg` names below `base` (from the store's
    root when it starts with '/'); '.' and empty segments are dropped. UsageError for a
    '..' segment: a path in a store never leaves it."""
    if ".." in arg.split("/"):
        raise UsageError(f"'..' in a path in the store: {arg}; give the path from the "
                         f"store's root (/run7/step-9) or below the TARGET (step-9)")
    if "\0" in arg:
        raise UsageError(f"a NUL character in the path {arg!r}")
    parts = [] if arg.startswith("/") else base.split("/")
    return "/".join(p for p in [*parts, *arg.split("/")] if p not in ("", "."))


def retyped(a: argparse.Namespace, words: list[str]) -> str:
    """The command the user ran, with its TARGET (and PATH, if given) replaced by
    `words`: a hint that works."""
    argv: list[str] = list(getattr(a, "argv", []))
    given = [a.target, *([p] if (p := target_path_arg(a)) else [])]
    for i in range(len(argv) - len(given) + 1):
        if argv[i:i + len(given)] == given:
            argv[i:i + len(given)] = words
            break
    return "ckptfs " + shlex.join(argv)


def target_path_arg(a: argparse.Namespace) -> str:
    """The PATH (or DIR) argument given after TARGET, or ''."""
    return str(getattr(a, "path", "") or getattr(a, "dir", "") or "")


def open_target(a: argparse.Namespace, path_arg: str | None = None,
                whole_store: bool = False) -> Target:
    """Open the store of `a.target`: a path inside a ckptfs mount, or a store URL, or a
    URL below a store (its path there, as git finds .git: locate.py), and PATH after it.
    With `whole_store` (gc, fsck, upgrade), a URL below a store is refused with the
    command that works."""
    from ckptfs.daemon import locate
    from ckptfs.format.manifests import INFO_KEY
    from ckptfs.store import open_store
    from ckptfs.tools import inspection

    mounted = mounted_path(a.target)
    region = getattr(a, "region", None)
    if mounted is not None:
        if path_arg:
            raise UsageError(f"{a.target} is a path in a ckptfs mount; give either a "
                             f"mounted path or STORE and a path in it, not both")
        mountpoint, path = mounted
        try:
            st = next(request(mountpoint, "status"))
        except CliError as e:
            raise CliError(f"{e}; name the store instead: STORE [PATH]") from None
        store_arg = str(st["store_arg"])
        if "://" not in store_arg and not os.path.isabs(os.path.expanduser(store_arg)):
            store_arg = str(st["store"])  # relative to the daemon's cwd: its file:// URL
        store = open_store(store_arg, endpoint_url=a.endpoint_url or st.get("endpoint_url")
                           or default_endpoint(store_arg), region=region)
        check = getattr(store, "check", None)
        if check is not None:
            check()
        # the mount point as the user spelled it, so printed paths match theirs
        shown = os.path.abspath(a.target)
        if path:
            shown = shown[:-len(path) - 1] if shown.endswith("/" + path) else mountpoint
        return Target(store, path, shown, shown)
    endpoint = a.endpoint_url or default_endpoint(a.target)
    found = locate.locate(a.target, endpoint_url=endpoint, region=region)
    if found.layout is not None:
        path = found.named_path
        extra = store_path(path_arg or "", path) if path_arg else path
        words = [found.url, *([extra] if extra and not whole_store else [])]
        raise UsageError(found.layout_refusal(a.target, retyped(a, words), len(words) > 1))
    if whole_store and found.rest:
        hint = retyped(a, [found.url])
        also = (f"; to check only that path: ckptfs verify {shlex.quote(found.url)} "
                f"{shlex.quote(found.rest)}" if a.command == "fsck" else "")
        raise UsageError(f"{a.command} works on a whole store, and {a.target} is the "
                         f"path {found.rest} inside the ckptfs store {found.url}; for that "
                         f"store: {hint}{also}")
    if not found.found:
        try:
            inspection.check_is_store(found.store)
        except NoEntry:
            raise NoEntry(f"not a ckptfs store, nor a path inside one: no {INFO_KEY} at "
                          f"{found.store.url} or up to {locate.MAX_LEVELS} levels above "
                          f"it") from None
    return Target(found.store, store_path(path_arg or "", found.rest), store_arg=found.url)


def _chunk_list(items: list[str], limit: int = 3) -> str:
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def describe_file(f: FileReport, shown: str) -> str:
    """One line saying why a file is not complete, naming its chunks and its writer."""
    from ckptfs.format.manifests import chunk_key

    if f.error is not None:
        return f"DAMAGED     {shown}: {f.error}"
    parts = []
    if f.missing:
        parts.append(f"{len(f.missing)} of {f.n_chunks} chunks missing (" + _chunk_list(
            [f"#{i} {chunk_key(h)}" for i, h in f.missing]) + ")")
    if f.corrupt:
        parts.append(f"{len(f.corrupt)} of {f.n_chunks} chunks corrupt (" + _chunk_list(
            [f"#{i} {chunk_key(h)}: {why}" for i, h, why in f.corrupt]) + ")")
    writer = f.writer or "unknown"
    return f"INCOMPLETE  {shown}: {'; '.join(parts)}; written by node {writer}"


def cmd_verify(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection

    t = open_target(a, a.path)
    inspection.read_info(t.store)
    result = inspection.verify(t.store, t.path, deep=a.deep)
    if a.json:
        d = result.to_dict()
        d["target"] = t.show(t.path)
        print(json.dumps(d, indent=1))
        return 0 if result.complete else 1
    for f in result.incomplete_files:
        print(describe_file(f, t.show(f.path)))
    files = {f.path for f in result.files}
    for p in result.problems:
        if p.kind == inspection.RENAMING:
            print(f"RENAMING    {t.show(p.path)}: {p.detail}")
        elif p.kind == inspection.DAMAGED and p.path not in files:  # a rename intent
            print(f"DAMAGED     {p.describe()}")
    size = human(sum(f.size for f in result.files))
    how = "chunks fetched and re-hashed" if a.deep else "chunks present (--deep re-hashes them)"
    where = t.show(result.path)
    if result.complete:
        print(f"complete: {len(result.files)} files, {size} under {where}; {how}")
        return 0
    bad = len(result.incomplete_files)
    kinds = {k: sum(p.kind == k for p in result.problems) for k in
             (inspection.MISSING, inspection.CORRUPT, inspection.DAMAGED)}
    print(f"INCOMPLETE: {bad} of {len(result.files)} files under {where} "
          f"({kinds['missing']} missing chunks, {kinds['corrupt']} corrupt chunks, "
          f"{kinds['damaged']} damaged records"
          + (", a directory rename in flight" if any(
              p.kind == inspection.RENAMING for p in result.problems) else "") + ")")
    return 1


def cmd_ls(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection

    t = open_target(a, a.path)
    inspection.read_info(t.store)
    files = inspection.list_files(t.store, t.path, deep=a.deep)
    if a.json:
        print(json.dumps([{**f.to_dict(), "shown": t.show(f.path)} for f in files], indent=1))
        return 0
    for f in files:
        shown = t.show(f.path)
        if f.error is not None:
            print(f"?---------  {'?':>12}  {'?':19}  {'?':<12}  {'damaged':<10}  {shown}: "
                  f"{f.error}")
            continue
        state = ("ok" if f.complete else f"missing {len(f.missing)}" if f.missing
                 else f"corrupt {len(f.corrupt)}")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.mtime_ns / 1e9))
        name = f"{shown} -> {f.target}" if f.target is not None else shown
        print(f"{stat.filemode(f.mode)}  {f.size:>12}  {when}  {f.writer or '-':<12}  "
              f"{state:<10}  {name}")
    return 0


def cmd_latest(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection

    check_glob(a.pattern, "--pattern")
    t = open_target(a, a.dir)
    inspection.read_info(t.store)
    found = inspection.latest(t.store, t.path, a.pattern, deep=a.deep, damaged=lambda p: print(
        f"ckptfs: skipped, DAMAGED {p.describe()}", file=sys.stderr))
    if found is None:
        print(f"ckptfs: no complete checkpoint directory matching {a.pattern!r} in "
              f"{t.show(t.path)}", file=sys.stderr)
        return 1
    print(t.show(found))
    return 0


def cmd_fsck(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection

    t = open_target(a, whole_store=True)
    inspection.check_is_store(t.store)  # else one line and exit 2, like verify, ls, latest
    r = inspection.fsck(t.store, deep=a.deep)
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0 if r.clean else 1
    if r.info is not None:
        from ckptfs.cli.upgrade import describe

        print(f"store        {r.url}: {describe(r.info)}; created by {r.info.created_by}")
    else:
        print(f"ERROR        {r.info_error}")
    for p in r.problems:
        print(f"{p.kind.upper():<12} {p.describe()}")
    for h, why in r.corrupt_garbage:
        print(f"CORRUPT      unreferenced chunk {h}: {why} (a writer deduplicating against "
              f"it would trust it; delete the object)")
    for i in (i for i in r.intents if i.error is None):  # damaged ones are problems
        print(f"warning      directory rename {i.src or '?'} -> {i.dst or '?'} by node "
              f"{i.writer} is in flight or was interrupted ({i.key}); the next mount "
              f"finishes it")
    for key in r.strays[:20]:
        print(f"warning      object outside the store layout: {key}")
    if len(r.strays) > 20:
        print(f"warning      ... and {len(r.strays) - 20} more objects outside the layout")
    print(f"files        {r.files} ({human(r.file_bytes)}), {r.symlinks} symlinks, "
          f"{r.dir_markers} directory markers")
    print(f"chunks       {r.chunks_referenced} referenced, {r.chunks_stored} stored "
          f"({human(r.stored_bytes)}), {r.garbage_chunks} unreferenced "
          f"({human(r.garbage_bytes)}, garbage for gc, not an error)")
    if r.trash_files:
        print(f"trash        {r.trash_files} deleted files whose chunks stay until their "
              f"trash time is up (ckptfs trash ls)")
    if r.fossils:
        named = (f"; {r.referenced_fossils} of them named by a file: readable, and the next "
                 f"gc run restores them" if r.referenced_fossils else "")
        print(f"fossils      {r.fossils} ({human(r.fossil_bytes)}) set aside by gc: freed by "
              f"a later gc run unless a file needs them{named}")
    how = "every stored chunk fetched and re-hashed" if r.deep else (
        "chunks checked for presence; --deep re-hashes them")
    print(f"{'clean' if r.clean else 'PROBLEMS':<12} "
          f"{len(r.problems) + len(r.corrupt_garbage) + (r.info is None)} problems; {how}")
    return 0 if r.clean else 1


def format_du(r: UsageReport, t: Target) -> list[str]:
    """du's table: a row per checkpoint directory, PATH as a whole, the store's totals."""
    rows = [(t.show(d.path), d) for d in r.dirs] + [(f"{t.show(r.path)} (all)", r.total)]
    width = max(len("directory"), *(len(name) for name, _ in rows))
    lines = [f"{'directory':<{width}}  {'files':>7}  {'logical':>10}  {'referenced':>10}  "
             f"{'unique':>10}  {'dedup':>6}  {'compr':>6}"]

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    for name, d in rows:
        lines.append(f"{name:<{width}}  {d.files:>7}  {human(d.logical_bytes):>10}  "
                     f"{human(d.referenced.bytes):>10}  {human(d.unique.bytes):>10}  "
                     f"{ratio(d.dedup_ratio):>6}  {ratio(d.compression_ratio):>6}")
    fossils = (f", {r.fossils.count} of them fossils ({human(r.fossils.bytes)})"
               if r.fossils.count else "")
    lines.append(f"store        {r.url}: {r.stored.count} chunk objects "
                 f"({human(r.stored.bytes)}){fossils}; {r.unreferenced.count} "
                 f"unreferenced ({human(r.unreferenced.bytes)}): what ckptfs gc frees once "
                 f"they are older than its grace")
    if r.trash.count:
        lines.append(f"trash        {r.trash.count} deleted files ({human(r.trash.bytes)} "
                     f"logical) keep their chunks until their trash time is up "
                     f"(ckptfs trash ls)")
    if r.missing:
        lines.append(f"warning      {r.missing} chunks named by a manifest are in neither "
                     f"chunks/ nor fossils/ and are not counted (run ckptfs fsck)")
    if r.unreadable:
        lines.append(f"warning      {len(r.unreadable)} manifests cannot be parsed and are "
                     f"not counted, so unreferenced bytes may be too high (run ckptfs fsck): "
                     f"{_chunk_list(r.unreadable)}")
    return lines


def cmd_du(a: argparse.Namespace) -> int:
    from ckptfs.tools import usage

    t = open_target(a, a.path)
    r = usage.du(t.store, t.path)
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
    else:
        print("\n".join(format_du(r, t)))
    return 0


def add_du_parser(sub: Any) -> None:
    """The parser of `ckptfs du`."""
    d = sub.add_parser(
        "du", help="space used by each checkpoint directory, and what gc would free",
        description="For each directory directly under PATH (the checkpoint directories) "
        "and for PATH as a whole: the number of files, logical bytes (the sum of the file "
        "sizes), referenced bytes (the stored size of the distinct chunks its files name, "
        "as compressed in the store) and unique bytes (those of the chunks that nothing "
        "else names: what deleting the directory lets gc free), and two ratios: dedup "
        "(logical bytes / bytes of the distinct chunks: what identical tensors across "
        "steps, ranks and files save) and compr (those bytes / their stored size: what "
        "compression saves). Then the store's totals: "
        "every chunk object (fossils included) and the unreferenced ones, which ckptfs gc "
        "frees once they are older than its grace. Reads every manifest of the store and "
        "lists chunks/ and fossils/; changes nothing. Exit 0, or 2 with one line when it "
        "cannot be done (a bad URL, not a ckptfs store, no directory PATH). " + STORE_HELP,
        epilog="examples: ckptfs du /mnt/ckpt/run7 | ckptfs du s3://bucket/run7 --json | "
        "ckptfs du ./store run7 | ckptfs du gs://bucket/ckpt/run7 (the path run7 of the "
        "store gs://bucket/ckpt)")
    d.add_argument("target", metavar="TARGET", help="mounted directory, or STORE")
    d.add_argument("path", metavar="PATH", nargs="?", default="",
                   help="with STORE: the directory holding the checkpoints (default: root)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
    d.add_argument("--region", help="S3 region (default: the AWS config chain)")
    d.set_defaults(func=cmd_du, error_exit=EXIT_ERROR)


class GcProgress(ProgressLine):
    """gc's progress on stderr: the step, a bar over the chunk names for the scans of
    fossils/ and chunks/ (listed in name order), counts for the reference listing."""

    def __init__(self) -> None:
        super().__init__(interval=5.0, redraw=0.2)
        if not self.tty:
            self.last_line = time.monotonic()  # a run of less than 5 s prints no progress

    def show(self, r: GcReport, fraction: float | None) -> None:
        if r.phase.startswith("references"):
            self.emit(f"gc {r.phase}: {r.manifests.count} manifests read, {r.referenced} "
                      f"chunks referenced")
        elif r.phase == "sweep":
            self.emit(f"gc sweep {bar(fraction or 0.0)} {r.fossils.count} fossils: "
                      f"{r.restored.count} restored, {r.freed.count} freed")
        elif r.phase == "mark":
            self.emit(f"gc mark  {bar(fraction or 0.0)} {r.chunks.count} chunks "
                      f"({human(r.chunks.bytes)}): {r.fossilized.count} set aside")


def _n(t: Tally) -> str:
    return f"{t.count} ({human(t.bytes)})"


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def format_gc(r: GcReport) -> list[str]:
    """The summary of a gc run, one line per step."""
    would = "would be " if r.dry_run else ""
    grace = format_duration(r.grace)
    lines = [
        f"store        {r.url}: store clock {_utc(r.store_time)}; grace {grace}: objects "
        f"written before {_utc(r.cutoff)} are old enough",
        f"manifests    {r.manifests.count} read ({human(r.manifests.bytes)}; "
        f"{r.manifests_reread} new or changed at the second listing; "
        f"{r.trash_manifests} in the trash), {r.referenced} chunks referenced",
        f"fossils      {_n(r.fossils)}: {_n(r.restored)} {would}restored (referenced), "
        f"{_n(r.freed)} {would}freed, {_n(r.kept_fossils)} kept for the grace",
        f"chunks       {_n(r.chunks)}: {_n(r.chunks_referenced)} referenced, "
        f"{_n(r.fossilized)} {would}set aside as fossils, {_n(r.kept_chunks)} unreferenced "
        f"kept for the grace",
    ]
    if r.trash_expired.count:
        lines.insert(1, f"trash        {r.trash_expired.count} entries {would}deleted: "
                        f"their trash time was up")
    if r.vanished:
        lines.append(f"note         {r.vanished} objects were moved or deleted by another gc "
                     f"run while this one worked; the next run sees them")
    if r.others:
        lines.append(f"note         {r.others} objects under chunks/ or fossils/ are outside "
                     f"the layout and were left alone (ckptfs fsck lists them)")
    if r.scratch_deleted:
        lines.append(f"note         deleted {r.scratch_deleted} clock probes left by killed "
                     f"gc runs")
    for h in r.lost:
        lines.append(f"ERROR        chunk {h} is named by a manifest but is in neither "
                     f"chunks/ nor fossils/ (run ckptfs fsck)")
    if r.dry_run:
        lines.append(f"dry run      nothing was changed (only a clock probe was written and "
                     f"deleted); {human(r.freed.bytes)} would be freed")
    else:
        aside = (f"; {human(r.fossilized.bytes)} set aside now is freed by a run {grace} or "
                 f"more from now, unless a file needs it by then" if r.fossilized.count else "")
        lines.append(f"done         freed {human(r.freed.bytes)} in {r.seconds:.1f}s{aside}")
    return lines


def cmd_gc(a: argparse.Namespace) -> int:
    from ckptfs.tools import gc

    grace = parse_duration(a.grace, "--grace")
    gc.check_grace(grace, a.no_writers)
    t = open_target(a, whole_store=True)
    progress = GcProgress()
    try:
        r = gc.collect(t.store, grace, dry_run=a.dry_run, progress=progress.show)
    finally:
        progress.end()
    if a.json:
        print(json.dumps(r.to_dict(), indent=1))
    else:
        print("\n".join(format_gc(r)))
    return 1 if r.lost else 0


# ---------------------------------------------------------------------------- prune
def format_prune(r: PruneResult, t: Target, keep: float = 0.0) -> list[str]:
    """One line per checkpoint directory (newest first), then the summary."""
    lines = []
    for c in r.checkpoints:
        if c.keep:
            lines.append(f"kept         {t.show(c.path)}: {'; '.join(c.detail)}")
        else:
            verb = "would remove" if r.dry_run else "removed     "
            lines.append(f"{verb} {t.show(c.path)} ({c.keys} manifests and markers)")
    removed = len(r.removed)
    trashed = f"in the trash for {format_duration(keep)}, then " if keep else ""
    where = f"{t.show(r.dir)} matching {r.pattern!r}, ordered by {r.order}"
    if r.dry_run:
        lines.append(f"dry run      {removed} of {len(r.checkpoints)} checkpoint directories "
                     f"in {where} would be removed, {len(r.kept)} kept; nothing was changed")
    else:
        lines.append(f"done         removed {removed} of {len(r.checkpoints)} checkpoint "
                     f"directories in {where} ({r.deleted_keys} manifests and markers), "
                     f"kept {len(r.kept)}; {trashed}ckptfs gc frees their chunks after "
                     f"its grace")
    return lines


def cmd_prune(a: argparse.Namespace) -> int:
    from ckptfs.tools import inspection, retention

    try:
        retention.check_policy(a.keep_last, a.keep_every)
    except retention.PolicyError as e:
        raise CliError(str(e)) from None
    check_glob(a.pattern, "--pattern")
    keep = trash_seconds(a.trash_hours)
    t = open_target(a, a.dir)
    inspection.read_info(t.store)
    r = retention.prune(t.store, t.path, a.keep_last, a.keep_every, a.pattern,
                        dry_run=a.dry_run, deep=a.deep, trash_keep=keep)
    if a.json:
        d = r.to_dict()
        d["target"] = t.show(r.dir)
        print(json.dumps(d, indent=1))
    else:
        print("\n".join(format_prune(r, t, keep)))
    return 0


def add_prune_parser(sub: Any) -> None:
    """Parser of prune (exit 2 when it cannot work)."""
    pr = sub.add_parser(
        "prune", help="remove old checkpoint directories, keeping the last N",
        description="Remove the older checkpoint directories directly under DIR whose name "
        "matches --pattern, ordered as `ckptfs latest` orders them (the numbers in the name "
        "when every candidate has one, else the newest file mtime). Kept: the newest "
        "--keep-last N; with --keep-every K, every checkpoint whose step (the LAST number "
        "in its name) is a multiple of K; always the newest COMPLETE checkpoint (what "
        "`ckptfs latest` prints) and everything newer, so an incomplete newest checkpoint "
        "keeps its complete predecessor; everything when none is complete; and every "
        "directory in a directory rename in flight. Removing a directory moves its "
        "manifests and directory markers to the store's trash for --trash-hours (ckptfs "
        "trash restore undoes it); the chunks stay until `ckptfs gc` frees those no file "
        "needs, after the trash time and its grace. Prints one line per directory, removed or kept "
        "and why, then a summary (--json: the same as JSON). Do not prune a directory that "
        "a mount is still writing into. Exit status: 0 done, 2 it could not be done. "
        + STORE_HELP,
        epilog="examples: ckptfs prune /mnt/ckpt/run7 --keep-last 3 --pattern "
        "'checkpoint-*' --dry-run | ckptfs prune s3://bucket/run7 ckpt --keep-last 5 "
        "--keep-every 10000 | ckptfs prune az://container/run7/ckpt --keep-last 3 (the same "
        "DIR given in the URL)")
    pr.add_argument("target", metavar="TARGET", help="mounted directory, or STORE")
    pr.add_argument("dir", metavar="DIR", nargs="?", default="",
                    help="with STORE: the directory holding the checkpoints (default: root)")
    pr.add_argument("--keep-last", type=int, required=True, metavar="N",
                    help="keep the newest N checkpoints (1 or more)")
    pr.add_argument("--keep-every", type=int, metavar="K",
                    help="also keep every checkpoint whose step, the last number in its "
                    "name, is a multiple of K (checkpoint-5000 with K=1000)")
    pr.add_argument("--pattern", default="*", help="shell pattern of checkpoint directory "
                    "names, e.g. 'checkpoint-*', 'global_step*', 'step-*' (default: '*')")
    pr.add_argument("--dry-run", action="store_true",
                    help="change nothing, say what would be removed")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.add_argument("--trash-hours", type=float, default=24.0, metavar="H",
                    help="keep what is removed in the store's trash for H hours (ckptfs "
                    "trash restore brings it back); 0 deletes at once (default 24)")
    pr.add_argument("--deep", action="store_true",
                    help="fetch and re-hash the chunks of the checkpoints checked for "
                    "completeness instead of only checking that they exist")
    pr.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
    pr.add_argument("--region", help="S3 region (default: the AWS config chain)")
    pr.set_defaults(func=cmd_prune, error_exit=EXIT_ERROR)


# ---------------------------------------------------------------------------- main
class ArgumentParser(argparse.ArgumentParser):
    """argparse's, but a help or usage text that cannot be written (`ckptfs --help |
    head -1`) raises BrokenPipeError, which main() answers with EXIT_PIPE: argparse itself
    drops the error (and, on CPython 3.11.7, flushes first), which ended in exit 0."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="ckptfs", description="A FUSE checkpoint store: writes land in a local cache at "
        "disk speed and go to object storage (S3, Azure Blob, GCS or a directory) in the "
        "background.",
        epilog="A STORE is " + STORE_FORMS + ". The store tools also take a URL below a "
        "store (s3://bucket/run7/step-1000: the path step-1000 of the store s3://bucket/run7, "
        "found by walking up to its ckptfs.json) and a path inside a mount. "
        "docs/OPERATIONS.md has every command.")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("mount", help="mount a store on a directory",
                       description="Mount STORE (" + STORE_FORMS + ") on MOUNTPOINT: a "
                       "whole store (a URL below a store is refused with the mount that "
                       "works), created when it does not exist. "
                       "Returns when the mount is ready; the daemon logs to "
                       "CACHE_DIR/ckptfs.log. Credentials come from each cloud's own chain: "
                       "AWS (environment, ~/.aws); Azure (AZURE_STORAGE_CONNECTION_STRING, or "
                       "AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, "
                       "or DefaultAzureCredential with azure-identity); Google (Application "
                       "Default Credentials).",
                       epilog="example: ckptfs mount s3://bucket/run7 /mnt/ckpt --cache-dir "
                       "/nvme/ckptfs --keep-last 3 --keep-pattern 'checkpoint-*' (after each save "
                       "into DIR/checkpoint-N, keeps the newest 3 checkpoint-* directories "
                       "of DIR, and the newest complete one)")
    m.add_argument("store")
    m.add_argument("mountpoint")
    m.add_argument("--cache-dir", help="local write-back cache (default: "
                   "~/.cache/ckptfs/<store hash>); put it on a fast local disk")
    m.add_argument("--cache-size", default="16G", help="bound of the cache directory; "
                   "writers wait when this much data is not yet uploaded (default 16G)")
    m.add_argument("--read-memory", default="1G", help="fetched chunks are served from "
                   "this much memory, and only those pushed out of it are written to the "
                   "read cache on disk (default 1G; 0: every fetched chunk goes to disk)")
    m.add_argument("--endpoint-url", help=ENDPOINT_HELP)
    m.add_argument("--region", help="S3 region (default: the AWS config chain)")
    m.add_argument("--chunk-size", help="chunk size of a NEW store (default 16M): the "
                   "largest chunk; an existing store keeps its own (a warning says so when "
                   "they differ)")
    m.add_argument("--min-record", help="for a NEW store: tensors (records) of this size "
                   "or more get chunks of their own, smaller ones share chunks with their "
                   "neighbours (default 256K, at most the chunk size); an existing store "
                   "keeps its own")
    m.add_argument("--codec", choices=("zstd4", "lz4"), help="how a NEW store compresses "
                   "its chunks: zstd4 (default) stores weights 17-33%% smaller at about "
                   "0.5 GB/s per core; lz4 costs almost no CPU and leaves weights as they "
                   "are (docs/EFFICIENCY.md); an existing store keeps its own")
    m.add_argument("--storage-class", metavar="CLASS",
                   help="S3 storage class of chunk objects, e.g. STANDARD_IA or "
                   "INTELLIGENT_TIERING (default: the bucket's); manifests stay in the "
                   "bucket's default class. s3:// stores only")
    m.add_argument("--trash-hours", type=float, default=24.0, metavar="H",
                   help="deleted files (unlink, rm -rf, a rename over a file) stay in the "
                   "store's trash for H hours, restorable from any node with ckptfs trash "
                   "restore; 0 deletes at once (default 24)")
    m.add_argument("--upload-threads", type=int, default=8)
    m.add_argument("--uploads-while-writing", type=int, default=None, metavar="N",
                   help="uploads that may run while a save streams in; the rest wait until "
                        "it pauses (default: the cores beyond two, at least 2, or at least 1 "
                        "on a store that compresses with zstd4)")
    m.add_argument("--fetch-threads", type=int, default=8)
    m.add_argument("--metadata-ttl", type=float, default=1.0,
                   help="seconds a listing or manifest is trusted before re-reading (1.0)")
    m.add_argument("--missing-chunk-timeout", type=float, default=60.0,
                   help="seconds a read waits for a chunk another node is still uploading")
    m.add_argument("--fsync-to-store", action="store_true",
                   help="make fsync() wait until the file is in the object store")
    m.add_argument("--allow-other", action="store_true", help="let other users access it")
    m.add_argument("--node-id", help="name of this node in manifests (default: hostname)")
    m.add_argument("--keep-last", type=int, metavar="N",
                   help="auto-prune: after this mount writes into a checkpoint directory "
                   "(one whose name matches --keep-pattern), remove the older ones beside "
                   "it as `ckptfs prune --keep-last N` does: keep the newest N, and always "
                   "the newest complete one and all newer. Give it on ONE node of a job, "
                   "e.g. where NODE_RANK is 0. Needs --keep-pattern")
    m.add_argument("--keep-every", type=int, metavar="K",
                   help="auto-prune: also keep every checkpoint whose step, the last number "
                   "in its name, is a multiple of K")
    m.add_argument("--keep-pattern", metavar="GLOB",
                   help="auto-prune: shell pattern of checkpoint directory names, e.g. "
                   "'checkpoint-*', 'global_step*', 'step-*' (required with --keep-last)")
    m.add_argument("-f", "--foreground", action="store_true", help="do not daemonize; log to "
                   "stderr")
    m.add_argument("--debug", action="store_true", help="debug logging")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="flush everything to the store, then unmount",
                       description="Wait (with progress) until every closed file is in the "
                       "store, unmount, and exit 0 only when everything is durable. A mount "
                       "whose daemon is gone (killed, crashed) is detached, and what its cache "
                       "directory still holds for the next mount is reported.")
    u.add_argument("mountpoint")
    u.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser("status", help="upload state of a mount")
    s.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    y = sub.add_parser("sync", help="wait until everything closed so far is in the store")
    y.add_argument("mountpoint", metavar="MOUNTPOINT",
                   help="the mount point, or any path inside the mount (the whole mount is "
                   "synced)")
    y.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    y.set_defaults(func=cmd_sync)
    add_store_tools(sub)
    add_prune_parser(sub)
    from ckptfs.cli.trash import add_trash_parser  # they import this module's helpers
    from ckptfs.cli.upgrade import add_upgrade_parser

    add_trash_parser(sub)
    add_upgrade_parser(sub)
    return p


#: every kind of store, as a URL names it
STORE_FORMS = ("s3://bucket[/prefix], az://container[/prefix], gs://bucket[/prefix], "
               "file:///path or a directory")
STORE_HELP = ("TARGET is a path inside a ckptfs mount (its store is found through the mount's "
              "daemon) or a STORE: " + STORE_FORMS + ". A URL may go on below the store "
              "(s3://bucket/run7/step-1000, store/run7): the store is found by walking up to "
              "the nearest ckptfs.json (at most 16 levels), and the rest is a path in its "
              "filesystem. PATH, with a STORE, is below that, or from the store's root when "
              "it starts with '/'; '..' is refused. Works from any machine "
              "that can reach the store; no mount needed. It sees what is in the store: a "
              "file still open, or closed but not yet published on its node, is not there.")
#: the TARGET of gc, fsck and upgrade
WHOLE_STORE_HELP = ("TARGET is a STORE (" + STORE_FORMS + ") or a path in a ckptfs mount "
                    "(its whole store). A URL below a store (s3://bucket/run7/step-1000) is "
                    "refused with the command that names the store.")


def add_store_tools(sub: Any) -> None:
    """Parsers of verify, ls, latest, fsck and gc (exit 2 when the tool cannot work)."""

    def common(p: argparse.ArgumentParser, deep: str) -> None:
        p.add_argument("--deep", action="store_true", help=deep)
        p.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
        p.add_argument("--region", help="S3 region (default: the AWS config chain)")
        p.set_defaults(error_exit=EXIT_ERROR)

    def tree_arguments(p: argparse.ArgumentParser, verb: str, deep: str) -> None:
        """TARGET [PATH] --json plus the common options (verify, ls)."""
        p.add_argument("target", metavar="TARGET", help="mounted path, or STORE")
        p.add_argument("path", metavar="PATH", nargs="?", default="",
                       help=f"with STORE: the file or directory to {verb} (default: everything)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        common(p, deep)

    deep_help = ("fetch every chunk and re-hash it (finds corrupt chunks; reads all the data) "
                 "instead of only checking that it exists")
    v = sub.add_parser(
        "verify", help="is a checkpoint completely in the store?",
        description="Check that every chunk of every file under PATH (a file or a directory, "
        "recursively) is in the store, so that any node can read it. Prints one line per "
        "incomplete file, naming its missing or corrupt chunks and the node that wrote it, "
        "then a summary. Exit status: 0 complete, 1 incomplete, 2 the check could not be "
        "done. " + STORE_HELP,
        epilog="examples: ckptfs verify /mnt/ckpt/step-1000 | "
        "ckptfs verify s3://bucket/run7 step-1000 --deep")
    tree_arguments(v, "check", deep_help)
    v.set_defaults(func=cmd_verify)

    ls = sub.add_parser(
        "ls", help="list files in a store with size, mtime, writer and completeness",
        description="List every file under PATH (recursively) like `ls -l`: mode, size in "
        "bytes, mtime, the node that wrote it, and its state: ok, `missing N` (N chunks not "
        "in the store), `corrupt N` (with --deep) or damaged (its manifest). Exit 0 when "
        "the listing worked, 2 when not. " + STORE_HELP)
    tree_arguments(ls, "list", deep_help)
    ls.set_defaults(func=cmd_ls)

    la = sub.add_parser(
        "latest", help="the newest complete checkpoint directory",
        description="Print the newest COMPLETE checkpoint directory directly under DIR whose "
        "name matches --pattern: relative to the filesystem root with STORE DIR, absolute "
        "when TARGET is a mounted directory. Newest = the largest numbers in the name when "
        "every candidate has one (checkpoint-100 after checkpoint-99), else the latest file "
        "mtime. Directories without files, with missing chunks, or in a directory rename in "
        "flight, or with a damaged manifest (named on stderr) are skipped: resume from what "
        "this prints. Exit 1 with a message when there "
        "is none, 2 when the check could not be done. " + STORE_HELP,
        epilog="example: ckptfs latest /mnt/ckpt/run7 --pattern 'checkpoint-*'")
    la.add_argument("target", metavar="TARGET", help="mounted directory, or STORE")
    la.add_argument("dir", metavar="DIR", nargs="?", default="",
                    help="with STORE: the directory holding the checkpoints (default: root)")
    la.add_argument("--pattern", default="*", help="shell pattern of checkpoint directory "
                    "names, e.g. 'checkpoint-*', 'global_step*', 'step-*' (default: '*')")
    common(la, deep_help)
    la.set_defaults(func=cmd_latest)

    fk = sub.add_parser(
        "fsck", help="check a whole store",
        description="Check the whole store: ckptfs.json, every manifest, directory marker, "
        "trash entry and rename intent (damaged ones are listed), every chunk a manifest "
        "names (missing ones are listed with the file and the writer node), interrupted "
        "directory renames, and count the unreferenced chunks "
        "(garbage, not an error). Read-only: it repairs nothing. Exit status: 0 clean, "
        "1 problems found, 2 the check could not be done (e.g. TARGET is not a ckptfs "
        "store: no ckptfs.json and no files/ or chunks/). " + WHOLE_STORE_HELP,
        epilog="examples: ckptfs fsck s3://bucket/run7 | ckptfs fsck az://container/run7 "
        "--deep | ckptfs fsck gs://bucket/run7 | ckptfs fsck file:///data/ckpt | ckptfs "
        "fsck /mnt/ckpt")
    fk.add_argument("target", metavar="TARGET", help="STORE, or a mounted path")
    fk.add_argument("--json", action="store_true", help="machine-readable output")
    common(fk, "fetch and re-hash every stored chunk, referenced or not (reads the whole "
           "store) instead of only checking that referenced chunks exist")
    fk.set_defaults(func=cmd_fsck)

    g = sub.add_parser(
        "gc", help="free the chunks that no file needs (safe while mounts write)",
        description="Garbage-collect the whole store of TARGET in two steps, safe while any "
        "number of mounts on other nodes keep writing: a chunk that no manifest names and "
        "that is older than --grace is first set aside as a fossil (readers still find it), "
        "and freed by a later run if it is still unreferenced after --grace more; a fossil "
        "that a file needs again is restored. Ages are read from the store's clock, never "
        "this machine's. So space comes back over two runs, e.g. daily with the default "
        "grace. Prints what it did (--json: the same as JSON); progress goes to stderr. "
        "Exit status: 0 done, 1 done but a referenced chunk was found missing, 2 the run "
        "could not be done (it can be run again: every step is safe to repeat). "
        + WHOLE_STORE_HELP,
        epilog="examples: ckptfs gc s3://bucket/run7 --dry-run | ckptfs gc "
        "az://container/run7 | ckptfs gc gs://bucket/run7 --grace 7d | ckptfs gc "
        "file:///data/ckpt | ckptfs gc /mnt/ckpt --grace 7d | ckptfs gc ./store --grace 0 "
        "--no-writers (twice: set aside, then free)")
    g.add_argument("target", metavar="TARGET", help="STORE, or a mounted path")
    g.add_argument("--grace", default="24h", metavar="DURATION",
                   help="how old an unreferenced chunk must be to be set aside, and a fossil "
                   "to be freed: 30s, 15m, 24h, 7d or 0 (default 24h; below 1h needs "
                   "--no-writers)")
    g.add_argument("--no-writers", action="store_true",
                   help="assert that no mount writes to the store from the start of this run "
                   "to the end of the next one (e.g. all are unmounted): allows a grace "
                   "below 1h, 0 included")
    g.add_argument("--dry-run", action="store_true",
                   help="change nothing, say what would be done")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("--endpoint-url", help=TOOL_ENDPOINT_HELP)
    g.add_argument("--region", help="S3 region (default: the AWS config chain)")
    g.set_defaults(func=cmd_gc, error_exit=EXIT_ERROR)
    add_du_parser(sub)


def negative_values_joined(argv: list[str]) -> list[str]:
    """`--grace -1h` as `--grace=-1h`: argparse would take '-1h' for an option and print
    its usage; joined, the value reaches parse_duration, which refuses it in one line."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--grace" and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"--grace={arg}"
        else:
            out.append(arg)
    return out


#: the exit status of a command whose output pipe was closed (`ckptfs ls STORE | head`):
#: what a shell reports for coreutils, which SIGPIPE kills (128 + 13)
EXIT_PIPE = 141


def output_closed(e: OSError) -> bool:
    """`e` is the EPIPE of writing to a stdout whose reader went away (poll reports an
    error on a pipe's write end once its read end is closed), not one from a socket."""
    if not isinstance(e, BrokenPipeError):
        return False
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError):
        return True  # no stdout to poll (closed): its write failed


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return run(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at exit as a traceback
    except BrokenPipeError as e:
        if not output_closed(e):
            raise
        # quietly, as coreutils: nothing more can be written, and the flush at exit must
        # not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE


def run(argv: list[str]) -> int:
    """Parse `argv` and run its command: its exit status, or one line on stderr and the
    command's error status."""
    args = parser().parse_args(negative_values_joined(argv))
    try:
        args.argv = argv
        return int(args.func(args))
    except UsageError as e:
        print(f"ckptfs: {e}", file=sys.stderr)
        return EXIT_ERROR
    except (CliError, CkptfsError) as e:
        print(f"ckptfs: {e}", file=sys.stderr)
        return int(getattr(args, "error_exit", 1))
    except KeyboardInterrupt:
        print("ckptfs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
