"""Fixtures of the pipeline tier: a recording store over a LocalStore, a cache, a journal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline_helpers import RecordingStore

from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.journal import Journal
from ckptfs.store.local import LocalStore


@pytest.fixture
def store(tmp_path: Path) -> RecordingStore:
    (tmp_path / "store").mkdir()
    return RecordingStore(LocalStore(tmp_path / "store", fsync=False))


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[LocalCache]:
    c = LocalCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    yield c
    c.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(str(tmp_path / "journal.sqlite"))
    yield j
    j.close()
