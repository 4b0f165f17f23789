"""Many nodes, one store: several mounts of one SeaweedFS bucket, each with its own cache.

Covers close-to-open visibility, directory operations seen across mounts, overwrite races,
the real multi-rank checkpoint patterns (torch.distributed.checkpoint, Orbax, HF Trainer,
DeepSpeed) and a directory rename killed halfway.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mounting import Mount, Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until


@pytest.fixture
def cluster(seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> Callable[..., Mount]:
    """A factory of mounted nodes (`nodes.mount`) on one fresh bucket."""
    url = f"s3://{seaweed.new_bucket()}/job-{uuid.uuid4().hex[:6]}"

    def node(name: str, *extra: str, env: dict[str, str] | None = None) -> Mount:
        return nodes.mount(url, tmp_path, name, "--endpoint-url", seaweed.endpoint,
                           "--chunk-size", "1M", *extra, env=env)

    return node


def eventually(check: Callable[[], object], what: str = "") -> None:
    """Until `check` holds on a node (an OSError counts as not yet: the node's view is
    catching up); other nodes see a change within the metadata TTL (1 s), and the wide
    bound is for a loaded machine."""
    wait_until(check, 30, what, interval=0.1, ignore=(OSError,))


def test_close_to_open_and_directories_across_nodes(cluster: Callable[..., Mount]) -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    data = random_bytes(3 * 2**20 + 17)
    (a / "step-1").mkdir()
    (a / "empty-dir").mkdir()
    with open(a / "step-1" / "w.pt", "wb") as f:
        f.write(data)
    # closed on A: B and C see it within the metadata TTL, with its size and bytes
    eventually(lambda: (b / "step-1" / "w.pt").exists())
    assert (b / "step-1" / "w.pt").stat().st_size == len(data)
    assert (c / "step-1" / "w.pt").read_bytes() == data
    assert (c / "empty-dir").is_dir()
    mtimes = [(m / "step-1" / "w.pt").stat().st_mtime for m in (a, b)]
    assert abs(mtimes[0] - mtimes[1]) < 1
    # a rename on B and an rmtree on C are observed everywhere
    (b / "step-1").rename(b / "step-1-final")
    eventually(lambda: (a / "step-1-final" / "w.pt").exists())
    eventually(lambda: not (a / "step-1").exists())
    assert (a / "step-1-final" / "w.pt").read_bytes() == data
    eventually(lambda: (c / "step-1-final" / "w.pt").exists())
    shutil.rmtree(c / "step-1-final")
    eventually(lambda: not (a / "step-1-final").exists() and not (b / "step-1-final").exists())


def test_overwrite_race_ends_with_one_whole_version(cluster: Callable[..., Mount]) -> None:
    a, b = cluster("a"), cluster("b")
    versions = {name: bytes([i]) * (2 * 2**20 + 5) for i, name in enumerate(("a", "b"))}

    def writer(m: Mount, body: bytes) -> None:
        for _ in range(5):
            with open(m / "latest.pt", "wb") as f:
                f.write(body)

    threads = [threading.Thread(target=writer, args=(m, versions[n]))
               for n, m in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.umount()
    b.umount()
    c = cluster("c")
    seen = (c / "latest.pt").read_bytes()
    assert seen in versions.values()  # one version, never a mix of the two


DCP_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    rank, world, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ckpt_dir = sys.argv[5 + rank]        # each rank saves through its own node's mount
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(100 + rank)
    state = {f"rank{rank}.w{i}": torch.randn(256, 1024) for i in range(4)}
    state["shared"] = torch.arange(1000.0)
    if mode == "save":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt_dir))
    else:
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(target, storage_reader=dcp.FileSystemReader(ckpt_dir))
        for k, v in state.items():
            assert torch.equal(target[k], v), k
        print("rank", rank, "verified", len(target))
    dist.barrier()
    dist.destroy_process_group()
""")


def run_ranks(tmp_path: Path, mode: str, dirs: list[Path]) -> None:
    script = tmp_path / "dcp_job.py"
    script.write_text(DCP_SCRIPT)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(len(dirs)), str(port),
                               mode, *map(str, dirs)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(len(dirs))]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out


