"""Benchmark where a cold load goes: the mount apart from the read, torch.load against a read.

One checkpoint (bench.py's optimizer state dict, --gib GiB) is saved once into each
target. Then, per run and per way of reading it (interleaved, medians of --runs), with
the page cache dropped before each:

  load    torch.load of the file
  read    a plain sequential read of it (16 MiB readinto calls)

Targets:
  local          a local directory
  trivial        scripts/trivialfs.py (the read floor of any pyfuse3 file system), its
                 read-ahead raised as ckptfs raises its own
  raw-s3         boto3 download_file of the same file as one object (8 threads, 16 MiB
                 parts) into a local file, then the load or the read of that file: the
                 object store's own pace (not with --no-s3)
  ck-dir, ck-s3  ckptfs on the directory store and on SeaweedFS S3 (started here on
                 127.0.0.1): `ckptfs mount` on a new, empty cache ("mount": the command's
                 seconds), then the load or the read (without the mount), then umount;
                 once per --variant, a set of mount options ('' = the defaults)

Run as root (drops the page cache).

    .venv/bin/python scripts/bench_cold_read.py --gib 1 --runs 3
    .venv/bin/python scripts/bench_cold_read.py --variant '' --variant '--fetch-threads 16'
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from benchlib.harness import (
    drop_caches,
    median,
    run,
    save_into,
    seaweed,
    start_trivial,
    state_dict,
    stop_trivial,
    table,
    tensor_gib,
    workdir,
)

from ckptfs.daemon.mount import tune_readahead

BLOCK = 16 << 20


def plain_read(path: Path) -> float:
    """Seconds to read the file sequentially in BLOCK-sized readinto calls."""
    buf = bytearray(BLOCK)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def timed_load(path: Path) -> float:
    """Seconds for torch.load of the file."""
    import torch

    t0 = time.perf_counter()
    torch.load(path)
    return time.perf_counter() - t0


READERS: dict[str, Callable[[Path], float]] = {"load": timed_load, "read": plain_read}


def measure(a: argparse.Namespace, work: Path, stack: ExitStack
            ) -> dict[str, dict[str, list[float]]]:
    """{target: {"mount" | "load" | "read": seconds per run}}; what it starts is stopped
    by `stack`."""
    rows: dict[str, dict[str, list[float]]] = {}

    def note(target: str, what: str, seconds: float) -> None:
        rows.setdefault(target, {}).setdefault(what, []).append(seconds)

    state = state_dict(a.gib)
    (work / "local").mkdir()
    local, _ = save_into(work / "local", state)
    os.sync()
    trivial, backing = work / "trivial", work / "trivial-backing"
    trivial.mkdir()
    proc = start_trivial(trivial, backing)
    stack.callback(stop_trivial, trivial, proc)
    tune_readahead(str(trivial))
    import torch

    torch.save(state, trivial / "ckpt.pt")  # (a flat file system: no step-1/)
    stores: dict[str, tuple[str, list[str]]] = {"ck-dir": (str(work / "store"), [])}
    (work / "store").mkdir()
    raw: Callable[[Path], None] | None = None
    if not a.no_s3:
        server = stack.enter_context(seaweed(work))
        bucket = server.new_bucket()
        stores["ck-s3"] = (f"s3://{bucket}/cold-read", ["--endpoint-url", server.endpoint])
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(max_concurrency=8, multipart_chunksize=16 << 20)
        server.s3.upload_file(str(local), bucket, "raw/ckpt.pt", Config=config)

        def raw(dst: Path) -> None:
            server.s3.download_file(bucket, "raw/ckpt.pt", str(dst), Config=config)

    for name, (url, extra) in stores.items():  # the checkpoint, saved once per store
        mnt = work / f"mnt-{name}"
        mnt.mkdir()
        run("mount", url, str(mnt), "--cache-dir", str(work / f"writer-{name}"), *extra)
        save_into(mnt, state)
        run("umount", str(mnt))
    del state
    relative = local.relative_to(work / "local")
    for i in range(a.runs):
        for how, reader in READERS.items():
            drop_caches()
            note("local", how, reader(local))
            drop_caches()
            note("trivial", how, reader(trivial / "ckpt.pt"))
            if raw is not None:  # GET into a local file, then load or read it
                dst = work / "raw.pt"
                drop_caches()
                t0 = time.perf_counter()
                raw(dst)
                note("raw-s3 (GET, then)", how, time.perf_counter() - t0 + reader(dst))
                dst.unlink()
            for name, (url, extra) in stores.items():
                for variant in a.variant:
                    target = name + (f" {variant}" if variant else "")
                    mnt, cache = work / f"mnt-{name}", work / "cache"
                    shutil.rmtree(cache, ignore_errors=True)
                    drop_caches()
                    t0 = time.perf_counter()
                    run("mount", url, str(mnt), "--cache-dir", str(cache), *extra,
                        *variant.split())
                    note(target, "mount", time.perf_counter() - t0)
                    note(target, how, reader(mnt / relative))
                    run("umount", str(mnt))
        print(f"run {i + 1} of {a.runs} done", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split(
        "\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variant", action="append", metavar="OPTIONS",
                    help="mount options of one more ckptfs variant, e.g. '--fetch-threads "
                         "16'; '' = the defaults (default: '' and '--fetch-threads 16')")
    ap.add_argument("--no-s3", action="store_true", help="no SeaweedFS: local, trivial, ck-dir")
    ap.add_argument("--workdir", default=None, help="on the disk to measure (default: /tmp)")
    a = ap.parse_args()
    if a.gib <= 0 or a.runs <= 0:
        ap.error("--gib and --runs must be positive")
    if os.geteuid() != 0:
        ap.error("run as root (the page cache is dropped before every read)")
    a.variant = a.variant or ["", "--fetch-threads 16"]
    with workdir("ckptfs-cold-read-", a.workdir) as work, ExitStack() as stack:
        rows = measure(a, work, stack)
    gib = tensor_gib(a.gib)
    print(f"\n{gib:g} GiB, medians of {a.runs}; mount = `ckptfs mount` on an empty cache; "
          "load and read exclude it")

    def cell(r: dict[str, list[float]], what: str, fmt: Callable[[float], str]) -> str:
        return fmt(median(r[what])) if what in r else "-"

    print(table(["target", "mount s", "torch.load s", "plain read s", "load GiB/s",
                 "read GiB/s"],
                ([t, cell(r, "mount", "{:.2f}".format), cell(r, "load", "{:.2f}".format),
                  cell(r, "read", "{:.2f}".format),
                  cell(r, "load", lambda s: f"{gib / s:.2f}"),
                  cell(r, "read", lambda s: f"{gib / s:.2f}")] for t, r in rows.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
