"""What a mount imports before it answers stays light: the SDK of its own store and FUSE,
not numpy (the first chunk loads it), boto3 and s3transfer (the S3 store uses botocore),
requests, prometheus_client (with --metrics-addr only), another cloud's SDK, or torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from seaweed import SeaweedServer

CHECKOUT = Path(__file__).resolve().parents[2]
HEAVY = ["numpy", "boto3", "s3transfer", "requests", "prometheus_client", "azure", "google",
         "torch", "botocore"]
#: `ckptfs mount -f` as far as the FUSE init: the command's modules, then prepare() (the
#: store checked and ckptfs.json read, the cache directory and journal opened) and the
#: daemon's parts built; the HEAVY modules then loaded, as JSON
PREPARE = f"""
import json, sys
import ckptfs.cli
from ckptfs.common.config import MountConfig
from ckptfs.daemon import mount as daemon
store, mountpoint, cache, endpoint = sys.argv[1:]
cfg = MountConfig.from_options(store, mountpoint, {{"cache_dir": cache, "foreground": True,
                                                   "endpoint_url": endpoint or None}})
daemon.Daemon(daemon.prepare(cfg), lambda err: None).build()
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")


def loaded_by_prepare(tmp_path: Path, store: str, endpoint: str = "",
                      env: dict[str, str] | None = None) -> list[str]:
    (tmp_path / "mnt").mkdir()
    r = subprocess.run([sys.executable, "-c", PREPARE, store, str(tmp_path / "mnt"),
                        str(tmp_path / "cache"), endpoint],
                       capture_output=True, text=True, timeout=60, cwd=CHECKOUT,
                       env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **(env or {})})
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_a_mount_of_an_s3_store_imports_no_other_sdk_and_no_numpy(
        tmp_path: Path, seaweed: SeaweedServer) -> None:
    bucket = seaweed.new_bucket()
    env = {"AWS_ACCESS_KEY_ID": seaweed.access_key, "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
           "AWS_DEFAULT_REGION": "us-east-1"}
    assert loaded_by_prepare(tmp_path, f"s3://{bucket}", seaweed.endpoint, env) == ["botocore"]


def test_a_mount_of_a_directory_store_imports_no_cloud_sdk_and_no_numpy(
        tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    assert loaded_by_prepare(tmp_path, str(tmp_path / "store")) == []
