"""Benchmark: the seconds per GiB an S3 client holds the GIL while it moves chunks.

8 threads PUT, then GET, --objects objects of 16 MiB each on a SeaweedFS started here on
127.0.0.1, through boto3 as the S3 store sends them (its client config; a bytearray body),
and through obstore (one PutObject, use_multipart=False; GET into its own buffer). py-spy
(`record --gil`, 100 Hz) samples this process during each round; the samples whose stack
holds the GIL, divided by the rate and the GiB moved, are the seconds in which no other
thread of a daemon (its FUSE loop) could have run Python. Rounds are interleaved, --runs
of each; CPU is this process's (user + system) per GiB.

    .venv/bin/python scripts/bench_s3_gil.py --objects 64 --runs 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

SIZE = 16 << 20
THREADS = 8
RATE = 100


def gil_seconds(path: Path) -> float:
    """Seconds of samples in a py-spy raw profile."""
    lines = path.read_text().splitlines()
    return sum(int(line.rpartition(" ")[2]) for line in lines if line.strip()) / RATE


def spied(fn: Callable[[int], object], objects: int, out: Path) -> tuple[float, float, float]:
    """(GIL s, CPU s, wall s) of THREADS threads calling fn on objects 0..objects-1."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    proc = subprocess.Popen([spy, "record", "--gil", "--rate", str(RATE), "--format", "raw",
                             "--pid", str(os.getpid()), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.7)  # attached
    start, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=lambda k=k: [fn(i) for i in range(k, objects, THREADS)])
               for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    return gil_seconds(out), cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=64, help="16 MiB objects (default 64)")
    ap.add_argument("--runs", type=int, default=2, help="interleaved rounds (default 2)")
    a = ap.parse_args()
    if a.objects < THREADS or a.runs < 1:
        ap.error(f"--objects must be at least {THREADS} and --runs at least 1")

    import numpy as np
    import obstore
    from obstore.store import S3Store as ObStore
    from seaweed import SeaweedServer

    from ckptfs.store.s3 import S3Store

    work = Path(tempfile.mkdtemp(prefix="ckptfs-s3gil-"))
    server = SeaweedServer(work / "weed")
    os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                      AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION="us-east-1")
    body = bytearray(np.random.default_rng(0).integers(0, 256, SIZE, np.uint8).tobytes())
    results: dict[str, list[tuple[float, float, float]]] = {}
    try:
        server.start()
        bucket = server.new_bucket()
        client = S3Store(bucket, "", server.endpoint)._client
        ob = ObStore(bucket, endpoint=server.endpoint, region="us-east-1",
                     virtual_hosted_style_request=False, unsigned_payload=True,
                     client_options={"allow_http": True})
        rounds: list[tuple[str, Callable[[int], object]]] = [
            ("PUT boto3", lambda i: client.put_object(Bucket=bucket, Key=f"k{i}", Body=body)),
            ("PUT obstore", lambda i: obstore.put(ob, f"k{i}", body, use_multipart=False)),
            ("GET boto3", lambda i: client.get_object(Bucket=bucket, Key=f"k{i}")["Body"]
             .read()),
            ("GET obstore", lambda i: obstore.get(ob, f"k{i}").bytes()),
        ]
        gib = a.objects * SIZE / 2**30
        for run in range(a.runs):
            for name, fn in rounds:
                gil, cpu, wall = spied(fn, a.objects, work / "spy.txt")
                results.setdefault(name, []).append((gil / gib, cpu / gib, wall))
                print(f"run {run + 1} {name}: GIL {gil / gib:.2f} s/GiB, CPU "
                      f"{cpu / gib:.2f} s/GiB, {wall:.2f} s", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.objects} x 16 MiB, {THREADS} threads, medians of {a.runs}")
    print(f"{'client':12s} {'GIL s/GiB':>10s} {'CPU s/GiB':>10s} {'wall s':>8s}")
    for name, rows in results.items():
        gil, cpu, wall = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{name:12s} {gil:10.2f} {cpu:10.2f} {wall:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
