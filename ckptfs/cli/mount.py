"""`ckptfs mount`: check the options, start the daemon, return once the mount is ready."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, NoReturn

from ckptfs.cli.errors import CliError, UsageError
from ckptfs.cli.options import STORE_FORMS, add_command
from ckptfs.cli.target import default_endpoint
from ckptfs.common.config import (
    MountConfig,
    mount_options,
    parse_mount_options,
    shown_default,
)
from ckptfs.common.errors import CkptfsError, ConfigError
from ckptfs.common.redact import redact

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
    "Default Credentials). Every option can also be set in the environment: "
    "CKPTFS_ and its name in capitals (CKPTFS_CACHE_DIR, CKPTFS_CACHE_SIZE, ...); the "
    "command line wins.")
MOUNT_EPILOG = (
    "example: ckptfs mount s3://bucket/run7 /mnt/ckpt --cache-dir "
    "/nvme/ckptfs --keep-last 3 --keep-pattern 'checkpoint-*' (after each save "
    "into DIR/checkpoint-N, keeps the newest 3 checkpoint-* directories "
    "of DIR, and the newest complete one)")


def cmd_mount(a: argparse.Namespace) -> int:
    given = {f.name: getattr(a, f.name) for f in mount_options()}
    return mount(a.store, a.mountpoint, given)


def mount_helper(argv: list[str]) -> int:
    """`ckptfs STORE MOUNTPOINT [-o OPTIONS]`: the form mount(8) runs for an fstab line or
    `mount -t fuse.ckptfs STORE MOUNTPOINT -o ...` (through mount.fuse3); OPTIONS are the
    mount options without their dashes (cache_dir=/nvme/ckptfs,cache_size=200G)."""
    store, mountpoint, rest = argv[0], argv[1], argv[2:]
    opts: list[str] = []
    while rest:
        if rest[0] == "-o" and len(rest) > 1:
            opts.append(rest[1])
            rest = rest[2:]
        elif rest[0].startswith("-o") and len(rest[0]) > 2:
            opts.append(rest[0][2:])
            rest = rest[1:]
        else:
            raise UsageError(f"unexpected {rest[0]!r}: the mount helper form is `ckptfs "
                             f"STORE MOUNTPOINT -o OPTIONS` (see ckptfs mount --help)")
    try:
        given = parse_mount_options(",".join(opts))
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return mount(store, mountpoint, given)


def mount(store: str, mountpoint: str, given: dict[str, Any]) -> int:
    """Mount `store` with the options `given` (field name -> value, MountConfig's), the
    rest from the environment or the defaults."""
    if not given.get("endpoint_url"):
        given["endpoint_url"] = os.environ.get("CKPTFS_ENDPOINT_URL") or default_endpoint(store)
    try:  # options that are malformed or do not go together: bad input, exit 2
        cfg = MountConfig.from_options(store, os.path.abspath(mountpoint), given)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    check_mount_store(cfg)
    if cfg.keep_last is not None:
        from ckptfs.tools import retention  # the daemon's modules: see the top

        try:
            retention.check_policy(cfg.keep_last, cfg.keep_every)
        except retention.PolicyError as e:
            raise UsageError(str(e)) from None
    from ckptfs.daemon import mount as daemon  # the daemon's modules: see the top

    if cfg.foreground:
        prepared = daemon.prepare(cfg)
        start_log(cfg, None)
        return daemon.serve(prepared, notify_systemd)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_fd)
        os.setsid()
        code = 1
        try:
            prepared = daemon.prepare(cfg)
            for notice in prepared.notices:
                os.write(write_fd, f"{NOTICE}{notice.line()}\n".encode())
            assert prepared.log_fd is not None  # opened by prepare (not in the foreground)
            _detach_stdio(prepared.log_fd)
            start_log(cfg, daemon.log_path(cfg))

            def ready(err: str | None) -> None:
                os.write(write_fd, (err or "ok").encode() + b"\n")

            code = daemon.serve(prepared, ready)
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
            print(f"ckptfs: {redact(line[len(NOTICE):])}", file=sys.stderr)
            line = ""
    if line != "ok":
        os.waitpid(pid, 0)
        raise CliError(line or "the ckptfs daemon exited before the mount was ready")
    exit_now()


def exit_now() -> NoReturn:
    """Exit 0 once the daemon is ready, skipping the interpreter's teardown: this process
    imported the daemon's modules before the fork, and unloading them took a tenth of its
    CPU, which the caller waits for (docs/PERFORMANCE.md "Mount time"). Nothing here needs
    the teardown: ckptfs registers no atexit handler, and stdout and stderr are flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def notify_systemd(err: str | None) -> None:
    """Tell systemd the mount is ready (a Type=notify service runs `ckptfs mount -f`):
    READY=1 on $NOTIFY_SOCKET (sd_notify's protocol: one datagram), or the reason it
    failed as STATUS=. Nothing when the variable is not set."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return
    message = "READY=1\nSTATUS=mounted" if err is None else f"STATUS={redact(err)}"
    address = "\0" + where[1:] if where.startswith("@") else where  # "@": abstract
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), address)
    except OSError as e:
        print(f"ckptfs: could not notify systemd at {where}: {e}", file=sys.stderr)


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


def _detach_stdio(logfd: int) -> None:
    """The daemon's stdin from /dev/null, its stdout and stderr to the log file (`logfd`,
    opened by prepare as the log is: never through a link, only if it is this user's)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(devnull)
    os.close(logfd)


def start_log(cfg: MountConfig, path: str | None) -> None:
    """The daemon's log as its options say, to `path` (None: stderr)."""
    from ckptfs.daemon.logs import setup_logging  # light, but only the daemon logs

    setup_logging("debug" if cfg.debug else cfg.log_level, path, cfg.log_format,
                  {"node": cfg.node_id, "store": cfg.store})


def add_mount_parser(sub: Any) -> None:
    """The parser of `ckptfs mount`."""
    m = add_command(sub, "mount", cmd_mount, "mount a store on a directory",
                    MOUNT_DESCRIPTION, MOUNT_EPILOG)
    m.add_argument("store")
    m.add_argument("mountpoint")
    add_mount_options(m)


def add_mount_options(m: argparse.ArgumentParser) -> None:
    """Every option of `ckptfs mount`: MountConfig's option fields, with their defaults
    and help texts from there. An option not given is None (False for a flag), so that
    its environment variable or default applies (MountConfig.from_options)."""
    for f in mount_options():
        meta = f.metadata
        kwargs: dict[str, Any] = {"dest": f.name, "default": None,
                                  "help": meta["help"].replace("{}", shown_default(f))}
        if meta["kind"] == "flag":
            kwargs.update(action="store_true", default=False)
        elif meta["kind"] in ("int", "float"):
            kwargs["type"] = int if meta["kind"] == "int" else float
        elif meta["kind"] == "choice":
            kwargs["choices"] = meta["choices"]
        if meta["metavar"] is not None:
            kwargs["metavar"] = meta["metavar"]
        m.add_argument(*filter(None, (meta["short"], meta["flag"])), **kwargs)
