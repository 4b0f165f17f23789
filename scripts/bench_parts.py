"""Benchmark: the parts of a save and a restore that docs/PERFORMANCE.md and OPERATIONS.md
quote apart from scripts/bench.py.

  overwrite  the close of an overwrite (torch.save over latest.pt) in the core tier on a
             directory store, with the trash on (one PUT more: the replaced manifest)
             and off; medians per run, then the median of the runs
  mount      `ckptfs mount` until the mount point answers, empty cache each time, on
             SeaweedFS (started here on 127.0.0.1) and on a directory store; --targets
             s3@/tmp/old,s3,dir@/tmp/old,dir runs another tree's ckptfs beside this one;
             each tree's package runs from a byte-compiled copy (--source: without);
             the target floor is the same for scripts/trivialfs.py --background (Python,
             pyfuse3 and trio imported, a fork, a mount that does nothing)
  imports    the CPU of what a mount loads before it answers, step by step: fresh
             interpreters that import one more part each (the command, trio, pyfuse3,
             the daemon's modules, botocore and an S3 client), then the same process's
             teardown at exit; medians
  get        16 MiB GETs from SeaweedFS through the S3 store, 1 and 8 threads at once:
             throughput and this process's CPU per GiB

    .venv/bin/python scripts/bench_parts.py overwrite --runs 5
    .venv/bin/python scripts/bench_parts.py mount --runs 6 --targets s3@/tmp/old,s3,dir@/tmp/old,dir
    .venv/bin/python scripts/bench_parts.py imports --runs 9
    .venv/bin/python scripts/bench_parts.py get
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
from seaweed import SeaweedServer  # noqa: E402 - tests/ holds the server fixture

CKPTFS = str(Path(sys.executable).with_name("ckptfs"))


def overwrite(runs: int) -> None:
    import trio
    from corefs import core, overwrite, write_file
    from support import random_bytes

    async def one(root: Path, keep: float) -> float:
        closes = []
        async with core(root, trash_keep=keep) as fs:
            await write_file(fs, "latest.pt", b"x")
            for i in range(40):
                data = random_bytes(200_000, i)
                start = time.perf_counter()
                await overwrite(fs, "latest.pt", data)
                closes.append(time.perf_counter() - start)
            await fs.wait_all_flushed()
        return statistics.median(closes) * 1000

    medians: dict[float, list[float]] = {0.0: [], 3600.0: []}
    for _ in range(runs):  # interleaved
        for keep in medians:
            with tempfile.TemporaryDirectory() as d:
                medians[keep].append(trio.run(one, Path(d), keep))
    for keep, ms in medians.items():
        print(f"trash {'on ' if keep else 'off'}: close of an overwrite, median of 40, per run "
              f"{[round(x, 1) for x in ms]} ms; median {statistics.median(ms):.1f} ms")


@contextmanager
def seaweed() -> Iterator[tuple[SeaweedServer, str]]:
    """A SeaweedFS server on 127.0.0.1 with a new bucket, credentials in the environment."""
    with tempfile.TemporaryDirectory() as d:
        server = SeaweedServer(Path(d) / "weed")
        server.start()
        try:
            os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                              AWS_SECRET_ACCESS_KEY=server.secret_key,
                              AWS_DEFAULT_REGION="us-east-1")
            yield server, server.new_bucket()
        finally:
            server.stop()


def mount_targets(spec: str) -> list[tuple[str, str, Path]]:
    """(label, store kind, source tree) of each comma-separated target: s3 or dir, with
    @TREE for the ckptfs of another source tree (an old commit's worktree)."""
    targets = []
    for t in spec.split(","):
        kind, _, tree = t.partition("@")
        if kind not in ("s3", "dir", "floor") or (kind == "floor" and tree):
            sys.exit(f"unknown target {t!r}: s3 or dir, with @TREE for another source tree, "
                     f"or floor")
        if tree and not (Path(tree) / "ckptfs" / "__init__.py").is_file():
            sys.exit(f"{tree} is not a ckptfs source tree (no ckptfs/__init__.py)")
        targets.append((t, kind, Path(tree) if tree else ROOT))
    return targets


def copy_package(tree: Path, to: Path, compiled: bool) -> Path:
    """A copy of `tree`'s ckptfs package in `to`, its modules byte-compiled if `compiled`
    (as pip compiles an installed wheel); else without any, as a checkout runs where
    PYTHONDONTWRITEBYTECODE is set: every module compiled from source at every start."""
    shutil.copytree(tree / "ckptfs", to / "ckptfs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if compiled:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(to / "ckptfs")],
                       check=True)
    return to


def children_cpu() -> float:
    """The CPU seconds of this process's children that have exited and been waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def mount(runs: int, spec: str, compiled: bool) -> None:
    """Each target's `ckptfs mount` until the mount point answers (a stat), a new empty
    cache each time, the targets interleaved in every run; each tree's package is run as
    `python -m ckptfs` from a copy (copy_package). The store of each kind is made by a
    first mount that is not timed."""
    with seaweed() as (server, bucket), tempfile.TemporaryDirectory() as d:
        targets = [(label, kind, copy_package(tree, Path(d) / f"tree{n}", compiled))
                   for n, (label, kind, tree) in enumerate(mount_targets(spec))]
        mnt = Path(d) / "mnt"
        mnt.mkdir()
        (Path(d) / "store").mkdir()
        stores = {"s3": [f"s3://{bucket}", "--endpoint-url", server.endpoint],
                  "dir": [f"{d}/store"]}

        cpus: dict[tuple[str, Path], list[float]] = defaultdict(list)

        def once(kind: str, tree: Path, cache: str) -> float:
            if kind == "floor":
                command = [sys.executable, str(ROOT / "scripts" / "trivialfs.py"), str(mnt),
                           d, "--background"]
            else:
                command = [sys.executable, "-m", "ckptfs", "mount", *stores[kind][:1],
                           str(mnt), *stores[kind][1:], "--cache-dir", cache]
            cpu = children_cpu()
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, cwd=tree)
            os.stat(mnt)
            took = time.perf_counter() - start
            cpus[kind, tree].append(children_cpu() - cpu)  # the command's, not its daemon's
            subprocess.run(["fusermount3", "-u", str(mnt)] if kind == "floor" else
                           [CKPTFS, "umount", str(mnt)], check=True, capture_output=True)
            return took

        for kind in {kind for _, kind, _ in targets} - {"floor"}:  # create the stores
            once(kind, targets[-1][2], f"{d}/cache-new-{kind}")
        times: dict[str, list[float]] = {label: [] for label, _, _ in targets}
        for i in range(runs):
            for n, (label, kind, tree) in enumerate(targets):
                times[label].append(once(kind, tree, f"{d}/cache{i}-{n}"))
        print(f"ckptfs mount until the mount point answers, empty cache, existing store "
              f"(SeaweedFS on 127.0.0.1 or a directory), {runs} runs interleaved, modules "
              f"{'byte-compiled' if compiled else 'compiled at each start'}:")
        for label, kind, tree in targets:
            ts = times[label]
            print(f"  {label}: median {statistics.median(ts):.3f} s  "
                  f"{[round(t, 3) for t in ts]}; the command's own CPU: median "
                  f"{statistics.median(cpus[kind, tree][-runs:]):.3f} s")


#: (label, code) of each step of `imports`: each runs what the step before ran, and more
IMPORT_STEPS = [
    ("Python itself", "pass"),
    ("+ the command (ckptfs.cli.main)", "import ckptfs.cli.main"),
    ("+ trio", "import trio"),
    ("+ pyfuse3", "import pyfuse3"),
    ("+ the daemon's modules", "import ckptfs.daemon.mount"),
    ("+ the S3 store (botocore)", "import ckptfs.store.s3"),
    ("+ an S3 client", "ckptfs.store.s3.S3Store('b', '', 'http://127.0.0.1:9', None, 16)"),
]
#: what `ckptfs mount` has imported when the daemon is ready: its teardown is measured
TEARDOWN_AFTER = "+ the daemon's modules"


def imports(runs: int) -> None:
    """The CPU seconds of each step of IMPORT_STEPS, medians of `runs` fresh interpreters
    (interleaved), and the teardown at exit of the step TEARDOWN_AFTER (against
    os._exit)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
               AWS_DEFAULT_REGION="us-east-1")

    def cpu(code: str) -> float:
        before = children_cpu()
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        return children_cpu() - before

    codes = ["\n".join(code for _, code in IMPORT_STEPS[:n + 1]) for n in
             range(len(IMPORT_STEPS))]
    parent = [label for label, _ in IMPORT_STEPS].index(TEARDOWN_AFTER)
    codes.append(codes[parent] + "\nimport os; os._exit(0)")
    cpus: list[list[float]] = [[] for _ in codes]
    for _ in range(runs):
        for n, code in enumerate(codes):
            cpus[n].append(cpu(code))
    medians = [statistics.median(c) * 1000 for c in cpus]
    print(f"CPU of a fresh interpreter that runs each step and those above it, medians "
          f"of {runs}:")
    for n, (label, _) in enumerate(IMPORT_STEPS):
        print(f"  {label:36} {medians[n]:6.1f} ms  (+{medians[n] - medians[max(n - 1, 0)]:.1f})")
    print(f"  teardown at exit, after {TEARDOWN_AFTER!r}: "
          f"{medians[parent] - medians[-1]:.1f} ms")


