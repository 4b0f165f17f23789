"""The text of `ckptfs status`: the state line while a damaged journal is checked, and what
it says of a fast tier."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ckptfs.cli.status import format_status, state_line, watch_line, watch_view

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


def fast_status(**fields: Any) -> dict[str, Any]:
    """A mount with a fast tier, as the daemon answers: one file being written, one
    moving from the fast tier to the store."""
    st: dict[str, Any] = dict(
        store="s3://b/run", mountpoint="/mnt", pid=1, cache_dir="/c", dirty_bytes=0,
        uploading_bytes=0, pending_chunks=0, pending_ops=0, uploaded_bytes=0, stored_bytes=0,
        dedup_bytes=0, upload_rate=0, eta_seconds=None, compression_ratio=None,
        dedup_ratio=None, logical_bytes=0, cache_bytes=0, cache_limit=1, fetched_bytes=0,
        open_files=1, errors=[], durable=False, fast_durable=False,
        fast_tier="file:///lustre/run", fast_pending_records=3, fast_pending_bytes=3 * 2**20,
        fast_moved_records=7, fast_moved_bytes=2**30, fast_last_error=None,
        files=[{"path": "step-2/a.pt", "state": "open", "size": 10, "left_bytes": 10,
                "fast_durable": False, "durable": False},
               {"path": "step-1/b.pt", "state": "moving", "size": 20, "left_bytes": 20,
                "fast_durable": True, "durable": False}])
    st.update(fields)
    return st


def test_status_says_what_the_fast_tier_still_holds_back() -> None:
    lines = format_status(fast_status()).splitlines()
    assert lines[-3].startswith("state        not durable:")
    assert lines[-2] == "fast tier    file:///lustre/run usable"
    assert lines[-1] == ("moving       3 pending records (3.0 MiB of files) from the fast "
                         "tier to the store   moved 7 (1.0 GiB)")
    assert "\nmoving" not in format_status(fast_status(fast_tier=None))
    assert watch_line(fast_status()).split("   fast tier pending 3 (3.0 MiB)")[1] == (
        "   step-2/a.pt 10 B left")


def test_the_watch_table_says_which_files_are_fast_durable() -> None:
    out = io.StringIO()
    Console(file=out, width=160).print(watch_view(fast_status(), {}))
    rows = {cells[0]: cells[1:3] for line in out.getvalue().splitlines() if "step-" in line
            for cells in [[c.strip() for c in line.split("│")[1:-1]]]}
    assert rows == {"step-2/a.pt": ["open", "no"], "step-1/b.pt": ["moving", "fast tier"]}
    out = io.StringIO()
    Console(file=out, width=160).print(watch_view(fast_status(fast_tier=None), {}))
    assert "durable" not in out.getvalue().split("files being saved")[1].splitlines()[1]
