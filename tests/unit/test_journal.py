"""journal: the SQLite journal of pending chunks and metadata ops."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time

import pytest
from support import journal_as_killed, restore_killed

from ckptfs.common.errors import JournalError
from ckptfs.format.chunking import MIN_CHUNK_SIZE
from ckptfs.pipeline.journal import Journal, PendingChunk, read_damage, read_lost, wal_damage

CS = MIN_CHUNK_SIZE  # the smallest legal chunk size keeps the arithmetic readable
H1 = "0" * 32
H2 = "0123456789abcdef" * 2


def test_journal_survives_reopen(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "journal.sqlite")
    j = Journal(path)
    assert j.counts() == (0, 0)
    c1, c2 = PendingChunk(H1, 2, 0, 100), PendingChunk(H2, 1, CS, 5)
    seqs = j.add_chunks([c1, c2], [("put_file", "a", None, b"{}"),
                                   ("rename_file", "a", "b", None)])
    assert len(seqs) == 2 and seqs[0] < seqs[1]
    seq3 = j.add_op("delete_file", "b")
    assert seq3 > seqs[1]
    j.add_chunks([PendingChunk(H1, 9, 9, 9)])  # same hash: the first location is kept
    j.set_meta("writer", "node-7")
    assert j.counts() == (2, 3)
    j.close()

    j = Journal(path)
    assert j.counts() == (2, 3)
    assert sorted(j.pending_chunks(), key=lambda c: c.hash) == [c1, c2]
    assert j.pending_chunks() == [c2, c1]  # ordered by staging file, then offset
    ops = j.pending_ops()
    assert [o.seq for o in ops] == [*seqs, seq3]
    assert [(o.kind, o.path, o.path2, o.body) for o in ops] == [
        ("put_file", "a", None, b"{}"), ("rename_file", "a", "b", None),
        ("delete_file", "b", None, None)]
    assert j.get_meta("writer") == "node-7" and j.get_meta("other") is None
    j.close()


def test_journal_ops_in_seq_order_and_remove(tmp_path: os.PathLike[str]) -> None:
    j = Journal(os.path.join(tmp_path, "j.sqlite"))
    seqs = [j.add_op("put_dir", f"d{i}", body=b"x") for i in range(20)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 20
    j.remove_ops(seqs[5:10])
    j.remove_ops([seqs[0], 10_000])  # an unknown seq is ignored
    assert [o.path for o in j.pending_ops()] == [f"d{i}" for i in (1, 2, 3, 4, *range(10, 20))]
    newer = j.add_op("put_dir", "last")
    assert newer > seqs[-1]  # seqs are never reused
    assert j.pending_ops()[-1].path == "last"
    j.add_chunks([PendingChunk(H1, 1, 0, 1), PendingChunk(H2, 1, 1, 1)])
    j.remove_chunk(H1)
    j.remove_chunk("f" * 32)  # absent: no error
    assert [c.hash for c in j.pending_chunks()] == [H2]
    assert j.counts() == (1, 15)
    j.close()


def test_journal_names_the_files_that_lost_a_chunk(tmp_path: os.PathLike[str]) -> None:
    """A lost chunk is reported by the path of every file that needs it, followed through
    renames (of the file and of its directory, not of a sibling with a longer name), and
    forgotten when the file is deleted or rewritten without it; not on chmod."""
    path = os.path.join(tmp_path, "j.sqlite")
    j = Journal(path)
    body = json.dumps({"chunks": [[H1, 1], [H2, 1]]}).encode()
    chunks = [PendingChunk(H1, 1, 0, 1), PendingChunk(H2, 1, 1, 1)]
    j.add_chunks(chunks, [("put_file", "ckpt/a.pt", None, body)], "ckpt/a.pt")
    j.add_chunks(chunks[:1], [("put_file", "ckpt2/b.pt", None, body)], "ckpt2/b.pt")
    j.add_op("rename_dir", "ckpt", "step-1")
    assert sorted(j.mark_lost(H1, "damaged")) == ["ckpt2/b.pt", "step-1/a.pt"]
    assert j.pending_chunks() == [chunks[1]]  # no longer tracked for upload
    j.add_op("put_file", "step-1/a.pt", body=body)  # chmod: same chunks, still lost
    j.add_op("rename_file", "step-1/a.pt", "step-1/final.pt")
    j.close()
    j = Journal(path)  # survives a restart
    assert [(f.path, f.hash, f.reason) for f in j.lost_files()] == [
        ("ckpt2/b.pt", H1, "damaged"), ("step-1/final.pt", H1, "damaged")]
    j.add_op("delete_file", "ckpt2/b.pt")
    j.add_chunks([PendingChunk(H2, 2, 0, 1)], [(
        "put_file", "step-1/final.pt", None, json.dumps({"chunks": [[H2, 1]]}).encode())],
        "step-1/final.pt")  # rewritten without the lost chunk
    assert j.lost_files() == []
    assert read_lost(path) == []
    j.close()


def test_journal_failed_transaction_rolls_back(tmp_path: os.PathLike[str]) -> None:
    j = Journal(os.path.join(tmp_path, "j.sqlite"))
    with pytest.raises(JournalError):
        # the second op has a NULL kind: the whole transaction, chunks included, is undone
        j.add_chunks([PendingChunk(H1, 1, 0, 1)], [("put_file", "a", None, None),
                                                   (None, "b", None, None)])  # type: ignore[list-item]
    assert j.counts() == (0, 0)
    j.add_op("put_file", "c")
    assert j.counts() == (0, 1)
    j.close()


def test_journal_file_mode(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "journal.sqlite")
    old = os.umask(0o022)
    try:
        j = Journal(path)
        j.add_op("put_file", "secret/name.pt", body=b"{}")
        # the WAL holds the same data as the database until a checkpoint
        for p in (path, path + "-wal", path + "-shm"):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
        j.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_journal_ops_record_when_and_which_staging_file(tmp_path: os.PathLike[str]) -> None:
    """Each op gets the time it was journaled; a put_file of a version written here, its
    staging file, which staging_in_use() names (with those of journaled chunks) until the
    op is applied."""
    path = os.path.join(tmp_path, "j.sqlite")
    j = Journal(path)
    before = time.time()
    [put] = j.add_chunks([PendingChunk(H1, 3, 0, 1)], [("put_file", "a", None, b"{}", 7)], "a")
    mkdir = j.add_op("put_dir", "d")
    after = time.time()
    j.close()
    j = Journal(path)
    ops = {o.seq: o for o in j.pending_ops()}
    assert ops[put].staging_id == 7 and ops[mkdir].staging_id is None
    assert all(before <= (o.journaled_at or 0) <= after for o in ops.values())
    assert j.staging_in_use() == {3, 7}
    assert j.journaled_among([H1, H2]) == {H1}
    j.remove_chunk(H1)
    assert j.staging_in_use() == {7}
    j.remove_ops([put])
    assert j.staging_in_use() == set() and j.journaled_among([H1]) == set()
    j.close()


def test_journal_from_an_older_ckptfs_gets_the_new_columns(tmp_path: os.PathLike[str]) -> None:
    """A journal written before ops had journaled_at and staging_id: opened, it gains
    them; its old rows read as NULL (an unknown time, so old; no staging file)."""
    path = os.path.join(tmp_path, "j.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE chunks (hash TEXT PRIMARY KEY, staging_id INTEGER NOT NULL,
                             offset INTEGER NOT NULL, length INTEGER NOT NULL);
        CREATE TABLE ops (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
                          path TEXT NOT NULL, path2 TEXT, body BLOB);
        INSERT INTO ops(kind, path, body) VALUES ('put_file', 'old.pt', x'7b7d');
    """)
    db.commit()
    db.close()
    j = Journal(path)
    [old] = j.pending_ops()
    assert (old.kind, old.path, old.body, old.journaled_at, old.staging_id) == (
        "put_file", "old.pt", b"{}", None, None)
    new = j.add_op("put_file", "new.pt", body=b"{}", staging_id=4)
    assert j.pending_ops()[1].seq == new and j.pending_ops()[1].staging_id == 4
    assert j.staging_in_use() == {4}
    j.close()
    Journal(path).close()  # a second open finds the columns there


