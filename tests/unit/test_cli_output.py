"""The CLI's output helpers when nothing is a terminal: the plain text logs and pipes get."""

from __future__ import annotations

import io
import time

import pytest

from ckptfs.cli.output import Column, ProgressDisplay, plain_progress, table_lines


def test_a_progress_line_in_a_log_is_the_plain_bar() -> None:
    assert plain_progress("sync", "1.0 MiB/2.0 MiB", 0.5) == (
        f"sync [{'#' * 15}{' ' * 15}]  50.0% 1.0 MiB/2.0 MiB")
    assert plain_progress("gc references:", "3 manifests read") == (
        "gc references: 3 manifests read")


def test_progress_off_a_terminal_is_a_line_every_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    log = io.StringIO()
    display = ProgressDisplay(log, interval=5.0)
    display.show("sync", "a", 0.0)  # the first line at once
    now[0] += 5.0
    display.show("sync", "b", 0.5)  # not yet: more than 5 s must have passed
    now[0] += 0.1
    display.show("sync", "c", 1.0)
    display.close()
    assert log.getvalue() == (f"{plain_progress('sync', 'a', 0.0)}\n"
                              f"{plain_progress('sync', 'c', 1.0)}\n")

    quiet = io.StringIO()
    with ProgressDisplay(quiet, quiet_start=True) as display:  # a short run prints none
        now[0] += 4.0
        display.show("gc mark ", "1 chunks", 0.1)
    assert quiet.getvalue() == ""


def test_a_table_off_a_terminal_keeps_its_columns() -> None:
    columns = (Column("name"), Column("files", right=True, width=7),
               Column("size", right=True), Column("path"))
    rows = [["a", "1", "2.0 KiB", "run7/a"], ["longer", "12345678", "0 B", "b"]]
    assert table_lines(columns, rows) == [
        "name      files     size  path",
        "a             1  2.0 KiB  run7/a",
        "longer  12345678      0 B  b",  # a fixed width overflows, as printf's does
    ]
