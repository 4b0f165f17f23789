"""Real checkpoints through real mounts, on the local store and on SeaweedFS S3.

Each test is a user story: save with torch/safetensors on one node, `ckptfs umount`,
load on "another node" (a second mount with an empty cache), compare every tensor.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from faultproxy import FaultProxy, is_chunk
from mounting import MountedStore, Nodes, run_cli
from support import max_overlap, random_bytes, wait_until
from training import assert_same, training_state


def test_torch_checkpoint_survives_remount_on_another_node(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    state = training_state(64)  # 65 MiB: more than four 16 MiB chunks
    a = store.node(nodes, tmp_path, "a")
    (a / "step-1000").mkdir()
    torch.save(state, a / "step-1000" / "rank0.pt")
    size = (a / "step-1000" / "rank0.pt").stat().st_size
    assert size > 60 * 2**20
    r = a.umount()
    assert "everything is in the store" in r.stdout

    b = store.node(nodes, tmp_path, "b")  # another node: its own, empty cache
    assert not any((b.cache / "chunks").rglob("*.tmp*"))
    assert_same(state, torch.load(b / "step-1000" / "rank0.pt", weights_only=False))
    assert_same(state, torch.load(b / "step-1000" / "rank0.pt", mmap=True, weights_only=False))
    assert b.status()["fetched_bytes"] >= size
    b.umount()


def test_cold_open_prefetches_the_whole_file_in_parallel(
        store: MountedStore, nodes: Nodes, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """A fresh node reads only the end of a 24-chunk file (as torch.load reads the zip
    directory first): the rest of the file is fetched without being asked. On S3, where
    each chunk is a GET, through a proxy that delays them: the GETs overlap in time."""
    data = random_bytes(24 * 2**20)
    a = store.node(nodes, tmp_path, "a", "--chunk-size", "1M")
    (a / "ckpt.bin").write_bytes(data)
    a.umount()
    proxy: FaultProxy | None = None
    if store.url.startswith("s3://"):
        proxy = request.getfixturevalue("proxy")
        proxy.delay(0.1, lambda m, p: m == "GET" and is_chunk(m, p))
        b = nodes.mount(store.url, tmp_path, "b", "--endpoint-url", proxy.endpoint)
    else:
        b = store.node(nodes, tmp_path, "b")
    with open(b / "ckpt.bin", "rb") as f:
        f.seek(-100, os.SEEK_END)  # torch.load reads the zip directory at the end first
        assert f.read() == data[-100:]
        # the rest comes without being asked
        wait_until(lambda: int(str(b.status()["fetched_bytes"])) >= len(data), 120,
                   "the whole file is fetched")
        f.seek(0)
        assert f.read() == data
    if proxy is not None:
        gets = proxy.intervals(lambda m, p: m == "GET" and is_chunk(m, p))
        assert len(gets) == 24, len(gets)  # each chunk once
        assert max_overlap(gets) >= 4, gets  # in parallel


def test_safetensors_roundtrip(store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    torch.manual_seed(7)
    tensors = {f"w{i}": torch.randn(512, 1024) for i in range(20)}
    tensors["half"] = torch.randn(333, 77).half()
    a = store.node(nodes, tmp_path, "a")
    save_file(tensors, str(a / "model.safetensors"))
    a.umount()
    b = store.node(nodes, tmp_path, "b")
    loaded = load_file(str(b / "model.safetensors"))
    assert_same(tensors, loaded)


def test_copy_of_a_stored_checkpoint_uploads_no_new_chunk(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """A fresh node copies a stored checkpoint and saves the same state again under another
    name: once both are in the store (sync), the node has uploaded nothing, it counts both
    files' bytes as deduplicated, and the store holds no new chunk."""
    state = training_state(40)
    a = store.node(nodes, tmp_path, "a")
    torch.save(state, a / "step-1.pt")
    size = (a / "step-1.pt").stat().st_size
    a.umount()
    chunks_before = store.count_chunks()
    assert chunks_before >= 2

    b = store.node(nodes, tmp_path, "b")  # a fresh node copies the checkpoint
    shutil.copyfile(b / "step-1.pt", b / "copy-of-step-1.pt")
    (b / "again").mkdir()
    torch.save(state, b / "again" / "step-1.pt")  # the same bytes saved under another name
    run_cli("sync", str(b.path))  # every chunk of both files is in the store now
    st = b.status()
    assert st["uploaded_bytes"] == 0, st
    assert st["dedup_bytes"] == 2 * size, st
    b.umount()
    assert store.count_chunks() == chunks_before

    c = store.node(nodes, tmp_path, "c")
    assert (c / "copy-of-step-1.pt").read_bytes() == (c / "again" / "step-1.pt").read_bytes()
    assert_same(state, torch.load(c / "copy-of-step-1.pt", weights_only=False))
