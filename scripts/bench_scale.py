"""Benchmark ckptfs at scale: many nodes restoring, many ranks saving, a save larger than the cache.

Three experiments (issue 19, items 2, 5 and 6), each its own subcommand; SeaweedFS S3 is
started here on 127.0.0.1 (tests/seaweed.py). Run as root (drops the page cache).

restore   One 1 GiB checkpoint (bench.py's optimizer state dict) is saved once. Then, per
          run, interleaved: 1 node alone, then N nodes (default 4) at once. Each node is a
          mount of its own (own empty cache dir, own --node-id); all are mounted, the page
          cache is dropped, and the nodes' torch.load processes start at the same moment.
          Reported: per-node load seconds and the aggregate (first start to last end).
          One more N-node round (not in the medians) goes through the fault proxy
          (tests/faultproxy.py, in a process of its own) that records every request:
          how many GETs of each chunk reached the store.
ranks     1, 2 and 4 processes (--ranks) each torch.save their own shard (--mib, default
          512 MiB; different values per rank, so nothing deduplicates) at the same moment
          into one directory of: a local directory, scripts/trivialfs.py (the floor of
          any pyfuse3 file system), ckptfs on SeaweedFS S3 (ck-s3) and on the local
          directory store (ck-dir). Wall time = first start to last end of the saves;
          every save starts settled (page cache dropped, 2 s idle, as bench.py does).
big       A --gib (default 6) GiB torch.save into a mount with --cache-size (default 2G)
          on S3, from a process of its own while the cache is watched (`status` every
          0.1 s): the save completes, no write fails, dirty data reaches the limit (the
          writer waited), daemon peak RSS; then umount (durable) and a fresh node with an
          empty cache reads the file back, compared by xxh3-128 with what was written.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_scale.py restore --runs 3
    PYTHONPATH=$PWD .venv/bin/python scripts/bench_scale.py ranks --runs 3 --ranks 2,4
    PYTHONPATH=$PWD .venv/bin/python scripts/bench_scale.py ranks --ranks 1,8 --mib 256 --gil
    PYTHONPATH=$PWD .venv/bin/python scripts/bench_scale.py big --gib 6 --cache-size 2G
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from benchlib import TESTS
from benchlib.harness import (
    CKPTFS,
    SCRIPTS,
    GiB,
    MiB,
    cpu_seconds,
    drop_caches,
    lazy_unmount,
    median,
    peak_rss,
    seaweed,
    settle,
    start_trivial,
    state_dict,
    stop_trivial,
    workdir,
)
from benchlib.pyspy import Recording, py_spy

from ckptfs.daemon import control
from ckptfs.daemon.mount import control_socket_path


class Parser(argparse.ArgumentParser):
    """Bad input ends in one line on stderr (exit 2), not the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"bench_scale.py: {message}\n")


