"""Helpers every tier shares: the one way to wait for a condition (a sync and a trio
version), the one generator of test bytes, how many calls overlapped in time, and a
journal's files as a killed process leaves them."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable

import trio


def wait_until(check: Callable[[], object], timeout: float = 30.0, what: str = "",
               *, interval: float = 0.05,
               ignore: tuple[type[BaseException], ...] = ()) -> None:
    """Poll `check` until it returns a true value. After `timeout` seconds, fail the test
    (AssertionError naming `what`). Exceptions of the types in `ignore` count as false:
    e.g. OSError while another node's view of the store catches up.

    Timeouts are upper bounds, not expectations: make them wide (a loaded 2-core machine
    runs every test far slower than an idle one); a passing test never waits them out.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            if check():
                return
        except ignore as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:g}s: {what or check}"
                                 + (f" (last error: {last!r})" if last else ""))
        time.sleep(interval)


async def wait_until_async(check: Callable[[], object], timeout: float = 30.0,
                           what: str = "", *, interval: float = 0.005) -> None:
    """wait_until for trio tests: polls with trio.sleep, so other tasks run meanwhile."""
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(interval)
        return
    raise AssertionError(f"not reached in {timeout:g}s: {what or check}")


def random_bytes(size: int, seed: int | None = None) -> bytes:
    """`size` incompressible bytes: the same for the same seed; without a seed, new ones
    at every call (two calls never share a chunk, so nothing is deduplicated)."""
    return random.Random(seed).randbytes(size)


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most of the (start, end) intervals that were in progress at one moment: how
    many requests really ran in parallel (measured, not inferred from a wall-clock)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start (+1)
        now += step
        most = max(most, now)
    return most


JOURNAL_FILES = ("", "-wal")  # suffixes of a journal's database and write-ahead log


def journal_as_killed(path: str) -> dict[str, bytes]:
    """The files of the open journal at `path` as a process killed now would leave them
    (the database and its write-ahead log, not yet checkpointed): give them to
    restore_killed after the journal is closed (a clean close checkpoints the log)."""
    return {sfx: open(path + sfx, "rb").read() for sfx in JOURNAL_FILES}


def restore_killed(path: str, files: dict[str, bytes], damage_wal_at: int | None = None,
                   ) -> None:
    """Put back the files journal_as_killed saved, with 8 bytes of the log overwritten at
    `damage_wal_at` (bit rot, or a disk that lied about a flush) if given."""
    for sfx in (*JOURNAL_FILES, "-shm"):
        if os.path.exists(path + sfx):
            os.unlink(path + sfx)
    for sfx, data in files.items():
        content = bytearray(data)
        if sfx == "-wal" and damage_wal_at is not None:
            content[damage_wal_at:damage_wal_at + 8] = bytes(
                b ^ 0x5A for b in content[damage_wal_at:damage_wal_at + 8])
        with open(path + sfx, "wb") as f:
            f.write(content)
