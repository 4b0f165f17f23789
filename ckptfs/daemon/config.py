"""Mount options: parsing and defaults, each limit with its cost (docs/OPERATIONS.md)."""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass

from ckptfs.common.errors import ConfigError
from ckptfs.common.units import MAX_DURATION

#: S3 storage classes for chunk objects: those whose objects can be read at once (the
#: archive classes GLACIER and DEEP_ARCHIVE need a restore before every read)
STORAGE_CLASSES = ("STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING",
                   "GLACIER_IR", "REDUCED_REDUNDANCY")
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


def default_cache_dir(store_url: str) -> str:
    """A per-user, per-store cache directory: $XDG_CACHE_HOME/ckptfs/<store hash>."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(store_url.encode()).hexdigest()[:16]
    return os.path.join(base, "ckptfs", digest)


@dataclass
class MountConfig:
    """Everything `ckptfs mount` needs; memory/disk cost of each limit in docs/OPERATIONS.md."""

    store: str
    mountpoint: str
    cache_dir: str = ""
    cache_size: int = 16 << 30  # disk: staging + read cache; dirty data above it blocks writers
    read_memory: int = 1 << 30  # memory: fetched chunks served from RAM before the read cache
    endpoint_url: str | None = None
    region: str | None = None
    chunk_size: int | None = None  # --chunk-size: for a new store (None: 16 MiB)
    min_record: int | None = None  # --min-record: for a new store (None: 256 KiB)
    codec: str | None = None  # --codec: for a new store (None: zstd4)
    upload_threads: int = 8  # memory: ~2 chunks each in flight
    uploads_while_writing: int | None = None  # None: by cores and codec (uploader.py)
    fetch_threads: int = 8  # memory: ~2 chunks each in flight
    prefetch_window: int = 256 << 20  # memory: a reader's prefetched, unread chunks
    metadata_ttl: float = 1.0
    publish_timeout: float = 10.0
    missing_chunk_timeout: float = 60.0
    fsync_to_store: bool = False
    allow_other: bool = False
    foreground: bool = False
    debug: bool = False
    node_id: str = ""
    storage_class: str | None = None  # S3 storage class of chunk objects
    trash_hours: float = 24.0  # deleted manifests stay in trash/ this long (0: no trash)
    # auto-prune (autoprune.py): off unless keep_last is set; the policy of `ckptfs prune`
    keep_last: int | None = None  # --keep-last N
    keep_every: int | None = None  # --keep-every K
    keep_pattern: str | None = None  # --keep-pattern GLOB: required with keep_last

    def __post_init__(self) -> None:
        if not self.node_id:
            self.node_id = socket.gethostname()
        for name in ("upload_threads", "fetch_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.uploads_while_writing is not None and self.uploads_while_writing < 0:
            raise ConfigError("--uploads-while-writing must be at least 0")
        trash_seconds(self.trash_hours)
        self._check_keep()
        if self.storage_class is not None:
            self.storage_class = self.storage_class.upper()
            if self.storage_class not in STORAGE_CLASSES:
                archive = self.storage_class in ("GLACIER", "DEEP_ARCHIVE")
                why = (" (an archive class: its objects cannot be read without a restore)"
                       if archive else "")
                raise ConfigError(f"--storage-class {self.storage_class} is not usable for "
                                  f"chunks{why}; use one of {', '.join(STORAGE_CLASSES)}")

    def _check_keep(self) -> None:
        """The auto-prune options go together; the numbers themselves are checked by
        retention.check_policy (cli, autoprune)."""
        if self.keep_last is None:
            given = [o for o, v in (("--keep-every", self.keep_every),
                                    ("--keep-pattern", self.keep_pattern)) if v is not None]
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
