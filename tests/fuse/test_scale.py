"""Scale at a small size: ranks saving into one mount at once, and a file larger than the cache."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from faultproxy import FaultProxy
from mounting import MountedStore, Nodes
from seaweed import SeaweedServer

from ckptfs.daemon import control
from ckptfs.daemon.mount import control_socket_path

MiB = 2**20

#: a rank: builds its own 64 MiB state (seeded by its rank), says "ready", waits for "go"
#: on stdin, torch.saves it into the mount, then saves the same state into a local
#: directory under the same name (torch.save's bytes depend on the file's name) and
#: prints the times of its save and the sha256 of the local copy as one JSON line
RANK = textwrap.dedent("""
    import hashlib, json, sys, time, torch
    rank, mib, target, ref = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.manual_seed(rank)
    n = mib * 2**20 // 4 // 4
    state = {"model": {f"w{i}": torch.randn(n) for i in range(3)},
             "optimizer": {"exp_avg": torch.randn(n) * 1e-3}, "step": rank}
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    torch.save(state, target)
    end = time.time()
    torch.save(state, ref)
    with open(ref, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({"start": start, "end": end, "sha256": digest}), flush=True)
""")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * MiB):
            h.update(block)
    return h.hexdigest()


def test_two_ranks_save_at_once_and_read_back_exactly(store: MountedStore, tmp_path: Path,
                                                      nodes: Nodes) -> None:
    a = store.node(nodes, tmp_path, "a")
    (a / "step-1").mkdir()
    ref = tmp_path / "ref"
    ref.mkdir()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), "64",
                               str(a / "step-1" / f"rank{r}.pt"), str(ref / f"rank{r}.pt")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        for p in ranks:  # both built their state: start them at the same moment
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in ranks:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in ranks:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank exited with {p.returncode}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    # the two saves really ran at the same time
    assert max(r["start"] for r in results) < min(r["end"] for r in results), results
    a.umount()  # everything in the store
    fresh = store.node(nodes, tmp_path, "fresh")  # another node, an empty cache
    for r, result in enumerate(results):
        assert sha256(fresh / "step-1" / f"rank{r}.pt") == result["sha256"], f"rank {r}"
    assert not any((fresh.cache / "staging").iterdir())


#: writes SIZE bytes into PATH in 1 MiB writes: 16 MiB chunks all different (slices at
#: distinct offsets of a random pool: incompressible, nothing deduplicated); prints the
#: sha256 of what it wrote and how long the writes took; any failed write exits 1
WRITER = textwrap.dedent("""
    import hashlib, json, os, random, sys, time
    path, size = sys.argv[1], int(sys.argv[2])
    pool = random.Random(7).randbytes(32 << 20)
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.monotonic()
    longest = 0.0
    for k in range(size >> 24):
        base = k * ((512 << 10) + 7)
        chunk = memoryview(pool)[base:base + (16 << 20)]
        for at in range(0, 16 << 20, 1 << 20):
            t = time.monotonic()
            piece = chunk[at:at + (1 << 20)]
            assert os.write(fd, piece) == len(piece)
            longest = max(longest, time.monotonic() - t)
            h.update(piece)
    os.close(fd)
    print(json.dumps({"seconds": time.monotonic() - start, "longest_write": longest,
                      "sha256": h.hexdigest()}), flush=True)
""")


def test_file_larger_than_the_cache(seaweed: SeaweedServer, proxy: FaultProxy,
                                    tmp_path: Path, nodes: Nodes) -> None:
    """256 MiB through a 64 MiB cache to a store capped at 100 MB/s (the proxy): the
    writer waits for the uploads (so its writes take at least as long as the store needs
    for what does not fit), no write fails, the cache stays within its documented bound
    (docs/OPERATIONS.md: --cache-size, plus up to one chunk per upload thread in flight
    during a sequential write), and a fresh node reads back exactly the bytes written."""
    size, limit, chunk, threads, rate = 256 * MiB, 64 * MiB, 16 * MiB, 4, 100e6
    proxy.limit_bandwidth(rate)
    url = f"s3://{seaweed.new_bucket()}/big"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint, "--cache-size",
                    f"{limit // MiB}M", "--upload-threads", str(threads))
    most: dict[str, int] = {"cache_bytes": 0, "dirty_bytes": 0, "disk": 0}
    stop = threading.Event()

    def watch() -> None:  # the cache's own accounting, and the blocks really on its disk
        sock = control_socket_path(str(a.cache))
        while not stop.is_set():
            s: dict[str, Any] = next(iter(control.request(sock, "status")))
            disk = sum(p.stat().st_blocks * 512 for d in ("staging", "chunks")
                       for p in (a.cache / d).rglob("*") if p.is_file())
            for k, v in (("cache_bytes", s["cache_bytes"]), ("dirty_bytes", s["dirty_bytes"]),
                         ("disk", disk)):
                most[k] = max(most[k], int(v))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        w = subprocess.run([sys.executable, "-c", WRITER, str(a / "big.bin"), str(size)],
                           capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        watcher.join(10)
    assert w.returncode == 0, f"the writer failed: {w.stderr}"
    wrote = json.loads(w.stdout)
    print("cache use", most, "writer", wrote)
    bound = limit + threads * chunk
    assert most["cache_bytes"] <= bound, most
    assert most["disk"] <= bound, most
    assert most["dirty_bytes"] >= limit - chunk, most  # it did fill the cache
    # what did not fit in the cache had to reach the store first: the writer waited
    must_wait = (size - bound) / rate
    assert wrote["seconds"] >= 0.8 * must_wait, (wrote, must_wait)
    a.umount()
    fresh = nodes.mount(url, tmp_path, "fresh", "--endpoint-url", seaweed.endpoint)
    assert (fresh / "big.bin").stat().st_size == size
    assert sha256(fresh / "big.bin") == wrote["sha256"]
