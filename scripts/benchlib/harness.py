"""The benchmark harness: the state dict, a settled machine, mounts, SeaweedFS, tables."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from benchlib import TESTS

if TYPE_CHECKING:
    from seaweed import SeaweedServer

SCRIPTS = TESTS.parent / "scripts"
CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
TRIVIALFS = [sys.executable, str(SCRIPTS / "trivialfs.py")]
GiB = 2**30
MiB = 2**20


# -- the checkpoint --------------------------------------------------------------------------

def parameters(gib: float) -> int:
    """The parameters of state_dict(gib): 4 tensors of 16 MiB each, at least one."""
    return max(1, round(gib * 1024 / 64))


def tensor_gib(gib: float) -> float:
    """The GiB of tensor data in state_dict(gib) (the file adds a few KiB)."""
    return parameters(gib) * 64 / 1024


def state_dict(gib: float) -> dict[str, object]:
    """An optimizer checkpoint of `gib` GiB in 16 MiB fp32 tensors, four per parameter:
    its weights, Adam's two moments (small values; the second one positive), and a
    frozen copy (a base model's weights, other random values)."""
    import torch  # here: a script's --help stays instant

    torch.manual_seed(0)
    n = parameters(gib)
    numel = 4 * 1024 * 1024
    weights = {f"layer{i}.weight": torch.randn(numel) for i in range(n)}
    return {
        "model": weights,
        "optimizer": {"state": {i: {"step": torch.tensor(1000.0),
                                    "exp_avg": torch.randn(numel) * 1e-3,
                                    "exp_avg_sq": torch.randn(numel).square() * 1e-6}
                                for i in range(n)},
                      "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999),
                                        "params": list(range(n))}]},
        "frozen": {f"base.layer{i}.weight": torch.randn(numel) for i in range(n)},
        "step": 1000,
    }


def save_into(root: Path, state: dict[str, object]) -> tuple[Path, float]:
    """mkdir root/step-1 and torch.save into it, as a training loop does: (the file, the
    seconds torch.save took)."""
    import torch

    (root / "step-1").mkdir()
    path = root / "step-1" / "ckpt.pt"
    t0 = time.perf_counter()
    torch.save(state, path)
    return path, time.perf_counter() - t0


# -- the machine -----------------------------------------------------------------------------

def drop_caches() -> None:
    """Write back and drop the page cache (as root; elsewhere only the write-back)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def settle() -> None:
    """The same starting state for every timed save: page cache dropped, then 2 s idle.
    On a VM that hands free memory back to its host, a page touched for the first time
    also costs a fault in the host, and how recently memory was freed changed one save's
    time by up to 4x; without this, the target that runs right after a cache drop wins."""
    drop_caches()
    time.sleep(2)


def du(path: Path) -> int:
    """The bytes of the regular files under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process `pid` has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    """The peak RSS (VmHWM) of process `pid`; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def tree_peak_rss(pid: int) -> int:
    """The peak RSS of `pid` and its descendants, added up (a supervisor and its worker)."""
    return peak_rss(pid) + sum(tree_peak_rss(c) for c in children(pid))


# -- mounts ------------------------------------------------------------------------------------

def run(*args: str, tree: str | None = None) -> str:
    """The ckptfs command line, from the source tree `tree` if given (A/B runs: `python
    -m` puts the working directory first on sys.path, so it runs there); a failure ends
    the benchmark with ckptfs's message."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    r = subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=env, cwd=tree)
    if r.returncode:
        raise SystemExit(f"ckptfs {' '.join(args[:2])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def status(mnt: Path, tree: str | None = None) -> dict[str, Any]:
    """`ckptfs status MNT --json`."""
    return cast(dict[str, Any], json.loads(run("status", str(mnt), "--json", tree=tree)))


def lazy_unmount(mnt: Path) -> None:
    """Detach `mnt` if it is a mount point (cleanup after a failure)."""
    if os.path.ismount(mnt):
        r = subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        if r.returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def start_trivial(mountpoint: Path, backing: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start scripts/trivialfs.py on `mountpoint` (its files in `backing`, made here) and
    return once it is mounted."""
    backing.mkdir()
    proc = subprocess.Popen([*TRIVIALFS, str(mountpoint), str(backing), *extra])
    deadline = time.monotonic() + 10
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("trivialfs did not mount")
        time.sleep(0.05)
    return proc


def stop_trivial(mountpoint: Path, proc: subprocess.Popen[bytes]) -> None:
    """Unmount a trivialfs started by start_trivial and wait for it to exit."""
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    proc.wait(10)


# -- servers and work directories ------------------------------------------------------------

@contextmanager
def seaweed(work: Path) -> Iterator[SeaweedServer]:
    """SeaweedFS S3 on 127.0.0.1 (tests/seaweed.py), its keys in the environment that
    ckptfs and boto3 read; stopped on the way out."""
    from seaweed import SeaweedServer

    server = SeaweedServer(work / "weed")
    os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                      AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION="us-east-1")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def workdir(prefix: str, where: str | None = None) -> Iterator[Path]:
    """A new directory under `where` (default /tmp); on the way out every mount point in
    it is detached and it is removed."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    try:
        yield work
    finally:
        for p in work.glob("*"):
            lazy_unmount(p)
        shutil.rmtree(work, ignore_errors=True)


# -- results -----------------------------------------------------------------------------------

def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the others right."""
    lines = [list(header), *map(list, rows)]
    widths = [max(len(line[i]) if i < len(line) else 0 for line in lines)
              for i in range(len(header))]
    return "\n".join(
        " ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(line, widths, strict=False))).rstrip()
        for line in lines)


def seconds(value: float) -> str:
    """A duration for a table: two decimals, '-' when not measured (NaN)."""
    return "-" if value != value else f"{value:.2f}"
