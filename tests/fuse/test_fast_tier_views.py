"""The tools that look at a store know both tiers: with the object store's chunk PUTs held
(a proxy), a checkpoint saved through a fast tier is fast-durable and not durable, and
`status`, the metrics, `latest`, `verify`, `ls`, `du` and `fsck` each say so; a chunk
damaged in the fast tier is data loss only where the store has no sound copy; once the
store has everything, they all say durable."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from faultproxy import FaultProxy, chunk_put
from mounting import Mount, Nodes, run_cli
from prometheus_client.parser import text_string_to_metric_families
from seaweed import SeaweedServer
from support import random_bytes, wait_until

from ckptfs.format import manifests
from ckptfs.format.manifests import Manifest
from ckptfs.store.local import LocalStore

MiB = 2**20
STEP1 = {"step-1/model.bin": random_bytes(2 * MiB + 5), "step-1/meta.json": b'{"step": 1}\n'}
STEP2 = {"step-2/model.bin": random_bytes(3 * MiB + 7), "step-2/meta.json": b'{"step": 2}\n'}
STEP2_BYTES = sum(len(d) for d in STEP2.values())


def scrape(addr: str) -> dict[str, float]:
    """The unlabelled samples of http://ADDR/metrics, by name."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels}


def flip(path: Path) -> bytes:
    """Damage a chunk object (its last byte flipped); its bytes before."""
    os.chmod(path, 0o600)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    return data


