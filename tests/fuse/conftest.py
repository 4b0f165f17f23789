"""The FUSE tier's fixture: a store to mount, on the local directory store and on SeaweedFS S3."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mounting import MountedStore
from seaweed import SeaweedServer


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MountedStore:
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return MountedStore(str(root), [], lambda: sum(
            1 for p in (root / "chunks").rglob("*") if p.is_file()))
    seaweed: SeaweedServer = request.getfixturevalue("seaweed")
    bucket = seaweed.new_bucket()
    prefix = f"run-{uuid.uuid4().hex[:6]}"
    client = seaweed.client()

    def count() -> int:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/chunks/")
        return sum(len(p.get("Contents", [])) for p in pages)

    return MountedStore(f"s3://{bucket}/{prefix}", ["--endpoint-url", seaweed.endpoint], count)