def get(count: int) -> None:
    import numpy as np

    from ckptfs.store import open_store

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    with seaweed() as (server, bucket):
        store = open_store(f"s3://{bucket}", endpoint_url=server.endpoint,
                           max_pool_connections=16)
        data = np.random.default_rng(0).integers(0, 255, 16 << 20, dtype=np.uint8).tobytes()
        for i in range(count):
            store.put(f"o{i}", data)
        gib = count * 16 / 1024
        for threads in (1, 8, 1, 8):
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda i: store.get(f"o{i}"), range(4)))  # warm
                c0, t0 = cpu(), time.perf_counter()
                list(pool.map(lambda i: len(store.get(f"o{i}")), range(count)))
                wall, used = time.perf_counter() - t0, cpu() - c0
            print(f"GET 16 MiB x {count}, {threads} thread(s): {gib * 1024 / wall:.0f} MiB/s, "
                  f"client CPU {used / gib:.2f} s/GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("part", choices=("overwrite", "mount", "imports", "get"))
    ap.add_argument("--runs", type=int, default=5, help="runs (overwrite, mount, imports)")
    ap.add_argument("--objects", type=int, default=48, help="16 MiB objects to GET (get)")
    ap.add_argument("--targets", default="s3,dir",
                    help="mount: s3 and/or dir, each with @TREE for another source tree")
    ap.add_argument("--source", action="store_true",
                    help="mount: run ckptfs without byte-compiled modules (as a checkout "
                    "runs where PYTHONDONTWRITEBYTECODE is set)")
    a = ap.parse_args()
    if a.runs < 1 or a.objects < 1:
        ap.error("--runs and --objects must be at least 1")
    if a.part == "overwrite":
        overwrite(a.runs)
    elif a.part == "mount":
        mount(a.runs, a.targets, not a.source)
    elif a.part == "imports":
        imports(a.runs)
    else:
        get(a.objects)


if __name__ == "__main__":
    main()
