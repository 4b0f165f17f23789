"""Benchmark: what a node's metadata calls cost in store requests, and `ls -l` of a large
directory, for one or more ckptfs checkouts side by side (docs/PERFORMANCE.md, "Lookups
and listings").

SeaweedFS is started on 127.0.0.1 with a FaultProxy in front that records every request.
For each checkout (`--trees`, default this one), in order:

  ls       a directory of 100 files listed with `ls -l` on a fresh node, then again
  dcp      torch.distributed.checkpoint: save on node A (one process), load on a fresh node
  orbax    scripts/orbax_multihost.py: 5 async saves on two nodes (two JAX processes),
           then a restore on two fresh nodes (needs jax[cpu] and orbax-checkpoint)
  bigdir   `ls -l` of a directory of --files files (manifests copied in the store) on a
           fresh node, then twice more: the requests (through the proxy), and the wall
           times on --runs fresh nodes mounted straight to the server (medians)

Wall times through the proxy include its own latency (tens of ms a request); the
`ls` part also times lookups of missing names, and `bigdir` its listings, without it.
Requests are counted by kind: LIST, HEAD, GET of a manifest or marker, GET of a chunk,
PUT, DELETE. A checkout is any directory holding the ckptfs package (a git worktree of
another commit: `git worktree add /tmp/before COMMIT`); its code runs the mounts.

    .venv/bin/python scripts/bench_lookups.py --trees /tmp/before,. --files 10000
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))
from faultproxy import FaultProxy  # noqa: E402 - tests/ holds the server fixtures
from seaweed import SeaweedServer  # noqa: E402

DCP = """
import sys, torch, torch.distributed.checkpoint as dcp
state = {f"layer{i}": torch.full((256, 256), float(i)) for i in range(8)}
if sys.argv[1] == "save":
    dcp.save(state, storage_writer=dcp.FileSystemWriter(sys.argv[2]))
else:
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=dcp.FileSystemReader(sys.argv[2]))
    assert all(torch.equal(target[k], v) for k, v in state.items())
"""


def kind(method: str, path: str) -> str:
    """The request's kind, from its method and path (with the query)."""
    query = urllib.parse.urlsplit(path).query
    if method == "GET" and ("list-type" in query or "prefix=" in query):
        return "LIST"
    if method == "GET":
        return "GET chunk" if "/chunks/" in path else "GET record"
    if method == "POST" and "delete" in query:
        return "DELETE"
    return method


class Env:
    """SeaweedFS behind a FaultProxy, and mounts of one bucket made with a checkout."""

    def __init__(self, server: SeaweedServer, proxy: FaultProxy, root: Path) -> None:
        self.server = server
        self.proxy = proxy
        self.root = root
        self.mounted: list[Path] = []

    def counted(self, fn: Callable[[], object]) -> tuple[Counter[str], float]:
        """The requests `fn` made, by kind, and its wall time."""
        start = len(self.proxy.log)
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        return Counter(kind(r.method, r.path) for r in self.proxy.log[start:]), wall

    def mount(self, tree: Path, url: str, name: str, direct: bool = False) -> Path:
        """Mount `url` with the checkout `tree`: through the proxy, or `direct` to the
        server (wall times without the proxy's own latency)."""
        mnt = self.root / f"{name}-mnt"
        mnt.mkdir()
        endpoint = self.server.endpoint if direct else self.proxy.endpoint
        subprocess.run([sys.executable, "-m", "ckptfs.cli", "mount", url, str(mnt),
                        "--endpoint-url", endpoint, "--cache-dir",
                        str(self.root / f"{name}-cache")], check=True, cwd=tree,
                       env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True)
        self.mounted.append(mnt)
        return mnt

    def umount(self, tree: Path, mnt: Path) -> None:
        subprocess.run([sys.executable, "-m", "ckptfs.cli", "umount", str(mnt)], check=True,
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                       capture_output=True)
        self.mounted.remove(mnt)

    def cleanup(self) -> None:
        for mnt in self.mounted:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


@contextmanager
def environment() -> Iterator[Env]:
    with tempfile.TemporaryDirectory() as d:
        server = SeaweedServer(Path(d) / "weed")
        server.start()
        proxy = FaultProxy(server.endpoint)
        env = Env(server, proxy, Path(d))
        os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                          AWS_SECRET_ACCESS_KEY=server.secret_key,
                          AWS_DEFAULT_REGION="us-east-1")
        try:
            yield env
        finally:
            env.cleanup()
            proxy.close()
            server.stop()


def show(what: str, counts: Counter[str], wall: float) -> None:
    kinds = ("LIST", "HEAD", "GET record", "GET chunk", "PUT", "DELETE")
    print(f"  {what:<44} " + "  ".join(f"{k} {counts.get(k, 0)}" for k in kinds)
          + f"  ({wall:.2f} s)")


