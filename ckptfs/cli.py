"""The `ckptfs` command: mount, umount, status, sync. Errors are one line, no traceback."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from typing import Any

from . import __version__
from .config import MountConfig, parse_size
from .errors import CkptfsError

log = logging.getLogger("ckptfs")

CONTROL_XATTR = "user.ckptfs.control"


class CliError(Exception):
    """A failure to report as one line and a non-zero exit."""


def human(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------------- mount
def cmd_mount(a: argparse.Namespace) -> int:
    cfg = MountConfig(
        store=a.store, mountpoint=os.path.abspath(a.mountpoint), cache_dir=a.cache_dir or "",
        cache_size=parse_size(a.cache_size, "--cache-size"),
        endpoint_url=a.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"), region=a.region,
        chunk_size=parse_size(a.chunk_size, "--chunk-size"),
        upload_threads=a.upload_threads, fetch_threads=a.fetch_threads,
        metadata_ttl=a.metadata_ttl, missing_chunk_timeout=a.missing_chunk_timeout,
        fsync_to_store=a.fsync_to_store, allow_other=a.allow_other,
        foreground=a.foreground, debug=a.debug, node_id=a.node_id or "")
    from . import mount  # imports pyfuse3: only for this command

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
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        answer += chunk
    line = answer.decode(errors="replace").strip()
    if line != "ok":
        os.waitpid(pid, 0)
        raise CliError(line or "the ckptfs daemon exited before the mount was ready")
    return 0


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
    except OSError:
        raise CliError(f"not a ckptfs mount: {mountpoint}") from None


def request(mountpoint: str, cmd: str, sock: str | None = None, timeout: float | None = 10.0
            ) -> Any:
    from .control import request as control_request

    try:
        yield from control_request(sock or control_socket(mountpoint), cmd, timeout)
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
        f"   fetched {human(st['fetched_bytes'])}   open files {st['open_files']}",
        f"state        {'durable: everything closed is in the store' if st['durable'] else 'uploading'}",
    ]
    for e in st["errors"]:
        lines.append(f"error        {e}")
    if st.get("retrying_since"):
        lines.append(f"retrying     since {time.ctime(st['retrying_since'])}")
    return "\n".join(lines)


def cmd_status(a: argparse.Namespace) -> int:
    st = next(request(a.mountpoint, "status"))
    print(json.dumps(st, indent=1) if a.json else format_status(st))
    return 0


class Progress:
    """A one-line progress bar on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.base: int | None = None
        self.last_line = 0.0

    def show(self, st: dict[str, Any]) -> None:
        done_total = st["uploaded_bytes"] + st["dedup_bytes"]
        if self.base is None:
            self.base = done_total
        done = done_total - self.base
        total = done + st["dirty_bytes"]
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        eta = st["eta_seconds"]
        why = f"  ({st['errors'][0]})" if st["errors"] else ""
        text = (f"{self.label} [{bar:<30}] {frac * 100:5.1f}% {human(done)}/{human(total)} "
                f"{human(st['upload_rate'])}/s ETA {eta if eta is not None else '-'}s"
                f" ops {st['pending_ops']}{why}")
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + text[:150].ljust(150))
            sys.stderr.flush()
        elif now - self.last_line > 5:
            sys.stderr.write(text + "\n")
            self.last_line = now

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def sync(mountpoint: str, timeout: float | None, sock: str | None = None) -> dict[str, Any]:
    """Stream the daemon's sync progress; the final status, or CliError on timeout."""
    progress = Progress("sync")
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for answer in request(mountpoint, "sync", sock, timeout=None if timeout is None
                              else max(timeout, 1.0)):
            if "progress" in answer:
                progress.show(answer["progress"])
            elif answer.get("done"):
                progress.show(answer["status"])
                return dict(answer["status"])
            elif "error" in answer:
                raise CliError(answer["error"])
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"not durable after {timeout:g}s; the data stays in the cache")
    except TimeoutError:
        raise CliError(f"not durable after {timeout:g}s; the data stays in the cache") from None
    finally:
        progress.end()
    raise CliError("the ckptfs daemon closed the connection before the sync finished")


