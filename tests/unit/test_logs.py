"""daemon.logs: the log file rotates at its size bound, and JSON lines carry the fields."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptfs.common.config import Limits
from ckptfs.daemon import logs


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        h.close()
    root.handlers[:], root.level = handlers, level


def test_the_log_rotates_and_keeps_a_few_files(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "LIMITS", Limits(log_bytes=10_000, log_files=2))
    path = tmp_path / "ckptfs.log"
    logs.setup_logging("info", str(path))
    for i in range(2000):
        logging.getLogger("ckptfs.test").info("line %d of the test", i)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["ckptfs.log", "ckptfs.log.1", "ckptfs.log.2"]
    assert all((tmp_path / f).stat().st_size <= 10_000 for f in files)
    assert "line 1999 of the test" in path.read_text()


def test_json_lines_carry_the_mount_and_the_extra_fields(tmp_path: Path) -> None:
    path = tmp_path / "ckptfs.log"
    logs.setup_logging("debug", str(path), "json", {"node": "n1", "store": "s3://b/run"})
    log = logging.getLogger("ckptfs.pipeline.uploader")
    log.debug("uploaded %s", "chunk", extra={"bytes": 42, "path": "a/b.pt"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["level"] == "debug" and first["message"] == "uploaded chunk"
    assert (first["node"], first["store"], first["bytes"], first["path"]) == (
        "n1", "s3://b/run", 42, "a/b.pt")
    assert first["logger"] == "ckptfs.pipeline.uploader" and first["time"].endswith("Z")
    assert second["level"] == "error" and "ValueError: boom" in second["exception"]


def test_the_level_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "ckptfs.log"
    logs.setup_logging("warning", str(path))
    logging.getLogger("ckptfs").info("not this")
    logging.getLogger("ckptfs").warning("this")
    assert path.read_text().count("\n") == 1 and "this" in path.read_text()
