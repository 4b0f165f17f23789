"""A journal that lost committed state (a damaged write-ahead log, a database SQLite
refuses) between two mounts: never trusted, checked against the store, never durable
until then; what is still staged is uploaded again, the rest reported lost."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from corefs import CHUNK, ROOT, core, read_file, run, write_file
from support import journal_as_killed, random_bytes, restore_killed, wait_until_async

from ckptfs.format import codec
from ckptfs.format.manifests import chunk_key
from ckptfs.pipeline.recovery import JournalCheck
from ckptfs.store.local import LocalStore

FIRST_FRAME = 32 + 24 + 100  # a byte of the log's first page: every frame is dropped
DATA = random_bytes(4 * CHUNK, 18)
HASHES = [codec.chunk_hash(DATA[i:i + CHUNK]) for i in range(0, len(DATA), CHUNK)]


def killed_while_uploads_fail(root: Path) -> dict[str, bytes]:
    """The repro: a file closed and published while none of its chunks reached the store,
    then the daemon killed. Returns the journal's files as the kill left them."""
    saved: dict[str, bytes] = {}

    async def main() -> None:
        async with core(root, upload=False) as fs:
            await write_file(fs, "model.pt", DATA)
            await fs.publisher.wait_empty()  # the manifest is in the store
            assert fs.uploader.pending_count() == 4
            saved.update(journal_as_killed(str(root / "journal.sqlite")))

    run(main)
    store = LocalStore(root / "store")
    assert not any(store.head(chunk_key(h)) for h in HASHES)
    return saved


def fresh_node_reads(root: Path) -> bytes:
    """The file as another node, with a cache of its own, reads it from the store."""
    other = root / "node-b"
    other.mkdir()
    os.symlink(root / "store", other / "store")
    out: list[bytes] = []

    async def main() -> None:
        async with core(other) as fs:
            out.append(await read_file(fs, "model.pt"))

    run(main)
    return out[0]


def test_a_damaged_log_is_checked_and_the_file_uploaded_again_from_staging(
        tmp_path: Path) -> None:
    """SQLite drops every transaction after the damaged frame: without the check the
    remount said pending 0 and durable, deleted the staging file, and the file stayed
    without its chunks. Now: not durable until the check ran, which finds the manifest
    this node wrote, HEADs its chunks and uploads them again from the staging file."""
    journal = str(tmp_path / "journal.sqlite")
    restore_killed(journal, killed_while_uploads_fail(tmp_path), damage_wal_at=FIRST_FRAME)

    async def remount() -> None:
        async with core(tmp_path) as fs:
            st = fs.statistics()
            assert not st.durable and st.journal_damage, st
            assert st.problems[0].startswith("the journal lost committed state (frame 0 of "
                                             "its write-ahead log is damaged"), st
            assert st.pending_chunks == 0  # what SQLite kept: nothing
            await fs.wait_all_flushed()  # includes the check
            st = fs.statistics()
            assert st.durable and st.problems == [] and st.journal_damage is None, st
            assert fs.cache.unnamed == {}  # the staging file was claimed and removed
            assert fs.publisher.journal.damage is None

    run(remount)
    assert os.listdir(tmp_path / "cache" / "staging") == []
    assert not (tmp_path / "cache" / "unclaimed").exists()
    assert [n for n in os.listdir(tmp_path) if ".damaged-" in n] != []  # kept for the operator
    assert fresh_node_reads(tmp_path) == DATA


def test_a_damaged_log_with_the_staging_file_gone_reports_the_file_lost(
        tmp_path: Path) -> None:
    """Nothing left to upload from: the file is recorded as lost (status, log, umount),
    at every mount until it is rewritten; the check itself runs once."""
    journal = str(tmp_path / "journal.sqlite")
    restore_killed(journal, killed_while_uploads_fail(tmp_path), damage_wal_at=FIRST_FRAME)
    for name in os.listdir(tmp_path / "cache" / "staging"):
        os.unlink(tmp_path / "cache" / "staging" / name)

    async def remount() -> None:
        async with core(tmp_path) as fs:
            await fs.wait_all_flushed()
            st = fs.statistics()
            assert not st.durable and not fs.durable() and st.journal_damage is None, st
            assert sorted(st.problems) == sorted(
                f"DATA LOST: model.pt: chunk {h} is not in the store: the journal lost its "
                f"record before the chunk reached the store, and no copy is left (no "
                f"fossil, not in this node's staging files); rewrite or delete the file"
                for h in HASHES), st

    run(remount)

    async def again() -> None:
        async with core(tmp_path) as fs:
            assert fs.journal_check is None  # done once
            assert len(fs.statistics().problems) == 4 and not fs.durable()
            node = await fs.lookup(ROOT, "model.pt")  # rewritten: saved again
            fh, _ = await fs.open(node.inode, os.O_WRONLY | os.O_TRUNC)
            await fs.write(fh, 0, DATA)
            await fs.flush(fh)
            await fs.release(fh)
            await fs.wait_all_flushed()
            assert fs.durable() and fs.statistics().problems == []

    run(again)
    assert fresh_node_reads(tmp_path) == DATA


