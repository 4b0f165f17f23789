"""The tools that change a store, with a fast tier, through real mounts (SeaweedFS as the
object store, a directory as the fast tier): prune removes checkpoints from every node's
view and the fast tier, and refuses the store alone; trash restore brings one back for
every node; gc counts the fast tier; --fast-size keeps the fast tier under its size but
for the newest complete checkpoint, and says so once."""

from __future__ import annotations

import os
from pathlib import Path

from mounting import Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.format import manifests
from ckptfs.store.local import LocalStore

MiB = 2**20


def steps_in(tier: LocalStore) -> set[str]:
    return {manifests.path_of_key(i.key).partition("/")[0] for i in tier.scan(manifests.FILES)}


def save(mnt: Path, steps: range, own: int = 1000) -> dict[str, bytes]:
    files = {}
    for step in steps:
        (mnt / f"step-{step}").mkdir()
        for name, data in ((f"step-{step}/model.bin", random_bytes(own + step)),
                           (f"step-{step}/meta.json", b'{"step": %d}\n' % step)):
            (mnt / name).write_bytes(data)
            files[name] = data
    return files


def test_prune_restore_and_gc_with_a_fast_tier(seaweed: SeaweedServer, tmp_path: Path,
                                               nodes: Nodes) -> None:
    """5 steps through a fast-tier mount that keeps them all in the fast tier. `prune`
    of the store without --fast-tier is refused (exit 2) with the command that works;
    with it, step-1..3 leave every node's view (the writer's, a fresh fast-tier node's)
    and the fast tier; `trash restore` of step-2 on the mounted path brings it back for
    every node, byte for byte, a node without the fast tier too; `gc` with the fast tier
    reports it and loses nothing."""
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    env = {**os.environ, "CKPTFS_FAST_LEASE": "2"}
    endpoint = ["--endpoint-url", seaweed.endpoint]
    common = [*endpoint, "--fast-tier", str(fast)]
    a = nodes.mount(url, tmp_path, "a", *common, "--fast-keep", "8", env=env)
    files = save(a.path, range(1, 6))
    run_cli("sync", str(a.path), "--timeout", "60")
    tier = LocalStore(fast)
    assert steps_in(tier) == {f"step-{s}" for s in range(1, 6)}

    r = run_cli("prune", url, "--keep-last", "2", *endpoint, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "written through a fast tier" in r.stderr and "--fast-tier DIR" in r.stderr

    r = run_cli("prune", url, "--keep-last", "2", *common)
    assert r.stdout.splitlines()[-1].startswith("done         removed 3 of 5"), r.stdout
    assert steps_in(tier) == {"step-4", "step-5"}
    b = nodes.mount(url, tmp_path, "b", *common, env=env)
    wait_until(lambda: sorted(os.listdir(a.path)) == ["step-4", "step-5"], 10,
               "the writer's mount no longer lists step-1..3")
    assert sorted(os.listdir(b.path)) == ["step-4", "step-5"]

    r = run_cli("trash", "restore", url, "step-2", *endpoint, check=False)
    assert r.returncode == 2 and "--fast-tier DIR" in r.stderr, r.stderr
    run_cli("trash", "restore", str(a / "step-2"))  # the mount's fast tier
    c = nodes.mount(url, tmp_path, "c", *endpoint)
    for node in (a, b, c):
        step_2 = node / "step-2"
        wait_until(step_2.is_dir, 10, f"{node.path} sees step-2")
        for name in ("step-2/model.bin", "step-2/meta.json", "step-5/model.bin"):
            assert (node / name).read_bytes() == files[name], (node.path, name)

    for node in (c, b, a):
        node.umount()
    r = run_cli("gc", url, *common, "--grace", "0", "--no-writers")
    assert "fast tier    " in r.stdout, r.stdout
    d = nodes.mount(url, tmp_path, "d", *common, env=env)
    for name in ("step-2/model.bin", "step-4/model.bin", "step-5/meta.json"):
        assert (d / name).read_bytes() == files[name], name
    d.umount()


def test_fast_size_keeps_the_fast_tier_small(seaweed: SeaweedServer, tmp_path: Path,
                                             nodes: Nodes) -> None:
    """--fast-keep 8 --fast-size 1M, 5 steps of 1 MiB each: once S3 has them, the fast
    tier holds step-5 alone (the newest complete; more than 1 MiB, so the log says once
    that what must stay is over the size, and `drain --fast-size 1M` prints it); every
    step reads byte for byte on a new node."""
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    env = {**os.environ, "CKPTFS_FAST_LEASE": "2"}
    common = ["--endpoint-url", seaweed.endpoint, "--fast-tier", str(fast)]
    a = nodes.mount(url, tmp_path, "a", *common, "--fast-keep", "8", "--fast-size", "1M",
                    env=env)
    files = save(a.path, range(1, 6), own=MiB)
    run_cli("sync", str(a.path), "--timeout", "60")
    tier = LocalStore(fast)
    wait_until(lambda: steps_in(tier) == {"step-5"}, 30, "the fast tier holds step-5 only")
    wait_until(lambda: "more than --fast-size" in a.log(), 10, "the log says it is over")
    for name, data in files.items():  # reads; the mover trims again meanwhile
        assert (a / name).read_bytes() == data, name
    a.umount()
    assert a.log().count("more than --fast-size") == 1, a.log()
    r = run_cli("drain", url, *common, "--fast-keep", "8", "--fast-size", "1M",
                "--interval", "0", env=env)
    assert "the fast tier still holds" in r.stdout and "more than --fast-size 1M" in r.stdout
    assert steps_in(tier) == {"step-5"}
    b = nodes.mount(url, tmp_path, "b", *common, env=env)
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name
    b.umount()
