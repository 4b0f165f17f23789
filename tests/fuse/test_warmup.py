"""`ckptfs warmup`: a checkpoint fetched into a fresh node's cache before it is read.

On SeaweedFS: warm-up adds no store-specific code (it fetches through Fetcher.fetch, the
path of every read), and S3 is where a fetch is a request to count. The error lines
need no store server: the directory store.
"""

from __future__ import annotations

from pathlib import Path

from faultproxy import FaultProxy, chunk_put
from mounting import Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes

MiB = 2**20


def chunk_get(method: str, path: str) -> bool:
    return method == "GET" and "/chunks/" in path


def test_warmup_latest_then_reads_fetch_nothing(seaweed: SeaweedServer, tmp_path: Path,
                                                 nodes: Nodes) -> None:
    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", seaweed.endpoint, "--chunk-size", "1M")
    files = {"step-9/model.pt": random_bytes(MiB // 2), "step-10/model.pt": random_bytes(
        2 * MiB + 17), "step-10/optim/state.pt": random_bytes(MiB + 5)}
    for name, data in files.items():
        (a / "run" / name).parent.mkdir(parents=True, exist_ok=True)
        (a / "run" / name).write_bytes(data)
    a.sync()
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)  # a fresh cache
    r = run_cli("warmup", str(b / "run"), "--latest", "--pattern", "step-*")
    newest = sum(len(d) for n, d in files.items() if n.startswith("step-10/"))
    assert r.stdout.startswith(f"warmed {b.path}/run/step-10: ")
    assert b.status()["fetched_bytes"] == newest  # step-10 only, every byte of it
    model = run_cli("warmup", str(b / "run" / "step-10" / "model.pt"))
    assert model.stdout == (f"warmed {b.path}/run/step-10/model.pt: 2.0 MiB of 2.0 MiB in "
                            f"this node's cache (0 B fetched, 2.0 MiB held already)\n")
    # as in a job script (docs/OPERATIONS.md); everything is held already: nothing fetched
    again = run_cli("warmup", str(b / "run"), "--latest", "--pattern", "step-*", "--no-wait")
    assert again.stdout == f"warming {b.path}/run/step-10: 3.0 MiB in 2 files, in the " \
        "background\n"
    for name, data in files.items():
        if name.startswith("step-10/"):
            assert (b / "run" / name).read_bytes() == data
    assert b.status()["fetched_bytes"] == newest  # the reads fetched nothing


def test_warmup_larger_than_the_cache_warns_and_keeps_dirty_data(
        seaweed: SeaweedServer, proxy: FaultProxy, tmp_path: Path, nodes: Nodes) -> None:
    url = f"s3://{seaweed.new_bucket()}/run"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", seaweed.endpoint, "--chunk-size", "1M")
    big = random_bytes(6 * MiB)
    (a / "step-1").mkdir()
    (a / "step-1" / "model.pt").write_bytes(big)
    a.sync()
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", proxy.endpoint, "--cache-size", "4M")
    proxy.hold(chunk_put)  # what B writes stays dirty in its cache
    mine = random_bytes(MiB)
    (b / "mine.bin").write_bytes(mine)
    assert b.status()["dirty_bytes"] == MiB
    r = run_cli("warmup", str(b / "step-1"))
    # 4 MiB less B's 1 MiB staging file: 3 of the 6 chunks, in order
    assert r.stderr == ("ckptfs: warning: the cache has room for 3145728 bytes (--cache-size "
                        "less this node's staging files): warmed 3145728 of 6291456 bytes, "
                        "in path order; the rest is fetched when read\n")
    assert r.stdout.startswith(f"warmed {b.path}/step-1: 3.0 MiB of 6.0 MiB ")
    warmed = {r.path for r in proxy.requests_where(chunk_get)}
    assert len(warmed) == 3
    assert b.status()["dirty_bytes"] == MiB  # nothing dirty was dropped
    assert (b / "step-1" / "model.pt").read_bytes() == big
    fetched = [r.path for r in proxy.requests_where(chunk_get)][3:]
    assert len(fetched) == 3 and not warmed & set(fetched)  # the warmed half: from the cache
    proxy.release()
    b.sync()
    assert (a / "mine.bin").read_bytes() == mine


def test_warmup_errors_are_one_line(tmp_path: Path, nodes: Nodes) -> None:
    (tmp_path / "store").mkdir()  # nothing store-specific: the directory store
    a = nodes.mount(str(tmp_path / "store"), tmp_path, "a")
    (a / "run").mkdir()
    (a / "run" / "notes.txt").write_text("no checkpoints yet")
    a.sync()
    outside = tmp_path / "plain"
    outside.mkdir()
    for args, message in [
            ([str(outside)], f"ckptfs: not in a ckptfs mount: {outside}\n"),
            ([str(a / "run" / "nope.pt")],
             f"ckptfs: no such file or directory: {a.path}/run/nope.pt\n"),
            ([str(a / "run"), "--latest", "--pattern", "step-*"],
             f"ckptfs: no complete checkpoint directory matching 'step-*' in {a.path}/run\n")]:
        r = run_cli("warmup", *args, check=False)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", message)
    r = run_cli("warmup", str(a / "run"), "--pattern", "step-*", check=False)
    assert (r.returncode, r.stderr) == (2, "ckptfs: --pattern chooses among checkpoint "
                                           "directories: it needs --latest\n")