def run_tree(env: Env, tree: Path, n: int, files: int, runs: int, parts: set[str]) -> None:
    bucket = env.server.new_bucket()
    url = f"s3://{bucket}/job"
    py = [sys.executable]
    tag = f"t{n}"
    if "ls" in parts:
        a = env.mount(tree, url, f"{tag}ls-a")
        (a / "dir").mkdir()
        for i in range(100):
            (a / "dir" / f"f{i:03}").write_bytes(b"x")
        env.umount(tree, a)
        b = env.mount(tree, url, f"{tag}ls-b")
        for what in ("ls -l, fresh node", "ls -l again"):
            show(what, *env.counted(lambda: subprocess.run(
                ["ls", "-l", str(b / "dir")], check=True, capture_output=True)))
        show("stat of 100 names that do not exist", *env.counted(
            lambda: [os.path.exists(b / "dir" / f"g{i}") for i in range(100)]))
        env.umount(tree, b)
        b = env.mount(tree, url, f"{tag}ls-c", direct=True)
        os.listdir(b / "dir")
        t0 = time.perf_counter()
        for i in range(100):
            os.path.exists(b / "dir" / f"g{i}")
        print(f"  the same, without the proxy: {(time.perf_counter() - t0) * 10:.1f} ms each")
        env.umount(tree, b)
    if "dcp" in parts:
        a = env.mount(tree, url, f"{tag}dcp-a")
        show("torch.distributed.checkpoint save", *env.counted(lambda: subprocess.run(
            [*py, "-c", DCP, "save", str(a / "dcp")], check=True)))
        env.umount(tree, a)
        c = env.mount(tree, url, f"{tag}dcp-c")
        show("torch.distributed.checkpoint load, fresh node", *env.counted(
            lambda: subprocess.run([*py, "-c", DCP, "load", str(c / "dcp")], check=True)))
        env.umount(tree, c)
    if "orbax" in parts:
        script = str(HERE / "scripts" / "orbax_multihost.py")
        a, b = env.mount(tree, url, f"{tag}ox-a"), env.mount(tree, url, f"{tag}ox-b")

        def save() -> None:
            r = subprocess.run([*py, script, "save", "--steps", "5", "--timeout", "120",
                                str(a / "ox"), str(b / "ox")], capture_output=True, text=True)
            if r.returncode:
                print(f"  (Orbax save failed: {r.stderr.strip().splitlines()[-1:]})")

        show("Orbax: 5 async saves on two nodes", *env.counted(save))
        env.umount(tree, a)
        env.umount(tree, b)
        c, d = env.mount(tree, url, f"{tag}ox-c"), env.mount(tree, url, f"{tag}ox-d")
        show("Orbax: restore on two fresh nodes", *env.counted(lambda: subprocess.run(
            [*py, script, "restore", "--timeout", "120", str(c / "ox"), str(d / "ox")],
            capture_output=True)))
        env.umount(tree, c)
        env.umount(tree, d)
    if "bigdir" in parts:
        a = env.mount(tree, url, f"{tag}big-a")
        (a / "big").mkdir()
        (a / "big" / "f00000").write_bytes(b"x")
        env.umount(tree, a)
        s3 = env.server.client()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: s3.copy_object(
                Bucket=bucket, Key=f"job/files/big/f{i:05}",
                CopySource={"Bucket": bucket, "Key": "job/files/big/f00000"}),
                range(1, files)))
        ls_l = ["ls", "-l", "--", "big"]
        names = ("fresh node", "again", "a third time")
        proxied = env.mount(tree, url, f"{tag}big-counted")
        for what in names:
            show(f"ls -l of {files} files, {what}", *env.counted(functools.partial(
                subprocess.run, ls_l, cwd=proxied, check=True, stdout=subprocess.DEVNULL)))
        env.umount(tree, proxied)
        walls: list[list[float]] = [[], [], []]
        for r in range(runs):  # wall times without the proxy
            m = env.mount(tree, url, f"{tag}big-{r}", direct=True)
            for i in range(3):
                t0 = time.perf_counter()
                subprocess.run(ls_l, cwd=m, check=True, stdout=subprocess.DEVNULL)
                walls[i].append(time.perf_counter() - t0)
            env.umount(tree, m)
        print(f"  ls -l of {files} files without the proxy, medians of {runs} fresh nodes: "
              + ", ".join(f"{w}: {statistics.median(t):.2f} s"
                          for w, t in zip(names, walls, strict=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--trees", default=".",
                    help="comma-separated ckptfs checkouts to measure (default: this one)")
    ap.add_argument("--parts", default="ls,dcp,orbax,bigdir",
                    help="which of ls, dcp, orbax, bigdir (default: all)")
    ap.add_argument("--files", type=int, default=10000, help="files in bigdir (10000)")
    ap.add_argument("--runs", type=int, default=3, help="fresh nodes in bigdir (3)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"ls", "dcp", "orbax", "bigdir"}
    if unknown:
        ap.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    if "orbax" in parts and subprocess.run(
            [sys.executable, "-c", "import orbax.checkpoint"], capture_output=True).returncode:
        ap.error("the orbax part needs jax[cpu] and orbax-checkpoint (the test extra)")
    with environment() as env:
        for n, tree in enumerate(Path(t).resolve() for t in args.trees.split(",")):
            print(f"{tree}:")
            run_tree(env, tree, n, args.files, args.runs, parts)


if __name__ == "__main__":
    main()