def test_journal_lost_file_of_an_old_manifest_follows_later_ops(
        tmp_path: os.PathLike[str]) -> None:
    """mark_lost_file records the file under the name the ops journaled after its
    put_file give it; nothing when they delete it or rewrite it without the chunk."""
    j = Journal(os.path.join(tmp_path, "j.sqlite"))
    body = json.dumps({"chunks": [[H1, 1], [H2, 1]]}).encode()
    a = j.add_op("put_file", "ckpt/a.pt", body=body)
    b = j.add_op("put_file", "ckpt/b.pt", body=body)
    c = j.add_op("put_file", "ckpt/c.pt", body=body)
    j.add_op("rename_file", "ckpt/a.pt", "ckpt/final.pt")
    j.add_op("rename_dir", "ckpt", "step-1")
    j.add_op("delete_file", "step-1/b.pt")
    j.add_op("put_file", "step-1/c.pt", body=json.dumps({"chunks": [[H2, 1]]}).encode())
    assert j.mark_lost_file(a, "ckpt/a.pt", H1, "gone") == "step-1/final.pt"
    assert j.mark_lost_file(b, "ckpt/b.pt", H1, "gone") is None
    assert j.mark_lost_file(c, "ckpt/c.pt", H1, "gone") is None
    assert j.mark_lost_file(c, "ckpt/c.pt", H2, "gone") == "step-1/c.pt"
    assert [(f.path, f.hash) for f in j.lost_files()] == [
        ("step-1/c.pt", H2), ("step-1/final.pt", H1)]
    j.add_op("rename_file", "step-1/final.pt", "kept.pt")  # later ops move the row as usual
    assert [f.path for f in j.lost_files()] == ["kept.pt", "step-1/c.pt"]
    j.close()


