"""Benchmark: checkpoint rotation through a mount, then `ckptfs gc`: how much chunk data
the store holds before gc, after its first run (unreferenced chunks set aside as
fossils), after its second (fossils freed), against what the kept checkpoints need.

The scenario of the gc issue: a training run saves a torch checkpoint (model with a
frozen part, trained layers, Adam state) SAVES times into step-N/ on a mount of a
local-directory store, and keeps the last KEEP with `rm -rf` of the oldest (which puts
them in the trash). Then `ckptfs trash empty` and `ckptfs gc --grace 0 --no-writers`
twice (nothing writes meanwhile: the mount is unmounted). Needs FUSE; run as a user who can mount.

    .venv/bin/python scripts/bench_gc.py                   # 12 saves of 64 MiB, keep 3
    .venv/bin/python scripts/bench_gc.py --mib 512 --saves 20 --keep 5
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

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ckptfs.cli.output import human  # noqa: E402
from ckptfs.store.local import LocalStore  # noqa: E402
from ckptfs.tools import inspection  # noqa: E402

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def ckptfs(*args: str) -> str:
    r = subprocess.run([*CKPTFS, *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"ckptfs {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


class Training:
    """A model whose first quarter (embeddings) is frozen, trained layers that change at
    every step, and Adam moments for the trained layers."""

    def __init__(self, mib: int) -> None:
        torch.manual_seed(0)
        floats = mib * 2**20 // 4
        frozen = floats // 4
        trained = (floats - frozen) // 3  # weights + two Adam moments
        self.state: dict[str, torch.Tensor] = {
            "embed.weight": torch.randn(frozen // 1024, 1024),
            "layers.weight": torch.randn(trained // 1024, 1024),
        }
        self.exp_avg = torch.zeros_like(self.state["layers.weight"])
        self.exp_avg_sq = torch.zeros_like(self.state["layers.weight"])
        self.step = 0

    def train_step(self) -> None:
        grad = torch.randn_like(self.exp_avg)
        self.exp_avg.mul_(0.9).add_(grad, alpha=0.1)
        self.exp_avg_sq.mul_(0.999).addcmul_(grad, grad, value=0.001)
        self.state["layers.weight"].sub_(1e-3 * self.exp_avg / (self.exp_avg_sq.sqrt() + 1e-8))
        self.step += 1

    def save(self, directory: Path) -> None:
        torch.save({"model": self.state,
                    "optimizer": {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq,
                                  "step": self.step}},
                   directory / "checkpoint.pt")


def usage(store: LocalStore) -> tuple[int, int, int]:
    """(chunk objects, their bytes, fossils included; bytes the files need)."""
    r = inspection.fsck(store)
    if not r.clean:
        raise SystemExit(f"fsck found problems: {r.to_dict()['problems']}")
    return (r.chunks_stored + r.fossils, r.stored_bytes + r.fossil_bytes,
            r.stored_bytes - r.garbage_bytes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="checkpoint size (default 64)")
    p.add_argument("--saves", type=int, default=12)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--chunk-size", default="4M", help="of the new store (default 4M)")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    a = p.parse_args()
    work = Path(a.dir or tempfile.mkdtemp(prefix="bench-gc-"))
    store_dir, mnt, cache = work / "store", work / "mnt", work / "cache"
    for d in (store_dir, mnt):
        d.mkdir(parents=True, exist_ok=True)
    training = Training(a.mib)
    ckptfs("mount", str(store_dir), str(mnt), "--cache-dir", str(cache), "--chunk-size",
           a.chunk_size)
    try:
        start = time.monotonic()
        for step in range(1, a.saves + 1):
            training.train_step()
            (mnt / f"step-{step}").mkdir()
            training.save(mnt / f"step-{step}")
            if step > a.keep:
                shutil.rmtree(mnt / f"step-{step - a.keep}")
        saved = time.monotonic() - start
    finally:
        ckptfs("umount", str(mnt))
    store = LocalStore(store_dir)
    rows = [("after the rotation", *usage(store)[:2])]
    ckptfs("trash", "empty", str(store_dir))  # the deleted checkpoints: gone for good
    for n, what in ((1, "set aside"), (2, "freed")):
        start = time.monotonic()
        ckptfs("gc", str(store_dir), "--grace", "0", "--no-writers")
        took = time.monotonic() - start
        rows.append((f"after gc run {n} ({what}, {took:.1f}s)", *usage(store)[:2]))
    _, _, needed = usage(store)
    size = sum(f.size for f in inspection.list_files(store))
    print(f"{a.saves} saves of a {human(a.mib * 2**20)} torch checkpoint (a quarter frozen) "
          f"in {saved:.1f}s, the last {a.keep} kept ({human(size)} of files); chunk size "
          f"{a.chunk_size}")
    print(f"{'':38} {'chunks':>8} {'bytes':>12} {'x needed':>9}")
    for label, count, nbytes in rows:
        print(f"{label:38} {count:>8} {human(nbytes):>12} {nbytes / needed:>9.3f}")
    print(f"{'needed by the ' + str(a.keep) + ' kept checkpoints':38} {'':>8} "
          f"{human(needed):>12} {1:>9.3f}")
    if not a.dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
