"""Benchmark: the cost of re-hashing the read cache left by an earlier mount.

1. `LocalCache.verify_cached` over N MiB of 16 MiB chunk files, in one thread, with the
   files in the page cache and after dropping it.
2. A file of N MiB of random bytes (raw chunks) on SeaweedFS S3 (started here on
   127.0.0.1), read in 1 MiB reads on a mount: cold (a new cache directory: every chunk
   is a GET), then warm (mounted again on that cache: every chunk is re-hashed at its
   first use), with the page cache dropped before the read, and without dropping it.

Run as root (drops the page cache); medians of --runs, the runs interleaved.

    .venv/bin/python scripts/bench_cache_verify.py --mib 512 --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from benchlib.harness import MiB, drop_caches, median, run, seaweed, workdir

from ckptfs.format import codec
from ckptfs.pipeline.cache import LocalCache

CHUNK = 16 * MiB


def read_all(path: Path) -> float:
    """Seconds to read the file in 1 MiB reads."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(MiB):
            pass
    return time.perf_counter() - t0


def verify_all(root: Path, hashes: list[str], drop: bool) -> float:
    """Seconds for verify_cached over every chunk file, as a fresh mount would."""
    if drop:
        drop_caches()
    cache = LocalCache(str(root), limit_bytes=1 << 40)
    cache.scan(keep_staging=set())
    t0 = time.perf_counter()
    ok = all(cache.verify_cached(h) for h in hashes)
    elapsed = time.perf_counter() - t0
    cache.close()
    assert ok
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reads-only", action="store_true",
                    help="only part 2 (e.g. to time the reads on a commit before the check)")
    a = ap.parse_args()
    with workdir("ckptfs-verify-") as work:
        results = measure(a, work)
    print(f"\n{a.mib} MiB, medians of {a.runs}:")
    for name, times in results.items():
        med = median(times)
        print(f"{name:34s} {med:6.3f} s  {a.mib / med / 1024:5.2f} GiB/s")
    return 0


def measure(a: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}

    def note(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)
        print(f"{name:34s} {seconds:6.3f} s", flush=True)

    # 1. verify_cached alone
    root = work / "cache-only"
    hashes = []
    for _ in range(0 if a.reads_only else a.mib * MiB // CHUNK):
        data = os.urandom(CHUNK)
        h = codec.chunk_hash(data)
        (root / "chunks" / h[:2]).mkdir(parents=True, exist_ok=True)
        (root / "chunks" / h[:2] / h).write_bytes(data)
        hashes.append(h)
    for _ in range(0 if a.reads_only else a.runs):
        note("verify, files in page cache", verify_all(root, hashes, drop=False))
        note("verify, page cache dropped", verify_all(root, hashes, drop=True))
    shutil.rmtree(root, ignore_errors=True)

    # 2. reads through a mount
    with seaweed(work) as server:
        store = f"s3://{server.new_bucket()}/bench"
        extra = ["--endpoint-url", server.endpoint]
        mnt, cache = work / "mnt", work / "cache"
        mnt.mkdir()
        run("mount", store, str(mnt), "--cache-dir", str(work / "writer-cache"), *extra)
        with open(mnt / "model.bin", "wb") as f:
            for _ in range(a.mib):
                f.write(os.urandom(MiB))
        run("umount", str(mnt))
        for _ in range(a.runs):
            shutil.rmtree(cache, ignore_errors=True)
            drop_caches()
            run("mount", store, str(mnt), "--cache-dir", str(cache), *extra)
            note("read, cold (empty cache: GETs)", read_all(mnt / "model.bin"))
            run("umount", str(mnt))
            drop_caches()
            run("mount", store, str(mnt), "--cache-dir", str(cache), *extra)
            note("read, warm, page cache dropped", read_all(mnt / "model.bin"))
            run("umount", str(mnt))
            run("mount", store, str(mnt), "--cache-dir", str(cache), *extra)
            note("read, warm, files in page cache", read_all(mnt / "model.bin"))
            run("umount", str(mnt))
    return results


if __name__ == "__main__":
    sys.exit(main())
