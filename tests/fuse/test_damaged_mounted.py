"""A damaged manifest through a real mount, on the local store and on SeaweedFS S3: the
mount starts, the damaged files are listed and give EIO (one log line each), every other
file reads back byte-exact."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from mounting import MountedStore, Nodes
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.store import open_store

#: file -> how its manifest is damaged
DAMAGED: dict[str, dict[str, Any]] = {
    "top.pt": {"mode": -1},  # in the root, which the mount lists before it is ready
    "step-1/mode-minus-1.pt": {"mode": -1},
    "step-1/mode-2-70.pt": {"mode": 2**70},
    "step-1/length-1e308.pt": {"size": 1e308, "chunks": [["0" * 32, 1e308]]},
}


def eio(call: Any, *args: Any) -> None:
    with pytest.raises(OSError) as e:
        call(*args)
    assert e.value.errno == errno.EIO, e.value


def test_a_damaged_manifest_is_eio_on_that_file_and_the_rest_reads(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    good = {"step-1/rank0.pt": random_bytes(3 * 2**20 + 17), "step-1/config.json": b"{}",
            "step-0/rank0.pt": random_bytes(2**20)}
    a = store.node(nodes, tmp_path, "a")
    for path, data in [*good.items(), *((p, b"soon damaged") for p in DAMAGED)]:
        (a / path).parent.mkdir(exist_ok=True, parents=True)
        (a / path).write_bytes(data)
    assert a.umount().returncode == 0
    s = open_store(store.url, endpoint_url=store.extra[1] if store.extra else None)
    for path, changes in DAMAGED.items():
        key = manifests.file_key(path)
        s.put(key, json.dumps({**json.loads(s.get(key)), **changes}).encode())

    b = store.node(nodes, tmp_path, "b")  # the mount starts: nothing else is affected
    for path in DAMAGED:  # stat of a name not yet listed: the lookup gives EIO
        eio(os.stat, b / path)
    assert sorted(os.listdir(b.path)) == ["step-0", "step-1", "top.pt"]
    assert sorted(os.listdir(b / "step-1")) == sorted(
        p.split("/")[1] for p in [*DAMAGED, *good] if p.startswith("step-1/"))
    for _ in range(3):
        for path in DAMAGED:
            eio(open, b / path, "rb")
        for path, data in good.items():
            assert (b / path).read_bytes() == data
    log = b.log()
    for path in DAMAGED:
        lines = [line for line in log.splitlines() if manifests.file_key(path) in line]
        assert len(lines) == 1 and "damaged manifest" in lines[0], lines
    assert b.status()["pid"] == b.pid
    assert b.umount().returncode == 0
