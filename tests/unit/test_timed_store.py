"""TimedStore: every call counted by kind with its latency bucket, errors by class."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.common.errors import NotFoundError
from ckptfs.common.latency import STORE_BUCKETS, LatencyTable
from ckptfs.store import open_store
from ckptfs.store.timed import TimedStore


def test_calls_are_counted_by_kind_and_errors_by_class(tmp_path: Path) -> None:
    table = LatencyTable(STORE_BUCKETS)
    store = TimedStore(open_store(str(tmp_path)), table)
    store.put("a", b"1")
    assert store.get("a") == b"1"
    with pytest.raises(NotFoundError):
        store.get("missing")
    assert list(store.scan("")) and store.head("a") == 1
    rows = {row.kind: row for row in table.rows()}
    assert {k: sum(r.counts) for k, r in rows.items()} == {"put": 1, "get": 2, "scan": 1,
                                                            "head": 1}
    assert len(rows["get"].counts) == len(STORE_BUCKETS) + 1 and rows["get"].seconds > 0
    assert table.errors() == {("get", "NotFoundError"): 1}
    assert store.url == store.inner.url
