"""Benchmark: torch.save / torch.load of an N GiB state dict, side by side, interleaved.

Targets (A B C ... interleaved, medians of --runs):
  local   a directory on the same disk as the cache (the baseline)
  ck-dir  ckptfs on the embedded local-directory store
  ck-s3   ckptfs on SeaweedFS S3 (started here on 127.0.0.1)
  ck-az   ckptfs on Azure Blob: Azurite (started here on 127.0.0.1)
  ck-gs   ckptfs on GCS: fake-gcs-server (started here on 127.0.0.1)
  az://container/prefix, gs://bucket/prefix, s3://bucket/prefix
          ckptfs on that store, with the environment's credentials and endpoint
  trivial scripts/trivialfs.py: the floor of any pyfuse3 file system (save, and cold
          load of what it saved)
  raw-s3  the object-store ceiling: the same file PUT/GET with boto3, 8 threads, 16 MiB parts
  ck-fast ckptfs on SeaweedFS S3 with a directory as fast tier (--fast-tier, in the work
          directory, or in --fast-tier-dir): close (torch.save returns), fast-durable
          (`ckptfs sync --fast`) and durable (`ckptfs sync`), each from the save's start;
          the cold restore of a fresh node with the fast tier against one on S3 alone
          (page cache dropped, each timed from its mount command); and `ckptfs warmup` on a
          fresh node, then a torch.load through its mount with the page cache dropped,
          against the same torch.load from a local directory (a table of its own; not
          covered by --profile and --gil)
  juicefs, rclone, s3fs
          peers on the same SeaweedFS (scripts/bench_peers.py; JuiceFS --writeback, rclone
          --vfs-cache-mode writes, s3fs): .venv/bin/pip install -e '.[bench]', apt-get
          install s3fs

The state dict is an optimizer checkpoint: per parameter, 16 MiB fp32 tensors of its
weights, Adam's two moments and a frozen copy (64 tensors per GiB). As a training loop
does, it is saved into a directory made just before (step-1/), right after the mount
comes up. Per target: save stall (until torch.save returns), time to durable (save +
umount, or save + fsync for local, or the PUT for raw), cold load (page cache dropped;
for ckptfs timed from the command that mounts a new, empty cache on: a node's restore
includes its mount; for raw, the GET), bytes stored, daemon peak RSS, and the daemon's CPU
seconds during the save and during its mount and cold load. Run as root (drops
the page cache before cold loads).

--gil adds the seconds per GiB each ckptfs daemon holds the GIL: py-spy (--gil, 250
samples a second, never pausing the daemon) attached before the save and before the cold
load's torch.load (not timed; the mount's own start-up is not per GiB), held seconds =
samples / rate, beside trivialfs's CPU seconds per GiB in the same phases (its whole
process: the least a pyfuse3 file system spends per GiB) and their ratio.

Every timed save starts from the same state: page cache dropped, then 2 s idle. On a VM
that hands free memory back to its host (this one does: virtio-balloon free page
reporting), a page touched for the first time costs a fault in the host too, and how
recently memory was freed changed one save's time by up to 4x here; without this, the
target that runs right after a cache drop wins.

    .venv/bin/python scripts/bench.py --gib 1 --runs 3
    .venv/bin/python scripts/bench.py --targets local,ck-s3,ck-az,ck-gs
    .venv/bin/python scripts/bench.py --gib 1 --runs 3 --targets trivial,ck-s3,ck-dir --gil
    .venv/bin/python scripts/bench.py --runs 5 --targets \
        local,trivial,raw-s3,ck-s3,ck-s3:--uploads-while-writing=0,juicefs,rclone,s3fs
    git worktree add /tmp/before HEAD~1   # a change measured before/after, interleaved:
    .venv/bin/python scripts/bench.py --targets local,ck-dir@/tmp/before,ck-dir
    .venv/bin/python scripts/bench.py --gib 1 --runs 3 --targets ck-fast,ck-s3
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from benchlib import TESTS
from benchlib.harness import (
    cpu_seconds,
    drop_caches,
    du,
    median,
    peak_rss,
    run,
    save_into,
    seconds,
    settle,
    start_trivial,
    state_dict,
    status,
    stop_trivial,
    table,
    tensor_gib,
)
from benchlib.peers import PEERS, missing_peers
from benchlib.pyspy import Recording, py_spy

from ckptfs.store import open_store

if TYPE_CHECKING:
    from azurite import AzuriteServer
    from fakegcs import FakeGcsServer


def bench_local(work: Path, state: dict[str, object], settled: bool) -> dict[str, float]:
    d = work / "local"
    d.mkdir(exist_ok=True)
    if settled:
        settle()
    t0 = time.perf_counter()
    path, save = save_into(d, state)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    durable = time.perf_counter() - t0
    drop_caches()
    t1 = time.perf_counter()
    torch.load(path)
    load = time.perf_counter() - t1
    size = path.stat().st_size
    shutil.rmtree(d)
    return {"save": save, "durable": durable, "load": load, "stored": size, "rss": 0}


#: makes the py-spy recording of one phase ("save", "load") of a daemon
Recorder = Callable[[str], Recording]


def bench_ckptfs(work: Path, state: dict[str, object], store: str, extra: list[str],
                 stored_bytes: Callable[[], int], settled: bool, tree: str | None = None,
                 record: Recorder | None = None) -> dict[str, float]:
    """Save right after the mount comes up, into a directory made just before; durable
    when `ckptfs umount` returns; cold load timed from the new mount's command on (a
    node's restore includes its mount). `record`: py-spy on the daemon during the save
    and during the cold load's torch.load (--profile, --gil): it attaches before each
    phase, untimed; it samples beside the phase, which pays for that only in CPU."""
    mnt, mnt2 = work / "mnt", work / "mnt2"
    cache, cache2 = work / "cache", work / "cache2"
    for p in (cache, cache2):
        shutil.rmtree(p, ignore_errors=True)
    mnt.mkdir(exist_ok=True)
    mnt2.mkdir(exist_ok=True)
    r: dict[str, float] = {}
    if settled:
        settle()
    run("mount", store, str(mnt), "--cache-dir", str(cache), *extra, tree=tree)
    pid = status(mnt, tree)["pid"]
    recording = record("save") if record else None
    if recording:
        recording.start(pid)
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    path, r["save"] = save_into(mnt, state)
    r["save_cpu"] = cpu_seconds(pid) - cpu0
    if recording and (gil := recording.stop()) is not None:
        r["save_gil"] = gil
    rss = peak_rss(pid)
    run("umount", str(mnt), tree=tree)
    r["durable"] = time.perf_counter() - t0
    drop_caches()
    t1 = time.perf_counter()
    run("mount", store, str(mnt2), "--cache-dir", str(cache2), *extra, tree=tree)
    pid2 = status(mnt2, tree)["pid"]
    up = time.perf_counter() - t1
    recording = record("load") if record else None
    if recording:
        recording.start(pid2)
    t2 = time.perf_counter()
    torch.load(mnt2 / path.relative_to(mnt))
    r["load"] = up + time.perf_counter() - t2
    r["load_cpu"] = cpu_seconds(pid2)  # since it started: its mount, then the load
    if recording and (gil := recording.stop()) is not None:
        r["load_gil"] = gil
    r["rss"] = max(rss, peak_rss(pid2))
    shutil.rmtree(mnt2 / "step-1")
    run("umount", str(mnt2), tree=tree)
    r["stored"] = stored_bytes()
    for p in (cache, cache2):
        shutil.rmtree(p, ignore_errors=True)
    return r


def timed_load(mount: Callable[[], object], path: Path) -> float:
    """Seconds of a cold restore: the page cache dropped, then `mount()` (a node's restore
    includes its mount) and torch.load of `path`."""
    drop_caches()
    t0 = time.perf_counter()
    mount()
    torch.load(path)
    return time.perf_counter() - t0


def bench_fast(work: Path, state: dict[str, object], store: str, extra: list[str],
               stored_bytes: Callable[[], int], settled: bool, tree: str | None = None,
               fast_root: Path | None = None) -> dict[str, float]:
    """The fast tier (a new directory under `fast_root`, default `work`) in front of
    `store`: a save's close,
    fast-durable and durable times; cold restores from the fast tier and from the store
    alone; a load after `ckptfs warmup` against the same load from a local directory."""
    fast = (fast_root or work) / f"ckptfs-bench-fast-tier-{os.getpid()}"
    mnts = [work / f"fmnt{i}" for i in range(4)]
    caches = [work / f"fcache{i}" for i in range(4)]
    for p in (fast, *caches):
        shutil.rmtree(p, ignore_errors=True)
    for m in mnts:
        m.mkdir(exist_ok=True)
    fast.mkdir()
    tiered = ["--fast-tier", str(fast), *extra]

    def mount(i: int, options: list[str]) -> None:
        run("mount", store, str(mnts[i]), "--cache-dir", str(caches[i]), *options, tree=tree)

    r: dict[str, float] = {}
    if settled:
        settle()
    mount(0, tiered)
    pid = status(mnts[0], tree)["pid"]
    t0 = time.perf_counter()
    path, r["save"] = save_into(mnts[0], state)  # torch.save returns once the file is closed
    run("sync", "--fast", str(mnts[0]), tree=tree)
    r["fast"] = time.perf_counter() - t0
    run("sync", str(mnts[0]), tree=tree)
    r["durable"] = time.perf_counter() - t0
    rss = peak_rss(pid)
    run("umount", str(mnts[0]), tree=tree)
    rel = path.relative_to(mnts[0])
    for i, key, options in ((1, "load", tiered), (2, "load_s3", extra)):
        r[key] = timed_load(functools.partial(mount, i, options), mnts[i] / rel)
        rss = max(rss, peak_rss(status(mnts[i], tree)["pid"]))
        run("umount", str(mnts[i]), tree=tree)
    mount(3, tiered)  # a node restarting: its checkpoint fetched before the training reads it
    t1 = time.perf_counter()
    run("warmup", str(mnts[3] / rel), tree=tree)
    r["warmup"] = time.perf_counter() - t1
    r["warm_load"] = timed_load(lambda: None, mnts[3] / rel)
    run("umount", str(mnts[3]), tree=tree)
    local = work / "fast-local"
    local.mkdir(exist_ok=True)
    torch.save(state, local / "ckpt.pt")  # the same bytes, on the cache's disk (untimed)
    os.sync()
    r["local_load"] = timed_load(lambda: None, local / "ckpt.pt")
    r["stored"], r["rss"] = stored_bytes(), rss
    for p in (fast, local, *caches):
        shutil.rmtree(p, ignore_errors=True)
    return r


def url_bytes(url: str, extra: list[str]) -> Callable[[], int]:
    """The bytes under chunks/ of the store at `url` (`extra`: --endpoint-url URL)."""

    def count() -> int:
        store = open_store(url, endpoint_url=extra[1] if extra[:1] == ["--endpoint-url"]
                           else None)
        try:
            return sum(size for _, size in store.list("chunks/", None).objects)
        finally:
            store.close()

    return count


def bench_trivial(work: Path, state: dict[str, object], settled: bool
                  ) -> dict[str, float]:
    """The floors of any pyfuse3 file system here: torch.save through one that only passes
    writes to a local file, and the cold torch.load of that file through it (page cache
    dropped; the mount's read-ahead raised as ckptfs raises its own)."""
    from ckptfs.daemon.mount import tune_readahead

    mnt, backing = work / "trivial", work / "trivial-backing"
    mnt.mkdir()
    proc = start_trivial(mnt, backing)
    try:
        tune_readahead(str(mnt))
        if settled:
            settle()
        cpu0 = cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        torch.save(state, mnt / "ckpt.pt")  # (a flat file system: no step-1/)
        save = time.perf_counter() - t0
        cpu1 = cpu_seconds(proc.pid)
        drop_caches()
        t1 = time.perf_counter()
        torch.load(mnt / "ckpt.pt")
        load = time.perf_counter() - t1
        cpu2 = cpu_seconds(proc.pid)
    finally:
        stop_trivial(mnt, proc)
        shutil.rmtree(backing, ignore_errors=True)
        mnt.rmdir()
    return {"save": save, "durable": float("nan"), "load": load, "stored": 0, "rss": 0,
            "save_cpu": cpu1 - cpu0, "load_cpu": cpu2 - cpu1}


def bench_raw(work: Path, state: dict[str, object], client: object, bucket: str
              ) -> dict[str, float]:
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                         max_concurrency=8)
    src = work / "raw-src.pt"
    torch.save(state, src)  # not timed: the raw store gets the same bytes
    os.sync()
    t0 = time.perf_counter()
    client.upload_file(str(src), bucket, "raw/ckpt.pt", Config=cfg)  # type: ignore[attr-defined]
    put = time.perf_counter() - t0
    size = src.stat().st_size
    os.unlink(src)
    drop_caches()
    dst = work / "raw-dst.pt"
    t1 = time.perf_counter()
    client.download_file(bucket, "raw/ckpt.pt", str(dst), Config=cfg)  # type: ignore[attr-defined]
    torch.load(dst)
    load = time.perf_counter() - t1
    os.unlink(dst)
    client.delete_object(Bucket=bucket, Key="raw/ckpt.pt")  # type: ignore[attr-defined]
    return {"save": float("nan"), "durable": put, "load": load, "stored": size, "rss": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="on the disk to measure (default: /tmp)")
    ap.add_argument("--targets", default="local,ck-dir,ck-s3,raw-s3",
                    help="comma-separated; a ckptfs target may name another source tree "
                         "after '@' (a checkout of an older commit: before/after in one run) "
                         "and carry mount options after a colon, e.g. "
                         "'ck-dir@/tmp/before,ck-dir,ck-s3:--uploads-while-writing=2'")
    ap.add_argument("--fast-tier-dir", type=Path, default=None, metavar="DIR",
                    help="ck-fast: make its fast tier in DIR (a shared file system: Lustre, "
                         "NFS; default: the work directory, a local disk)")
    ap.add_argument("--no-settle", action="store_true",
                    help="time each save in whatever state the previous target left")
    ap.add_argument("--s3-mbps", type=float, default=0.0, metavar="MB/S",
                    help="cap the S3 link (ck-s3, ck-fast and raw-s3, both ways together) at this "
                         "many MB/s with a proxy: a store slower than the node, as a real "
                         "one is (default: no cap, loopback speed)")
    ap.add_argument("--profile", metavar="DIR", type=Path, default=None,
                    help="write py-spy flame graphs of each ckptfs daemon's save and cold "
                         "load to DIR/<target>-<run>-save.svg and -load.svg (with --gil: of "
                         "the thread holding the GIL only)")
    ap.add_argument("--gil", action="store_true",
                    help="report the seconds per GiB each ckptfs daemon holds the GIL "
                         "during the save and the cold load's torch.load (py-spy --gil), "
                         "beside trivialfs's CPU seconds per GiB")
    a = ap.parse_args()
    spy = py_spy()
    if (a.profile is not None or a.gil) and spy is None:
        ap.exit(2, "bench.py: --profile and --gil need py-spy: .venv/bin/pip install -e "
                   "'.[bench]'\n")
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    settled = not a.no_settle
    targets = a.targets.split(",")
    known = {"local", "trivial", "raw-s3", "ck-dir", "ck-s3", "ck-fast", "ck-az", "ck-gs",
             *PEERS}
    unknown = [t for t in targets if "://" not in t
               and t.partition(":")[0].partition("@")[0] not in known]
    if unknown:
        ap.error(f"unknown target {unknown[0]!r} (one of {', '.join(sorted(known))}, or a "
                 f"store URL)")
    missing = missing_peers([t for t in targets if t in PEERS])
    if missing:
        ap.exit(2, "".join(f"bench.py: {m}\n" for m in missing))
    work = Path(tempfile.mkdtemp(prefix="ckptfs-bench-", dir=a.workdir))
    state = state_dict(a.gib)
    gib = tensor_gib(a.gib)

    def recorder(name: str) -> Recorder | None:
        """py-spy's recordings of target run `name`: flame graphs in --profile DIR,
        else (--gil alone) collapsed stacks in the work dir, counted, then removed."""
        if spy is None or (a.profile is None and not a.gil):
            return None
        where, suffix = (a.profile, ".svg") if a.profile is not None else (work, ".gil.txt")
        return lambda phase: Recording(spy, where / f"{name}-{phase}{suffix}", a.gil)

    from seaweed import SeaweedServer  # (tests/: on sys.path through benchlib)

    server = SeaweedServer(work / "weed")
    os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                      AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION="us-east-1")
    server.start()
    s3_endpoint = server.endpoint
    proxy = None
    if a.s3_mbps:  # in a process of its own: see faultproxy.main
        proxy = subprocess.Popen([sys.executable, str(TESTS / "faultproxy.py"), server.endpoint,
                                  str(a.s3_mbps)], stdout=subprocess.PIPE, text=True)
        assert proxy.stdout is not None
        s3_endpoint = proxy.stdout.readline().strip()
    azurite: AzuriteServer | None = None  # (their SDKs imported only when used)
    fakegcs: FakeGcsServer | None = None
    if "ck-az" in a.targets:
        from azurite import AzuriteServer

        azurite = AzuriteServer(work / "azurite")
    if "ck-gs" in a.targets:
        from fakegcs import FakeGcsServer

        fakegcs = FakeGcsServer(work / "fakegcs")
    results: dict[str, list[dict[str, float]]] = {t: [] for t in targets}
    try:
        if azurite is not None:
            azurite.start()
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
            container = azurite.new_container()
        if fakegcs is not None:
            fakegcs.start()
            gcs_bucket = fakegcs.new_bucket()
        client = server.client(s3_endpoint)
        bucket = server.new_bucket()
        dir_store = work / "dir-store"
        for i in range(a.runs):
            for n, t in enumerate(targets):
                kind, _, options = t.partition(":")
                rec = recorder("".join(c if c.isalnum() or c in "-_" else "_" for c in t)
                               + f"-{i + 1}")
                kind, _, tree = kind.partition("@")
                extra = options.split()
                if "://" in t:  # a store URL, as it is
                    r = bench_ckptfs(work, state, t.rstrip("/") + f"/run{i}-{n}", [],
                                     url_bytes(t.rstrip("/") + f"/run{i}-{n}", []), settled,
                                     record=rec)
                elif kind in ("ck-az", "ck-gs"):
                    if kind == "ck-az":
                        assert azurite is not None
                        url, endpoint = f"az://{container}/run{i}-{n}", azurite.endpoint
                    else:
                        assert fakegcs is not None
                        url, endpoint = f"gs://{gcs_bucket}/run{i}-{n}", fakegcs.endpoint
                    store_extra = ["--endpoint-url", endpoint, *extra]
                    r = bench_ckptfs(work, state, url, store_extra,
                                     url_bytes(url, store_extra), settled, tree or None, rec)
                elif kind == "local":
                    r = bench_local(work, state, settled)
                elif kind in PEERS:
                    r = PEERS[kind](work, state, server, settle if settled else lambda: None,
                                    drop_caches)
                elif kind == "trivial":
                    r = bench_trivial(work, state, settled)
                elif kind == "ck-dir":
                    shutil.rmtree(dir_store, ignore_errors=True)
                    dir_store.mkdir()
                    r = bench_ckptfs(work, state, str(dir_store), extra,
                                     lambda: du(dir_store / "chunks"), settled, tree or None,
                                     rec)
                elif kind in ("ck-s3", "ck-fast"):
                    prefix = f"run{i}-{n}"

                    def s3_bytes(prefix: str = prefix) -> int:
                        pages = client.get_paginator("list_objects_v2").paginate(
                            Bucket=bucket, Prefix=f"{prefix}/chunks/")
                        return sum(o["Size"] for p in pages for o in p.get("Contents", []))

                    url, s3_extra = f"s3://{bucket}/{prefix}", ["--endpoint-url", s3_endpoint,
                                                                *extra]
                    if kind == "ck-fast":
                        r = bench_fast(work, state, url, s3_extra, s3_bytes, settled,
                                       tree or None, a.fast_tier_dir)
                    else:
                        r = bench_ckptfs(work, state, url, s3_extra, s3_bytes, settled,
                                         tree or None, rec)
                else:  # raw-s3
                    r = bench_raw(work, state, client, bucket)
                results[t].append(r)
                print(f"run {i + 1} {t:14s} " + " ".join(
                    f"{k}={v:.2f}" for k, v in r.items() if k in FAST_COLUMNS), flush=True)
    finally:
        if proxy is not None:
            proxy.kill()
            proxy.wait()
        server.stop()
        for emulator in (azurite, fakegcs):
            if emulator is not None:
                emulator.stop()
        for m in ("mnt", "mnt2"):
            subprocess.run(["fusermount3", "-u", "-z", str(work / m)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{a.gib:g} GiB state dict, medians of {a.runs} interleaved runs")
    print(summary(results, targets, gib, a.gil))
    return 0


#: what a run line shows, and the fast tier's table (ck-fast): key -> column
FAST_COLUMNS = {"save": "close s", "fast": "fast-durable s", "durable": "durable s",
                "load": "cold load: fast tier s", "load_s3": "S3 alone s",
                "warmup": "warmup s", "warm_load": "load after warmup s",
                "local_load": "local load s"}


def summary(results: dict[str, list[dict[str, float]]], targets: list[str], gib: float,
            gil: bool) -> str:
    """The table of medians, the GIL table (--gil), then each ckptfs target against the
    floors and the raw store."""

    def med(t: str, k: str) -> float:
        return median(r.get(k, float("nan")) for r in results[t])

    lines = [table(
        ["target", "save s", "durable s", "cold load s", "stored MiB", "daemon RSS MiB",
         "daemon CPU s: save", "load"],
        ([t, seconds(med(t, "save")), seconds(med(t, "durable")), seconds(med(t, "load")),
          f"{med(t, 'stored') / 2**20:.0f}", f"{max(r['rss'] for r in results[t]) / 2**20:.0f}",
          seconds(med(t, "save_cpu")), seconds(med(t, "load_cpu"))] for t in targets))]
    floor = {k: med("trivial", f"{k}_cpu") / gib if "trivial" in targets else float("nan")
             for k in ("save", "load")}
    if gil:
        def per_gib(t: str, k: str) -> str:
            held = med(t, f"{k}_gil") / gib
            x = f" ({held / floor[k]:.2f}x)" if floor[k] == floor[k] else ""
            return "-" if held != held else f"{held:.2f}{x}"

        lines += ["", "seconds per GiB: a ckptfs daemon holding the GIL (during the save; "
                  "during the cold load's torch.load, the mount excluded) and x trivialfs's "
                  "CPU seconds per GiB (its whole process, same phases)", table(
                      ["target", "save s/GiB", "load s/GiB"],
                      [*([["trivial (CPU)", seconds(floor["save"]), seconds(floor["load"])]]
                         if "trivial" in targets else []),
                       *([f"{t} (GIL held)", per_gib(t, "save"), per_gib(t, "load")]
                         for t in targets if "save_gil" in results[t][0])])]

    fast = [t for t in targets if "fast" in results[t][0]]
    if fast:
        lines += ["", "the fast tier (ck-fast): close, fast-durable and durable from the "
                  "save's start; cold loads timed from the mount command, page cache "
                  "dropped; the load after warmup and the local one with the page cache "
                  "dropped", table(
                      ["target", *FAST_COLUMNS.values(), "after warmup / local"],
                      ([t, *(seconds(med(t, k)) for k in FAST_COLUMNS),
                        f"{med(t, 'warm_load') / med(t, 'local_load'):.2f}x"]
                       for t in fast))]

    def ratio(t: str, k: str, base: str, what: str) -> str | None:
        return f"{med(t, k) / med(base, k):.2f}x {what}" if base in targets else None

    lines.append("")
    for t in targets:
        if not (t.startswith("ck-") or "://" in t or t in PEERS):
            continue
        s3 = t.startswith("ck-s3") or t in PEERS
        said = [ratio(t, "save", "trivial", "the save floor (trivial)"),
                ratio(t, "load", "trivial", "the read floor (trivial)"),
                *((ratio(t, "durable", "raw-s3", "raw PUT (durable)"),
                   ratio(t, "load", "raw-s3", "raw GET+load"),
                   ratio(t, "load", "s3fs", "s3fs (cold load)")) if s3 else ())]
        if any(x is not None for x in said):
            lines.append(f"{t}: " + ", ".join(x for x in said if x is not None))
    return "\n".join(lines).rstrip()


if __name__ == "__main__":
    sys.exit(main())
