"""Shared pytest fixtures: one SeaweedFS server per session, and a fresh store per test."""

from __future__ import annotations

import atexit
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import Mount
from seaweed import SeaweedServer

from ckptfs.store.local import LocalStore
from ckptfs.store.s3 import S3Store


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A real SeaweedFS server (S3 at `seaweed.endpoint`) shared by the whole session.

    For the session, the AWS environment holds the server's test credentials (so boto3's
    default chain, and ckptfs subprocesses, use them) and ~/.aws is ignored.
    """
    workdir = tmp_path_factory.mktemp("seaweed")
    server = SeaweedServer(workdir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", server.access_key)
        mp.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", str(workdir / "no-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(workdir / "no-aws-credentials"))
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            mp.delenv(name, raising=False)
        atexit.register(server.stop)  # in case the session dies before teardown
        try:
            server.start()
            yield server
        finally:
            server.stop()
            atexit.unregister(server.stop)


@pytest.fixture
def s3_store(seaweed: SeaweedServer) -> Iterator[S3Store]:
    """An S3Store on a fresh SeaweedFS bucket, under a random key prefix."""
    bucket = seaweed.new_bucket()
    store = S3Store(bucket, prefix=f"p-{uuid.uuid4().hex[:8]}", endpoint_url=seaweed.endpoint)
    yield store
    store.close()
    seaweed.drop_bucket(bucket)


@pytest.fixture
def local_store_dir(tmp_path: Path) -> Path:
    """An empty directory for a store."""
    root = tmp_path / "store"
    root.mkdir()
    return root


@pytest.fixture
def local_store(local_store_dir: Path) -> LocalStore:
    """A LocalStore in an empty directory of its own."""
    return LocalStore(local_store_dir)


@pytest.fixture
def nodes() -> Iterator[list[Mount]]:
    """Mounts ("nodes") made by a test: every one appended here is unmounted (lazily, its
    daemon stopped) at the end, even when the test fails."""
    made: list[Mount] = []
    yield made
    for m in made:
        m.cleanup()