def test_torch_distributed_checkpoint_across_nodes(cluster: Callable[..., Mount],
                                                   tmp_path: Path) -> None:
    a, b = cluster("a"), cluster("b")
    run_ranks(tmp_path, "save", [a / "dcp" / "step-5", b / "dcp" / "step-5"])
    a.umount()
    b.umount()
    # load on swapped, fresh nodes: rank 0 reads through what was node b's view and v.v.
    c, d = cluster("c"), cluster("d")
    names = sorted(p.name for p in (c / "dcp" / "step-5").iterdir())
    assert ".metadata" in names and sum(n.endswith(".distcp") for n in names) == 2
    run_ranks(tmp_path, "load", [d / "dcp" / "step-5", c / "dcp" / "step-5"])


def test_orbax_style_tmp_dir_commit(cluster: Callable[..., Mount]) -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    tmp = "100.orbax-checkpoint-tmp-1234"
    (a / tmp).mkdir()
    shards = {}
    for i, m in enumerate((a, b)):  # both ranks write into the tmp dir, each on its node
        eventually((m / tmp).is_dir)
        shards[f"shard{i}"] = random_bytes(2 * 2**20 + i)
        (m / tmp / f"shard{i}").write_bytes(shards[f"shard{i}"])
    eventually(lambda: len(list((a / tmp).iterdir())) == 2)
    (a / tmp).rename(a / "100")  # rank 0 commits by renaming the directory
    eventually(lambda: (c / "100").is_dir() and not (c / tmp).exists())
    for name, data in shards.items():
        assert (c / "100" / name).read_bytes() == data


def test_hf_trainer_rotation_and_deepspeed_latest(cluster: Callable[..., Mount]) -> None:
    a, b = cluster("a"), cluster("b")
    for step in (10, 20, 30):
        for rank, m in enumerate((a, b)):
            d = m / f"checkpoint-{step}"
            d.mkdir(exist_ok=True)
            torch.save({"rank": rank, "step": step, "w": torch.randn(64, 64)},
                       d / f"rng_state_{rank}.pth")
        (a / "latest").write_text(f"global_step{step}")  # DeepSpeed: rewritten in place
        def latest_seen(want: str = f"global_step{step}") -> bool:
            return (b / "latest").read_text() == want

        eventually(latest_seen)
        kept = sorted(p for p in a.path.glob("checkpoint-*"))
        for old in kept[:-2]:  # save_total_limit=2: rank 0 rotates with rmtree
            def both_ranks_saved(old: Path = old) -> bool:
                return len(list(old.iterdir())) == 2

            eventually(both_ranks_saved)
            shutil.rmtree(old)
    eventually(lambda: sorted(p.name for p in b.path.glob("checkpoint-*")) ==
               ["checkpoint-20", "checkpoint-30"])
    assert torch.load(b / "checkpoint-30" / "rng_state_0.pth")["step"] == 30


def test_directory_rename_killed_halfway_is_completed_by_the_next_mount(
        cluster: Callable[..., Mount], seaweed: SeaweedServer) -> None:
    env = {**os.environ, "CKPTFS_CRASH_AT": "rename_dir_copied"}
    a = cluster("a", env=env)
    files = {f"f{i}": random_bytes(300_000 + i) for i in range(20)}
    (a / "tmp-ckpt").mkdir()
    for name, data in files.items():
        (a / "tmp-ckpt" / name).write_bytes(data)
    with pytest.raises(OSError) as e:  # the daemon dies after copying, before deleting
        (a / "tmp-ckpt").rename(a / "step-7")
    assert e.value.errno in (errno.EIO, errno.ENOTCONN, errno.ECONNABORTED), e.value
    assert a.wait_exit(30) == -9  # killed at the crash point (no flush finished the rename)
    a.cleanup()
    # what it left in the store: both trees, and the intent that says which one is real
    bucket, _, prefix = a.store[len("s3://"):].partition("/")
    pages = seaweed.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = {o["Key"][len(prefix) + 1:] for p in pages for o in p.get("Contents", [])}
    # (SeaweedFS lists no copy of a directory marker: "files/step-7/" may be absent)
    for tree in ("tmp-ckpt", "step-7"):
        assert {k for k in keys if k.startswith(f"files/{tree}/")} - {"files/step-7/"} == {
            *(f"files/{tree}/{name}" for name in files)} | (
                {"files/tmp-ckpt/"} if tree == "tmp-ckpt" else set()), sorted(keys)
    [intent] = [k for k in keys if k.startswith("intents/")]
    body = json.loads(seaweed.s3.get_object(Bucket=bucket, Key=f"{prefix}/{intent}")
                      ["Body"].read())
    assert (body["op"], body["src"], body["dst"]) == ("rename_dir", "tmp-ckpt", "step-7")
    b = cluster("b")  # another node: rolls the rename forward at mount
    eventually(lambda: (b / "step-7").is_dir() and not (b / "tmp-ckpt").exists())
    assert sorted(p.name for p in (b / "step-7").iterdir()) == sorted(files)
    for name, data in files.items():
        assert (b / "step-7" / name).read_bytes() == data


