"""TEMPORARY stub: fixed cuts only (the real module is being written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Read = Callable[[int, int], bytes]


class Cutter(Protocol):
    def feed(self, read: Read, available: int) -> list[int]: ...


class FixedCutter:
    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.next = chunk_size

    def feed(self, read: Read, available: int) -> list[int]:
        cuts = []
        while self.next <= available:
            cuts.append(self.next)
            self.next += self.chunk_size
        return cuts


def new_cutter(chunk_size: int, min_record: int, aware: bool) -> Cutter:
    return FixedCutter(chunk_size)
