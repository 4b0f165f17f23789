"""What the store keeps and how: the S3 storage class of chunk objects."""

from __future__ import annotations

from pathlib import Path

import pytest
from mounting import Nodes, run_cli
from seaweed import SeaweedServer
from support import random_bytes

MiB = 2**20


def storage_classes(seaweed: SeaweedServer, bucket: str, prefix: str) -> dict[str, str]:
    """key (below the prefix) -> the storage class the server reports for it."""
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1:]: o.get("StorageClass", "STANDARD")
            for page in pages for o in page.get("Contents", [])}


def test_chunks_get_the_storage_class_and_manifests_do_not(
        seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    bucket = seaweed.new_bucket()
    url = f"s3://{bucket}/job"
    endpoint = ["--endpoint-url", seaweed.endpoint]
    a = nodes.mount(url, tmp_path, "a", *endpoint, "--chunk-size", "1M",
                    "--storage-class", "standard_ia")
    data = random_bytes(3 * MiB + 5)
    (a / "ckpt").mkdir()
    (a / "ckpt" / "model.pt").write_bytes(data)
    a.umount()
    classes = storage_classes(seaweed, bucket, "job")
    chunks = {k: c for k, c in classes.items() if k.startswith("chunks/")}
    others = {k: c for k, c in classes.items() if not k.startswith("chunks/")}
    assert len(chunks) == 4 and set(chunks.values()) == {"STANDARD_IA"}, classes
    assert {"ckptfs.json", "files/ckpt/model.pt"} <= set(others), others
    assert not [k for k in classes if "probe" in k], classes  # the mount's probe is gone
    assert set(others.values()) == {"STANDARD"}, others
    b = nodes.mount(url, tmp_path, "b", *endpoint)
    assert (b / "ckpt" / "model.pt").read_bytes() == data


@pytest.mark.parametrize("case", ["unknown", "archive", "directory-store"])
def test_a_storage_class_that_cannot_work_is_one_line(
        case: str, seaweed: SeaweedServer, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = f"s3://{seaweed.new_bucket()}/job"
    cls, want = {"unknown": ("FROZEN", "not usable for chunks"),
                 "archive": ("GLACIER", "cannot be read without a restore"),
                 "directory-store": ("STANDARD_IA", "s3:// stores only")}[case]
    if case == "directory-store":
        store = str(tmp_path / "store")
        (tmp_path / "store").mkdir()
    r = run_cli("mount", store, str(mnt), "--cache-dir", str(tmp_path / "cache"),
                "--endpoint-url", seaweed.endpoint, "--storage-class", cls, check=False)
    lines = r.stderr.strip().splitlines()
    # a class no S3 store takes chunks in is a malformed option (2); one a directory
    # store cannot have, an error of that store (1)
    assert r.returncode == (1 if case == "directory-store" else 2), r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ckptfs: ") and want in lines[0], lines
    assert not list(mnt.iterdir())
