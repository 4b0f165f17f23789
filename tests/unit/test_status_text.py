"""The state line of `ckptfs status`: what it says while a damaged journal is checked."""

from __future__ import annotations

from typing import Any

from ckptfs.cli.status import state_line

CHECK = ("the journal lost committed state (frame 0 of its write-ahead log is damaged): "
         "checking the files this node wrote against the store; not durable until that "
         "is done")


def status(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(durable=False, pending_chunks=0, pending_ops=0, open_files=0,
                                problems=[], journal_damage=None)
    base.update(fields)
    return base


def test_a_journal_being_checked_is_named_not_counted_as_a_file() -> None:
    st = status(problems=[CHECK], journal_damage="frame 0 of its write-ahead log is damaged")
    assert state_line(st) == ("not durable: the journal lost committed state: checking the "
                              "files written here against the store")
    st["problems"].append("DATA LOST: a.pt: chunk 00 is not in the store: x; rewrite or delete")
    assert state_line(st).endswith("against the store, 1 files could not be saved (see errors)")


def test_the_state_line_without_a_damaged_journal_is_unchanged() -> None:
    assert state_line(status(durable=True)) == "durable: everything written is in the store"
    assert state_line(status(pending_chunks=3)) == "not durable: uploading"
    assert state_line(status(problems=["x"])) == ("not durable: 1 files could not be saved "
                                                  "(see errors)")