# ------------------------------------------------------------------- a damaged journal
FIRST_FRAME = 32 + 24 + 100  # a byte of the first page in the write-ahead log


def journal_with_commits(path: str, n: int) -> Journal:
    j = Journal(path)
    for i in range(n):
        j.add_chunks([PendingChunk(f"{i:032x}", i, 0, 10)],
                     [("put_file", f"f{i}", None, b"{}", i)], f"f{i}")
    return j


def test_a_damaged_log_is_found_before_sqlite_drops_what_follows(
        tmp_path: os.PathLike[str]) -> None:
    """SQLite silently replays a damaged log only up to the damage; the journal says so,
    keeps a copy of the log and records the damage until checked() (also read-only)."""
    path = os.path.join(tmp_path, "journal.sqlite")
    j = journal_with_commits(path, 20)
    killed = journal_as_killed(path)
    j.close()
    for at, kept in ((FIRST_FRAME, 0), (len(killed["-wal"]) // 2, None)):
        restore_killed(path, killed, damage_wal_at=at)
        assert wal_damage(path) is not None
        j = Journal(path)
        chunks, ops = j.counts()
        assert chunks == ops < 20 and (kept is None or chunks == kept)  # dropped silently
        assert j.damage is not None and "write-ahead log is damaged" in j.damage
        copies = [n for n in os.listdir(tmp_path) if n.startswith("journal.sqlite-wal.damaged-")]
        assert len(copies) == 1 and open(os.path.join(tmp_path, copies[0]), "rb").read(
            ) != killed["-wal"]  # the damaged log, as found
        os.unlink(os.path.join(tmp_path, copies[0]))
        j.close()
        assert read_damage(path) is not None
        j = Journal(path)
        j.checked()
        assert j.damage is None
        j.close()
        assert read_damage(path) is None


def test_an_intact_or_stale_log_is_no_damage(tmp_path: os.PathLike[str]) -> None:
    """A killed process's intact log, and frames of an older log generation left past the
    end after a checkpoint restarted the log (even damaged), are replayed as SQLite does:
    no false alarm."""
    path = os.path.join(tmp_path, "journal.sqlite")
    j = journal_with_commits(path, 20)
    assert wal_damage(path) is None
    checkpoint = sqlite3.connect(path)
    assert checkpoint.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0] == 0
    checkpoint.close()
    j.add_op("delete_file", "f0")  # the log restarts at its start, shorter than before
    killed = journal_as_killed(path)
    j.close()
    restore_killed(path, killed)
    assert wal_damage(path) is None
    restore_killed(path, killed, damage_wal_at=len(killed["-wal"]) - 1000)  # a stale frame
    assert wal_damage(path) is None
    j = Journal(path)
    assert j.damage is None and j.counts() == (20, 21)
    j.close()
    restore_killed(path, killed, damage_wal_at=FIRST_FRAME)  # the current generation
    assert wal_damage(path) is not None


def test_a_journal_sqlite_refuses_is_moved_aside(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "journal.sqlite")
    journal_with_commits(path, 3).close()
    with open(path, "r+b") as f:
        f.write(b"\0" * 16)
    j = Journal(path)
    assert j.counts() == (0, 0) and "SQLite cannot read it (file is not a database)" in (
        j.damage or "")
    [aside] = [n for n in os.listdir(tmp_path) if n.startswith("journal.sqlite.damaged-")]
    assert str(aside) in (j.damage or "")
    j.close()
