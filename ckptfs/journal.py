"""The SQLite journal in the cache directory: what is not yet durable in the store.

Two tables, written before an operation is acknowledged and cleared when the store has it:

- ``chunks``: chunks of published files still to upload, and where their bytes are
  (a staging file and an offset);
- ``ops``: metadata operations (manifest puts, deletes, renames) still to apply to the
  store, applied strictly in ``seq`` order.

All methods block; the filesystem calls them through one thread (a limiter of size 1),
so a single connection is used. WAL mode with synchronous=FULL: a commit survives a
crash of the process and of the machine.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass

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
    body BLOB
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def _counts(db: sqlite3.Connection) -> tuple[int, int]:
    c = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    o = db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    return int(c), int(o)


def read_counts(path: str) -> tuple[int, int]:
    """Journal.counts() of a journal not in use (read-only: e.g. after the daemon exited)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _counts(db)
    finally:
        db.close()


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


class Journal:
    """One SQLite database; thread-safe through a lock, meant to be used from one thread."""

    def __init__(self, path: str) -> None:
        new = not os.path.exists(path)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if new:
            os.chmod(path, 0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- chunks -------------------------------------------------------------------
    def add_chunks(self, chunks: list[PendingChunk], ops: list[tuple[str, str, str | None,
                   bytes | None]] = ()) -> list[int]:  # type: ignore[assignment]
        """Record chunks to upload and ops to apply in one transaction; returns op seqs."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.executemany(
                    "INSERT OR IGNORE INTO chunks(hash, staging_id, offset, length) "
                    "VALUES (?, ?, ?, ?)",
                    [(c.hash, c.staging_id, c.offset, c.length) for c in chunks])
                seqs = []
                for kind, path, path2, body in ops:
                    cur.execute("INSERT INTO ops(kind, path, path2, body) VALUES (?, ?, ?, ?)",
                                (kind, path, path2, body))
                    seqs.append(int(cur.lastrowid or 0))
                cur.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite already rolled back on SQLITE_FULL
                    cur.execute("ROLLBACK")
                raise
            return seqs

    def add_op(self, kind: str, path: str, path2: str | None = None,
               body: bytes | None = None) -> int:
        """Record one metadata op; returns its sequence number."""
        return self.add_chunks([], [(kind, path, path2, body)])[0]

    def remove_chunk(self, chunk_hash: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM chunks WHERE hash = ?", (chunk_hash,))

    def pending_chunks(self) -> list[PendingChunk]:
        with self._lock:
            rows = self._db.execute(
                "SELECT hash, staging_id, offset, length FROM chunks ORDER BY staging_id, offset"
            ).fetchall()
        return [PendingChunk(*r) for r in rows]

    # -- ops ----------------------------------------------------------------------
    def remove_ops(self, seqs: list[int]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM ops WHERE seq = ?", [(s,) for s in seqs])

    def pending_ops(self) -> list[Op]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, kind, path, path2, body FROM ops ORDER BY seq").fetchall()
        return [Op(*r) for r in rows]

    def counts(self) -> tuple[int, int]:
        """(pending chunks, pending ops): both zero means everything is in the store."""
        with self._lock:
            return _counts(self._db)

    # -- meta ---------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                             (key, value))
