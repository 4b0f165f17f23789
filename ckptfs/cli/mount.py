"""`ckptfs mount`: check the options, start the daemon, return once the mount is ready."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import ENDPOINT_HELP, REGION_HELP, STORE_FORMS, add_command
from ckptfs.cli.target import default_endpoint
from ckptfs.common.errors import CkptfsError, ConfigError
from ckptfs.common.units import parse_size
from ckptfs.daemon.config import MountConfig

#: how the daemon marks a line for the user (mount.Notice) on the pipe to `ckptfs mount`
NOTICE = "notice: "

# the daemon's modules are imported in cmd_mount and check_mount_store: they import
# pyfuse3, trio and numpy (~0.3 s), which no other command needs

# what --help says
MOUNT_DESCRIPTION = (
    "Mount STORE (" + STORE_FORMS + ") on MOUNTPOINT: a "
    "whole store (a URL below a store is refused with the mount that "
    "works), created when it does not exist. "
    "Returns when the mount is ready; the daemon logs to "
    "CACHE_DIR/ckptfs.log. Credentials come from each cloud's own chain: "
    "AWS (environment, ~/.aws); Azure (AZURE_STORAGE_CONNECTION_STRING, or "
    "AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, "
    "or DefaultAzureCredential with azure-identity); Google (Application "
    "Default Credentials).")
MOUNT_EPILOG = (
    "example: ckptfs mount s3://bucket/run7 /mnt/ckpt --cache-dir "
    "/nvme/ckptfs --keep-last 3 --keep-pattern 'checkpoint-*' (after each save "
    "into DIR/checkpoint-N, keeps the newest 3 checkpoint-* directories "
    "of DIR, and the newest complete one)")


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
        from ckptfs.tools import retention  # the daemon's modules: see the top

        try:
            retention.check_policy(cfg.keep_last, cfg.keep_every)
        except retention.PolicyError as e:
            raise CliError(str(e)) from None
    from ckptfs.daemon import mount  # the daemon's modules: see the top

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
    from ckptfs.daemon.locate import missing_directory_hint  # the daemon's: see the top
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


def add_mount_parser(sub: Any) -> None:
    """The parser of `ckptfs mount`."""
    m = add_command(sub, "mount", cmd_mount, "mount a store on a directory",
                    MOUNT_DESCRIPTION, MOUNT_EPILOG)
    m.add_argument("store")
    m.add_argument("mountpoint")
    add_mount_options(m)


def add_mount_options(m: argparse.ArgumentParser) -> None:
    """Every option of `ckptfs mount`, with its default and help (MountConfig's fields)."""
    m.add_argument("--cache-dir", help="local write-back cache (default: "
                   "~/.cache/ckptfs/<store hash>); put it on a fast local disk")
    m.add_argument("--cache-size", default="16G", help="bound of the cache directory; "
                   "writers wait when this much data is not yet uploaded (default 16G)")
    m.add_argument("--read-memory", default="1G", help="fetched chunks are served from "
                   "this much memory, and only those pushed out of it are written to the "
                   "read cache on disk (default 1G; 0: every fetched chunk goes to disk)")
    m.add_argument("--endpoint-url", help=ENDPOINT_HELP)
    m.add_argument("--region", help=REGION_HELP)
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