def cmd_sync(a: argparse.Namespace) -> int:
    sync(a.mountpoint, a.timeout)
    print(f"durable: everything closed under {a.mountpoint} is in the store")
    return 0


def cmd_umount(a: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(a.mountpoint)
    sock = control_socket(mountpoint)
    st = next(request(mountpoint, "status", sock))
    pid, cache_dir = st["pid"], st["cache_dir"]
    start = time.monotonic()
    try:
        sync(mountpoint, a.timeout, sock)
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
    chunks, ops = journal_counts(cache_dir)
    if chunks or ops:
        raise CliError(f"unmounted, but {chunks} chunks and {ops} metadata ops are not in the "
                       f"store yet; they stay in {cache_dir} for the next mount")
    print(f"unmounted {mountpoint}: everything is in the store "
          f"({time.monotonic() - start:.1f}s)")
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
    db = sqlite3.connect(f"file:{os.path.join(cache_dir, 'journal.sqlite')}?mode=ro", uri=True)
    try:
        c = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        o = db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    finally:
        db.close()
    return int(c), int(o)


# ---------------------------------------------------------------------------- main
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptfs", description="A FUSE checkpoint store: writes land in a local cache at "
        "disk speed and go to object storage (S3 or a directory) in the background.")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("mount", help="mount a store on a directory",
                       description="Mount STORE (s3://bucket[/prefix], file:///path or a "
                       "directory) on MOUNTPOINT. Returns when the mount is ready; the daemon "
                       "logs to CACHE_DIR/ckptfs.log. Credentials come from the standard AWS "
                       "chain (environment, ~/.aws).")
    m.add_argument("store")
    m.add_argument("mountpoint")
    m.add_argument("--cache-dir", help="local write-back cache (default: "
                   "~/.cache/ckptfs/<store hash>); put it on a fast local disk")
    m.add_argument("--cache-size", default="16G", help="bound of the cache directory; "
                   "writers wait when this much data is not yet uploaded (default 16G)")
    m.add_argument("--endpoint-url", help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL "
                   "or AWS)")
    m.add_argument("--region", help="S3 region (default: the AWS config chain)")
    m.add_argument("--chunk-size", default="16M", help="chunk size of a NEW store (16M)")
    m.add_argument("--upload-threads", type=int, default=8)
    m.add_argument("--fetch-threads", type=int, default=8)
    m.add_argument("--metadata-ttl", type=float, default=1.0,
                   help="seconds a listing or manifest is trusted before re-reading (1.0)")
    m.add_argument("--missing-chunk-timeout", type=float, default=60.0,
                   help="seconds a read waits for a chunk another node is still uploading")
    m.add_argument("--fsync-to-store", action="store_true",
                   help="make fsync() wait until the file is in the object store")
    m.add_argument("--allow-other", action="store_true", help="let other users access it")
    m.add_argument("--node-id", help="name of this node in manifests (default: hostname)")
    m.add_argument("-f", "--foreground", action="store_true", help="do not daemonize; log to "
                   "stderr")
    m.add_argument("--debug", action="store_true", help="debug logging")
    m.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="flush everything to the store, then unmount",
                       description="Wait (with progress) until every closed file is in the "
                       "store, unmount, and exit 0 only when everything is durable.")
    u.add_argument("mountpoint")
    u.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    u.set_defaults(func=cmd_umount)

    s = sub.add_parser("status", help="upload state of a mount")
    s.add_argument("mountpoint")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    y = sub.add_parser("sync", help="wait until everything closed so far is in the store")
    y.add_argument("mountpoint")
    y.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    y.set_defaults(func=cmd_sync)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CliError, CkptfsError) as e:
        print(f"ckptfs: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ckptfs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
