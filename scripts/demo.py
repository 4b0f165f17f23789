"""Demo: save a real torch checkpoint through ckptfs, remount with an empty cache, load it.

Uses the embedded default store (a local directory), as a first-time user would:

    ckptfs mount STORE MNT  ->  torch.save  ->  ckptfs umount  ->
    ckptfs mount STORE MNT2 --cache-dir EMPTY  ->  torch.load  ->  compare every tensor
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def ckptfs(*args: str) -> None:
    subprocess.run([*CKPTFS, *args], check=True)


def make_state(params_millions: float) -> dict[str, object]:
    """A model + Adam-like optimizer state, as a training loop would save it."""
    torch.manual_seed(0)
    width = 1024
    layers = max(1, int(params_millions * 1e6 / (width * width)))
    model = {f"layers.{i}.weight": torch.randn(width, width) for i in range(layers)}
    model["embed.weight"] = torch.randn(8192, 256).to(torch.bfloat16)
    optim = {"state": {i: {"step": torch.tensor(1000.0), "exp_avg": torch.randn_like(t.float()),
                           "exp_avg_sq": torch.rand_like(t.float())}
                       for i, t in enumerate(model.values())},
             "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999),
                               "params": list(range(len(model)))}]}
    return {"model": model, "optimizer": optim, "step": 1000,
            "rng": torch.get_rng_state()}


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True)))
    return a == b


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params-millions", type=float, default=16.0,
                    help="model size; the checkpoint is about 12 bytes per parameter")
    ap.add_argument("--workdir", help="where to put the store, caches and mount points "
                    "(default: a temporary directory, removed at the end)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="ckptfs-demo-"))
    store, mnt = work / "store", work / "mnt"
    for d in (store, mnt):
        d.mkdir(parents=True, exist_ok=True)
    state = make_state(a.params_millions)
    try:
        print(f"store: {store} (the embedded default: a plain directory)")
        ckptfs("mount", str(store), str(mnt), "--cache-dir", str(work / "cache-node1"))
        (mnt / "step-1000").mkdir()
        t0 = time.perf_counter()
        torch.save(state, mnt / "step-1000" / "checkpoint.pt")
        save_s = time.perf_counter() - t0
        size = (mnt / "step-1000" / "checkpoint.pt").stat().st_size
        t1 = time.perf_counter()
        ckptfs("umount", str(mnt))
        durable_s = save_s + time.perf_counter() - t1

        ckptfs("mount", str(store), str(mnt), "--cache-dir", str(work / "cache-node2"))
        t2 = time.perf_counter()
        loaded = torch.load(mnt / "step-1000" / "checkpoint.pt", weights_only=False)
        load_s = time.perf_counter() - t2
        ok = same(state, loaded)
        ckptfs("umount", str(mnt))
        stored = du(store / "chunks")
        mib = size / 2**20
        print(f"checkpoint     {mib:8.1f} MiB  ({a.params_millions:g}M params + Adam state)")
        print(f"save stall     {save_s:8.2f} s    {mib / save_s:7.0f} MiB/s  "
              "(torch.save returned)")
        print(f"durable        {durable_s:8.2f} s    (save + ckptfs umount: all in the store)")
        print(f"cold load      {load_s:8.2f} s    {mib / load_s:7.0f} MiB/s  "
              "(new node, empty cache)")
        print(f"stored chunks  {stored / 2**20:8.1f} MiB  "
              f"(compression {size / max(stored, 1):.2f}x)")
        print(f"verify         {'OK: every tensor identical' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
