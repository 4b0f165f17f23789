"""Format v1 records and keys: ckptfs.json, file manifests, directory markers (docs/FORMAT.md)."""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass, field, replace
from itertools import accumulate

from . import __version__
from .chunking import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from .codec import CODECS, HASH_NAME
from .errors import FormatError, InvalidKeyError

#: records (manifests, directory markers): unchanged since format 1
RECORD_VERSION = 1
#: the store (ckptfs.json): 2 added per-store chunking and codec; a format 1 store is
#: read and written as format 1 (fixed chunks, lz4) until `ckptfs upgrade`
FORMAT_VERSION = 2
#: chunking and codec of each store format: what a store's ckptfs.json may not name
FORMAT_DEFAULTS = {1: ("fixed", "lz4"), 2: ("records", "zstd4")}
CHUNKINGS = ("fixed", "records")
DEFAULT_MIN_RECORD = 256 * 1024
MIN_RECORD_RANGE = (4 * 1024, 16 * 1024 * 1024)
INFO_KEY = "ckptfs.json"
FILES = "files/"
CHUNKS = "chunks/"
INTENTS = "intents/"  # directory renames in progress (publisher.roll_forward_intents)
FOSSILS = "fossils/"  # chunks set aside by `ckptfs gc` (docs/FORMAT.md, "Garbage collection")
GC = "gc/"  # scratch objects of gc runs (its clock probe)
TRASH = "trash/"  # deleted manifests and markers, kept for a while (trash.py)
#: the environment variable that shortens CONFIRM_WINDOW: a test-only hook (a mount daemon
#: is a separate process), not a user option; read once, at import
CONFIRM_WINDOW_ENV = "CKPTFS_CONFIRM_WINDOW"
#: CONFIRM_WINDOW when CONFIRM_WINDOW_ENV is not set
DEFAULT_CONFIRM_WINDOW = 600.0


def confirm_window_from(value: str | None) -> float:
    """The confirmation window a CONFIRM_WINDOW_ENV value asks for (seconds; unset or
    empty: the default). It can only shorten the window: gc's MIN_SAFE_GRACE rests on
    the default, and a longer window would make that grace unsafe."""
    if not value:
        return DEFAULT_CONFIRM_WINDOW
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= DEFAULT_CONFIRM_WINDOW:
        raise ValueError(f"{CONFIRM_WINDOW_ENV}={value!r}: want seconds in "
                         f"(0, {DEFAULT_CONFIRM_WINDOW:g}]")
    return seconds


#: seconds a writer trusts that a chunk is in the store after it last saw it there (its
#: PUT, or a HEAD that found it); after that, a new manifest may name the chunk only once
#: a HEAD has found it again (or it was uploaded again). gc's safe minimum grace rests on
#: it (docs/FORMAT.md, "Garbage collection"). Tests shorten it through CONFIRM_WINDOW_ENV
#: (then gc needs a grace of at least 2 x the window + RESTAMP_AFTER, and --no-writers);
#: the uploader and the publisher copy it at import.
CONFIRM_WINDOW = confirm_window_from(os.environ.get(CONFIRM_WINDOW_ENV))
#: a chunk name as codec.chunk_hash() writes it: xxh3-128 in lowercase hex
CHUNK_NAME = re.compile(r"[0-9a-f]{32}")


def check_path(path: str) -> str:
    """Return `path` (relative, '/'-separated, no '', '.', '..' or NUL) or raise.

    The root directory is the empty path "". Paths from the store are checked before use.
    """
    if path == "":
        return path
    if path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in path.split("/")):
        raise InvalidKeyError(f"unsafe path in store: {path!r}")
    return path


def join(parent: str, name: str) -> str:
    """Path of entry `name` in directory `parent`."""
    return f"{parent}/{name}" if parent else name


def file_key(path: str) -> str:
    """Key of the manifest of the file (or symlink) at `path`."""
    return FILES + check_path(path)


