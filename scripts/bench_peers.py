"""Benchmark three peer FUSE file systems (JuiceFS, rclone, s3fs) alone, on a SeaweedFS S3.

The method is scripts/bench.py's (they are its targets juicefs, rclone and s3fs there,
beside ckptfs): save, durable, cold load, bytes stored, peak RSS; see
scripts/benchlib/peers.py. Here each runs once on a state dict of --mib MiB.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_peers.py [--mib 64] [juicefs rclone s3fs]
"""

from __future__ import annotations

import argparse
import sys

from benchlib.harness import drop_caches, seaweed, settle, state_dict, workdir
from benchlib.peers import PEERS, binary, missing_peers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peers", nargs="*", help=f"some of {' '.join(PEERS)} (default: all)")
    ap.add_argument("--mib", type=int, default=64, help="state dict size (64 MiB tensors)")
    a = ap.parse_args()
    wanted = a.peers or list(PEERS)
    if set(wanted) - set(PEERS):
        ap.error(f"unknown peers: {' '.join(sorted(set(wanted) - set(PEERS)))}")
    for line in missing_peers(wanted):
        print(line)
    names = [n for n in wanted if binary(n) is not None]
    with workdir("ckptfs-peers-") as work, seaweed(work) as server:
        state = state_dict(a.mib / 1024)
        for n in names:
            print(n, PEERS[n](work, state, server, settle, drop_caches), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
