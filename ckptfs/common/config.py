"""Every limit and default of ckptfs in one place: the mount's options (MountConfig,
the only source of `ckptfs mount`'s defaults and --help numbers) and the fixed limits
(LIMITS), each with what it costs."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptfs.common.errors import ConfigError
from ckptfs.common.units import MAX_DURATION, format_size, parse_size

#: S3 storage classes for chunk objects: those whose objects can be read at once (the
#: archive classes GLACIER and DEEP_ARCHIVE need a restore before every read)
STORAGE_CLASSES = ("STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
                   "GLACIER_IR", "REDUCED_REDUNDANCY")
#: what a NEW store gets without --chunk-size, --min-record, --codec (an existing store
#: keeps what its ckptfs.json says; tests/unit/test_config.py checks these against the
#: format's own fallbacks)
NEW_STORE_CHUNK_SIZE = 16 << 20
NEW_STORE_MIN_RECORD = 256 << 10
NEW_STORE_CODEC = "zstd4"
CODECS = ("zstd4", "lz4")
#: the modes a directory store may give the files it writes (--store-mode, and
#: ckptfs.json's store_mode): its owner reads and writes them; its group reads them, or
#: reads and writes them; others read them at most, and only where the group does; nobody
#: executes them. Its directories get the same bits, and x wherever there is r
#: (dir_mode). A new directory store gets NEW_STORE_MODE: only its owner reads weights.
STORE_MODES = (0o600, 0o640, 0o660, 0o644, 0o664)
NEW_STORE_MODE = 0o600
LOG_LEVELS = ("debug", "info", "warning", "error")
#: the largest uid or gid an entry can be owned by: uid_t is 32 bits, and -1 (2^32 - 1)
#: means "unchanged" to chown
MAX_ID = 2**32 - 2
#: the mode bits ckptfs stores and reports: read, write and execute for the owner, the
#: group and others, and the sticky bit; never setuid or setgid (docs/SEMANTICS.md)
MODE_BITS = 0o1777

ENDPOINT_HELP = ("endpoint of the store the URL names: an S3-compatible server for s3:// "
                 "(default $AWS_ENDPOINT_URL, else AWS), an Azure blob endpoint for az:// "
                 "(Azurite, sovereign clouds; default: the connection string's, else "
                 "https://ACCOUNT.blob.core.windows.net), a GCS endpoint for gs:// (default "
                 "$STORAGE_EMULATOR_HOST, else Google)")


@dataclass(frozen=True)
class Limits:
    """The fixed limits: not options (no user has needed to change them), each sized
    here once with its cost. Concurrency is threads unless it says otherwise."""

    #: the filesystem's `hash` limiter: hashing a file's last chunks at close, and the
    #: fsync of staging files (CPU: each holds a core while it hashes)
    hash_threads: int = 2
    #: manifest, marker and listing calls of the FUSE path in flight at once (the
    #: `metadata` limiter of the store): latency of a listing of many files
    metadata_threads: int = 16
    #: S3 connections kept beyond --upload-threads + --fetch-threads: for the metadata
    #: calls and the publisher (a file descriptor and a few KiB each)
    spare_connections: int = 40
    #: manifest and marker GETs in flight while one directory listing is merged
    list_concurrency: int = 32
    #: objects of one directory rename copied at once (publisher)
    rename_threads: int = 16
    #: HEADs (and fossil copies) of one manifest's chunks at once, when a publish is
    #: confirmed (publisher) or a damaged journal is checked against the store (recovery)
    confirm_threads: int = 16
    #: chunks uploaded again from a staging file at once during a confirmation (memory:
    #: up to this many chunks of read buffer)
    confirm_uploads: int = 4
    #: trash entries written, restored or emptied at once (ckptfs trash, and deletes
    #: through the mount)
    trash_threads: int = 16
    #: objects deleted at once by gc and prune on stores with no batch delete (Azure,
    #: GCS); S3 deletes in batches of 1,000 keys instead
    delete_threads: int = 8
    #: upload jobs the queue holds (memory: a few hundred bytes each): an early job that
    #: finds it full is dropped (its chunk is journaled and queued at close instead); a
    #: published chunk that finds it full waits, in order, until workers take jobs
    upload_queue: int = 10_000
    #: the daemon's log file is rotated at this size (disk: log_files + 1 such files)
    log_bytes: int = 16 << 20
    #: rotated log files kept (ckptfs.log.1 ... .N)
    log_files: int = 3
    #: bytes of the largest record (ckptfs.json, a manifest, a directory marker, a rename
    #: intent, a trash entry) a reader takes: a larger one is damaged, refused before it is
    #: read (docs/FORMAT.md, "Record sizes"). 64 MiB holds a manifest of 1.4 million
    #: chunks (memory: up to this per record GET in flight, and its parse a few times more)
    record_bytes: int = 64 << 20


LIMITS = Limits()


def option(default: Any, flag: str, help: str, kind: str = "str", metavar: str | None = None,
           shown: str | None = None, choices: tuple[str, ...] | None = None,
           short: str | None = None) -> Any:
    """A MountConfig field that is a `ckptfs mount` option: `flag` (and a `short` one),
    its `help` ("{}" is replaced by the default as shown_default gives it), and its
    `kind`: str, size (16G), int, float, flag (true when given), choice (of `choices`) or
    mode (octal permission bits: 0644)."""
    return dataclasses.field(default=default, metadata={
        "flag": flag, "help": help, "kind": kind, "metavar": metavar, "shown": shown,
        "choices": choices, "short": short})


def shown_default(f: dataclasses.Field[Any]) -> str:
    """The default of an option field as --help and docs/OPERATIONS.md show it."""
    if f.metadata["shown"] is not None:
        return str(f.metadata["shown"])
    default: Any = f.default
    if default is None or isinstance(default, bool):
        return "on" if default else "off"
    if f.metadata["kind"] == "size":
        return format_size(default)
    return f"{default:g}" if isinstance(default, float) else str(default)


def env_name(f: dataclasses.Field[Any]) -> str:
    """The environment variable of an option: --cache-size is CKPTFS_CACHE_SIZE."""
    return "CKPTFS_" + f.name.upper()


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_option(f: dataclasses.Field[Any], text: str, source: str) -> Any:
    """The value of option field `f` written as `text` (in an environment variable or
    a mount -o option named `source`); ConfigError, naming `source`, if it is not one."""
    kind = f.metadata["kind"]
    if kind == "size":
        return parse_size(text, source)
    if kind == "mode":
        digits = text.removeprefix("0o")
        if not digits or len(digits) > 5 or any(c not in "01234567" for c in digits):
            raise ConfigError(f"invalid value {text!r} for {source}: want octal permission "
                              f"bits, e.g. 0644")
        return int(digits, 8)
    if kind == "flag":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"invalid value {text!r} for {source}: want 1 or 0 (or yes/no, "
                          f"true/false, on/off)")
    if kind == "choice" and text not in f.metadata["choices"]:
        raise ConfigError(f"invalid value {text!r} for {source}: want one of "
                          f"{', '.join(f.metadata['choices'])}")
    if kind in ("int", "float"):
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            want = "a whole number" if kind == "int" else "a number"
            raise ConfigError(f"invalid value {text!r} for {source}: want {want}") from None
    return text


#: options mount(8) and mount.fuse3 pass on, or that an fstab line may carry, that mean
#: nothing more to ckptfs (it always mounts nodev, nosuid is the kernel's default for FUSE)
GENERIC_MOUNT_OPTIONS = frozenset({
    "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime",
    "relatime", "strictatime", "nodiratime", "async", "auto", "noauto", "defaults",
    "_netdev", "nofail", "user", "users", "nouser"})


def parse_mount_options(text: str) -> dict[str, Any]:
    """The options of `mount -t fuse.ckptfs ... -o TEXT` (an fstab line's fourth field):
    a comma-separated list of OPTION=VALUE and flags, named as the command-line options
    without their dashes (cache_dir=/nvme/ckptfs, cache-size=200G, fsync_to_store);
    the generic mount options are ignored. Field name -> value; ConfigError, one line,
    for anything else."""
    fields = {f.name: f for f in mount_options()}
    given: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if key in GENERIC_MOUNT_OPTIONS and not eq:
            continue
        if key == "ro":
            raise ConfigError("-o ro: a ckptfs mount is always read-write")
        f = fields.get(key.replace("-", "_"))
        if f is None:
            raise ConfigError(f"unknown mount option -o {key} (the options of `ckptfs mount "
                              f"--help`, without their dashes, e.g. cache_dir=DIR)")
        if f.metadata["kind"] == "flag" and not eq:
            value = "1"
        elif not value:
            raise ConfigError(f"mount option -o {key} needs a value: {key}=...")
        given[f.name] = parse_option(f, value, f"-o {key}")
    return given


def mount_options() -> list[dataclasses.Field[Any]]:
    """The fields of MountConfig that are `ckptfs mount` options, in --help order."""
    return [f for f in dataclasses.fields(MountConfig) if "flag" in f.metadata]


def trash_seconds(hours: float) -> float:
    """--trash-hours in seconds; ConfigError unless it is 0 (no trash) or more."""
    if not 0 <= hours < float("inf"):
        raise ConfigError(f"--trash-hours must be 0 (no trash) or more hours, not {hours:g}")
    if hours * 3600.0 > MAX_DURATION:
        raise ConfigError(f"--trash-hours must be at most {MAX_DURATION // 3600} (100 "
                          f"years), not {hours:g}")
    return hours * 3600.0


def check_glob(pattern: str, option: str) -> str:
    """`pattern` if it is a shell pattern of one directory name that can match: not
    empty, no '/', every '[' closed by a ']' (fnmatch would take an unclosed one for a
    plain character), no empty range such as [z-a]; else ConfigError."""
    what = f"{option} {pattern!r}"
    if not pattern or "/" in pattern:
        raise ConfigError(f"{what} must be a pattern of one directory name (no '/'), e.g. "
                          f"'checkpoint-*'")
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1  # a ']' first in the set is one of its characters
            end = pattern.find("]", j)
            if end < 0:
                raise ConfigError(f"{what} is not a valid pattern: the '[' at {i + 1} is "
                                  f"never closed (a literal '[' is written [[])")
            body = pattern[i + 1:end].lstrip("!")
            for k in range(1, len(body) - 1):
                if body[k] == "-" and body[k - 1] > body[k + 1]:
                    raise ConfigError(f"{what} is not a valid pattern: the range "
                                      f"{body[k - 1]}-{body[k + 1]} is empty")
            i = end
        i += 1
    return pattern


def metrics_address(text: str) -> tuple[str, int]:
    """--metrics-addr [HOST:]PORT as (host, port): a bare PORT or :PORT is 127.0.0.1,
    an IPv6 host is written in brackets ([::1]:9100); port 0 picks a free one.
    ConfigError, one line, for anything else."""
    host, _, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    valid_host = (bracketed or ":" not in host) and not any(
        c.isspace() or c in "/[]" for c in host)
    if not (valid_host and port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigError(f"--metrics-addr {text!r} is not [HOST:]PORT (e.g. 9100, "
                          f"127.0.0.1:9100, 0.0.0.0:9100, [::1]:9100; port 0 picks a free one)")
    return host or "127.0.0.1", int(port)


def parse_store_mode(text: str) -> int:
    """A directory store's file mode written in octal ("0640" or "640"); ValueError, with
    a one-line reason, unless it is one of STORE_MODES."""
    digits = text[1:] if len(text) == 4 and text[0] == "0" else text
    value = int(digits, 8) if len(digits) == 3 and all(c in "01234567" for c in digits) else -1
    if value not in STORE_MODES:
        raise ValueError(f"{text!r} is not a mode a directory store may give its files: want "
                         f"one of {', '.join(f'{m:04o}' for m in STORE_MODES)}")
    return value


def dir_mode(file_mode: int) -> int:
    """The mode of a directory store's directories, for files of `file_mode`: the same
    bits and x wherever there is r (0600 -> 0700, 0640 -> 0750)."""
    return file_mode | (file_mode & 0o444) >> 2


def default_cache_dir(store_url: str) -> str:
    """A per-user, per-store cache directory: $XDG_CACHE_HOME/ckptfs/<store hash>."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(store_url.encode()).hexdigest()[:16]
    return os.path.join(base, "ckptfs", digest)


@dataclass
class MountConfig:
    """Everything `ckptfs mount` needs. Each option: its default, what it does and what
    it costs (memory, disk, CPU, requests); docs/OPERATIONS.md has the same table, and a
    test checks it against these fields. Validated once, in __post_init__."""

    store: str
    mountpoint: str
    cache_dir: str = option(
        "", "--cache-dir", "local write-back cache (default: {}); put it on a fast local "
        "disk", metavar="DIR", shown="~/.cache/ckptfs/<store hash>")
    #: disk: the staging files and the read cache; dirty data above it blocks writers
    cache_size: int = option(
        16 << 30, "--cache-size", "bound of the cache directory; writers wait when this "
        "much data is not yet uploaded (default {})", kind="size", metavar="SIZE")
    #: memory: fetched chunks are served from RAM before any goes to the read cache
    read_memory: int = option(
        1 << 30, "--read-memory", "fetched chunks are served from this much memory, and only "
        "those pushed out of it are written to the read cache on disk (default {}; 0: "
        "every fetched chunk goes to disk)", kind="size", metavar="SIZE")
    endpoint_url: str | None = option(None, "--endpoint-url", ENDPOINT_HELP, metavar="URL",
                                      shown="the cloud's own")
    region: str | None = option(None, "--region", "S3 region (default: {})", metavar="REGION",
                                shown="the AWS config chain")
    #: for a NEW store only (None: NEW_STORE_CHUNK_SIZE); memory per upload/fetch thread
    chunk_size: int | None = option(
        None, "--chunk-size", "chunk size of a NEW store (default {}): the largest chunk; "
        "an existing store keeps its own (a warning says so when they differ)", kind="size",
        metavar="SIZE", shown=format_size(NEW_STORE_CHUNK_SIZE))
    min_record: int | None = option(
        None, "--min-record", "for a NEW store: tensors (records) of this size or more get "
        "chunks of their own, smaller ones share chunks with their neighbours (default {}, "
        "at most the chunk size); an existing store keeps its own", kind="size",
        metavar="SIZE", shown=format_size(NEW_STORE_MIN_RECORD))
    #: CPU: zstd4 takes about a core per 0.5 GB/s encoded
    codec: str | None = option(
        None, "--codec", "how a NEW store compresses its chunks: zstd4 (default) stores "
        "weights 17-33%% smaller at about 0.5 GB/s per core; lz4 costs almost no CPU and "
        "leaves weights as they are (docs/EFFICIENCY.md); an existing store keeps its own",
        kind="choice", choices=CODECS, shown=NEW_STORE_CODEC)
    storage_class: str | None = option(
        None, "--storage-class", "S3 storage class of chunk objects, e.g. STANDARD_IA or "
        "INTELLIGENT_TIERING (if not given: {}); manifests stay in the bucket's default class. "
        "s3:// stores only", metavar="CLASS", shown="the bucket's default")
    store_mode: str | None = option(
        None, "--store-mode", "directory stores: the mode of the files a NEW store writes "
        "(default {}: only the store's owner reads them; 0640 or 0660: its group reads "
        "them, or writes too; also 0644, 0664); its directories get x where there is r "
        "(0700, 0750, ...); an existing store keeps its own (ckptfs.json)",
        metavar="MODE", shown=f"{NEW_STORE_MODE:04o}")
    #: store: deleted versions' chunks stay this much longer before gc can free them
    trash_hours: float = option(
        24.0, "--trash-hours", "deleted files (unlink, rm -rf, a rename over a file) stay in "
        "the store's trash for H hours, restorable from any node with ckptfs trash restore; "
        "0 deletes at once (default {})", kind="float", metavar="H")
    #: memory: a chunk of read buffer each, plus its compressed output (docs/OPERATIONS.md)
    upload_threads: int = option(8, "--upload-threads", "parallel uploads (default {})",
                                 kind="int", metavar="N")
    #: None: by cores and codec (uploader.py); CPU and memory bus during a save
    uploads_while_writing: int | None = option(
        None, "--uploads-while-writing", "uploads that may run while a save streams in; the "
        "rest wait until it pauses (default: {})", kind="int", metavar="N",
        shown="the cores beyond two, at least 2 (at least 1 on a zstd4 store: its encode "
        "takes a core)")
    #: memory: about a chunk each in flight, besides --read-memory
    fetch_threads: int = option(8, "--fetch-threads", "parallel GETs (default {})",
                                kind="int", metavar="N")
    #: memory: a reader's prefetched, unread chunks (at most --cache-size / 4)
    prefetch_window: int = 256 << 20
    #: requests: one LIST per directory and one GET per opened file per TTL; listings
    #: and lookups of names not known here ask the store whatever it is (listing.py)
    metadata_ttl: float = option(
        1.0, "--metadata-ttl", "seconds a known name, its attributes and its manifest are "
        "trusted before re-reading; a name another node made is always seen at once "
        "(default {})", kind="float", metavar="S")
    publish_timeout: float = 10.0  # seconds a close waits for its publish before returning
    missing_chunk_timeout: float = option(
        60.0, "--missing-chunk-timeout", "seconds a read waits for a chunk another node is "
        "still uploading (default {})", kind="float", metavar="S")
    fsync_to_store: bool = option(False, "--fsync-to-store", "make fsync() wait until the "
                                  "file is in the object store", kind="flag")
    allow_other: bool = option(False, "--allow-other", "let other users access it",
                               kind="flag")
    # what stat shows, whatever the records say (docs/SEMANTICS.md, "Owners and modes")
    uid: int | None = option(None, "--uid", "show every entry as owned by this user id "
                             "(default: {})", kind="int", metavar="UID",
                             shown="its creator's")
    gid: int | None = option(None, "--gid", "show every entry as owned by this group id "
                             "(default: {})", kind="int", metavar="GID",
                             shown="its creator's")
    file_mode: int | None = option(
        None, "--file-mode", "show every file with these permission bits, octal, e.g. 0644 "
        "(default: {})", kind="mode", metavar="MODE", shown="its own")
    dir_mode: int | None = option(
        None, "--dir-mode", "show every directory with these permission bits, octal, e.g. "
        "0755 or 1777 (default: {})", kind="mode", metavar="MODE", shown="its own")
    node_id: str = option("", "--node-id", "name of this node in manifests (default: {})",
                          metavar="NAME", shown="hostname")
    fast_tier: str | None = option(
        None, "--fast-tier", "a directory every node shares (Lustre, NFS, EFS; any "
        "directory store URL) in front of the store: closed files go there first and to the "
        "store in the background, any node finishes what a lost node left (default {})",
        metavar="DIR")
    fast_keep: int | None = option(
        None, "--fast-keep", "with --fast-tier: keep the newest N checkpoint directories (of "
        "each parent directory; named by --keep-pattern, else the top-level directories) in "
        "the fast tier, and always the newest complete one and all newer; of the others, "
        "what the store already has is removed from the fast tier (default {})",
        kind="int", metavar="N", shown="2")
    fast_size: int | None = option(
        None, "--fast-size", "with --fast-tier: also remove from the fast tier what the "
        "store already has of the checkpoints --fast-keep keeps, oldest first, while it "
        "holds more than SIZE (its chunks and manifests), but never the newest complete "
        "checkpoint nor a newer one; logged once when what must stay is more "
        "(default {})", kind="size", metavar="SIZE", shown="no limit")
    # auto-prune (autoprune.py): off unless keep_last is set; the policy of `ckptfs prune`
    keep_last: int | None = option(
        None, "--keep-last", "auto-prune: after this mount writes into a checkpoint directory "
        "(one whose name matches --keep-pattern), remove the older ones beside it as `ckptfs "
        "prune --keep-last N` does: keep the newest N, and always the newest complete one "
        "and all newer. Give it on ONE node of a job, e.g. where NODE_RANK is 0. Needs "
        "--keep-pattern", kind="int", metavar="N")
    keep_every: int | None = option(
        None, "--keep-every", "auto-prune: also keep every checkpoint whose step, the last "
        "number in its name, is a multiple of K", kind="int", metavar="K")
    keep_pattern: str | None = option(
        None, "--keep-pattern", "auto-prune: shell pattern of checkpoint directory names, "
        "e.g. 'checkpoint-*', 'global_step*', 'step-*' (required with --keep-last; with "
        "--fast-tier, it also names those of --fast-keep)",
        metavar="GLOB")
    foreground: bool = option(False, "--foreground", "do not daemonize; log to stderr; "
                              "tell systemd when mounted if $NOTIFY_SOCKET is set "
                              "(Type=notify)", kind="flag", short="-f")
    debug: bool = option(False, "--debug", "debug logging (the same as --log-level debug)",
                         kind="flag")
    log_level: str = option("info", "--log-level", "what the daemon logs: debug, info, "
                            "warning or error (default {})", kind="choice",
                            choices=LOG_LEVELS)
    log_file: str = option(
        "", "--log-file", "the daemon's log (default: {}); rotated at "
        f"{LIMITS.log_bytes >> 20} MiB, {LIMITS.log_files} old files kept",
        metavar="PATH", shown="CACHE_DIR/ckptfs.log")
    log_format: str = option("text", "--log-format", "text lines, or json: one object per "
                             "line for log collectors (default {})", kind="choice",
                             choices=("text", "json"))
    metrics_addr: str | None = option(
        None, "--metrics-addr", "serve Prometheus metrics on [HOST:]PORT (default {}); a "
        "bare PORT listens on 127.0.0.1 only, port 0 picks a free one (ckptfs status shows "
        "it)", metavar="[HOST:]PORT")

    @classmethod
    def from_options(cls, store: str, mountpoint: str, given: dict[str, Any],
                     environ: Mapping[str, str] = os.environ) -> MountConfig:
        """A config from option values as the command line gives them: `given` maps field
        names to values (sizes may be text such as '16G'). An option not given (None, or
        False for a flag) comes from its environment variable (env_name) if that is set,
        else it keeps its default."""
        values: dict[str, Any] = {}
        for f in mount_options():
            value = given.get(f.name)
            if value is None or value is False:
                text = environ.get(env_name(f), "")
                if text:
                    value = parse_option(f, text, env_name(f))
            elif f.metadata["kind"] in ("size", "mode") and isinstance(value, str):
                value = parse_option(f, value, f.metadata["flag"])
            if value is not None:
                values[f.name] = value
        return cls(store=store, mountpoint=mountpoint, **values)

    def __post_init__(self) -> None:
        if not self.node_id:
            self.node_id = socket.gethostname()
        for name in ("upload_threads", "fetch_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        for f in mount_options():
            value = getattr(self, f.name)
            if f.metadata["kind"] == "choice" and value is not None and (
                    value not in f.metadata["choices"]):
                raise ConfigError(f"{f.metadata['flag']} {value}: want one of "
                                  f"{', '.join(f.metadata['choices'])}")
        if self.uploads_while_writing is not None and self.uploads_while_writing < 0:
            raise ConfigError("--uploads-while-writing must be at least 0")
        trash_seconds(self.trash_hours)
        self._check_owner()
        if self.metrics_addr is not None:
            metrics_address(self.metrics_addr)
        self._check_keep()
        if self.fast_tier is not None and self.keep_last is not None:
            raise ConfigError("--keep-last does not work with --fast-tier yet: run "
                              "`ckptfs prune` on the store instead")
        if self.store_mode is not None:
            try:
                parse_store_mode(self.store_mode)
            except ValueError as e:
                raise ConfigError(f"--store-mode {e}") from None
            scheme = self.store.partition("://")[0] if "://" in self.store else "file"
            if scheme.lower() != "file":
                raise ConfigError(f"--store-mode applies to directory stores only, not "
                                  f"{self.store} (a bucket's access is its own policy's)")
        if self.storage_class is not None:
            self.storage_class = self.storage_class.upper()
            if self.storage_class not in STORAGE_CLASSES:
                archive = self.storage_class in ("GLACIER", "DEEP_ARCHIVE")
                why = (" (an archive class: its objects cannot be read without a restore)"
                       if archive else "")
                raise ConfigError(f"--storage-class {self.storage_class} is not usable for "
                                  f"chunks{why}; use one of {', '.join(STORAGE_CLASSES)}")

    def _check_owner(self) -> None:
        """--uid and --gid are ids a file can have; --file-mode and --dir-mode are
        permission bits (and the sticky bit), never setuid or setgid."""
        for flag, value in (("--uid", self.uid), ("--gid", self.gid)):
            if value is not None and not 0 <= value <= MAX_ID:
                raise ConfigError(f"{flag} {value} is not an id (0 to {MAX_ID})")
        for flag, value in (("--file-mode", self.file_mode), ("--dir-mode", self.dir_mode)):
            if value is not None and value & ~MODE_BITS:
                why = ("setuid and setgid bits are never shown" if value <= 0o7777
                       else "more than the permission bits")
                raise ConfigError(f"{flag} {value:04o}: {why}; give permission bits and "
                                  f"the sticky bit only (0 to 1777), e.g. 0644")

    def _check_keep(self) -> None:
        """The auto-prune options go together; the numbers themselves are checked by
        retention.check_policy (cli, autoprune)."""
        if self.fast_tier is None:
            given = [o for o, v in (("--fast-keep", self.fast_keep),
                                    ("--fast-size", self.fast_size)) if v is not None]
            if given:
                verb = "need" if len(given) > 1 else "needs"
                raise ConfigError(f"{' and '.join(given)} {verb} --fast-tier DIR (they say "
                                  f"what the fast tier keeps)")
        if self.fast_keep is not None and self.fast_keep < 1:
            raise ConfigError(f"--fast-keep must be 1 or more, not {self.fast_keep}")
        if self.keep_last is None:
            given = [o for o, v in (("--keep-every", self.keep_every),
                                    ("--keep-pattern", self.keep_pattern)) if v is not None
                     and (o != "--keep-pattern" or self.fast_tier is None)]
            if self.keep_pattern is not None and self.fast_tier is not None:
                check_glob(self.keep_pattern, "--keep-pattern")
            if given:
                verb = "need" if len(given) > 1 else "needs"
                raise ConfigError(f"{' and '.join(given)} {verb} --keep-last N (the mount "
                                  f"prunes only with a --keep-last policy)")
            return
        if self.keep_pattern is None:
            raise ConfigError("--keep-last needs --keep-pattern GLOB on a mount, the names of "
                              "the checkpoint directories (e.g. 'checkpoint-*'): without it, "
                              "any directory written into would be pruned")
        check_glob(self.keep_pattern, "--keep-pattern")