def dir_key(path: str) -> str:
    """Key of the marker of the directory at `path`; the root's is 'files/'."""
    return FILES + (check_path(path) + "/" if path else "")


def dir_prefix(path: str) -> str:
    """LIST prefix of the entries of the directory at `path`."""
    return dir_key(path)


def chunk_key(chunk_hash: str) -> str:
    """Key of a chunk: sharded by the first two hex digits of its name."""
    return f"{CHUNKS}{chunk_hash[:2]}/{chunk_hash}"


def fossil_key(chunk_hash: str) -> str:
    """Key of a chunk set aside by gc: the same object bytes, under fossils/."""
    return f"{FOSSILS}{chunk_hash[:2]}/{chunk_hash}"


def chunk_name(key: str, prefix: str = CHUNKS) -> str | None:
    """The chunk name of a chunks/ (or, with prefix FOSSILS, fossils/) key of the
    layout, or None for any other key."""
    name = key.rpartition("/")[2]
    if CHUNK_NAME.fullmatch(name) and key == f"{prefix}{name[:2]}/{name}":
        return name
    return None


def path_of_key(key: str) -> str:
    """Inverse of file_key/dir_key: 'files/a/b' and 'files/a/b/' -> 'a/b'."""
    if not key.startswith(FILES):
        raise InvalidKeyError(f"not a files/ key: {key!r}")
    return check_path(key[len(FILES):].rstrip("/"))


