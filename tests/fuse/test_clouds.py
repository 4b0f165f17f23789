"""Real mounts on the Azure (Azurite) and GCS (fake-gcs-server) stores: a torch checkpoint
saved, unmounted and loaded on a fresh node; two nodes (close-to-open, a directory rename);
throttling through the fault proxy; the store tools on the new URLs.

The local and S3 stores run the same stories in test_checkpoints.py and test_multinode.py;
only these run on the new stores, to keep the suite's time in check.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path

import pytest
import torch
from azurite import AzuriteServer
from fakegcs import FakeGcsServer
from faultproxy import FaultProxy
from mounting import MountedStore, Nodes, run_cli
from support import random_bytes, wait_until
from training import assert_same, training_state

from ckptfs.store import open_store

MiB = 2**20


def count_objects(url: str, extra: list[str], prefix: str = "chunks/") -> int:
    """How many objects the store at `url` holds under `prefix`."""
    store = open_store(url, endpoint_url=extra[1] if extra else None)
    try:
        return len(store.list(prefix, None).objects)
    finally:
        store.close()


def mounted_store(url: str, extra: list[str]) -> MountedStore:
    return MountedStore(url, extra, lambda: count_objects(url, extra))


@pytest.fixture(params=["azure", "gcs"])
def cloud(request: pytest.FixtureRequest) -> MountedStore:
    """A fresh container (Azurite) or bucket (fake-gcs-server) to mount; `extra` names the
    endpoint (the session's environment does too: a connection string, STORAGE_EMULATOR_HOST)."""
    prefix = f"run-{uuid.uuid4().hex[:6]}"
    if request.param == "azure":
        azurite: AzuriteServer = request.getfixturevalue("azurite")
        container = azurite.new_container()
        request.addfinalizer(lambda: azurite.drop_container(container))
        return mounted_store(f"az://{container}/{prefix}", ["--endpoint-url", azurite.endpoint])
    fakegcs: FakeGcsServer = request.getfixturevalue("fakegcs")
    bucket = fakegcs.new_bucket()
    request.addfinalizer(lambda: fakegcs.drop_bucket(bucket))
    return mounted_store(f"gs://{bucket}/{prefix}", ["--endpoint-url", fakegcs.endpoint])


def test_torch_checkpoint_survives_remount_on_another_node(
        cloud: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """Save on node A, umount (everything in the store), load on node B with an empty
    cache: exact tensors. Then the store tools on the URL: ls, verify, latest, fsck, gc."""
    state = training_state(64)  # 65 MiB: more than four 16 MiB chunks
    a = cloud.node(nodes, tmp_path, "a")
    (a / "step-1000").mkdir()
    torch.save(state, a / "step-1000" / "rank0.pt")
    size = (a / "step-1000" / "rank0.pt").stat().st_size
    assert size > 60 * MiB
    r = a.umount()
    assert "everything is in the store" in r.stdout
    assert cloud.count_chunks() >= size // (16 * MiB)

    chunks = cloud.count_chunks()
    # another node: its own, empty cache; no trash, so that a delete leaves garbage at once
    b = cloud.node(nodes, tmp_path, "b", "--trash-hours", "0")
    assert_same(state, torch.load(b / "step-1000" / "rank0.pt", weights_only=False))
    assert b.status()["fetched_bytes"] >= size

    url, extra = cloud.url, cloud.extra
    assert "step-1000/" in run_cli("ls", url, *extra).stdout
    assert "rank0.pt" in run_cli("ls", url, "step-1000", *extra).stdout
    run_cli("verify", url, "step-1000", *extra)
    assert run_cli("latest", url, "", "--pattern", "step-*", *extra).stdout.strip().endswith(
        "step-1000")
    run_cli("fsck", url, *extra)
    # the checkpoint deleted: gc sets its chunks aside, then the next run frees them
    shutil.rmtree(b / "step-1000")
    b.umount()
    gc = json.loads(run_cli("gc", url, "--grace", "0", "--no-writers", "--json", *extra).stdout)
    assert gc["fossilized"]["count"] == chunks and gc["freed"]["count"] == 0, gc
    aside = gc["fossilized"]["bytes"]
    gc = json.loads(run_cli("gc", url, "--grace", "0", "--no-writers", "--json", *extra).stdout)
    assert gc["freed"] == {"count": chunks, "bytes": aside}, gc
    assert count_objects(url, extra) == count_objects(url, extra, "fossils/") == 0


def test_two_nodes_close_to_open_and_directory_rename(
        cloud: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """A file closed on A is seen whole on B; a directory renamed on B is seen under its
    new name on A and is gone under its old one."""
    a = cloud.node(nodes, tmp_path, "a", "--chunk-size", "1M")
    b = cloud.node(nodes, tmp_path, "b", "--chunk-size", "1M")
    data = random_bytes(3 * MiB + 17)
    (a / "step-1.tmp").mkdir()
    with open(a / "step-1.tmp" / "w.pt", "wb") as f:
        f.write(data)
    wait_until(lambda: (b / "step-1.tmp" / "w.pt").exists(), 30, "B sees the file",
               ignore=(OSError,))
    assert (b / "step-1.tmp" / "w.pt").stat().st_size == len(data)
    assert (b / "step-1.tmp" / "w.pt").read_bytes() == data
    os.rename(b / "step-1.tmp", b / "step-1")
    wait_until(lambda: (a / "step-1" / "w.pt").exists(), 30, "A sees the new name",
               ignore=(OSError,))
    wait_until(lambda: not (a / "step-1.tmp").exists(), 30, "A loses the old name",
               ignore=(OSError,))
    assert (a / "step-1" / "w.pt").read_bytes() == data
    assert sorted(os.listdir(a.path)) == ["step-1"]
    a.umount()
    b.umount()


def test_throttled_store_everything_lands(cloud: MountedStore, nodes: Nodes,
                                          tmp_path: Path) -> None:
    """Through a FaultProxy that answers 503 to the first two tries of every request (the
    SDK's two attempts, so ckptfs must retry itself) and to 10% after that: a save with a
    file rename lands byte-exact, and a fresh node reads it under throttled GETs."""
    endpoint = cloud.extra[1]
    upstream = endpoint.rsplit("/devstoreaccount1", 1)[0]
    proxy = FaultProxy(upstream)
    try:
        through = endpoint.replace(upstream, proxy.endpoint)
        a = nodes.mount(cloud.url, tmp_path, "a", "--endpoint-url", through,
                        "--chunk-size", "1M")
        proxy.throttle(0.1, lambda m, p: True, first=2)  # after the mount (it needs the store)
        files = {f"ckpt/rank{i}.bin": random_bytes(3 * MiB + i) for i in range(2)}
        (a / "ckpt").mkdir()
        for name, data in files.items():
            (a / f"{name}.tmp").write_bytes(data)
            os.rename(a / f"{name}.tmp", a / name)
        r = a.umount()
        assert r.returncode == 0 and "everything is in the store" in r.stdout
        assert len(proxy.injected) > 20
        log = (a.cache / "ckptfs.log").read_text()
        assert "upload failed (retrying)" in log and "HTTP 503" in log, log

        proxy.throttle(0.0, lambda m, p: False)
        b = nodes.mount(cloud.url, tmp_path, "b", "--endpoint-url", through)
        assert sorted(os.listdir(b / "ckpt")) == ["rank0.bin", "rank1.bin"]
        proxy.throttle(0.1, lambda m, p: m == "GET", first=2)
        before = len(proxy.injected)
        for name, data in files.items():
            assert (b / name).read_bytes() == data, name
        throttled = Counter(proxy.injected[before:])
        assert throttled and min(throttled.values()) >= 2, throttled  # each GET twice
        proxy.throttle(0.0, lambda m, p: False)
        b.umount()
    finally:
        proxy.close()