def test_a_journal_sqlite_refuses_is_set_aside_and_checked(tmp_path: Path) -> None:
    """A damaged database header ('file is not a database'): the journal is moved aside
    for the operator, a new one started, and the same check runs."""
    killed_while_uploads_fail(tmp_path)  # the core closed it: all in journal.sqlite
    journal = tmp_path / "journal.sqlite"
    with open(journal, "r+b") as f:
        f.write(b"\0" * 16)  # "SQLite format 3\0" gone

    async def remount() -> None:
        async with core(tmp_path) as fs:
            st = fs.statistics()
            assert not st.durable and "SQLite cannot read it" in (st.journal_damage or ""), st
            await fs.wait_all_flushed()
            assert fs.durable() and fs.statistics().problems == []

    run(remount)
    [aside] = [n for n in os.listdir(tmp_path) if n.startswith("journal.sqlite.damaged-")]
    assert open(tmp_path / aside, "rb").read(16) == b"\0" * 16
    assert fresh_node_reads(tmp_path) == DATA


def test_a_killed_journal_without_damage_is_trusted(tmp_path: Path) -> None:
    """No false alarm: the log of a killed process, intact, is replayed whole, no check
    runs, and the pending chunks are uploaded from the journal as before."""
    journal = str(tmp_path / "journal.sqlite")
    restore_killed(journal, killed_while_uploads_fail(tmp_path))

    async def remount() -> None:
        async with core(tmp_path) as fs:
            assert fs.journal_check is None and fs.uploader.pending_count() == 4
            await fs.wait_all_flushed()
            assert fs.durable()

    run(remount)
    assert fresh_node_reads(tmp_path) == DATA


def test_staging_files_nothing_names_are_kept_for_the_operator(tmp_path: Path) -> None:
    """A file open (never closed) at the crash has a staging file that no manifest
    names: after the check it is moved to unclaimed/, not deleted."""
    journal = str(tmp_path / "journal.sqlite")
    saved = killed_while_uploads_fail(tmp_path)
    stray = tmp_path / "cache" / "staging" / "999"
    stray.write_bytes(b"half a file")
    restore_killed(journal, saved, damage_wal_at=FIRST_FRAME)

    async def remount() -> None:
        async with core(tmp_path) as fs:
            await fs.wait_all_flushed()
            assert fs.durable()

    run(remount)
    assert (tmp_path / "cache" / "unclaimed" / "999").read_bytes() == b"half a file"
    assert os.listdir(tmp_path / "cache" / "staging") == []


def test_a_file_closed_during_the_check_is_not_reported_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mount serves while the check runs: a file closed meanwhile (its chunks still
    on their way to the store, and in no staging file the check knew of) is this
    mount's own journal's business, never recorded as lost by the check."""
    journal = str(tmp_path / "journal.sqlite")
    restore_killed(journal, killed_while_uploads_fail(tmp_path), damage_wal_at=FIRST_FRAME)
    gate = threading.Event()
    check = JournalCheck._check_sync

    def held(self: JournalCheck, *args: Any) -> Any:
        assert gate.wait(30)
        return check(self, *args)

    monkeypatch.setattr(JournalCheck, "_check_sync", held)
    newer = random_bytes(2 * CHUNK, 19)

    async def remount() -> None:
        async with core(tmp_path, upload=False) as fs:
            await write_file(fs, "newer.pt", newer)  # journaled by this mount, not uploaded
            await fs.publisher.wait_empty()
            gate.set()
            assert fs.journal_check is not None
            await wait_until_async(lambda: fs.checked())
            st = fs.statistics()
            assert st.problems == [] and st.pending_chunks == 2, st

    run(remount)