@dataclass(frozen=True)
class StoreInfo:
    """The contents of <prefix>/ckptfs.json: read first, written once at creation."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    format: int = FORMAT_VERSION
    hash: str = HASH_NAME
    created_by: str = f"ckptfs {__version__}"
    created_at: float = field(default_factory=time.time)
    chunking: str = "records"  # "fixed": every chunk_size bytes; "records": formats.py
    codec: str = "zstd4"  # how new chunks are compressed (codec.py)
    # records smaller than this (or than chunk_size) share chunks (formats.py)
    min_record: int = DEFAULT_MIN_RECORD

    def to_json(self) -> bytes:
        d: dict[str, object] = {"format": self.format, "chunk_size": self.chunk_size,
                                "hash": self.hash}
        if self.format >= 2:
            d.update(chunking=self.chunking, codec=self.codec, min_record=self.min_record)
        d.update(created_by=self.created_by, created_at=self.created_at)
        return json.dumps(d, indent=1).encode() + b"\n"

    def upgraded(self, codec: str | None = None) -> StoreInfo:
        """This store as the current format: new files chunked and compressed its way, with
        `codec` (default: the format's); chunks already stored stay as they are (every
        format reads every codec). A store already at the format keeps its codec."""
        if self.format == FORMAT_VERSION:
            return self
        chunking, default = FORMAT_DEFAULTS[FORMAT_VERSION]
        return replace(self, format=FORMAT_VERSION, chunking=chunking, codec=codec or default)

    @classmethod
    def from_json(cls, blob: bytes) -> StoreInfo:
        try:
            d = json.loads(blob)
            version = int(d["format"])
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{INFO_KEY} is not valid: {e}") from None
        if version > FORMAT_VERSION:
            raise FormatError(
                f"store format version {version} is newer than this ckptfs supports "
                f"({FORMAT_VERSION}); upgrade ckptfs")
        if d.get("hash", HASH_NAME) != HASH_NAME:
            raise FormatError(f"store uses hash {d.get('hash')!r}, ckptfs knows {HASH_NAME}")
        chunking, codec = FORMAT_DEFAULTS.get(version, FORMAT_DEFAULTS[1])
        try:
            if version >= 2:  # format 1 had no such fields: fixed chunks and lz4
                chunking, codec = str(d["chunking"]), str(d["codec"])
            info = cls(chunk_size=int(d["chunk_size"]), format=version, hash=HASH_NAME,
                       created_by=str(d.get("created_by", "")),
                       created_at=float(d.get("created_at", 0)), chunking=chunking,
                       codec=codec, min_record=int(d.get("min_record", DEFAULT_MIN_RECORD)))
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{INFO_KEY} is not valid: {e!r}") from None
        problem = info.problem()
        if problem:
            raise FormatError(f"{INFO_KEY} is not valid: {problem}")
        return info

    def problem(self) -> str | None:
        """What makes these settings unusable, or None."""
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            return f"chunk size {self.chunk_size} is not in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]"
        if self.chunking not in CHUNKINGS:
            return f"chunking {self.chunking!r} is not one of {', '.join(CHUNKINGS)}"
        if self.codec not in CODECS:
            return f"codec {self.codec!r} is not one of {', '.join(CODECS)}"
        low, high = MIN_RECORD_RANGE
        if not low <= self.min_record <= high:
            return f"min_record {self.min_record} is not in [{low}, {high}]"
        return None


@dataclass(frozen=True)
class Manifest:
    """One file or symlink: its attributes and the chunks that hold its bytes, in order."""

    size: int
    mode: int
    mtime_ns: int
    chunks: tuple[tuple[str, int], ...] = ()
    chunk_size: int = DEFAULT_CHUNK_SIZE
    writer: str = ""
    target: str | None = None  # symlinks only

    @property
    def is_symlink(self) -> bool:
        return self.target is not None

    def chunk_offsets(self) -> list[int]:
        """Start offset of every chunk, plus the file size at the end."""
        return [0, *accumulate(n for _, n in self.chunks)]

    def chunk_at(self, offsets: list[int], offset: int) -> int:
        """Index of the chunk holding byte `offset`, given chunk_offsets()."""
        return bisect.bisect_right(offsets, offset) - 1

    def to_json(self) -> bytes:
        d: dict[str, object] = {"v": RECORD_VERSION, "size": self.size, "mode": self.mode,
                                "mtime_ns": self.mtime_ns}
        if self.target is not None:
            d["target"] = self.target
        else:
            d["chunk_size"] = self.chunk_size
            d["chunks"] = [list(c) for c in self.chunks]
        d["writer"] = self.writer
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> Manifest:
        """Parse and validate; FormatError for anything malformed or from a newer format."""
        try:
            d = json.loads(blob)
            if int(d["v"]) > RECORD_VERSION:
                raise FormatError(f"manifest format {d['v']} is newer than this ckptfs")
            target = d.get("target")
            chunks = tuple((str(h), int(n)) for h, n in d.get("chunks", ()))
            m = cls(size=int(d["size"]), mode=int(d["mode"]), mtime_ns=int(d["mtime_ns"]),
                    chunks=chunks, chunk_size=int(d.get("chunk_size", DEFAULT_CHUNK_SIZE)),
                    writer=str(d.get("writer", "")),
                    target=None if target is None else str(target))
        except FormatError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"manifest is not valid: {e!r}") from None
        if m.target is None and sum(n for _, n in m.chunks) != m.size:
            raise FormatError("manifest chunk lengths do not add up to its size")
        if any(n < 0 or not CHUNK_NAME.fullmatch(h) for h, n in m.chunks):
            raise FormatError("manifest names a malformed chunk")
        if m.target is None and not stat.S_ISREG(m.mode):
            m = Manifest(m.size, stat.S_IFREG | (m.mode & 0o7777), m.mtime_ns, m.chunks,
                         m.chunk_size, m.writer)
        return m


@dataclass(frozen=True)
class DirMarker:
    """The body of a directory marker: the directory's mode and mtime."""

    mode: int = stat.S_IFDIR | 0o755
    mtime_ns: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"v": RECORD_VERSION, "mode": self.mode,
                           "mtime_ns": self.mtime_ns}).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> DirMarker:
        try:
            d = json.loads(blob) if blob else {}
            return cls(mode=stat.S_IFDIR | (int(d.get("mode", 0o755)) & 0o7777),
                       mtime_ns=int(d.get("mtime_ns", 0)))
        except (ValueError, TypeError) as e:
            raise FormatError(f"directory marker is not valid: {e!r}") from None
