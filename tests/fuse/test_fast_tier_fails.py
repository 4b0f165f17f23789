"""A fast tier that fails, through real mounts: full, read-only or unmounted, a save goes
straight to the object store with no error to the writer (one warning line, the metric
says so) and back to the fast tier once it is usable; the object store unreachable, a
save stays in the fast tier and the mover catches up once the store is back."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultproxy import FaultProxy
from mounting import Mount, Nodes, is_mounted, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.format import manifests
from ckptfs.store.local import LocalStore

MiB = 2**20
UNUSABLE = "fast tier {} unusable"
USABLE_AGAIN = "fast tier {} usable again"


def mount_cmd(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(DIR, its file system): a 256 MiB tmpfs bind-mounted on DIR, so that DIR can be
    unmounted and mounted again with its contents. Unmounted at the end, always."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the fast tier is a tmpfs made full, read-only or unmounted")
    real, fast = tmp_path / "tier-fs", tmp_path / "fast"
    real.mkdir()
    fast.mkdir()
    mounted = []
    try:
        mount_cmd("-t", "tmpfs", "-o", "size=256m", "tmpfs", str(real))
        mounted.append(real)
        mount_cmd("--bind", str(real), str(fast))
        mounted.append(fast)
        yield fast, real
    finally:
        for path in (fast, real):
            while is_mounted(path):
                subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path) -> None:
    """Write a file into `directory` until its file system is full."""
    with open(directory / "filler", "wb") as f:
        block = bytes(MiB)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        with contextlib.suppress(OSError):  # the last partial block
            f.close()


def metrics(addr: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("ckptfs_fast_tier"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def save(node: Mount, step: int) -> dict[str, bytes]:
    """A training-like save: a directory, a model of a few MiB, a small meta file."""
    files = {f"step-{step}/model.bin": random_bytes(5 * MiB + step),
             f"step-{step}/meta.json": b'{"step": %d}\n' % step}
    (node / f"step-{step}").mkdir()
    for name, data in files.items():
        (node / name).write_bytes(data)
    return files


@pytest.mark.parametrize("failure", ["full", "read-only", "unmounted"])
def test_a_failed_fast_tier_sends_saves_to_the_store(failure: str, tier: tuple[Path, Path],
                                                     tmp_path: Path, nodes: Nodes) -> None:
    """Node a saves step-1 through the fast tier; the tier fails (full, read-only,
    unmounted); a save of step-2 raises nothing, `ckptfs sync` returns, the daemon's log
    has one warning line, the metric ckptfs_fast_tier_usable is 0 and `ckptfs status`
    says UNUSABLE; a node without the fast tier reads both steps from the object store
    byte for byte. Once the tier is usable again (a probe finds it so: one more line),
    step-3 goes to the fast tier again."""
    fast, real = tier
    store = tmp_path / "store"
    store.mkdir()
    a = nodes.mount(str(store), tmp_path, "a", "--fast-tier", str(fast), "--chunk-size", "1M",
                    "--metrics-addr", "127.0.0.1:0")
    url = str(fast)
    files = save(a, 1)
    run_cli("sync", str(a.path), "--timeout", "60")
    assert LocalStore(fast).head(manifests.file_key("step-1/model.bin")) is not None

    if failure == "full":
        fill(real)
    elif failure == "read-only":
        mount_cmd("-o", "remount,ro", str(real))
    else:
        subprocess.run(["umount", "-l", str(fast)], check=True)
        assert not (fast / manifests.INFO_KEY).exists()
    files.update(save(a, 2))
    run_cli("sync", str(a.path), "--timeout", "60")
    assert a.log().count(UNUSABLE.format(url)) == 1, a.log()
    st = a.status()
    assert st["fast_usable"] is False and st["fast_direct_ops"] > 0, st
    line = run_cli("status", str(a.path)).stdout
    assert f"fast tier    file://{fast} UNUSABLE since" in line, line
    seen = metrics(st["metrics_addr"])
    assert seen["ckptfs_fast_tier_usable"] == 0, seen
    assert seen["ckptfs_fast_tier_direct_bytes_total"] >= 5 * MiB, seen
    if failure == "unmounted":  # nothing of step-2 is only on this node's local disk
        assert not (fast / "pending").exists() or not any((fast / "pending").rglob("*"))

    b = nodes.mount(str(store), tmp_path, "b")
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name
    b.umount()

    if failure == "full":
        (real / "filler").unlink()
    elif failure == "read-only":
        mount_cmd("-o", "remount,rw", str(real))
    else:
        mount_cmd("--bind", str(real), str(fast))
    wait_until(lambda: a.status()["fast_usable"], 30, "a probe finds the fast tier usable")
    assert a.log().count(USABLE_AGAIN.format(url)) == 1, a.log()
    assert metrics(st["metrics_addr"])["ckptfs_fast_tier_usable"] == 1
    direct = a.status()["fast_direct_bytes"]
    files.update(save(a, 3))
    run_cli("sync", "--fast", str(a.path), "--timeout", "60")
    assert LocalStore(fast).head(manifests.file_key("step-3/model.bin")) is not None
    assert a.status()["fast_direct_bytes"] == direct
    a.umount()
    assert a.log().count(UNUSABLE.format(url)) == 1, a.log()
    c = nodes.mount(str(store), tmp_path, "c")
    for name, data in files.items():
        assert (c / name).read_bytes() == data, name
    c.umount()


def fail_all(method: str, path: str) -> bool:
    return True


def test_the_store_unreachable_keeps_saves_in_the_fast_tier(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """Every request to SeaweedFS fails (503): a save of step-2 on node a raises nothing,
    `sync --fast` returns, node b (same fast tier, mounted before) lists step-2 and reads
    it byte for byte from the fast tier, the fast tier stays usable; once the store
    answers again, `ckptfs sync` returns and a node without the fast tier reads
    everything from S3."""
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    common = ["--endpoint-url", proxy.endpoint, "--chunk-size", "1M", "--fast-tier", str(fast)]
    env = {**os.environ, "CKPTFS_FAST_LEASE": "2"}
    a = nodes.mount(url, tmp_path, "a", *common, env=env)
    b = nodes.mount(url, tmp_path, "b", *common, env=env)
    files = save(a, 1)
    run_cli("sync", str(a.path), "--timeout", "60")

    proxy.refuse(503, b'{"error": "unreachable"}', fail_all)
    files.update(save(a, 2))
    r = run_cli("sync", "--fast", str(a.path), "--timeout", "60")
    assert r.stdout.startswith("fast-durable: everything closed"), r.stdout
    assert sorted(os.listdir(b / "step-2")) == ["meta.json", "model.bin"]
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name
    st = a.status()
    assert st["fast_usable"] is True and not st["durable"] and st["fast_durable"], st
    assert LocalStore(fast).head(manifests.file_key("step-2/model.bin")) is not None

    proxy.refuse(503, b"", lambda method, path: False)
    run_cli("sync", str(a.path), "--timeout", "120")
    a.umount()
    b.umount()
    c = nodes.mount(url, tmp_path, "c", "--endpoint-url", seaweed.endpoint)
    for name, data in files.items():
        assert (c / name).read_bytes() == data, name
    c.umount()
