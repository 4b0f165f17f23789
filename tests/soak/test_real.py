"""The soak's real-process level in CI: one short schedule on 2 FUSE mounts, with kill -9."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import soaklib
from faultproxy import FaultProxy
from mounting import become_subreaper
from real import RealSoak
from seaweed import SeaweedServer


def fuse_missing() -> str | None:
    """Why real FUSE mounts cannot work here, or None (as tests/conftest.py decides)."""
    if not os.path.exists("/dev/fuse") or not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not usable"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing"
    return None


#: the seed and length CI runs (about 30 s)
REAL_SEED, REAL_OPS = 21, 30


@pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))
def test_real_mounts_soak(seaweed: SeaweedServer, proxy: FaultProxy, tmp_path: Path) -> None:
    become_subreaper()
    result = RealSoak(tmp_path, seaweed, proxy).run(REAL_SEED, REAL_OPS, tmp_path / "run")
    if result.failure is not None:
        pytest.fail(soaklib.describe(result), pytrace=False)
    assert result.done == REAL_OPS and result.faults["crash"] >= 1