def test_the_tools_see_both_tiers_while_the_store_lags(proxy: FaultProxy,
                                                       seaweed: SeaweedServer,
                                                       tmp_path: Path, nodes: Nodes) -> None:
    url = f"s3://{seaweed.new_bucket()}/job"
    fast = tmp_path / "fast"
    fast.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CKPTFS_FAST_TIER"}
    a = Mount(url, tmp_path, "a", extra=["--endpoint-url", proxy.endpoint, "--chunk-size",
                                         "1M", "--fast-tier", str(fast), "--metrics-addr",
                                         "127.0.0.1:0"], env=env)
    nodes.append(a)
    a.mount()
    for files in (STEP1, STEP2):
        (a / next(iter(files)).partition("/")[0]).mkdir()
    for name, data in STEP1.items():
        (a / name).write_bytes(data)
    a.sync()  # step-1: durable
    proxy.hold(chunk_put)  # step-2 reaches the fast tier, not S3
    for name, data in STEP2.items():
        (a / name).write_bytes(data)
    run_cli("sync", "--fast", str(a.path))
    wait_until(lambda: proxy.held > 0, 30, "a's mover is copying a chunk of step-2 to S3")
    tools = ["--endpoint-url", seaweed.endpoint]  # past the proxy
    tier = ["--fast-tier", str(fast), *tools]

    # status and the metrics: this mount's pending records hold step-2 back
    st = a.status()
    assert st["fast_durable"] is True and st["durable"] is False
    assert st["fast_pending_bytes"] == STEP2_BYTES and st["fast_pending_records"] >= 2
    moving = {f["path"]: f for f in st["files"] if f["state"] == "moving"}
    assert set(moving) == set(STEP2), st["files"]
    assert moving["step-2/model.bin"]["fast_durable"] is True
    assert moving["step-2/model.bin"]["durable"] is False
    text = run_cli("status", str(a.path)).stdout
    assert (f"moving       {st['fast_pending_records']} pending records "
            f"({STEP2_BYTES / MiB:.1f} MiB of files) from the fast tier to the store"
            in text), text
    metrics = scrape(st["metrics_addr"])
    assert metrics["ckptfs_fast_tier_pending_bytes"] == STEP2_BYTES
    assert metrics["ckptfs_fast_tier_pending_records"] == st["fast_pending_records"]
    step1_bytes = sum(len(d) for d in STEP1.values())
    assert metrics["ckptfs_fast_tier_moved_bytes_total"] == step1_bytes
    assert metrics["ckptfs_fast_tier_moved_records_total"] >= 3  # the marker, 2 files

    # latest: step-2 counts (every node with the fast tier reads it), not durable yet
    r = run_cli("latest", url, *tier)
    assert r.stdout == "step-2\n" and "in the fast tier only so far" in r.stderr, r
    got = json.loads(run_cli("latest", url, *tier, "--json").stdout)
    assert (got["path"], got["fast_durable"], got["durable"]) == ("step-2", True, False)
    assert run_cli("latest", url, *tier, "--durable").stdout == "step-1\n"
    assert run_cli("latest", url, *tools, env=env).stdout == "step-1\n"  # no fast tier
    assert run_cli("latest", str(a.path)).stdout == f"{a.path}/step-2\n"  # the mount's

    # verify: complete over both tiers; --durable names what S3 lacks, exit 1
    r = run_cli("verify", url, *tier)
    assert r.stdout.startswith("complete: 4 files") and (
        "; 2 of them in the fast tier only so far (fast-durable, not yet durable)"
        in r.stdout), r.stdout
    r = run_cli("verify", url, *tier, "--durable", check=False)
    assert r.returncode == 1, r
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("FAST ONLY")) == [
        f"FAST ONLY   {name}: in the fast tier, not yet in the store" for name in sorted(STEP2)]
    got = json.loads(run_cli("verify", url, *tier, "--json").stdout)
    assert got["complete"] is True and got["durable"] is False
    assert sorted(got["fast_only_files"]) == sorted(STEP2)
    assert run_cli("verify", url, "step-1", *tier, "--durable").returncode == 0

    # ls: a state per file
    states = {line.split()[-1]: line.split()[-2]
              for line in run_cli("ls", url, *tier).stdout.splitlines()}
    assert states == {**dict.fromkeys(STEP1, "ok"), **dict.fromkeys(STEP2, "fast-only")}

    # du: the fast tier's chunks, and what of them S3 lacks, per checkpoint too
    du = json.loads(run_cli("du", url, *tier, "--json").stdout)
    dirs = {d["path"]: d for d in du["dirs"]}
    assert dirs["step-1"]["pending_bytes"] == 0 and dirs["step-1"]["fast_chunks"] == 4
    assert dirs["step-2"]["pending_chunks"] == 5  # 4 of model.bin, 1 of meta.json
    assert du["fast_tier"]["pending_bytes"] == dirs["step-2"]["pending_bytes"] > STEP2_BYTES
    assert du["fast_tier"]["chunks"] == 9 and du["fast_tier"]["pending_records"] >= 2
    text = run_cli("du", url, *tier).stdout
    assert text.splitlines()[0].split()[:6] == ["directory", "files", "logical",
                                                "referenced", "unique", "pending"]
    assert f"fast tier    file://{fast}: 9 chunk objects" in text, text

    # fsck: both tiers, clean; the object store alone is a valid store too
    r = run_cli("fsck", url, *tier)
    assert r.stdout.splitlines()[-1].startswith("clean        0 problems"), r.stdout
    assert f"fast tier    file://{fast}: 9 chunk objects" in r.stdout, r.stdout
    got = json.loads(run_cli("fsck", url, *tier, "--json").stdout)
    assert got["fast_tier"]["pending_chunks"] == 5
    assert got["fast_tier"]["pending_records"]["files"] == 2
    assert run_cli("fsck", url, *tools, env=env).returncode == 0

    # a chunk damaged in the fast tier: of step-1 (S3 has it: reported, not data loss)...
    fast_store = LocalStore(fast)

    def chunk_file(name: str) -> Path:
        h = Manifest.from_json(fast_store.get(manifests.file_key(name))).chunks[0][0]
        path = fast_store.local_path(manifests.chunk_key(h))
        assert path is not None
        return Path(path)

    old = flip(chunk_file("step-1/model.bin"))
    r = run_cli("fsck", url, *tier, "--deep")
    assert "is damaged in the fast tier" in r.stdout and "not data loss" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1].startswith("clean"), r.stdout
    r = run_cli("verify", url, "step-1", *tier, "--deep")
    assert "the store has a sound copy, which readers read: not data loss" in r.stdout
    chunk_file("step-1/model.bin").write_bytes(old)
    # ... and of step-2 (S3 has not: data loss), exit 1 from fsck --deep and verify --deep
    old = flip(chunk_file("step-2/model.bin"))
    r = run_cli("fsck", url, *tier, "--deep", check=False)
    assert r.returncode == 1 and "damaged in the fast tier (" in r.stdout, r
    assert "and not in the store" in r.stdout, r.stdout
    r = run_cli("verify", url, "step-2", *tier, "--deep", check=False)
    assert r.returncode == 1 and r.stdout.startswith("INCOMPLETE  step-2/model.bin"), r
    chunk_file("step-2/model.bin").write_bytes(old)
    # a pending record that does not parse: fsck names it, exit 1
    bad = "pending/lost-node-0/000000000001"
    fast_store.put(bad, b"{not json")
    r = run_cli("fsck", url, *tier, check=False)
    assert r.returncode == 1 and f"DAMAGED      {bad}: pending record: " in r.stdout, r
    assert "in 2 queues" in r.stdout, r.stdout
    fast_store.delete(bad)

    # S3 takes it all: every tool says durable
    proxy.release()
    a.sync()
    st = a.status()
    assert st["durable"] is True and st["fast_pending_bytes"] == 0
    assert not [f for f in st["files"] if f["state"] == "moving"]
    metrics = scrape(st["metrics_addr"])
    assert metrics["ckptfs_fast_tier_pending_bytes"] == 0
    assert metrics["ckptfs_fast_tier_moved_bytes_total"] == step1_bytes + STEP2_BYTES
    got = json.loads(run_cli("latest", url, *tier, "--json").stdout)
    assert (got["path"], got["durable"]) == ("step-2", True)
    r = run_cli("verify", url, *tier, "--durable")
    assert "; all of them in the store (durable)" in r.stdout, r.stdout
    du = json.loads(run_cli("du", url, *tier, "--json").stdout)
    assert du["fast_tier"]["pending_bytes"] == 0
    a.umount()
