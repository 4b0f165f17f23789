"""The SQLite journal in the cache directory: what is not yet durable in the store.

Tables written before an operation is acknowledged and cleared when the store has it:

- ``chunks``: chunks of published files still to upload, and where their bytes are
  (a staging file and an offset);
- ``chunk_paths``: which files (paths) need each of those chunks, kept up to date
  through renames and deletes, so that a lost chunk can be reported by file name;
- ``ops``: metadata operations (manifest puts, deletes, renames) still to apply to the
  store, applied strictly in ``seq`` order; each with the time it was journaled (this
  node's wall clock) and, for a manifest put of a version written here, the staging file
  that holds the version's local chunks: a manifest published long after it was
  journaled has its chunks re-confirmed first (publisher.py), and may need them again;
- ``lost``: files that lost a chunk before it reached the store (its staged bytes were
  gone or damaged), or whose old manifest, re-confirmed before its late publish, names a
  chunk gone from the store with no copy left (publisher.py). A row stays, and status,
  the log and umount report it, until the file is rewritten without that chunk or
  deleted.

All methods block; the filesystem calls them through one thread (a limiter of size 1),
so a single connection is used. WAL mode with synchronous=FULL: a commit survives a
crash of the process and of the machine. This is the only module that imports sqlite3:
its errors leave as errors.JournalFull (the disk is full) or errors.JournalError.

A journal that lost committed state cannot be trusted to say what is pending. SQLite
replays its write-ahead log only up to the first frame that fails its checksum, and
drops that frame and every later one without an error. So before SQLite opens the
journal, the log left by a process that did not close it is read here (`wal_damage`,
the file format of sqlite.org/fileformat.html): a damaged frame of the current log
generation that is followed by a committing frame, or is itself one, means committed
transactions are about to be dropped. A journal SQLite refuses (not a database,
malformed, `PRAGMA quick_check` failing) is moved aside and a new one started. Either
way the damaged file is kept beside the journal for the operator, and the meta row
``damaged`` records why until the check against the store (recovery.py) has run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import wraps
from typing import ParamSpec, TypeVar

from ckptfs.common import private
from ckptfs.common.errors import JournalError, JournalFull

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums of little-, big-endian 32-bit words
WAL_HEADER = 32
WAL_FRAME_HEADER = 24
#: SQLite primary result codes of a file that is not a (sound) database
_DAMAGED_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _journal_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """sqlite3 errors as the project's JournalFull / JournalError."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as e:
            if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                raise JournalFull(f"the cache disk is full (journal: {e})") from None
            raise JournalError(f"the journal failed: {e}") from e

    return call

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    hash TEXT PRIMARY KEY,
    staging_id INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ops (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    path TEXT NOT NULL,
    path2 TEXT,
    body BLOB,
    journaled_at REAL,
    staging_id INTEGER
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chunk_paths (
    hash TEXT NOT NULL,
    path TEXT NOT NULL,
    PRIMARY KEY (hash, path)
);
CREATE TABLE IF NOT EXISTS lost (
    path TEXT NOT NULL,
    hash TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (path, hash)
);
"""
#: columns added to a table after its first release: (table, column, type). A journal
#: written before gets them at open (ALTER TABLE), NULL in its old rows
ADDED_COLUMNS = (("ops", "journaled_at", "REAL"), ("ops", "staging_id", "INTEGER"))

#: an op to journal: (kind, path, path2, body), and for the put_file of a version written
#: on this node, a fifth item: the id of the staging file that holds it
OpRecord = (tuple[str, str, str | None, bytes | None]
            | tuple[str, str, str | None, bytes | None, int | None])


def _migrate(db: sqlite3.Connection) -> None:
    """Add the columns a journal from an older ckptfs lacks."""
    for table, column, kind in ADDED_COLUMNS:
        have = {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _wal_checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum of `data` (a multiple of 8 bytes), continuing from (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_damage(path: str) -> str | None:
    """Why SQLite will drop committed transactions from the write-ahead log of the
    journal at `path` (path + '-wal'), or None when it will replay all of them.

    SQLite replays the frames of the current generation (the header's salts) while each
    checksum, chained from the previous frame's, holds, and keeps what the last valid
    committing frame (one with a database size) committed. A frame that fails, followed
    by any frame of the same generation that commits and is consistent with its own
    predecessor, was written and acknowledged before frames SQLite will drop: committed
    state is lost. A failing committing frame is counted too (a torn write of the last,
    unacknowledged transaction looks the same: the check that follows is then harmless).
    A failing frame with nothing committing after it is a transaction that never
    committed, and frames of an older generation past the end are stale: both are
    ignored, as SQLite does.
    """
    try:
        with open(path + "-wal", "rb") as f:
            wal = f.read()
    except FileNotFoundError:
        return None
    if len(wal) <= WAL_HEADER:
        return None  # no frame was ever written
    magic, _, page_size, _, salt1, salt2, c1, c2 = struct.unpack(">8I", wal[:WAL_HEADER])
    big = magic & 1 == 1
    valid_size = page_size >= 512 and page_size & (page_size - 1) == 0
    if magic not in WAL_MAGIC or not valid_size or _wal_checksum(
            wal[:24], big) != (c1, c2):
        return f"its write-ahead log header is damaged ({len(wal)} bytes of log ignored)"
    frame = WAL_FRAME_HEADER + page_size
    seed = (c1, c2)
    broken = None  # index of the first frame SQLite rejects
    for i in range((len(wal) - WAL_HEADER) // frame):
        at = WAL_HEADER + i * frame
        head = wal[at:at + WAL_FRAME_HEADER]
        _, commit, f1, f2, k1, k2 = struct.unpack(">6I", head)
        ours = (f1, f2) == (salt1, salt2)
        sound = ours and _wal_checksum(head[:8] + wal[at + WAL_FRAME_HEADER:at + frame],
                                       big, *seed) == (k1, k2)
        if broken is None and not sound:
            broken = i
            if ours and commit:
                return f"frame {i} of its write-ahead log, which commits, is damaged"
        elif broken is not None and sound and commit:
            return (f"frame {broken} of its write-ahead log is damaged, and frame {i} "
                    "after it commits: SQLite drops both")
        seed = (k1, k2)  # a later frame is checked against its own predecessor
    return None


def _damaged_suffix() -> str:
    """The suffix of a damaged journal file kept for the operator: when it was found."""
    return time.strftime(".damaged-%Y%m%dT%H%M%S")


def _set_aside(path: str, suffix: str) -> str:
    """Rename the file at `path` to path + suffix (kept for the operator); the new name."""
    aside = f"{path}{suffix}"
    os.replace(path, aside)
    return aside


def _counts(db: sqlite3.Connection) -> tuple[int, int]:
    c = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    o = db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    return int(c), int(o)


def _lost(db: sqlite3.Connection) -> list[LostFile]:
    try:
        rows = db.execute("SELECT path, hash, reason FROM lost ORDER BY path, hash").fetchall()
    except sqlite3.OperationalError:  # a journal from before the table existed
        return []
    return [LostFile(*r) for r in rows]


@_journal_errors
def read_counts(path: str) -> tuple[int, int]:
    """Journal.counts() of a journal not in use (read-only: e.g. after the daemon exited)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _counts(db)
    finally:
        db.close()


@_journal_errors
def read_damage(path: str) -> str | None:
    """Journal.damage of a journal not in use (read-only)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'damaged'").fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


@_journal_errors
def read_lost(path: str) -> list[LostFile]:
    """Journal.lost_files() of a journal not in use (read-only)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _lost(db)
    finally:
        db.close()


def _chunk_hashes(body: bytes | None) -> list[str]:
    """The chunk names a put_file op's manifest lists ([] if it lists none or is unreadable)."""
    try:
        return [str(c[0]) for c in json.loads(body or b"{}").get("chunks", ())]
    except (ValueError, TypeError, IndexError, AttributeError):
        return []


def _follow_op(cur: sqlite3.Cursor, kind: str, path: str, path2: str | None,
               body: bytes | None) -> None:
    """Keep chunk_paths and lost naming the right files after a namespace op."""
    for table in ("chunk_paths", "lost"):
        if kind == "put_file":  # a new version: forget what it no longer references
            hashes = _chunk_hashes(body)
            marks = ",".join("?" * len(hashes))
            cur.execute(f"DELETE FROM {table} WHERE path = ? AND hash NOT IN ({marks})",
                        (path, *hashes))
        elif kind == "delete_file":
            cur.execute(f"DELETE FROM {table} WHERE path = ?", (path,))
        elif kind == "rename_file" and path2 is not None:
            cur.execute(f"DELETE FROM {table} WHERE path = ?", (path2,))
            cur.execute(f"UPDATE OR REPLACE {table} SET path = ? WHERE path = ?", (path2, path))
        elif kind == "rename_dir" and path2 is not None:
            n = len(path) + 1
            cur.execute(f"UPDATE OR REPLACE {table} SET path = ? || substr(path, ?) "
                        f"WHERE substr(path, 1, ?) = ?", (path2, n, n, path + "/"))


def followed(path: str, chunk_hash: str,
             ops: Iterable[tuple[str, str, str | None, bytes | None]]) -> str | None:
    """Where the file at `path`, with the chunk `chunk_hash`, is after `ops` (kind, path,
    path2, body) in order, as _follow_op moves a row; None once they delete the file or
    replace it with a version without that chunk."""
    for kind, op_path, path2, body in ops:
        if kind == "put_file" and op_path == path and chunk_hash not in _chunk_hashes(body):
            return None
        if kind == "delete_file" and op_path == path:
            return None
        if kind == "rename_file" and path2 is not None:
            if op_path == path:
                path = path2
            elif path2 == path:
                return None
        elif kind == "rename_dir" and path2 is not None and path.startswith(op_path + "/"):
            path = path2 + path[len(op_path):]
    return path


@dataclass(frozen=True)
class LostFile:
    """A file that lost a chunk before the chunk reached the store."""

    path: str
    hash: str
    reason: str


@dataclass(frozen=True)
class PendingChunk:
    """A chunk of a published file whose bytes are only in the local cache."""

    hash: str
    staging_id: int
    offset: int
    length: int


@dataclass(frozen=True)
class Op:
    """A metadata operation to apply to the store (see publisher.py for the kinds)."""

    seq: int
    kind: str
    path: str
    path2: str | None = None
    body: bytes | None = None
    #: when it was journaled (time.time() of this node); None: unknown, so long ago
    journaled_at: float | None = None
    #: put_file of a version written here: the staging file of that version
    staging_id: int | None = None


class Journal:
    """One SQLite database; thread-safe through a lock, meant to be used from one thread."""

    @_journal_errors
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        for name in (path, path + "-wal", path + "-shm"):  # SQLite opens them by path
            private.check_file(name, "the journal file", private.INSIDE_FIX)
        damage = wal_damage(path)
        if damage is not None:
            stamp = _damaged_suffix()  # SQLite is about to drop what follows: keep a copy
            copy = private.open_file(path + "-wal" + stamp, os.O_WRONLY | os.O_CREAT
                                     | os.O_EXCL, "the copy of the journal", private.INSIDE_FIX)
            with open(path + "-wal", "rb") as src, open(copy, "wb") as dst:
                dst.write(src.read())
            damage += f"; the log is kept as {path}-wal{stamp}"
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as e:
            if getattr(e, "sqlite_errorcode", 0) & 0xFF not in _DAMAGED_CODES:
                raise
            stamp = _damaged_suffix()
            damage = f"SQLite cannot read it ({e}); it is kept as {_set_aside(path, stamp)}"
            for extra in ("-wal", "-shm"):
                if os.path.exists(path + extra):
                    _set_aside(path + extra, stamp)
            self._db = self._open()
        if damage is not None:
            log.error("the journal %s lost committed state: %s; what this node published "
                      "is checked against the store before the mount says durable",
                      path, damage)
            if self._meta("damaged") is None:  # the first reason stands until the check
                self.set_meta("damaged", damage)
        self._lost = _lost(self._db)  # read often (status), changed rarely

    def _open(self) -> sqlite3.Connection:
        """Connect and check the database; sqlite3.DatabaseError if it is damaged."""
        if not private.check_file(self.path, "the journal file", private.INSIDE_FIX):
            # made here, 0600 (SQLite gives its -wal and -shm the same mode)
            os.close(private.open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                       "the journal file", private.INSIDE_FIX))
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            problems = [str(r[0]) for r in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                e = sqlite3.DatabaseError(f"quick_check: {'; '.join(problems[:3])}")
                e.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
                raise e
            # one transaction, so one sync of the log, not one per table: a new cache's
            # journal is made while `ckptfs mount` waits
            db.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}COMMIT;")
            _migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @property
    def damage(self) -> str | None:
        """Why this journal may have lost committed state (module docstring), until
        the check against the store has run (checked()); None: it can be trusted."""
        with self._lock:
            return self._meta("damaged")

    @_journal_errors
    def checked(self) -> None:
        """The check after a damage is done: the journal is trusted again."""
        with self._lock:
            self._db.execute("DELETE FROM meta WHERE key = 'damaged'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction under the lock, rolled back if anything fails."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite already rolled back on SQLITE_FULL
                    cur.execute("ROLLBACK")
                raise

    # -- chunks -------------------------------------------------------------------
    @_journal_errors
    def add_chunks(self, chunks: list[PendingChunk], ops: Iterable[OpRecord] = (),
                   path: str | None = None) -> list[int]:
        """Record chunks to upload (needed by the file at `path`) and ops to apply, in one
        transaction; returns the ops' sequence numbers. Each op is stamped with the
        current time (see Op.journaled_at)."""
        now = time.time()
        with self._transaction() as cur:
            cur.executemany(
                "INSERT OR IGNORE INTO chunks(hash, staging_id, offset, length) "
                "VALUES (?, ?, ?, ?)",
                [(c.hash, c.staging_id, c.offset, c.length) for c in chunks])
            if path is not None:
                rows = [(c.hash, path) for c in chunks]
                cur.executemany("INSERT OR IGNORE INTO chunk_paths(hash, path) VALUES (?, ?)",
                                rows)
                cur.executemany("DELETE FROM lost WHERE hash = ? AND path = ?", rows)
            seqs = []
            for op in ops:
                kind, op_path, path2, body = op[:4]
                staging_id = op[4] if len(op) == 5 else None
                cur.execute("INSERT INTO ops(kind, path, path2, body, journaled_at, staging_id) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            (kind, op_path, path2, body, now, staging_id))
                seqs.append(int(cur.lastrowid or 0))
                _follow_op(cur, kind, op_path, path2, body)
        if self._lost:
            with self._lock:
                self._lost = _lost(self._db)
        return seqs

    @_journal_errors
    def add_op(self, kind: str, path: str, path2: str | None = None,
               body: bytes | None = None, staging_id: int | None = None) -> int:
        """Record one metadata op; returns its sequence number."""
        return self.add_chunks([], [(kind, path, path2, body, staging_id)])[0]

    @_journal_errors
    def remove_chunk(self, chunk_hash: str) -> None:
        """The chunk is in the store."""
        with self._transaction() as cur:
            cur.execute("DELETE FROM chunks WHERE hash = ?", (chunk_hash,))
            cur.execute("DELETE FROM chunk_paths WHERE hash = ?", (chunk_hash,))

    @_journal_errors
    def mark_lost(self, chunk_hash: str, reason: str) -> list[str]:
        """The chunk can never be uploaded: record the files that needed it as lost and
        stop tracking the chunk. Returns those files' paths."""
        with self._transaction() as cur:
            cur.execute("INSERT OR REPLACE INTO lost(path, hash, reason) "
                        "SELECT path, hash, ? FROM chunk_paths WHERE hash = ?",
                        (reason, chunk_hash))
            cur.execute("DELETE FROM chunks WHERE hash = ?", (chunk_hash,))
            cur.execute("DELETE FROM chunk_paths WHERE hash = ?", (chunk_hash,))
        with self._lock:
            self._lost = _lost(self._db)
        return [f.path for f in self._lost if f.hash == chunk_hash]

    @_journal_errors
    def mark_lost_file(self, seq: int, path: str, chunk_hash: str, reason: str) -> str | None:
        """A chunk of the manifest that op `seq` puts at `path` is in the store no more
        and cannot be put back: record the file as lost, under the name the ops journaled
        after `seq` give it (none if they delete it or rewrite it without the chunk).
        Returns that name, or None when nothing was recorded."""
        with self._transaction() as cur:
            later = cur.execute("SELECT kind, path, path2, body FROM ops WHERE seq > ? "
                                "ORDER BY seq", (seq,)).fetchall()
            now = followed(path, chunk_hash, later)
            if now is not None:
                cur.execute("INSERT OR REPLACE INTO lost(path, hash, reason) VALUES (?, ?, ?)",
                            (now, chunk_hash, reason))
        with self._lock:
            self._lost = _lost(self._db)
        return now

    @_journal_errors
    def found_lost(self, chunk_hash: str) -> None:
        """A chunk recorded as lost is in the store after all (uploaded again, by a new
        version with the same bytes): no file lacks it any more."""
        with self._transaction() as cur:
            cur.execute("DELETE FROM lost WHERE hash = ?", (chunk_hash,))
        with self._lock:
            self._lost = _lost(self._db)

    def lost_files(self) -> list[LostFile]:
        """Files that lost data (see the module docstring); no database read."""
        return self._lost

    @_journal_errors
    def pending_chunks(self) -> list[PendingChunk]:
        with self._lock:
            rows = self._db.execute(
                "SELECT hash, staging_id, offset, length FROM chunks ORDER BY staging_id, offset"
            ).fetchall()
        return [PendingChunk(*r) for r in rows]

    @_journal_errors
    def journaled_among(self, hashes: Iterable[str]) -> set[str]:
        """Those of `hashes` that are journaled for upload (not yet in the store)."""
        wanted = list(hashes)
        found: set[str] = set()
        with self._lock:
            for i in range(0, len(wanted), 500):
                part = wanted[i:i + 500]
                found.update(str(r[0]) for r in self._db.execute(
                    f"SELECT hash FROM chunks WHERE hash IN ({','.join('?' * len(part))})",
                    part))
        return found

    @_journal_errors
    def staging_in_use(self) -> set[int]:
        """The staging files the journal needs: those holding journaled chunks, and those
        of versions whose put_file op is not applied yet (LocalCache.scan keeps them)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT staging_id FROM chunks UNION "
                "SELECT staging_id FROM ops WHERE staging_id IS NOT NULL").fetchall()
        return {int(r[0]) for r in rows}

    # -- ops ----------------------------------------------------------------------
    @_journal_errors
    def remove_ops(self, seqs: list[int]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM ops WHERE seq = ?", [(s,) for s in seqs])

    @_journal_errors
    def pending_ops(self) -> list[Op]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, path, path2, body, journaled_at, staging_id FROM ops "
                "ORDER BY seq").fetchall()
        return [Op(*r) for r in rows]

    @_journal_errors
    def counts(self) -> tuple[int, int]:
        """(pending chunks, pending ops): both zero means everything is in the store."""
        with self._lock:
            return _counts(self._db)

    # -- meta ---------------------------------------------------------------------
    @_journal_errors
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            return self._meta(key)

    @_journal_errors
    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                             (key, value))