def test_chunks_of_a_lost_writer_give_eio_after_the_bound_and_latest_skips_it(
        cluster: Callable[..., Mount], seaweed: SeaweedServer) -> None:
    a = cluster("a")
    for step in (1, 2):
        (a / f"step-{step}").mkdir()
        (a / f"step-{step}" / "model.pt").write_bytes(random_bytes(2 * 2**20 + step))
    run_cli("sync", str(a.path))
    # node a "died before uploading" step-2's chunks: its manifest is in the store, a
    # chunk is not (removed here, as if it had never arrived)
    url = a.store
    bucket, _, prefix = url[len("s3://"):].partition("/")
    m = json.loads(seaweed.client().get_object(
        Bucket=bucket, Key=f"{prefix}/files/step-2/model.pt")["Body"].read())
    lost = m["chunks"][1][0]
    seaweed.client().delete_object(Bucket=bucket, Key=f"{prefix}/chunks/{lost[:2]}/{lost}")
    b = cluster("b", "--missing-chunk-timeout", "2")
    start = time.monotonic()
    with pytest.raises(OSError) as e:
        (b / "step-2" / "model.pt").read_bytes()
    assert e.value.errno == errno.EIO
    assert 1.5 < time.monotonic() - start < 30  # waited for the writer, with a bound
    log = (b.cache / "ckptfs.log").read_text()
    assert lost in log and "step-2/model.pt" in log and "a-mnt" in log  # file, chunk, writer
    assert (b / "step-1" / "model.pt").stat().st_size == 2 * 2**20 + 1
    extra = ["--endpoint-url", a.extra[1]]
    r = run_cli("verify", url, "step-2", *extra, check=False)
    assert r.returncode == 1 and lost in r.stdout + r.stderr
    r = run_cli("latest", url, "", "--pattern", "step-*", *extra)
    assert r.stdout.strip().endswith("step-1")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_directory_renamed_elsewhere_is_gone_under_its_old_name(
        kind: str, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """Node B has used `step_9.tmp`; node A renames it to `step_9`. As soon as B's
    listing no longer shows the old name, the old name and the paths under it give
    ENOENT on B: no stale entry in ckptfs, and B's kernel entry is invalidated
    (asynchronously: within milliseconds, not when the entry times out a TTL later)."""
    if kind == "local":
        store, extra = str(tmp_path / "store"), []
        (tmp_path / "store").mkdir()
    else:
        store = f"s3://{seaweed.new_bucket()}/job"
        extra = ["--endpoint-url", seaweed.endpoint]
    a, b = (nodes.mount(store, tmp_path, name, *extra) for name in ("a", "b"))
    (a / "step_9.tmp").mkdir()
    (a / "step_9.tmp" / "w.pt").write_bytes(b"weights")
    wait_until(lambda: (b / "step_9.tmp" / "w.pt").exists(), 30, "B sees step_9.tmp")
    os.rename(a / "step_9.tmp", a / "step_9")
    deadline = time.monotonic() + 10
    listing_lost = None
    while True:
        assert time.monotonic() < deadline, "B never saw the rename"
        listed = os.listdir(b.path)
        old_resolves = (b / "step_9.tmp").exists()
        now = time.monotonic()
        if listing_lost is None and "step_9.tmp" not in listed:
            assert listed == ["step_9"], listed
            listing_lost = now
        if listing_lost is not None:
            if not old_resolves:
                break
            assert now - listing_lost < 0.25, "the old name still resolves on B"
        time.sleep(0.01)
    assert not (b / "step_9.tmp" / "w.pt").exists()
    assert (b / "step_9" / "w.pt").read_bytes() == b"weights"
