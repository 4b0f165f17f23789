"""The contract tier's fixture: each crafted-store test runs on a local and an S3 store."""

from __future__ import annotations

import pytest
from crafting import StoreUnderTest, s3_url

from ckptfs.store.local import LocalStore
from ckptfs.store.s3 import S3Store


@pytest.fixture(params=["local", "s3"])
def st(request: pytest.FixtureRequest) -> StoreUnderTest:
    """A new store on the local directory store, then on SeaweedFS S3."""
    if request.param == "local":
        local: LocalStore = request.getfixturevalue("local_store")
        return StoreUnderTest(local, str(local.root), [])
    s3: S3Store = request.getfixturevalue("s3_store")
    return StoreUnderTest(s3, s3_url(s3), ["--endpoint-url", s3.endpoint])
