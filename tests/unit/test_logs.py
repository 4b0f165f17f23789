"""daemon.logs: the log file rotates at its size bound keeping mode 0600, is never opened
through a link, JSON lines carry the fields, and no line carries a credential."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptfs.common.config import Limits
from ckptfs.common.errors import ConfigError
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


def test_every_log_file_is_0600_also_after_a_rotation(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "LIMITS", Limits(log_bytes=10_000, log_files=2))
    old = os.umask(0o022)  # the usual one: the standard handler's new files were 0644
    try:
        logs.setup_logging("info", str(tmp_path / "ckptfs.log"))
        for i in range(1000):
            logging.getLogger("ckptfs.test").info("line %d of the test", i)
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    assert modes == {"ckptfs.log": "0o600", "ckptfs.log.1": "0o600",
                     "ckptfs.log.2": "0o600"}, modes


def test_a_log_file_that_is_a_link_or_another_users_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "root-only"
    target.write_bytes(b"not a log\n")
    link = tmp_path / "ckptfs.log"
    link.symlink_to(target)
    with pytest.raises(ConfigError) as refused:
        logs.setup_logging("info", str(link))
    assert str(refused.value) == (f"the log file {link} is a symbolic link: remove it, or "
                                  f"give a log file of your own (--log-file)")
    if os.geteuid() == 0:  # a file another user made (chown needs root)
        theirs = tmp_path / "theirs.log"
        theirs.write_bytes(b"")
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ConfigError, match=r"is owned by uid 65534, not by you \(uid 0\)"):
            logs.setup_logging("info", str(theirs))
        assert theirs.read_bytes() == b""
    assert target.read_bytes() == b"not a log\n"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_carry_no_credential(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "ckptfs.log"
    logs.setup_logging("info", str(path), fmt, {"store": "s3://b/run"})
    log = logging.getLogger("ckptfs.daemon.mount")
    log.info("mounted %s on /mnt", "az://c/ at http://h/acct/?sv=2022-11-02&sig=S3CR3T%3D")
    try:
        raise OSError("cannot connect to http://alice:pa55w0rd@h:9000")
    except OSError:
        log.exception("failed")
    text = path.read_text()
    assert "S3CR3T" not in text and "pa55w0rd" not in text, text
    assert "sig=REDACTED" in text and "alice:REDACTED@h:9000" in text, text
