"""manifests: the format v1 records (Manifest, StoreInfo, DirMarker) and store keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from ckptfs.common.errors import FormatError, InvalidKeyError
from ckptfs.format import manifests
from ckptfs.format.chunking import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from ckptfs.format.manifests import Manifest, StoreInfo

CS = MIN_CHUNK_SIZE  # the smallest legal chunk size keeps the arithmetic readable
H1 = "0" * 32
H2 = "0123456789abcdef" * 2


def test_manifest_roundtrip_file() -> None:
    m = Manifest(size=CS + 5, mode=stat.S_IFREG | 0o640, mtime_ns=1_700_000_000_123_456_789,
                 chunks=((H1, CS), (H2, 5)), chunk_size=CS, writer="node-1")
    back = Manifest.from_json(m.to_json())
    assert back == m
    assert not back.is_symlink
    assert back.chunk_offsets() == [0, CS, CS + 5]
    offs = back.chunk_offsets()
    assert [back.chunk_at(offs, o) for o in (0, CS - 1, CS, CS + 4)] == [0, 0, 1, 1]


def test_manifest_roundtrip_empty_file_and_symlink() -> None:
    empty = Manifest(size=0, mode=stat.S_IFREG | 0o600, mtime_ns=1)
    assert Manifest.from_json(empty.to_json()) == empty
    link = Manifest(size=9, mode=stat.S_IFLNK | 0o777, mtime_ns=42, target="../a/b.pt",
                    writer="w")
    blob = link.to_json()
    assert "chunks" not in json.loads(blob)
    back = Manifest.from_json(blob)
    assert back == link
    assert back.is_symlink and back.target == "../a/b.pt"
    assert stat.S_ISLNK(back.mode)


def test_manifest_regular_mode_normalised() -> None:
    d = json.loads(Manifest(size=0, mode=0o644, mtime_ns=0).to_json())
    d["mode"] = stat.S_IFDIR | 0o1755  # a file manifest can only describe a regular file
    m = Manifest.from_json(json.dumps(d).encode())
    assert m.mode == stat.S_IFREG | 0o1755


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755, 0o106755])
def test_setuid_and_setgid_bits_in_a_record_are_never_kept(mode: int) -> None:
    """A record written into the store by anyone (an old writer, a hostile one) cannot
    make a setuid or setgid file or directory: readers drop those bits."""
    assert Manifest.from_json(_manifest_dict(mode=mode)).mode == stat.S_IFREG | 0o755
    marker = json.dumps({"v": 1, "mode": stat.S_IFDIR | mode, "mtime_ns": 1}).encode()
    assert manifests.DirMarker.from_json(marker).mode == stat.S_IFDIR | 0o755
    assert manifests.kept_mode(stat.S_IFDIR | 0o7777) == stat.S_IFDIR | 0o1777


def test_the_owner_round_trips_and_old_records_name_none() -> None:
    """uid and gid are kept in manifests (files and symlinks) and markers; a record
    without them (every record before them) names no owner, and is written unchanged."""
    m = Manifest(size=CS + 5, mode=stat.S_IFREG | 0o640, mtime_ns=7,
                 chunks=((H1, CS), (H2, 5)), chunk_size=CS, writer="n", uid=1001, gid=2002)
    assert json.loads(m.to_json())["uid"] == 1001
    assert Manifest.from_json(m.to_json()) == m
    link = Manifest(size=1, mode=stat.S_IFLNK | 0o777, mtime_ns=7, target="x", uid=0, gid=0)
    assert Manifest.from_json(link.to_json()) == link
    marker = manifests.DirMarker(stat.S_IFDIR | 0o1770, 9, uid=4294967294, gid=5)
    assert manifests.DirMarker.from_json(marker.to_json()) == marker
    old = Manifest.from_json(_manifest_dict())
    assert (old.uid, old.gid) == (None, None)
    assert "uid" not in json.loads(old.to_json()) and "gid" not in json.loads(old.to_json())
    assert manifests.DirMarker.from_json(b'{"v": 1, "mode": 16877}').uid is None


@pytest.mark.parametrize("field", ["uid", "gid"])
@pytest.mark.parametrize("value", [-1, 2**32 - 1, 2**40, "0", 1.0, True, None])
def test_an_owner_that_is_no_id_damages_the_record(field: str, value: object) -> None:
    with pytest.raises(FormatError, match=f"{field} is"):
        Manifest.from_json(_manifest_dict(**{field: value}))
    with pytest.raises(FormatError, match=f"{field} is"):
        manifests.DirMarker.from_json(json.dumps({"v": 1, field: value}).encode())


def _manifest_dict(**changes: object) -> bytes:
    d: dict[str, object] = json.loads(
        Manifest(size=10, mode=stat.S_IFREG | 0o644, mtime_ns=5,
                 chunks=((H1, 4), (H2, 6)), chunk_size=CS).to_json())
    d.update(changes)
    return json.dumps(d).encode()


def test_manifest_helper_is_valid() -> None:
    assert Manifest.from_json(_manifest_dict()).size == 10


@pytest.mark.parametrize("blob", [
    _manifest_dict(v=2),
    _manifest_dict(size=11),  # chunk lengths add up to 10
    _manifest_dict(size=-10, chunks=[[H1, -4], [H2, -6]]),
    _manifest_dict(chunks=[[H1[:-1], 4], [H2, 6]]),  # 31 hex digits
    _manifest_dict(chunks=[["z" * 32, 4], [H2, 6]]),  # not hex
    _manifest_dict(chunks=[["../../../../../etc/passwd" + "x" * 7, 4], [H2, 6]]),
    _manifest_dict(chunks=[[H1.upper().replace("0", "A"), 4], [H2, 6]]),  # not lowercase
    _manifest_dict(chunks=[[H1, 4, 9], [H2, 6]]),
    _manifest_dict(chunks=[[H1, "four"], [H2, 6]]),
    _manifest_dict(chunks=None),
    _manifest_dict(mode="rw"),
    _manifest_dict(v="one"),
    b"",
    b"garbage",
    b"\xff\xfe\x00",
    b"[]",
    b"null",
    b"42",
    b"{}",
    b'{"v": 1}',
])
def test_manifest_rejects(blob: bytes) -> None:
    with pytest.raises(FormatError):
        Manifest.from_json(blob)


def test_manifest_newer_version_message() -> None:
    with pytest.raises(FormatError, match="newer"):
        Manifest.from_json(_manifest_dict(v=manifests.RECORD_VERSION + 1))


def test_store_info_roundtrip_and_checks() -> None:
    info = StoreInfo(chunk_size=CS, created_by="test", created_at=12.5)
    assert StoreInfo.from_json(info.to_json()) == info
    d = json.loads(info.to_json())
    d["format"] = manifests.FORMAT_VERSION + 1
    with pytest.raises(FormatError, match=r"newer than this ckptfs.*upgrade ckptfs"):
        StoreInfo.from_json(json.dumps(d).encode())
    d["format"] = 1
    d["hash"] = "sha256"
    with pytest.raises(FormatError, match="sha256"):
        StoreInfo.from_json(json.dumps(d).encode())
    for blob in (b"", b"nope", b"[]", b"{}", b'{"format": 1}', b'{"format": 1, "chunk_size": "x"}',
                 b'{"format": 1, "chunk_size": 0}',
                 b'{"format": 1, "chunk_size": %d}' % (MAX_CHUNK_SIZE * 2)):
        with pytest.raises(FormatError):
            StoreInfo.from_json(blob)
    assert StoreInfo.from_json(b'{"format": 1, "chunk_size": %d}' % CS).chunk_size == CS


@pytest.mark.parametrize("path", ["a", "a/b", "a b/c.pt", ".hidden", "a..b", "...", ""])
def test_check_path_accepts(path: str) -> None:
    assert manifests.check_path(path) == path


@pytest.mark.parametrize("path", [
    "..", "a/..", "../a", "a/../b", ".", "a/./b", "/a", "/", "a//b", "a/", "//", "a\0b", "\0"])
def test_check_path_rejects(path: str) -> None:
    with pytest.raises(InvalidKeyError):
        manifests.check_path(path)


def test_keys() -> None:
    assert manifests.file_key("a/b.pt") == "files/a/b.pt"
    assert manifests.dir_key("a/b") == "files/a/b/"
    assert manifests.dir_key("") == "files/"
    assert manifests.dir_prefix("a") == "files/a/"
    assert manifests.chunk_key(H2) == f"chunks/01/{H2}"
    assert manifests.join("", "x") == "x" and manifests.join("a/b", "x") == "a/b/x"
    for p in ("a", "a/b", "d/e/f.bin"):
        assert manifests.path_of_key(manifests.file_key(p)) == p
        assert manifests.path_of_key(manifests.dir_key(p)) == p
    assert manifests.path_of_key("files/") == ""
    for bad in ("chunks/00/" + H1, "file/a", "files/../x", "files//a", "files/a/../b", "x"):
        with pytest.raises(InvalidKeyError):
            manifests.path_of_key(bad)
    for bad in ("../x", "/x", "a/../b", "a\0"):
        with pytest.raises(InvalidKeyError):
            manifests.file_key(bad)
        with pytest.raises(InvalidKeyError):
            manifests.dir_key(bad)


def test_dir_marker_roundtrip() -> None:
    m = manifests.DirMarker(mode=stat.S_IFDIR | 0o700, mtime_ns=99)
    assert manifests.DirMarker.from_json(m.to_json()) == m
    assert manifests.DirMarker.from_json(b"") == manifests.DirMarker()
    with pytest.raises(FormatError):
        manifests.DirMarker.from_json(b"not json")


def test_fossil_keys_and_chunk_names() -> None:
    h = "6bba86c7e069f56d5a10b435f1c8e49c"
    assert manifests.fossil_key(h) == f"fossils/6b/{h}"
    assert manifests.chunk_name(manifests.chunk_key(h)) == h
    assert manifests.chunk_name(manifests.fossil_key(h), manifests.FOSSILS) == h
    for key in (manifests.fossil_key(h), f"chunks/6c/{h}", f"chunks/6b/{h}x", "chunks/6b/x",
                f"chunks/{h}", f"chunks/6b/{h.upper()}"):
        assert manifests.chunk_name(key) is None, key


def test_the_confirmation_window_from_the_environment() -> None:
    """CKPTFS_CONFIRM_WINDOW (a test-only hook) can only shorten the window: gc's
    MIN_SAFE_GRACE rests on the default."""
    assert manifests.confirm_window_from(None) == manifests.DEFAULT_CONFIRM_WINDOW == 600
    assert manifests.confirm_window_from("") == 600
    assert manifests.confirm_window_from("2.5") == 2.5
    assert manifests.confirm_window_from("600") == 600
    for bad in ("0", "-1", "601", "nan", "inf", "5s"):
        with pytest.raises(ValueError, match="CKPTFS_CONFIRM_WINDOW"):
            manifests.confirm_window_from(bad)


def test_every_user_of_the_confirmation_window_reads_the_environment() -> None:
    """A mount daemon is another process: the variable reaches the uploader's in_store
    window and the publisher's late-publish check through manifests, at import."""
    code = ("from ckptfs.format import manifests\n"
            "from ckptfs.pipeline import publisher, uploader\n"
            "from ckptfs.tools import gc\n"
            "import inspect\n"
            "default = inspect.signature(uploader.Uploader).parameters['confirm_window']\n"
            "print(manifests.CONFIRM_WINDOW, publisher.CONFIRM_WINDOW, default.default)\n")
    env = {**os.environ, manifests.CONFIRM_WINDOW_ENV: "3.5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["3.5", "3.5", "3.5"]


def test_store_info_store_mode() -> None:
    """A directory store's ckptfs.json records the mode of its files as four octal digits;
    a store without one (older, or a bucket) reads as None; anything but one of the modes
    a directory store may have makes ckptfs.json invalid, on one line."""
    info = StoreInfo(chunk_size=CS, store_mode=0o640)
    assert json.loads(info.to_json())["store_mode"] == "0640"
    assert StoreInfo.from_json(info.to_json()) == info
    assert "store_mode" not in json.loads(StoreInfo(chunk_size=CS).to_json())
    assert StoreInfo.from_json(StoreInfo(chunk_size=CS).to_json()).store_mode is None
    d = json.loads(info.to_json())
    for bad, why in (("0666", "store_mode '0666' is not a mode a directory store may give"),
                     (416, "store_mode is 416, not a string"), ("0o640", "'0o640' is not")):
        d["store_mode"] = bad
        with pytest.raises(FormatError) as e:
            StoreInfo.from_json(json.dumps(d).encode())
        assert str(e.value).startswith("ckptfs.json is not valid: ") and why in str(e.value)
        assert "\n" not in str(e.value)


def test_store_info_formats_1_and_2() -> None:
    """A format 1 ckptfs.json means fixed chunks and lz4 and is written back without the
    format 2 fields (older readers see what they wrote); upgraded() keeps the chunk size;
    format 2 must name its chunking and codec, and only known ones."""
    old = StoreInfo.from_json(b'{"format": 1, "chunk_size": %d}' % CS)
    assert (old.format, old.chunking, old.codec) == (1, "fixed", "lz4")
    assert set(json.loads(old.to_json())) == {"format", "chunk_size", "hash", "created_by",
                                              "created_at"}
    new = old.upgraded()
    assert (new.format, new.chunking, new.codec, new.chunk_size) == (2, "records", "zstd4", CS)
    assert StoreInfo.from_json(new.to_json()) == new
    d = json.loads(new.to_json())
    for field, bad in (("chunking", "cdc"), ("codec", "gzip"), ("min_record", 10)):
        with pytest.raises(FormatError, match=field):
            StoreInfo.from_json(json.dumps({**d, field: bad}).encode())
    del d["codec"]
    with pytest.raises(FormatError, match="codec"):
        StoreInfo.from_json(json.dumps(d).encode())
