"""What the commands print: sizes, times, tables and progress (drawn by rich on a terminal)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ckptfs.format.manifests import StoreInfo
    from ckptfs.tools.gc import Tally

# rich is imported where a terminal draws with it, not at the top: rich.progress costs
# ~40 ms (python -X importtime), and `ckptfs status --help` takes 70 ms in all without it;
# no command writing to a pipe or a file needs it


def human(n: float | None) -> str:
    """A byte count as people read it: '512 B', '1.5 MiB'; '-' for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def utc(seconds: float) -> str:
    """A time as '2024-05-01 12:00:00 UTC' (store times: the store's clock, not ours)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def tally(t: Tally) -> str:
    """A count of objects and their bytes: '12 (3.0 MiB)'."""
    return f"{t.count} ({human(t.bytes)})"


def first_few(items: Sequence[str], limit: int = 3) -> str:
    """The first `limit` items, comma-separated, and how many more there are."""
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def describe_format(info: StoreInfo) -> str:
    """One store format in a few words: 'format 1: fixed 16.0 MiB chunks, lz4' (and, a
    directory store that records the mode of its files, ', files 0600')."""
    if info.chunking == "records":
        cut = (f"chunks cut at tensor boundaries (records of {human(info.min_record)} or "
               f"more get their own, none over {human(info.chunk_size)})")
    else:
        cut = f"fixed {human(info.chunk_size)} chunks"
    files = "" if info.store_mode is None else f", files {info.store_mode:04o}"
    return f"format {info.format}: {cut}, {info.codec}{files}"


# ---------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Column:
    """A column of a table: its heading, whether it is right-aligned, and its width in
    plain text (None: as wide as its widest cell; a longer cell overflows, as printf's)."""

    heading: str
    right: bool = False
    width: int | None = None


def table_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """The table as plain text: the headings, then a line per row, columns two spaces
    apart; a left-aligned last column is not padded."""
    lines = []
    every = [[c.heading for c in columns], *rows]
    widths = [c.width if c.width is not None else max(len(r[i]) for r in every)
              for i, c in enumerate(columns)]
    for row in every:
        cells = []
        for i, (c, cell) in enumerate(zip(columns, row, strict=True)):
            if c.right:
                cells.append(f"{cell:>{widths[i]}}")
            else:
                cells.append(cell if i == len(columns) - 1 else f"{cell:<{widths[i]}}")
        lines.append("  ".join(cells))
    return lines


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[str]],
                file: TextIO | None = None) -> None:
    """Print the table: drawn by rich on a terminal, else as table_lines()."""
    out = file or sys.stdout
    if not out.isatty():
        for line in table_lines(columns, rows):
            print(line, file=out)
        return
    from rich import box  # on a terminal only (see the top of this module)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in columns:
        # a table wider than the terminal wraps its cells, never cuts them: a path stays
        # whole, to copy
        table.add_column(c.heading, justify="right" if c.right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: a '[' in a name is no markup
    Console(file=out, highlight=False).print(table)


# ---------------------------------------------------------------------------- progress
def plain_bar(fraction: float, width: int = 30) -> str:
    """A bar in plain text: '[#########                     ]  30.0%'."""
    return f"[{'#' * int(fraction * width):<{width}}] {fraction * 100:5.1f}%"


def plain_progress(label: str, detail: str, fraction: float | None = None) -> str:
    """A progress line as plain text: the label, a bar when the fraction is known, the
    detail."""
    return " ".join([label, *([plain_bar(fraction)] if fraction is not None else []), detail])


class ProgressDisplay:
    """Progress of a command on `stream` (stderr by default). On a terminal, rich draws a
    row per label (a bar when the fraction done is known, else a pulse), redrawn in place.
    Otherwise a plain line (plain_progress) at most every `interval` seconds: the first at
    once, or, with `quiet_start`, only once `interval` has passed (a short run prints
    none). A context manager; close() leaves the last rows drawn."""

    def __init__(self, stream: TextIO | None = None, interval: float = 5.0,
                 quiet_start: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval
        self.last_line = time.monotonic() if quiet_start else -math.inf
        self._rich: Any = None  # rich.progress.Progress, started by the first show()
        self._row: tuple[str, bool] | None = None  # the label of the row drawn, and bar?
        self._task: Any = None

    def show(self, label: str, detail: str, fraction: float | None = None) -> None:
        """The state now: a label ('sync'), how far (0.0 to 1.0, None: unknown), detail."""
        if self.tty:
            self._draw(label, detail, fraction)
            return
        now = time.monotonic()
        if now - self.last_line > self.interval:
            self.stream.write(plain_progress(label, detail, fraction) + "\n")
            self.stream.flush()
            self.last_line = now

    def _draw(self, label: str, detail: str, fraction: float | None) -> None:
        if self._rich is None:
            from rich.console import Console  # on a terminal only (the top of the module)
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
            from rich.table import Column as RichColumn

            self._rich = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(bar_width=30), TaskProgressColumn(),
                TextColumn("{task.fields[detail]}", markup=False,
                           table_column=RichColumn(no_wrap=True, overflow="ellipsis")),
                console=Console(file=self.stream), refresh_per_second=10)
        row = (label, fraction is not None)
        if row == self._row:
            self._rich.update(self._task, completed=fraction or 0.0, detail=detail)
            return
        if self._task is not None:  # a new step: a row of its own; the last stays as it was
            self._rich.stop_task(self._task)
        self._task = self._rich.add_task(label, total=None if fraction is None else 1.0,
                                         completed=fraction or 0.0, detail=detail)
        if self._row is None:
            self._rich.start()  # once the first row is there: nothing empty is drawn
        self._row = row

    def close(self) -> None:
        """Stop redrawing: the rows stay as last drawn, and the terminal gets its cursor
        back."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
