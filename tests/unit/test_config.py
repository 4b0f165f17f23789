"""config: option values (sizes, durations), the default cache directory, MountConfig's
checks."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from ckptfs.common import config
from ckptfs.common.config import MountConfig, check_glob, default_cache_dir, trash_seconds
from ckptfs.common.errors import ConfigError
from ckptfs.common.units import MAX_DURATION, format_duration, parse_duration, parse_size
from ckptfs.format.chunking import DEFAULT_CHUNK_SIZE
from ckptfs.format.codec import CODECS
from ckptfs.format.manifests import DEFAULT_MIN_RECORD, StoreInfo


@pytest.mark.parametrize(("text", "size"), [
    ("4096", 4096), ("0", 0), ("1K", 1024), ("512M", 512 << 20), ("16G", 16 << 30),
    ("1T", 1 << 40), ("1.5G", 3 << 29), ("64k", 64 << 10), ("2MB", 2 << 20),
    ("2MiB", 2 << 20), (" 8 M ", 8 << 20), ("100B", 100)])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "12Q", "-1M", "1..5G", "one", "1 2M", "0x10"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--cache-size") as e:
        parse_size(text, "--cache-size")
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("text", "seconds", "shown"), [
    ("0", 0, "0s"), ("30s", 30, "30s"), ("90", 90, "90s"), ("15m", 900, "15m"),
    ("1h", 3600, "1h"), ("24h", 86400, "24h"), ("48H", 172800, "48h"), ("7d", 604800, "7d"),
    ("1.5h", 5400, "90m"), (" 2 d ", 172800, "48h")])
def test_parse_duration(text: str, seconds: float, shown: str) -> None:
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == shown and parse_duration(shown) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1h", "-5", "1y", "1 h 2", "ten", "1e3s",
                                  "99999999999d", "36501d", "876001h", f"{36500 * 86400 + 1}"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--grace") as e:
        parse_duration(text, "--grace")
    assert repr(text) in str(e.value) and "\n" not in str(e.value)


def test_default_cache_dir_is_per_user_and_per_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    a, b = default_cache_dir("s3://bucket/a"), default_cache_dir("s3://bucket/b")
    assert a.startswith("/xdg/ckptfs/") and b.startswith("/xdg/ckptfs/") and a != b
    assert default_cache_dir("s3://bucket/a") == a  # stable: a remount finds its journal
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/someone")
    assert default_cache_dir("s3://bucket/a") == "/home/someone/.cache/ckptfs/" + (
        os.path.basename(a))


def test_mount_config_defaults_and_checks() -> None:
    c = MountConfig("store", "/mnt")
    assert c.node_id  # the host name when not given
    assert c.upload_threads >= 1 and c.fetch_threads >= 1 and c.cache_size > 0
    assert MountConfig("store", "/mnt", node_id="n7").node_id == "n7"
    for bad, message in ((dict(upload_threads=0), "--upload-threads must be at least 1"),
                         (dict(fetch_threads=0), "--fetch-threads must be at least 1"),
                         (dict(uploads_while_writing=-1),
                          "--uploads-while-writing must be at least 0")):
        with pytest.raises(ConfigError, match=message):
            MountConfig("store", "/mnt", **bad)  # type: ignore[arg-type]
    assert MountConfig("store", "/mnt", uploads_while_writing=0).uploads_while_writing == 0


def test_durations_up_to_100_years() -> None:
    """A longer one is a typo whose cutoff would lie before year 1 (`--grace 99999999999d`
    gave year -273788674)."""
    assert parse_duration("36500d") == MAX_DURATION == 100 * 365 * 86400
    with pytest.raises(ConfigError, match=r"at most 36500d \(100 years\)"):
        parse_duration("99999999999d", "--grace")
    assert trash_seconds(876000) == MAX_DURATION
    with pytest.raises(ConfigError, match="--trash-hours must be at most 876000"):
        trash_seconds(1e12)


@pytest.mark.parametrize("pattern", ["checkpoint-*", "step-[0-9]*", "[]]x", "[!a]*", "[[]",
                                     "x]", "global_step?"])
def test_check_glob_accepts(pattern: str) -> None:
    assert check_glob(pattern, "--pattern") == pattern


@pytest.mark.parametrize(("pattern", "why"), [
    ("[", "the '[' at 1 is never closed"), ("ckpt-[0-9", "the '[' at 6 is never closed"),
    ("[]", "never closed"), ("[!]", "never closed"), ("[z-a]*", "the range z-a is empty"),
    ("", "one directory name"), ("run/step-*", "one directory name")])
def test_check_glob_refuses(pattern: str, why: str) -> None:
    """fnmatch takes an unclosed '[' for a plain character: such a pattern silently
    matched nothing."""
    with pytest.raises(ConfigError, match=re.escape(why)) as e:
        check_glob(pattern, "--pattern")
    assert str(e.value).startswith(f"--pattern {pattern!r} ") and "\n" not in str(e.value)


def test_a_new_store_gets_what_the_format_falls_back_to() -> None:
    """The config's defaults for a new store are the format's own defaults (which a
    ckptfs.json without those fields is read with)."""
    assert config.NEW_STORE_CHUNK_SIZE == DEFAULT_CHUNK_SIZE
    assert config.NEW_STORE_MIN_RECORD == DEFAULT_MIN_RECORD
    assert config.NEW_STORE_CODEC == StoreInfo().codec and set(config.CODECS) == set(CODECS)


def test_the_options_table_of_operations_md_is_the_config() -> None:
    """docs/OPERATIONS.md's option table names every option of MountConfig, with the
    default MountConfig has; the fixed-limits table every field of Limits with its value."""
    text = (Path(__file__).parents[2] / "docs" / "OPERATIONS.md").read_text()
    rows = {}
    for line in text.split("## Options", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for flag in re.findall(r"`(--[a-z-]+)[^`]*`", cells[0]) if line.startswith("| `") else []:
            rows[flag] = cells[1].strip("`").removesuffix("` s")
    by_flag = {f.metadata["flag"]: f for f in config.mount_options()}
    assert sorted(rows) == sorted(by_flag)
    for flag, f in by_flag.items():
        assert rows[flag] == config.shown_default(f), flag
    limits = {}
    for line in text.split("### Fixed limits", 1)[1].split("\n#", 1)[0].splitlines():
        m = re.match(r"\| `(\w+)` \| ([\d,]+)[ |]", line)
        if m:
            limits[m.group(1)] = int(m.group(2).replace(",", ""))
    assert limits == dataclasses.asdict(config.LIMITS)


def test_options_come_from_the_environment_and_the_command_line_wins() -> None:
    """Every option has a CKPTFS_ variable (a launcher sets defaults once); a value on
    the command line wins; an empty variable is unset."""
    env = {"CKPTFS_CACHE_SIZE": "8G", "CKPTFS_UPLOAD_THREADS": "3",
           "CKPTFS_FSYNC_TO_STORE": "yes", "CKPTFS_CODEC": "lz4", "CKPTFS_REGION": "",
           "CKPTFS_METADATA_TTL": "2.5", "CKPTFS_CACHE_DIR": "/nvme/c"}
    cfg = MountConfig.from_options("s", "/m", {"upload_threads": 5}, env)
    assert (cfg.cache_size, cfg.upload_threads, cfg.fsync_to_store, cfg.codec) == (
        8 << 30, 5, True, "lz4")
    assert (cfg.region, cfg.metadata_ttl, cfg.cache_dir) == (None, 2.5, "/nvme/c")
    assert MountConfig.from_options("s", "/m", {"cache_size": "1G"}, env).cache_size == 1 << 30
    assert {config.env_name(f) for f in config.mount_options()} >= set(env)


@pytest.mark.parametrize(("name", "value", "want"), [
    ("CKPTFS_UPLOAD_THREADS", "many", "want a whole number"),
    ("CKPTFS_FSYNC_TO_STORE", "maybe", "want 1 or 0"),
    ("CKPTFS_CODEC", "gzip", "want one of zstd4, lz4"),
    ("CKPTFS_CACHE_SIZE", "lots", "use e.g. 512M"),
    ("CKPTFS_UPLOAD_THREADS", "0", "--upload-threads must be at least 1")])
def test_a_bad_environment_value_is_one_line_naming_it(name: str, value: str,
                                                        want: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(want)) as e:
        MountConfig.from_options("s", "/m", {}, {name: value})
    assert "\n" not in str(e.value)
    if "must be" not in want:
        assert name in str(e.value)


def test_fstab_options_are_the_mount_options_without_dashes() -> None:
    given = config.parse_mount_options(
        "rw,cache_dir=/nvme/c,cache-size=2G,fsync_to_store,_netdev,nofail,dev,suid,"
        "endpoint_url=http://127.0.0.1:8333,allow_other")
    assert given == {"cache_dir": "/nvme/c", "cache_size": 2 << 30, "fsync_to_store": True,
                     "endpoint_url": "http://127.0.0.1:8333", "allow_other": True}
    cfg = MountConfig.from_options("s3://b/r", "/m", given, {"CKPTFS_CACHE_SIZE": "9G"})
    assert cfg.cache_size == 2 << 30 and cfg.cache_dir == "/nvme/c"


@pytest.mark.parametrize(("text", "want"), [
    ("cache_dirr=/x", "unknown mount option -o cache_dirr"),
    ("cache_size=", "needs a value"), ("ro", "always read-write"),
    ("upload_threads=lots", "-o upload_threads: want a whole number")])
def test_bad_fstab_options_are_one_line(text: str, want: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(want)):
        config.parse_mount_options(text)


def test_owner_and_mode_options_from_the_command_line_environment_and_fstab() -> None:
    """--uid/--gid are ids, --file-mode/--dir-mode octal (0644, 644, 0o1777), the same
    from the command line, a CKPTFS_ variable and an fstab -o option."""
    env = {"CKPTFS_UID": "1000", "CKPTFS_DIR_MODE": "1777"}
    cfg = MountConfig.from_options("s", "/m", {"gid": 100, "file_mode": "0640"}, env)
    assert (cfg.uid, cfg.gid, cfg.file_mode, cfg.dir_mode) == (1000, 100, 0o640, 0o1777)
    given = config.parse_mount_options("uid=0,gid=4294967294,file_mode=0o600,dir-mode=755")
    assert given == {"uid": 0, "gid": 2**32 - 2, "file_mode": 0o600, "dir_mode": 0o755}
    cfg = MountConfig.from_options("s", "/m", {}, {})
    assert (cfg.uid, cfg.gid, cfg.file_mode, cfg.dir_mode) == (None, None, None, None)


@pytest.mark.parametrize(("given", "env", "want"), [
    ({"file_mode": "4755"}, {}, "--file-mode 4755: setuid and setgid bits are never shown"),
    ({}, {"CKPTFS_DIR_MODE": "2775"}, "--dir-mode 2775: setuid and setgid"),
    ({"file_mode": "0x1ff"}, {}, "invalid value '0x1ff' for --file-mode: want octal"),
    ({}, {"CKPTFS_FILE_MODE": "rw-r--r--"}, "for CKPTFS_FILE_MODE: want octal"),
    ({"dir_mode": "17777"}, {}, "--dir-mode 17777: more than the permission bits"),
    ({"uid": -1}, {}, "--uid -1 is not an id (0 to 4294967294)"),
    ({}, {"CKPTFS_GID": "4294967295"}, "--gid 4294967295 is not an id")])
def test_bad_owner_and_mode_options_are_one_line(given: dict[str, object],
                                                 env: dict[str, str], want: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(want)) as e:
        MountConfig.from_options("s", "/m", given, env)
    assert "\n" not in str(e.value)


def test_a_choice_is_checked_however_the_config_is_made() -> None:
    with pytest.raises(ConfigError, match="--log-format yaml: want one of text, json"):
        MountConfig(store="s", mountpoint="/m", log_format="yaml")


@pytest.mark.parametrize("text, address", [
    ("9100", ("127.0.0.1", 9100)), (":9100", ("127.0.0.1", 9100)), ("0", ("127.0.0.1", 0)),
    ("127.0.0.1:0", ("127.0.0.1", 0)), ("0.0.0.0:9100", ("0.0.0.0", 9100)),
    ("[::1]:9100", ("::1", 9100)), ("node7.cluster:65535", ("node7.cluster", 65535))])
def test_metrics_address_is_loopback_unless_a_host_is_given(
        text: str, address: tuple[str, int]) -> None:
    assert config.metrics_address(text) == address


@pytest.mark.parametrize("text", ["", ":", "x", "host:", "1:65536", "-1", "::1:9100",
                                  "a b:1", "[::1]", "http://h:1", "１２"])
def test_a_bad_metrics_address_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-addr .* is not \\[HOST:\\]PORT") as e:
        config.MountConfig("s", "m", metrics_addr=text)
    assert "\n" not in str(e.value)


def test_metrics_address_comes_from_the_environment_and_mount_options() -> None:
    cfg = config.MountConfig.from_options("s", "m", {}, {"CKPTFS_METRICS_ADDR": ":9100"})
    assert cfg.metrics_addr == ":9100"
    assert config.parse_mount_options("metrics_addr=0") == {"metrics_addr": "0"}
    assert config.MountConfig("s", "m").metrics_addr is None  # off by default


@pytest.mark.parametrize(("text", "mode"), [("0600", 0o600), ("640", 0o640), ("0660", 0o660),
                                            ("0644", 0o644), ("664", 0o664)])
def test_store_mode_takes_the_modes_a_directory_store_may_have(text: str, mode: int) -> None:
    assert config.parse_store_mode(text) == mode
    cfg = MountConfig.from_options("/data/store", "/mnt", {"store_mode": text})
    assert cfg.store_mode == text


@pytest.mark.parametrize("text", ["0700", "0666", "0604", "0400", "1600", "4640", "06400",
                                  "0x180", "rw-------", "", "0608", "-600"])
def test_store_mode_refuses_the_others_in_one_line(text: str) -> None:
    """Executable, world-writable, unreadable by its owner, setuid or sticky, or no octal
    mode at all: one line naming the option and the modes it takes."""
    with pytest.raises(ConfigError) as e:
        MountConfig.from_options("/data/store", "/mnt", {"store_mode": text})
    assert str(e.value) == (f"--store-mode {text!r} is not a mode a directory store may "
                            f"give its files: want one of 0600, 0640, 0660, 0644, 0664")


@pytest.mark.parametrize("url", ["s3://bucket/p", "az://container", "gs://bucket/x"])
def test_store_mode_is_for_directory_stores_only(url: str) -> None:
    with pytest.raises(ConfigError, match=f"--store-mode applies to directory stores only, "
                                          f"not {url} "):
        MountConfig.from_options(url, "/mnt", {"store_mode": "0640"})
    assert MountConfig.from_options("file:///data/s", "/mnt", {"store_mode": "0640"})
    assert config.dir_mode(0o600) == 0o700 and config.dir_mode(0o664) == 0o775
