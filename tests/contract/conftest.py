"""The contract tier's fixture: each crafted-store test runs on the local store, SeaweedFS
S3, Azure (Azurite) and GCS (fake-gcs-server)."""

from __future__ import annotations

import pytest
from crafting import StoreUnderTest, make_st


@pytest.fixture(params=["local", "s3", "azure", "gcs"])
def st(request: pytest.FixtureRequest) -> StoreUnderTest:
    """A new store on each kind in turn."""
    return make_st(request.param, request)
