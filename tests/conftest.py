"""Shared pytest fixtures and hooks for every tier (unit, pipeline, contract, core, fuse;
docs/ARCHITECTURE.md, Tests): one SeaweedFS, one Azurite and one fake-gcs-server per
session (each started on first use), a fresh store per test, the mounts of a test
(`nodes`), a fault-injecting HTTP proxy; FUSE tests skip without FUSE.

This directory is on sys.path (pytest's default "prepend" import mode puts it there for
this conftest.py), so test modules of every tier import the support modules beside it:
`from mounting import Mount`, `from support import wait_until`, ...
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azurite import AzuriteServer
from fakegcs import FakeGcsServer
from faultproxy import FaultProxy
from mounting import Nodes, become_subreaper
from seaweed import SeaweedServer
from users import User, second_user

from ckptfs.store.azure import AzureStore
from ckptfs.store.gcs import GcsStore
from ckptfs.store.local import LocalStore
from ckptfs.store.s3 import S3Store

# google-auth looks for the GCE metadata server (a link-local address) when it finds no
# credentials: never from the tests (read when google.auth is first imported)
os.environ["NO_GCE_CHECK"] = "true"


@contextlib.contextmanager
def running(server: Any) -> Iterator[Any]:
    """A test server started, and stopped by pid at the end even if the session dies."""
    atexit.register(server.stop)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        atexit.unregister(server.stop)


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
        with running(server):
            yield server


@pytest.fixture
def s3_store(seaweed: SeaweedServer) -> Iterator[S3Store]:
    """An S3Store on a fresh SeaweedFS bucket, under a random key prefix."""
    bucket = seaweed.new_bucket()
    store = S3Store(bucket, prefix=f"p-{uuid.uuid4().hex[:8]}", endpoint_url=seaweed.endpoint)
    yield store
    store.close()
    seaweed.drop_bucket(bucket)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """A real Azurite blob service shared by the whole session. For the session,
    AZURE_STORAGE_CONNECTION_STRING names it (so ckptfs subprocesses find it too) and no
    other Azure credential variable is set."""
    workdir = tmp_path_factory.mktemp("azurite")
    server = AzuriteServer(workdir)
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("AZURE_"):
                mp.delenv(name)
        mp.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string)
        with running(server):
            yield server


@pytest.fixture(scope="session")
def fakegcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    """A real fake-gcs-server shared by the whole session. For the session,
    STORAGE_EMULATOR_HOST names it (so ckptfs subprocesses find it too) and no Google
    credentials are configured."""
    workdir = tmp_path_factory.mktemp("fakegcs")
    server = FakeGcsServer(workdir)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
            mp.delenv(name, raising=False)
        mp.setenv("CLOUDSDK_CONFIG", str(workdir / "no-gcloud-config"))
        mp.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        with running(server):
            yield server


@pytest.fixture
def azure_store(azurite: AzuriteServer) -> Iterator[AzureStore]:
    """An AzureStore on a fresh Azurite container, under a random key prefix."""
    container = azurite.new_container()
    store = AzureStore(container, prefix=f"p-{uuid.uuid4().hex[:8]}")
    yield store
    store.close()
    azurite.drop_container(container)


@pytest.fixture
def gcs_store(fakegcs: FakeGcsServer) -> Iterator[GcsStore]:
    """A GcsStore on a fresh fake-gcs-server bucket, under a random key prefix."""
    bucket = fakegcs.new_bucket()
    store = GcsStore(bucket, prefix=f"p-{uuid.uuid4().hex[:8]}")
    yield store
    store.close()
    fakegcs.drop_bucket(bucket)


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
def nodes() -> Iterator[Nodes]:
    """Mounts ("nodes") made by a test: every one made by `nodes.mount(...)` or appended
    here is unmounted (lazily, its daemon stopped) at the end, even when the test fails."""
    made = Nodes()
    yield made
    made.cleanup()


@pytest.fixture(scope="session")
def other_user() -> Iterator[User]:
    """A second, unprivileged local user of this machine (useradd; userdel at the end of
    the session): what another user of a shared node can do. Skipped, with the reason,
    where the tests cannot make one (not root, no useradd)."""
    with second_user() as user:
        yield user


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session's SeaweedFS (its `endpoint`: the proxy's)."""
    p = FaultProxy(seaweed.endpoint)
    yield p
    p.close()


# -- FUSE --------------------------------------------------------------------------------

FUSE_TESTS = Path(__file__).parent / "fuse"


def fuse_missing() -> str | None:
    """Why real FUSE mounts cannot work on this machine, or None if they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # the daemons `ckptfs mount` leaves behind become children of this process: tests
    # can then check how they exited (mounting.Mount.exited)
    become_subreaper()


# -- order -------------------------------------------------------------------------------

#: modules whose tests take longest (measured: `pytest -n 3 --durations=80`), handed out
#: first, longest first; then every other test, its tier in TIER_ORDER. pytest-xdist hands
#: tests out one at a time in this order (--maxschedchunk 1 in pyproject.toml), so that a
#: long test never starts last while the other processes sit idle
LONGEST_FIRST = (
    "fuse/test_gc_load.py",
    "fuse/test_efficiency.py",
    "fuse/test_orbax_multihost.py",
    "fuse/test_crash.py",
    "fuse/test_faults.py",
    "fuse/test_scale.py",
)
TIER_ORDER = ("fuse", "soak", "contract", "core", "pipeline", "unit")


def run_order(item: pytest.Item) -> tuple[int, int]:
    """Where `item` comes in the run: (module in LONGEST_FIRST, else after them; its
    tier in TIER_ORDER, else after them)."""
    try:
        rel = item.path.relative_to(Path(__file__).parent)
    except ValueError:
        return len(LONGEST_FIRST), len(TIER_ORDER)
    first = rel.as_posix()
    tier = rel.parts[0]
    return (LONGEST_FIRST.index(first) if first in LONGEST_FIRST else len(LONGEST_FIRST),
            TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The run's order (run_order; otherwise the collection's); every test under
    tests/fuse is marked `fuse`, and skipped, with the reason, where FUSE is unavailable."""
    items.sort(key=run_order)
    reason = fuse_missing()
    for item in items:
        if FUSE_TESTS in item.path.parents:
            item.add_marker(pytest.mark.fuse)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs FUSE: {reason}"))
