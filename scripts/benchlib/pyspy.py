"""py-spy attached to a daemon for one phase: a flame graph, and the seconds it held the GIL."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

#: samples per second: a phase of about a second gets a few hundred
RATE = 250
#: what py-spy prints once it samples (then a phase may start)
SAMPLING = "Sampling process"


def py_spy() -> str | None:
    """The py-spy executable: next to this Python (the venv's, from `pip install -e
    '.[bench]'`), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def samples(recorded: str) -> int:
    """The samples in what py-spy wrote: an SVG flame graph (its `total_samples`), or
    collapsed stacks (`--format raw`: `frame;frame;... COUNT` per line)."""
    if recorded.lstrip().startswith("<"):
        found = re.search(r'total_samples="(\d+)"', recorded)
        return int(found.group(1)) if found else 0
    return sum(int(line.rpartition(" ")[2]) for line in recorded.splitlines()
               if line.strip())


class Recording:
    """One py-spy process recording one phase of a daemon: `start` returns once py-spy
    samples, `stop` ends it and returns the seconds of the phase that a thread of the
    daemon held the GIL (samples / RATE) if `gil`, else None.

    `out`: an SVG flame graph if it ends in .svg, else collapsed stacks (a flame graph's
    input). With `gil`, py-spy keeps only the stack of the thread holding the GIL
    (`--gil`; idle threads are never kept), so every sample is one that some thread held
    it. py-spy runs with --nonblocking: it reads the daemon's memory without pausing it,
    on a core of its own if the machine has one to spare."""

    def __init__(self, executable: str, out: Path, gil: bool) -> None:
        self.executable, self.out, self.gil = executable, out, gil
        self._proc: subprocess.Popen[str] | None = None

    def start(self, pid: int) -> None:
        fmt = "flamegraph" if self.out.suffix == ".svg" else "raw"
        self._proc = subprocess.Popen(
            [self.executable, "record", "--pid", str(pid), "--rate", str(RATE), "--threads",
             "--nonblocking", *(["--gil"] if self.gil else []), "--format", fmt,
             "-o", str(self.out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self._proc.stdout is not None
        said = []
        for line in self._proc.stdout:  # py-spy attaches in 0.1-0.5 s
            if SAMPLING in line:
                return
            said.append(line)
        self._proc.wait()
        self._proc = None
        raise SystemExit(f"py-spy did not attach to pid {pid}: {''.join(said).strip()}")

    def stop(self) -> float | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        proc.communicate(timeout=60)
        if not self.gil:
            return None
        return samples(self.out.read_text(errors="replace")) / RATE
