"""The metrics endpoint (--metrics-addr): scraped during a save and after sync, parsed with
prometheus_client's own parser, its byte counters checked against `ckptfs status`."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from faultproxy import FaultProxy
from mounting import MountedStore, Nodes, run_cli
from prometheus_client.parser import text_string_to_metric_families
from seaweed import SeaweedServer
from support import random_bytes

MiB = 2**20

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(addr: str) -> Samples:
    """Every sample of http://ADDR/metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def stable_pair(mnt: Any, addr: str) -> tuple[dict[str, Any], Samples]:
    """A status and a scrape between which the byte counters did not move (uploads run
    in the background): the status read before and after the scrape agree."""
    fields = ("written_bytes", "uploaded_bytes", "stored_bytes", "dirty_bytes")
    for _ in range(50):
        before = mnt.status()
        samples = scrape(addr)
        after = mnt.status()
        if all(before[f] == after[f] for f in fields):
            return after, samples
    raise AssertionError("the counters never held still for one scrape")


def test_metrics_during_a_save_and_after_sync_match_status(
        store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    a = nodes.mount(store.url, tmp_path, "a", *store.extra, "--chunk-size", "1M",
                    "--metrics-addr", "127.0.0.1:0")
    addr = a.status()["metrics_addr"]
    host, _, port = addr.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert f"metrics on http://{addr}/metrics" in a.log()
    idle = scrape(addr)
    assert idle["ckptfs_written_bytes_total", ()] == 0
    assert idle["ckptfs_durable", ()] == 1
    info = [labels for name, labels in idle if name == "ckptfs_info"]
    assert info and dict(info[0])["store"] == a.status()["store"].split("?")[0]

    data = random_bytes(8 * MiB)
    with open(a.path / "model.bin", "wb") as f:  # a save: kept open while it is written
        for i in range(0, len(data), MiB):
            f.write(data[i:i + MiB])
            f.flush()  # O_WRONLY is direct I/O: each write is in the daemon on return
        status, during = stable_pair(a, addr)
        assert during["ckptfs_written_bytes_total", ()] == status["written_bytes"] == len(data)
        assert during["ckptfs_uploaded_bytes_total", ()] == status["uploaded_bytes"]
        assert during["ckptfs_dirty_bytes", ()] == status["dirty_bytes"]
        assert during["ckptfs_open_files", ()] == status["open_files"], status
        assert during["ckptfs_durable", ()] == status["durable"]
        writes = during["ckptfs_fuse_request_duration_seconds_count", (("op", "write"),)]
        assert writes >= 8

    a.sync()
    status, synced = stable_pair(a, addr)
    assert synced["ckptfs_written_bytes_total", ()] == status["written_bytes"] == len(data)
    uploaded = synced["ckptfs_uploaded_bytes_total", ()]
    assert uploaded == status["uploaded_bytes"] == len(data)  # random bytes: no dedup
    assert synced["ckptfs_uploaded_bytes_total", ()] > during["ckptfs_uploaded_bytes_total", ()] \
        or during["ckptfs_uploaded_bytes_total", ()] == len(data)
    assert synced["ckptfs_stored_bytes_total", ()] == status["stored_bytes"] > 0
    assert synced["ckptfs_published_bytes_total", ()] == len(data)
    assert synced["ckptfs_durable", ()] == 1
    assert synced["ckptfs_seconds_since_durable", ()] < 5
    assert synced["ckptfs_lost_files", ()] == 0
    assert synced["ckptfs_pending_chunks", ()] == 0
    puts = synced["ckptfs_store_request_duration_seconds_count", (("kind", "put"),)]
    assert puts >= 8  # 8 chunks, a manifest
    assert synced["ckptfs_store_request_duration_seconds_bucket",
                  (("kind", "put"), ("le", "+Inf"))] == puts
    a.umount()


def test_retries_and_store_errors_are_counted(proxy: FaultProxy, seaweed: SeaweedServer,
                                              tmp_path: Path, nodes: Nodes) -> None:
    """Every chunk PUT answered 503 SlowDown twice (both of botocore's attempts), so ckptfs
    tries each once more: ckptfs_retries_total{what="upload"} counts them, as status
    `retries` does, and the errors are counted by kind and class."""
    a = nodes.mount(f"s3://{seaweed.new_bucket()}/job", tmp_path, "a", "--endpoint-url",
                    proxy.endpoint, "--chunk-size", "1M", "--metrics-addr", "127.0.0.1:0")
    addr = a.status()["metrics_addr"]
    assert ("ckptfs_retries_total", (("what", "upload"),)) not in scrape(addr)
    proxy.throttle(0.0, lambda m, p: m == "PUT" and "/chunks/" in p, first=2)
    (a.path / "model.bin").write_bytes(random_bytes(3 * MiB))
    a.sync()
    status, samples = stable_pair(a, addr)
    retried = samples["ckptfs_retries_total", (("what", "upload"),)]
    assert retried >= 3 and retried == status["retries"]["upload"], status["retries"]
    failed = samples["ckptfs_store_request_errors_total",
                     (("error", "TransientStoreError"), ("kind", "put"))]
    assert failed >= 3
    assert "retries      " in run_cli("status", str(a.path)).stdout
    a.umount()
