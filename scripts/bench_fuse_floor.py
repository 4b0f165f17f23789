"""The floor of a Python FUSE write path on this machine: `dd bs=1M` into the local disk,
into scripts/trivialfs.py (each write a pwrite into a local file), into the same with
--discard (the FUSE transport alone), and into ckptfs.

    .venv/bin/python scripts/bench_fuse_floor.py --mib 1024 --runs 3 [--no-settle]
        [--before TREE]   # also ckptfs from another source tree (an older commit)

Prints the seconds each takes (medians, interleaved). ckptfs cannot beat the trivial
file system; the gap between them is what ckptfs's own work costs. All open write-only
files with direct I/O, as ckptfs does; every dd starts with an empty file, and ckptfs's
uploads of one dd finish (`ckptfs sync`, not timed) before the next dd starts. Settled (the
default), each dd starts after the page cache is dropped (but for the source) and the
machine left idle for 2 s (see bench.py); with --no-settle, in whatever state the
previous one left, which on this VM is memory-speed for the local disk. Run as root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.harness import CKPTFS, median, start_trivial, stop_trivial


def dd(src: Path, dst: Path, settled: bool) -> float:
    if settled:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        src.read_bytes()  # the source in the page cache again, so dd measures the target
        time.sleep(2)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M"], check=True,
                   capture_output=True)
    return time.perf_counter() - t


def tree_env(tree: str | None) -> dict[str, str] | None:
    return None if tree is None else {**os.environ, "PYTHONPATH": tree}


def ckptfs(tree: str | None, *args: str) -> None:
    """The ckptfs command line, from source tree `tree` if given (`python -m` puts the
    working directory first on sys.path, so it runs there)."""
    subprocess.run([*CKPTFS, *args], check=True, capture_output=True, env=tree_env(tree),
                   cwd=tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-settle", action="store_true",
                    help="time each dd in whatever state the previous one left")
    ap.add_argument("--before", metavar="TREE",
                    help="also measure ckptfs from this source tree (a checkout of an "
                         "older commit), as target 'before', interleaved with the others")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptfs-floor-"))
    src = work / "src.bin"
    with open(src, "wb") as f:
        for _ in range(a.mib):
            f.write(os.urandom(1 << 20))
    names = ("local", "discard", "trivial", "ckptfs", *(("before",) if a.before else ()))
    ckptfs_targets = {"ckptfs": None, "before": a.before}
    dirs = {n: work / n for n in names}
    for d in dirs.values():
        d.mkdir()
    servers: list[subprocess.Popen[bytes]] = []
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        servers.append(start_trivial(dirs["discard"], work / "discard-backing", "--discard"))
        servers.append(start_trivial(dirs["trivial"], work / "trivial-backing"))
        for name in names:
            if name in ckptfs_targets:
                (work / f"store-{name}").mkdir()
                ckptfs(ckptfs_targets[name], "mount", str(work / f"store-{name}"),
                       str(dirs[name]), "--cache-dir", str(work / f"cache-{name}"))
        for _ in range(a.runs):
            for name in names:
                target = dirs[name] / "f"
                if target.exists():
                    target.unlink()
                times[name].append(dd(src, target, settled=not a.no_settle))
                if name in ckptfs_targets:  # its uploads finish before the next dd (untimed)
                    ckptfs(ckptfs_targets[name], "sync", str(dirs[name]))
    finally:
        for name, proc in zip(("discard", "trivial"), servers, strict=False):
            stop_trivial(dirs[name], proc)
        for name, tree in ckptfs_targets.items():
            if name in names:
                subprocess.run([*CKPTFS, "umount", str(dirs[name])], capture_output=True,
                               env=tree_env(tree), cwd=tree)
        shutil.rmtree(work, ignore_errors=True)
    state = "in whatever state the previous left" if a.no_settle else "settled"
    print(f"dd bs=1M of {a.mib} MiB, medians of {a.runs} interleaved runs, {state}")
    for name, ts in times.items():
        m = median(ts)
        print(f"{name:8s} {m:6.2f} s  {a.mib / m:7.0f} MiB/s  "
              f"{m / median(times['local']):5.2f}x local  "
              f"(runs: {' '.join(f'{t:.2f}' for t in ts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