def ckptfs(*args: str) -> str:
    r = subprocess.run([*CKPTFS, *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"ckptfs {' '.join(args[:2])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


class Node:
    """One mount: its own mount point, empty cache dir and node id."""

    def __init__(self, work: Path, name: str, store: str, extra: list[str]) -> None:
        self.mnt, self.cache = work / f"{name}-mnt", work / f"{name}-cache"
        self.name, self.store, self.extra = name, store, extra
        self.pid = 0

    def mount(self) -> Node:
        shutil.rmtree(self.cache, ignore_errors=True)
        self.mnt.mkdir(exist_ok=True)
        ckptfs("mount", self.store, str(self.mnt), "--cache-dir", str(self.cache),
               "--node-id", self.name, *self.extra)
        self.pid = int(self.status()["pid"])
        return self

    def status(self) -> dict[str, Any]:
        answer = next(iter(control.request(control_socket_path(str(self.cache)), "status")))
        return dict(answer)

    def umount(self) -> None:
        ckptfs("umount", str(self.mnt))
        shutil.rmtree(self.cache, ignore_errors=True)


# -- processes started at the same moment ------------------------------------------------

#: a worker: does its setup, says "ready", waits for "go" on stdin, runs the timed part,
#: prints {"start", "end", ...} as one JSON line (times: time.time(), shared by processes)
LOADER = textwrap.dedent("""
    import json, sys, time, torch
    path = sys.argv[1]
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    torch.load(path)
    print(json.dumps({"start": start, "end": time.time()}), flush=True)
""")

SAVER = textwrap.dedent("""
    import json, sys, time, torch
    sys.path.insert(0, sys.argv[4])
    from benchlib.harness import state_dict
    path, rank, mib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    state = state_dict(mib / 1024)
    def perturb(x):  # each rank its own values: nothing deduplicates across ranks
        if isinstance(x, torch.Tensor) and x.numel() > 1:
            x.add_(rank * 1e-3)
        elif isinstance(x, dict):
            for v in x.values():
                perturb(v)
    perturb(state)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    torch.save(state, path)
    print(json.dumps({"start": start, "end": time.time()}), flush=True)
""")

#: torch.save into an open file whose writes are hashed (xxh3-128) on their way
HASHED_SAVER = textwrap.dedent("""
    import json, sys, time, torch, xxhash
    sys.path.insert(0, sys.argv[3])
    from benchlib.harness import state_dict
    path, gib = sys.argv[1], float(sys.argv[2])
    state = state_dict(gib)
    class Hashed:
        def __init__(self, f):
            self.f, self.h, self.n = f, xxhash.xxh3_128(), 0
        def write(self, b):
            self.h.update(b)
            self.n += len(b)
            return self.f.write(b)
        def flush(self):
            self.f.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    with open(path, "wb", buffering=0) as f:
        out = Hashed(f)
        torch.save(state, out)
    print(json.dumps({"start": start, "end": time.time(), "xxh3": out.h.hexdigest(),
                      "bytes": out.n}), flush=True)
""")


def at_once(cmds: list[list[str]], before_go: Callable[[], None] = lambda: None,
            timeout: float = 3600) -> list[dict[str, Any]]:
    """Start the workers, wait until all are ready, run `before_go`, release them at once."""
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for c in cmds]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"a worker did not start (said {line!r})")
        before_go()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            if p.returncode:
                raise SystemExit(f"a worker failed (exit {p.returncode})")
            out.append(json.loads(text.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def wall(results: list[dict[str, Any]]) -> float:
    return float(max(r["end"] for r in results) - min(r["start"] for r in results))


def med(xs: list[float]) -> float:
    return median(xs)


# -- item 2: restore at scale ---------------------------------------------------------------

#: the recording proxy in a process of its own (a torch.load blocked in FUSE must never
#: stop the proxy that its mount waits for); on a line on stdin it prints its log as JSON
PROXY = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from faultproxy import FaultProxy
    proxy = FaultProxy(sys.argv[1])
    print(proxy.endpoint, flush=True)
    sys.stdin.readline()
    print(json.dumps([[r.method, r.path, r.status] for r in proxy.log]), flush=True)
""")


def restore(a: argparse.Namespace, work: Path) -> None:
    with seaweed(work) as server:
        bucket = server.new_bucket()
        store = f"s3://{bucket}/restore"
        direct = ["--endpoint-url", server.endpoint]
        writer = Node(work, "writer", store, direct).mount()
        (writer.mnt / "step-1").mkdir()
        import torch

        torch.save(state_dict(a.gib), writer.mnt / "step-1" / "ckpt.pt")
        writer.umount()

        def round_of(n: int, extra: list[str]) -> list[dict[str, Any]]:
            nodes = [Node(work, f"node{i}", store, extra).mount() for i in range(n)]
            try:
                cmds = [[sys.executable, "-c", LOADER, str(m.mnt / "step-1" / "ckpt.pt")]
                        for m in nodes]
                res = at_once(cmds, before_go=drop_caches)
                for r, m in zip(res, nodes, strict=True):
                    r["rss"] = peak_rss(m.pid)
                    r["fetched"] = int(m.status()["fetched_bytes"])
            finally:
                for m in nodes:
                    m.umount()
            return res

        times: dict[int, list[list[dict[str, Any]]]] = {1: [], a.nodes: []}
        for i in range(a.runs):
            for n in times:
                res = round_of(n, direct)
                times[n].append(res)
                print(f"run {i + 1} nodes={n} aggregate={wall(res):.2f} s per node " +
                      " ".join(f"{r['end'] - r['start']:.2f}" for r in res), flush=True)
        # the counted round, through the recording proxy
        proxy = subprocess.Popen([sys.executable, "-c", PROXY, server.endpoint, str(TESTS)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proxy.stdout is not None and proxy.stdin is not None
            endpoint = proxy.stdout.readline().strip()
            counted = round_of(a.nodes, ["--endpoint-url", endpoint])
            proxy.stdin.write("dump\n")
            proxy.stdin.flush()
            log = json.loads(proxy.stdout.readline())
        finally:
            proxy.kill()
            proxy.wait()
        stored = [k for p in server.s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix="restore/chunks/") for k in p.get("Contents", [])]
    gets = collections.Counter(path.split("?")[0] for method, path, status in log
                               if method == "GET" and "/chunks/" in path)
    other = collections.Counter(method for method, path, status in log
                                if not (method == "GET" and "/chunks/" in path))
    per_chunk = collections.Counter(gets.values())
    print(f"\nrestore of a {a.gib:g} GiB checkpoint, SeaweedFS S3 on loopback, medians of "
          f"{a.runs} interleaved runs (torch.load timed from the moment all start, mounts "
          f"up and page cache dropped before)")
    print(f"{'nodes':>5s} {'aggregate s':>12s} {'per node s (median, max)':>25s} "
          f"{'GB/s total':>10s} {'daemon RSS MiB (max)':>21s}")
    for n, rounds in times.items():
        agg = med([wall(r) for r in rounds])
        per = [r["end"] - r["start"] for rs in rounds for r in rs]
        rss = max(r["rss"] for rs in rounds for r in rs) / MiB
        print(f"{n:5d} {agg:12.2f} {med(per):12.2f} {max(per):12.2f} "
              f"{n * a.gib * GiB / agg / 1e9:10.2f} {rss:21.0f}")
    ratio = med([wall(r) for r in times[a.nodes]]) / med([wall(r) for r in times[1]])
    print(f"{a.nodes} nodes at once take {ratio:.2f}x one node alone "
          f"({a.nodes / ratio:.2f}x its throughput)")
    print(f"\ncounted round ({a.nodes} nodes through the recording proxy, aggregate "
          f"{wall(counted):.2f} s): {len(stored)} chunks in the store, {len(gets)} of them "
          f"fetched, {sum(gets.values())} chunk GETs: "
          + ", ".join(f"{c} chunks got {k} GET(s)" for k, c in sorted(per_chunk.items()))
          + f"; {sum(gets.values()) / max(1, len(gets)):.2f} GETs per chunk "
          f"({sum(gets.values()) / max(1, len(gets)) / a.nodes:.2f} per chunk per node); "
          f"other requests: {dict(other)}; fetched per node: "
          + ", ".join(f"{r['fetched'] / MiB:.0f} MiB" for r in counted))
    sizes = {f"/{bucket}/{o['Key']}": o["Size"] for o in stored}
    for path, k in sorted(gets.items()):
        if k > a.nodes:
            print(f"  {path.rsplit('/', 1)[1]} ({sizes.get(path, 0) / MiB:.2f} MiB stored): "
                  f"{k} GETs")


# -- item 5: many ranks ---------------------------------------------------------------------

def ranks(a: argparse.Namespace, work: Path) -> None:
    counts = [int(x) for x in a.ranks.split(",")]
    results: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    durable: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, int], list[float]] = collections.defaultdict(list)  # s/GiB
    gil: dict[tuple[str, int], list[float]] = collections.defaultdict(list)  # s/GiB
    with seaweed(work) as server:
        bucket = server.new_bucket()
        for i in range(a.runs):
            for n in counts:
                for t in a.targets.split(","):
                    mnt = work / "target"
                    node: Node | None = None
                    proc = None
                    if t == "local":
                        mnt.mkdir()
                    elif t == "trivial":
                        mnt.mkdir()
                        proc = start_trivial(mnt, work / "trivial-backing")
                    else:
                        store = (f"s3://{bucket}/run{i}-{n}" if t == "ck-s3"
                                 else str(work / f"dir-store-{i}-{n}"))
                        extra = ["--endpoint-url", server.endpoint] if t == "ck-s3" else []
                        if t == "ck-dir":
                            Path(store).mkdir()
                        node = Node(work, "ranks", store, extra).mount()
                        mnt = node.mnt
                    try:
                        cmds = [[sys.executable, "-c", SAVER, str(mnt / f"rank{r}.pt"), str(r),
                                 str(a.mib), str(SCRIPTS)] for r in range(n)]
                        recording: Recording | None = None
                        fs_pid = node.pid if node is not None else (
                            proc.pid if proc is not None else None)
                        cpu0 = 0.0

                        def go(node: Node | None = node, n: int = n, i: int = i,
                               t: str = t, fs_pid: int | None = fs_pid) -> None:
                            nonlocal recording, cpu0
                            settle()
                            graph = (a.profile and node is not None and n == max(counts)
                                     and i == 0)
                            if node is not None and (graph or a.gil):
                                out = (Path(a.profile) / f"ranks-{t}-{n}.svg" if graph
                                       else work / f"ranks-{t}-{n}-{i}.gil.txt")
                                recording = Recording(a.py_spy, out, a.gil)
                                recording.start(node.pid)
                            if fs_pid is not None:
                                cpu0 = cpu_seconds(fs_pid)

                        res = at_once(cmds, before_go=go)
                        gib = n * a.mib / 1024
                        if fs_pid is not None:
                            cpu[t, n].append((cpu_seconds(fs_pid) - cpu0) / gib)
                        held = recording.stop() if recording is not None else None
                        seconds = wall(res)
                        results[t, n].append(seconds)
                        line = f"run {i + 1} ranks={n} {t:8s} save wall {seconds:.2f} s"
                        if fs_pid is not None:
                            line += f", file system CPU {cpu[t, n][-1]:.2f} s/GiB"
                        if held is not None:
                            gil[t, n].append(held / gib)
                            line += f", GIL held {gil[t, n][-1]:.2f} s/GiB"
                        if node is not None:
                            node.umount()
                            durable[t, n].append(time.time() - min(r["start"] for r in res))
                            line += f", durable {durable[t, n][-1]:.2f} s"
                            node = None
                        print(line, flush=True)
                    finally:
                        if node is not None:
                            lazy_unmount(node.mnt)
                        if proc is not None:
                            stop_trivial(mnt, proc)
                        shutil.rmtree(work / "trivial-backing", ignore_errors=True)
                        if t in ("local", "trivial"):
                            shutil.rmtree(mnt, ignore_errors=True)
                        shutil.rmtree(work / f"dir-store-{i}-{n}", ignore_errors=True)
    targets = a.targets.split(",")
    print(f"\n{len(counts)} rank counts, each rank a {a.mib:g} MiB torch.save, all at once "
          f"into one directory; medians of {a.runs} interleaved runs (save wall = first "
          f"start to last end)")
    print(f"{'ranks':>5s} " + " ".join(f"{t + ' s':>10s}" for t in targets)
          + "".join(f" {t + '/floor':>14s}" for t in targets if t.startswith("ck-"))
          + "".join(f" {t + ' durable s':>17s}" for t in targets if t.startswith("ck-")))
    for n in counts:
        floor = med(results["trivial", n]) if "trivial" in targets else float("nan")
        print(f"{n:5d} " + " ".join(f"{med(results[t, n]):10.2f}" for t in targets)
              + "".join(f" {med(results[t, n]) / floor:14.2f}" for t in targets
                        if t.startswith("ck-"))
              + "".join(f" {med(durable[t, n]):17.2f}" for t in targets
                        if t.startswith("ck-")))
    fs_targets = [t for t in targets if t != "local"]
    print("\nCPU seconds per GiB saved of the file system's process (trivialfs or the "
          "ckptfs daemon)" + (", and the seconds per GiB the daemon held the GIL "
                              "(py-spy --gil), against trivialfs's CPU" if a.gil else ""))
    print(f"{'ranks':>5s} " + " ".join(f"{t + ' CPU':>14s}" for t in fs_targets)
          + "".join(f" {t + ' GIL':>14s} {'/trivial CPU':>13s}" for t in fs_targets
                    if a.gil and t.startswith("ck-")))
    for n in counts:
        floor = med(cpu["trivial", n]) if "trivial" in targets else float("nan")
        print(f"{n:5d} " + " ".join(f"{med(cpu[t, n]):14.2f}" for t in fs_targets)
              + "".join(f" {med(gil[t, n]):14.2f} {med(gil[t, n]) / floor:13.2f}"
                        for t in fs_targets if a.gil and t.startswith("ck-")))
    if len(counts) > 1 and "trivial" in targets:
        lo, hi = counts[0], counts[-1]
        for t in targets:
            print(f"{t}: {hi} ranks take {med(results[t, hi]) / med(results[t, lo]):.2f}x "
                  f"{lo} ranks ({hi / lo:g}x the bytes)")


# -- item 6: larger than the cache -----------------------------------------------------------

def big(a: argparse.Namespace, work: Path) -> None:
    import xxhash

    limit = parse_size(a.cache_size)
    with seaweed(work) as server:
        bucket = server.new_bucket()
        store = f"s3://{bucket}/big"
        direct = ["--endpoint-url", server.endpoint]
        for i in range(a.runs):
            node = Node(work, "big", store, [*direct, "--cache-size", a.cache_size]).mount()
            most = {"dirty_bytes": 0, "cache_bytes": 0}
            try:
                path = node.mnt / f"step-{i}" / "ckpt.pt"
                path.parent.mkdir()
                proc = subprocess.Popen([sys.executable, "-c", HASHED_SAVER, str(path),
                                         str(a.gib), str(SCRIPTS)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
                assert proc.stdout is not None and proc.stdin is not None
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit("the saver did not start")
                settle()
                proc.stdin.write("go\n")
                proc.stdin.flush()
                while proc.poll() is None:
                    s = node.status()
                    for k in most:
                        most[k] = max(most[k], int(s[k]))
                    time.sleep(0.1)
                out, _ = proc.communicate()
                if proc.returncode:
                    raise SystemExit(f"the save failed (exit {proc.returncode})")
                saved = json.loads(out.strip().splitlines()[-1])
                save_rss = peak_rss(node.pid)
                errors = node.status().get("errors")
                t0 = time.time()
                node.umount()
                durable = time.time() - saved["start"]
                flush = time.time() - t0
            finally:
                lazy_unmount(node.mnt)
            drop_caches()
            fresh = Node(work, "fresh", store, direct).mount()
            try:
                h = xxhash.xxh3_128()
                t1 = time.time()
                with open(fresh.mnt / f"step-{i}" / "ckpt.pt", "rb") as f:
                    while block := f.read(16 * MiB):
                        h.update(block)
                read = time.time() - t1
                read_rss = peak_rss(fresh.pid)
                fresh.umount()
            finally:
                lazy_unmount(fresh.mnt)
            same = h.hexdigest() == saved["xxh3"]
            print(f"run {i + 1}: {saved['bytes'] / GiB:.2f} GiB saved in "
                  f"{saved['end'] - saved['start']:.2f} s (no write failed) with "
                  f"--cache-size {a.cache_size}; dirty peak {most['dirty_bytes'] / MiB:.0f} MiB,"
                  f" cache peak {most['cache_bytes'] / MiB:.0f} MiB (limit {limit / MiB:.0f});"
                  f" errors in status: {errors}; durable {durable:.2f} s (umount {flush:.2f} s);"
                  f" daemon peak RSS {save_rss / MiB:.0f} MiB writing, {read_rss / MiB:.0f} MiB"
                  f" reading; fresh node read back in {read:.2f} s: "
                  f"{'identical' if same else 'DIFFERENT'} (xxh3-128 {h.hexdigest()})",
                  flush=True)
            if not same:
                raise SystemExit("the file read back differs from what was saved")


def parse_size(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def check(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return v

    return check


def main() -> int:
    ap = Parser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="on the disk to measure (default: /tmp)")
    sub = ap.add_subparsers(dest="what", required=True, parser_class=Parser)
    r = sub.add_parser("restore", help="N nodes load one checkpoint at once (item 2)")
    r.add_argument("--gib", type=positive(float), default=1.0)
    r.add_argument("--nodes", type=positive(int), default=4)
    r.add_argument("--runs", type=positive(int), default=3)
    k = sub.add_parser("ranks", help="R ranks save their shards at once (item 5)")
    k.add_argument("--mib", type=positive(float), default=512.0)
    k.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    k.add_argument("--runs", type=positive(int), default=3)
    k.add_argument("--targets", default="local,trivial,ck-s3,ck-dir")
    k.add_argument("--profile", metavar="DIR",
                   help="py-spy flame graphs of the daemon during the first run of the "
                        "largest rank count, one per ckptfs target, into DIR")
    k.add_argument("--gil", action="store_true",
                   help="also the seconds per GiB each ckptfs daemon holds the GIL during "
                        "the saves (py-spy --gil, every run), against trivialfs's CPU")
    k.add_argument("--py-spy", default=py_spy() or "py-spy")
    b = sub.add_parser("big", help="a save larger than the cache (item 6)")
    b.add_argument("--gib", type=positive(float), default=6.0)
    b.add_argument("--cache-size", default="2G")
    b.add_argument("--runs", type=positive(int), default=1)
    a = ap.parse_args()
    if a.what == "ranks":
        try:
            counts = [int(x) for x in a.ranks.split(",")]
        except ValueError:
            ap.error(f"--ranks: not a list of integers: {a.ranks!r}")
        if any(c <= 0 for c in counts):
            ap.error(f"--ranks: rank counts must be positive: {a.ranks!r}")
        bad = [t for t in a.targets.split(",") if t not in ("local", "trivial", "ck-s3",
                                                            "ck-dir")]
        if bad:
            ap.error(f"unknown target {bad[0]!r} (one of local, trivial, ck-s3, ck-dir)")
        if (a.profile or a.gil) and shutil.which(a.py_spy) is None:
            ap.error(f"--profile and --gil need py-spy: {a.py_spy} not found (--py-spy "
                     f"PATH, or .venv/bin/pip install -e '.[bench]')")
        if a.profile:
            Path(a.profile).mkdir(parents=True, exist_ok=True)
    if a.what == "big":
        try:
            parse_size(a.cache_size)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--cache-size: {e}")
    if os.geteuid() != 0:
        ap.error("run as root (the page cache is dropped between runs)")
    with workdir("ckptfs-scale-", a.workdir) as work:
        {"restore": restore, "ranks": ranks, "big": big}[a.what](a, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
