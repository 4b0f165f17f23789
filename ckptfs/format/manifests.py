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

from ckptfs import __version__
from ckptfs.common.config import MAX_ID, MODE_BITS, STORE_MODES, parse_store_mode
from ckptfs.common.errors import FormatError, InvalidKeyError
from ckptfs.format.chunking import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from ckptfs.format.codec import CODECS, HASH_NAME

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
#: sizes and lengths are below this; times are int64 nanoseconds, within +-this
INT63 = 2**63
#: st_mode is 16 bits: the type (S_IFMT) and the permission bits
MODE_MAX = 0o177777
_REQUIRED = object()


class RecordReader:
    """The fields of one JSON record read from the store, each checked for its type and
    range: every record parser goes through it, and the only error it raises is
    FormatError (naming the record and the field). JSON `true`/`false` are not integers."""

    def __init__(self, blob: bytes, what: str, empty_ok: bool = False) -> None:
        self.what = what
        if empty_ok and not blob:
            self.d: dict[str, object] = {}
            return
        try:
            d = json.loads(blob)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise FormatError(f"{what} is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise FormatError(f"{what} is not a JSON object")
        self.d = d

    def problem(self, why: str) -> FormatError:
        return FormatError(f"{self.what} is not valid: {why}")

    def _get(self, key: str, default: object) -> object:
        if key in self.d:
            return self.d[key]
        if default is _REQUIRED:
            raise self.problem(f"no {key!r}")
        return default

    def has(self, key: str) -> bool:
        return key in self.d

    def integer(self, key: str, low: int, high: int, default: object = _REQUIRED) -> int:
        """An integer field in [low, high]."""
        value = self._get(key, default)
        return self.check_int(key, value, low, high)

    def check_int(self, name: str, value: object, low: int, high: int) -> int:
        if type(value) is not int or not low <= value <= high:
            raise self.problem(f"{name} is {_shown(value)}, not an integer in [{low}, {high}]")
        return value

    def string(self, key: str, default: object = _REQUIRED) -> str:
        """A string field that is valid Unicode (it can be written as UTF-8)."""
        value = self._get(key, default)
        return self.check_str(key, value)

    def check_str(self, name: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.problem(f"{name} is {_shown(value)}, not a string")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise self.problem(f"{name} is {_shown(value)}, not valid Unicode") from None
        return value

    def owner_id(self, key: str) -> int | None:
        """An optional uid or gid (absent: None, the record names no owner)."""
        return self.integer(key, 0, MAX_ID) if key in self.d else None

    def number(self, key: str, default: float) -> float:
        """A finite number (integer or not)."""
        value = self._get(key, default)
        if type(value) is int and abs(value) < 2**1000:
            value = float(value)
        if type(value) is not float or not math.isfinite(value):
            raise self.problem(f"{key} is {_shown(value)}, not a finite number")
        return value

    def version(self, key: str, newest: int, default: object = _REQUIRED) -> int:
        """A record version: FormatError saying "newer" for one above `newest`."""
        value = self._get(key, default)
        if type(value) is int and value > newest:
            raise FormatError(f"{self.what} format {key}={_shown(value)} is newer than this "
                              f"ckptfs knows ({newest}); upgrade ckptfs")
        return self.check_int(key, value, 1, newest)

    def items(self, key: str, default: object = _REQUIRED) -> list[object]:
        value = self._get(key, default)
        if not isinstance(value, list):
            raise self.problem(f"{key} is {_shown(value)}, not a list")
        return value


def _shown(value: object) -> str:
    """A value as JSON for a one-line message, at most 40 characters of it."""
    if type(value) is int and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    # a directory store's: the mode of the files it writes (its directories: x where there
    # is r); None, a store made before there was one: 0644 (0755) less the umask
    store_mode: int | None = None

    def to_json(self) -> bytes:
        d: dict[str, object] = {"format": self.format, "chunk_size": self.chunk_size,
                                "hash": self.hash}
        if self.format >= 2:
            d.update(chunking=self.chunking, codec=self.codec, min_record=self.min_record)
        if self.store_mode is not None:
            d.update(store_mode=f"{self.store_mode:04o}")
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
        """Parse and validate; FormatError for anything malformed, unknown or newer."""
        r = RecordReader(blob, INFO_KEY)
        version = r.integer("format", 1, INT63 - 1)
        if version > FORMAT_VERSION:
            raise FormatError(
                f"store format version {version} is newer than this ckptfs supports "
                f"({FORMAT_VERSION}); upgrade ckptfs")
        hash_name = r.string("hash", HASH_NAME)
        if hash_name != HASH_NAME:
            raise FormatError(f"store uses hash {hash_name!r}, ckptfs knows {HASH_NAME}")
        chunking, codec = FORMAT_DEFAULTS[version]
        if version >= 2:  # format 1 had no such fields: fixed chunks and lz4
            chunking, codec = r.string("chunking"), r.string("codec")
        store_mode = None
        if r.has("store_mode"):
            try:
                store_mode = parse_store_mode(r.string("store_mode"))
            except ValueError as e:
                raise r.problem(f"store_mode {e}") from None
        info = cls(chunk_size=r.integer("chunk_size", 0, INT63 - 1), format=version,
                   hash=HASH_NAME, created_by=r.string("created_by", ""),
                   created_at=r.number("created_at", 0.0), chunking=chunking, codec=codec,
                   min_record=r.integer("min_record", 0, INT63 - 1, DEFAULT_MIN_RECORD),
                   store_mode=store_mode)
        problem = info.problem()
        if problem:
            raise r.problem(problem)
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
        if self.store_mode is not None and self.store_mode not in STORE_MODES:
            return f"store_mode {self.store_mode:04o} is not one of " + ", ".join(
                f"{m:04o}" for m in STORE_MODES)
        return None


def kept_mode(mode: int) -> int:
    """`mode` as records keep it and a mount shows it: its type, permission and sticky
    bits. Setuid and setgid are dropped, written or read: a file anyone can create
    through a mount, or write into a store, never becomes a setuid program of its owner
    (here, or after a `cp -a` out of the mount)."""
    return stat.S_IFMT(mode) | (mode & MODE_BITS)


def owner_fields(uid: int | None, gid: int | None) -> dict[str, int]:
    """The "uid" and "gid" fields of a manifest or marker: those that are recorded."""
    return {k: v for k, v in (("uid", uid), ("gid", gid)) if v is not None}


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
    uid: int | None = None  # the owner (None: not recorded; the mounting user is shown)
    gid: int | None = None

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
        d.update(owner_fields(self.uid, self.gid))
        if self.target is not None:
            d["target"] = self.target
        else:
            d["chunk_size"] = self.chunk_size
            d["chunks"] = [list(c) for c in self.chunks]
        d["writer"] = self.writer
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> Manifest:
        """Parse and validate every field (docs/FORMAT.md, "Manifests"); FormatError for
        anything malformed, out of range or from a newer format, and nothing else."""
        r = RecordReader(blob, "manifest")
        r.version("v", RECORD_VERSION)
        size = r.integer("size", 0, INT63 - 1)
        mode = r.integer("mode", 0, MODE_MAX)
        mtime_ns = r.integer("mtime_ns", -INT63, INT63 - 1)
        writer = r.string("writer", "")
        uid, gid = r.owner_id("uid"), r.owner_id("gid")
        if r.has("target"):  # a symlink: its target instead of chunks
            target = r.string("target")
            if "\0" in target:
                raise r.problem("the symlink target holds a NUL")
            if r.has("chunks") or r.has("chunk_size"):
                raise r.problem("a symlink manifest lists chunks")
            if size != len(target.encode()):
                raise r.problem(f"size {size} is not the length of the symlink target "
                                f"({len(target.encode())} bytes)")
            return cls(size, mode, mtime_ns, writer=writer, target=target, uid=uid, gid=gid)
        chunk_size = r.integer("chunk_size", 0, INT63 - 1, DEFAULT_CHUNK_SIZE)
        chunks = []
        for i, c in enumerate(r.items("chunks", [])):
            if not isinstance(c, list) or len(c) != 2:
                raise r.problem(f"chunk {i} is not a [name, length] pair")
            name = c[0]
            if not isinstance(name, str) or not CHUNK_NAME.fullmatch(name):
                raise r.problem(f"chunk {i} has a malformed name (want 32 lowercase hex "
                                f"digits): {_shown(name)}")
            chunks.append((name, r.check_int(f"the length of chunk {i}", c[1], 0,
                                             MAX_CHUNK_SIZE)))
        if sum(n for _, n in chunks) != size:
            raise r.problem(f"the chunk lengths add up to {sum(n for _, n in chunks)}, not "
                            f"to its size {size}")
        # a file manifest describes a regular file, whatever type bits it gives; setuid
        # and setgid bits are never honoured (a record anyone with store access could write)
        return cls(size, kept_mode(stat.S_IFREG | (mode & 0o7777)), mtime_ns, tuple(chunks),
                   chunk_size, writer, uid=uid, gid=gid)


@dataclass(frozen=True)
class DirMarker:
    """The body of a directory marker: the directory's mode, mtime and owner."""

    mode: int = stat.S_IFDIR | 0o755
    mtime_ns: int = 0
    uid: int | None = None  # the owner (None: not recorded; the mounting user is shown)
    gid: int | None = None

    def to_json(self) -> bytes:
        return json.dumps({"v": RECORD_VERSION, "mode": self.mode, "mtime_ns": self.mtime_ns,
                           **owner_fields(self.uid, self.gid)}).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> DirMarker:
        """Parse and validate (an empty body: the defaults); FormatError for anything
        malformed, out of range or from a newer format, and nothing else."""
        r = RecordReader(blob, "directory marker", empty_ok=True)
        if r.has("v"):
            r.version("v", RECORD_VERSION)
        mode = r.integer("mode", 0, MODE_MAX, 0o755)
        return cls(mode=kept_mode(stat.S_IFDIR | (mode & 0o7777)),
                   mtime_ns=r.integer("mtime_ns", -INT63, INT63 - 1, 0),
                   uid=r.owner_id("uid"), gid=r.owner_id("gid"))


@dataclass(frozen=True)
class RenameIntent:
    """The body of intents/<node>-<seq>.json: a directory rename in progress."""

    src: str
    dst: str
    writer: str = ""
    time: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps({"v": RECORD_VERSION, "op": "rename_dir", "src": self.src,
                           "dst": self.dst, "writer": self.writer, "time": self.time}).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> RenameIntent:
        """Parse and validate; FormatError for anything malformed, unknown or newer, and
        for a rename no writer makes (of the root, or into or onto itself)."""
        r = RecordReader(blob, "rename intent")
        r.version("v", RECORD_VERSION)
        op = r.string("op")
        if op != "rename_dir":
            raise r.problem(f"op is {_shown(op)}, not \"rename_dir\"")
        paths = []
        for key in ("src", "dst"):
            try:
                paths.append(check_path(r.string(key)))
            except InvalidKeyError as e:
                raise r.problem(f"{key}: {e}") from None
        src, dst = paths
        if not src or not dst or src == dst or dst.startswith(src + "/") or (
                src.startswith(dst + "/")):
            raise r.problem(f"a rename of {src!r} to {dst!r} is not one a writer makes")
        return cls(src, dst, r.string("writer", ""), r.number("time", 0.0))


#: the manifest field a fast-tier mount adds (docs/FORMAT.md, "The fast tier"): the
#: version's generation, which orders the versions of one path; readers ignore it
GENERATION = "gen"


def generation(body: bytes) -> int:
    """The `gen` of a manifest's bytes; 0 when it has none (written without a fast tier)
    or is not a JSON object with an integer `gen`."""
    try:
        value = json.loads(body).get(GENERATION, 0)
    except (ValueError, AttributeError, UnicodeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def with_generation(body: bytes, gen: int) -> bytes:
    """The manifest `body` with its `gen` set to `gen` (other fields as they were)."""
    record = json.loads(body)
    record[GENERATION] = gen
    return json.dumps(record, separators=(",", ":")).encode()
