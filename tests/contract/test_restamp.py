"""A move slower than RESTAMP_AFTER stamps its copy again (docs/FORMAT.md, "Moves"): when
that stamp fails transiently, it alone is retried, so gc's mark counts the chunk as set
aside (not as vanished) and the fossil carries a time from after its source vanished."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from azure.core.exceptions import ServiceRequestError
from crafting import new_store
from faultproxy import FaultProxy
from google.cloud.storage import Blob
from seaweed import SeaweedServer
from support import random_bytes

from ckptfs.format.codec import chunk_hash, encode_chunk
from ckptfs.format.manifests import chunk_key, fossil_key
from ckptfs.store import base
from ckptfs.store.azure import AzureStore
from ckptfs.store.base import Store
from ckptfs.store.gcs import GcsStore
from ckptfs.store.s3 import S3Store
from ckptfs.tools import gc


def unreferenced_chunk(store: Store) -> str:
    h = chunk_hash(data := random_bytes(1000))
    store.put(chunk_key(h), encode_chunk(data)[0])
    return h


def assert_set_aside(store: Store, h: str) -> None:
    """One gc run (grace 0) sets the chunk aside and says so."""
    report = gc.collect(store, 0.0)
    assert (report.fossilized.count, report.vanished) == (1, 0), report.to_dict()
    assert store.head(chunk_key(h)) is None and store.head(fossil_key(h)) is not None


def test_s3_restamp_failing_transiently_is_retried_alone(
        proxy: FaultProxy, seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the fault proxy: the move's DELETE is held 2 s (a move slower than
    RESTAMP_AFTER, shortened to 1 s), and both tries botocore makes of the re-stamp (the
    second CopyObject onto fossils/<h>) get 503. The stamp is sent again, alone; the
    fossil's LastModified is after the DELETE, not the first copy's."""
    monkeypatch.setattr(base, "RESTAMP_AFTER", 1.0)
    bucket = seaweed.new_bucket()
    store = S3Store(bucket, "p", endpoint_url=proxy.endpoint)
    try:
        new_store(store)
        h = unreferenced_chunk(store)
        fossil_path = f"/{bucket}/p/{fossil_key(h)}"
        copies = 0

        def restamp(method: str, path: str) -> bool:  # the 2nd and 3rd PUT of the fossil
            nonlocal copies
            if (method, path) != ("PUT", fossil_path):
                return False
            copies += 1
            return copies in (2, 3)

        proxy.throttle(1.0, restamp)
        proxy.delay(2.0, lambda m, p: m == "DELETE" and p == f"/{bucket}/p/{chunk_key(h)}")
        assert_set_aside(store, h)
        puts = proxy.requests_where(lambda m, p: (m, p) == ("PUT", fossil_path))
        assert [r.status for r in puts] == [200, 503, 503, 200]
        wall = time.time() - time.monotonic()  # the proxy logs monotonic times
        fossil = store.stat(fossil_key(h))
        assert fossil is not None
        # LastModified has whole seconds: the first copy's is at most puts[0].end; the
        # stamp came at least 2 s later
        assert fossil.mtime >= puts[0].end + wall + 0.5, (fossil.mtime, puts[0].end + wall)
    finally:
        proxy.throttle(0.0, lambda m, p: False)
        proxy.delay(0.0, lambda m, p: False)
        store.close()
        seaweed.drop_bucket(bucket)


def failing_once(monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
                 error: Callable[[], Exception]) -> list[int]:
    """Make owner.name raise error() on its first call; returns the list of calls made."""
    real = getattr(owner, name)
    calls: list[int] = []

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise error()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, call)
    return calls


@pytest.mark.parametrize("kind", ["azure", "gcs"])
def test_cloud_restamp_failing_transiently_is_retried_alone(
        kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure (Set Blob Metadata) and GCS (a metadata patch) stamp a slow move's copy the
    same way; its first try fails with a network error, and only it is tried again."""
    from azure.storage.blob import BlobClient

    monkeypatch.setattr(base, "RESTAMP_AFTER", -1.0)  # every move is "slow"
    store: AzureStore | GcsStore = request.getfixturevalue(f"{kind}_store")
    new_store(store)
    h = unreferenced_chunk(store)
    if kind == "azure":
        calls = failing_once(monkeypatch, BlobClient, "set_blob_metadata",
                             lambda: ServiceRequestError("connection reset"))
    else:
        calls = failing_once(monkeypatch, Blob, "patch",
                             lambda: requests.ConnectionError("connection reset"))
    assert_set_aside(store, h)
    assert len(calls) == 2


def test_a_restamp_that_keeps_failing_fails_the_move_for_good() -> None:
    """After its retries (retry.STORE_CALL: 6 tries), a stamp that still fails makes the
    move fail with a permanent error: no caller runs the move again (it would find the
    source gone and take the chunk for vanished)."""
    from ckptfs.common.errors import PermanentStoreError, TransientStoreError

    tries: list[int] = []

    def restamp() -> None:
        tries.append(1)
        raise TransientStoreError("HTTP 503")

    with pytest.raises(PermanentStoreError, match="moved fossils/ab/abc, but could not "
                       "stamp it with the time of the move: HTTP 503"):
        base.restamp_if_slow(time.monotonic() - base.RESTAMP_AFTER - 1, "fossils/ab/abc",
                             restamp)
    assert len(tries) == 6
    base.restamp_if_slow(time.monotonic(), "fossils/ab/abc", restamp)  # a fast move: none
    assert len(tries) == 6
