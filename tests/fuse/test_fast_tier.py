"""The fast tier through real mounts, SeaweedFS as the object store: a node that dies
after `ckptfs sync --fast`, before its uploads to S3, loses nothing; the fast tier keeps
only the newest checkpoints once S3 has the rest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from faultproxy import FaultProxy, chunk_put
from mounting import Mount, Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest
from ckptfs.store.local import LocalStore

MiB = 2**20
#: the checkpoint's size: small in CI; CKPTFS_TEST_FAST_TIER_MIB=200 for the full scenario
SIZE = int(os.environ.get("CKPTFS_TEST_FAST_TIER_MIB", "12")) * MiB


def test_node_lost_after_fast_sync_loses_nothing(proxy: FaultProxy, seaweed: SeaweedServer,
                                                 tmp_path: Path, nodes: Nodes) -> None:
    """Node a saves a checkpoint; `sync --fast` returns; a is killed (SIGKILL) while every
    chunk PUT to S3 is held, and its cache directory deleted. Node b (a fresh cache, the
    same fast tier) reads the checkpoint byte for byte at once. `ckptfs drain` then puts
    everything into S3 (once a's lease has run out), exit 0; with the fast tier deleted,
    a node without one reads it all from S3."""
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    env = {**os.environ, "CKPTFS_FAST_LEASE": "2"}
    common = ["--endpoint-url", proxy.endpoint, "--chunk-size", "1M"]
    files = {"step-1/model.bin": random_bytes(SIZE), "step-1/meta.json": b'{"step": 1}\n'}
    a = Mount(url, tmp_path, "a", extra=[*common, "--fast-tier", str(fast)], env=env)
    nodes.append(a)
    a.mount()
    proxy.hold(chunk_put)  # nothing a sends reaches S3's chunks/
    (a / "step-1").mkdir()
    for name, data in files.items():
        (a / name).write_bytes(data)
    r = run_cli("sync", "--fast", str(a.path))
    assert r.stdout.startswith("fast-durable: everything closed"), r.stdout
    wait_until(lambda: proxy.held > 0, 30, "a's mover is copying a chunk to S3")
    a.kill()
    shutil.rmtree(a.cache)
    assert proxy.requests_where(chunk_put, status=200) == []

    b = Mount(url, tmp_path, "b", extra=[*common, "--fast-tier", str(fast)], env=env)
    nodes.append(b)
    b.mount()
    assert sorted(os.listdir(b / "step-1")) == ["meta.json", "model.bin"]
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name

    proxy.release()
    r = run_cli("drain", url, "--fast-tier", str(fast), "--endpoint-url", proxy.endpoint,
                "--interval", "0", env=env)
    assert r.stdout.startswith("drained: "), r.stdout
    assert not (fast / "pending").exists() or not any((fast / "pending").iterdir())
    b.umount()

    shutil.rmtree(fast)
    c = nodes.mount(url, tmp_path, "c", "--endpoint-url", seaweed.endpoint)
    for name, data in files.items():
        assert (c / name).read_bytes() == data, name
    c.umount()


def test_a_mount_killed_while_moving_finishes_at_its_next_mount(tmp_path: Path,
                                                                nodes: Nodes) -> None:
    """A mount is killed by a crash point right after its mover PUT a file's manifest
    into the store, before it deleted the file's pending record: mounted again on the
    same cache directory, it moves what its queue still holds, and `ckptfs sync` returns
    with the file in the store (read with no fast tier), byte for byte."""
    store, fast = tmp_path / "store", tmp_path / "fast"
    store.mkdir()
    fast.mkdir()
    data = random_bytes(3 * MiB)
    a = Mount(str(store), tmp_path, "a", extra=["--fast-tier", str(fast)],
              env={**os.environ, "CKPTFS_CRASH_AT": "fast_manifest_put"})
    nodes.append(a)
    a.mount()
    (a / "d").mkdir()
    (a / "d/a.bin").write_bytes(data)
    assert a.exited(30) and a.exit_code == -9
    a.cleanup()
    assert len(list((fast / "pending").rglob("*%o"))) == 1
    a.env = None
    a.mount()
    run_cli("sync", str(a.path), "--timeout", "20")
    assert not list((fast / "pending").rglob("*%o"))
    a.umount()
    assert stored_file(LocalStore(store), "d/a.bin") == data


def test_the_fast_tier_keeps_the_two_newest_checkpoints(seaweed: SeaweedServer,
                                                        tmp_path: Path, nodes: Nodes) -> None:
    """8 saves (step-1 .. step-8, a chunk shared by all) with --fast-keep 2: once S3 has
    everything, the fast tier holds the manifests of step-7 and step-8 and the chunks
    they name, nothing else of the steps; `ckptfs drain --fast-keep 1` leaves step-8
    only; a node with a fresh cache reads every step byte for byte (the older ones from
    S3)."""
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    env = {**os.environ, "CKPTFS_FAST_LEASE": "2"}  # the mover looks every 0.7 s
    common = ["--endpoint-url", seaweed.endpoint, "--chunk-size", "1M", "--fast-tier",
              str(fast)]
    shared = random_bytes(MiB)
    files = {}
    for step in range(1, 9):
        files[f"step-{step}/model.bin"] = shared + random_bytes(1000 + step)
        files[f"step-{step}/meta.json"] = b'{"step": %d}\n' % step
    a = nodes.mount(url, tmp_path, "a", *common, "--fast-keep", "2", env=env)
    for name, data in files.items():
        (a / name).parent.mkdir(exist_ok=True)
        (a / name).write_bytes(data)
    run_cli("sync", str(a.path), "--timeout", "60")
    tier = LocalStore(fast)

    def steps_in_fast() -> set[str]:
        return {manifests.path_of_key(i.key).partition("/")[0]
                for i in tier.scan(manifests.FILES)}

    def chunks_in_fast() -> set[str | None]:
        return {manifests.chunk_name(i.key) for i in tier.scan(manifests.CHUNKS)}

    def named() -> set[str | None]:  # the shared chunk, and each file's own
        return {h for step in (7, 8) for name in ("model.bin", "meta.json")
                for h, _ in Manifest.from_json(
                    tier.get(manifests.file_key(f"step-{step}/{name}"))).chunks}

    wait_until(lambda: steps_in_fast() == {"step-7", "step-8"}
               and chunks_in_fast() == named(), 30,
               "the fast tier holds step-7 and step-8 only, and the chunks they name")
    assert len(named()) == 5
    r = run_cli("drain", url, "--fast-tier", str(fast), "--endpoint-url", seaweed.endpoint,
                "--fast-keep", "1", "--interval", "0", env=env)
    assert "removed from the fast tier: 2 manifests" in r.stdout, r.stdout
    assert steps_in_fast() == {"step-8"}
    b = nodes.mount(url, tmp_path, "b", *common, env=env)
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name
    b.umount()
    a.umount()


def stored_file(store: LocalStore, path: str) -> bytes:
    """A file's bytes as the store alone holds them (its manifest, its chunks)."""
    m = Manifest.from_json(store.get(manifests.file_key(path)))
    return b"".join(bytes(codec.decode_chunk(store.get(manifests.chunk_key(h)), h))
                    for h, _ in m.chunks)
