"""The Store contract, run over every store; then LocalStore, S3Store, FaultyStore specifics."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from seaweed import SeaweedServer

from ckptfs.errors import (
    InvalidKeyError,
    NotFoundError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ckptfs.store import Listing, LocalStore, Store
from ckptfs.store.faulty import FaultyStore
from ckptfs.store.s3 import S3Store


@pytest.fixture(params=["local", "s3", "faulty-local"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each store implementation in turn (s3 is a real SeaweedFS bucket)."""
    inner: Store = request.getfixturevalue("s3_store" if request.param == "s3" else "local_store")
    return FaultyStore(inner) if request.param == "faulty-local" else inner


def put_all(store: Store, items: dict[str, bytes]) -> None:
    """Put many objects from 16 threads."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: store.put(*kv), items.items()))


def keys_of(objects: Iterable[tuple[str, int]]) -> list[str]:
    return [key for key, _ in objects]


# -- the contract


def test_put_get_roundtrip(store: Store) -> None:
    store.put("a", b"hello")
    store.put("dir/b", memoryview(bytearray(b"--world--"))[2:-2])
    store.put("empty", b"")
    assert store.get("a") == b"hello"
    assert store.get("dir/b") == b"world"
    assert store.get("empty") == b""


def test_large_object(store: Store) -> None:
    data = os.urandom(20 << 20)
    store.put("big/object", data)
    assert store.head("big/object") == len(data)
    assert store.get("big/object") == data


def test_overwrite_replaces(store: Store) -> None:
    store.put("k", b"a much longer old value")
    store.put("k", b"new")
    assert store.get("k") == b"new"
    assert store.head("k") == 3


def test_missing_object(store: Store) -> None:
    store.put("dir/present", b"x")
    for key in ("absent", "dir/absent", "nodir/absent", "dir/present/below"):
        with pytest.raises(NotFoundError):
            store.get(key)
        with pytest.raises(NotFoundError):
            store.get_range(key, 0, 10)
        assert store.head(key) is None


def test_head_sizes(store: Store) -> None:
    store.put("zero", b"")
    store.put("seven", b"1234567")
    assert store.head("zero") == 0
    assert store.head("seven") == 7
    assert store.head("none") is None


def test_get_range(store: Store) -> None:
    data = bytes(range(256)) * 4
    store.put("r", data)
    store.put("empty", b"")
    assert store.get_range("r", 10, 20) == data[10:20]
    assert store.get_range("r", 1000, 1024) == data[1000:]
    assert store.get_range("r", 1020, 2000) == data[1020:]
    assert store.get_range("r", 0, 1) == data[:1]
    assert store.get_range("r", 1024, 2000) == b""
    assert store.get_range("r", 5000, 6000) == b""
    assert store.get_range("r", 5, 5) == b""
    assert store.get_range("empty", 0, 10) == b""


def test_delete(store: Store) -> None:
    store.put("d/k", b"x")
    store.put("d/other", b"y")
    store.delete("d/k")
    assert store.head("d/k") is None
    with pytest.raises(NotFoundError):
        store.get("d/k")
    store.delete("d/k")
    store.delete("never/existed")
    assert store.list("d/").objects == [("d/other", 1)]


@pytest.mark.parametrize("store", ["local", "s3"], indirect=True)  # FaultyStore: pass-through
def test_thousands_of_keys(store: Store) -> None:
    """Listing crosses S3's 1000-key pages; delete_many crosses its 1000-key batches.

    Every other key exists, so each batch of the 2500 holds keys that must really go.
    """
    keys = [f"many/{i:04d}" for i in range(2500)]
    present = keys[::2]
    put_all(store, {k: b"xy" for k in present})
    store.put("keep/me", b"kept")
    assert store.list("many/").objects == [(k, 2) for k in present]
    assert store.list("", None).objects == [("keep/me", 4), *((k, 2) for k in present)]
    assert store.list("").prefixes == ["keep/", "many/"]
    store.delete_many(keys)
    assert store.list("", None).objects == [("keep/me", 4)]


TREE = {
    "dir/": b"",  # a directory marker, as S3 consoles create them
    "dir/x": b"333",
    "dir/sub/y": b"4444",
    "dir/sub/z": b"55555",
    "obj": b"22",  # an object and a prefix of the same name
    "obj/child": b"1",
    "top": b"1",
    "other/deep/q": b"6",
}


def test_list_with_delimiter(store: Store) -> None:
    for key, data in TREE.items():
        store.put(key, data)
    root = store.list("")
    assert root.objects == [("obj", 2), ("top", 1)]
    assert root.prefixes == ["dir/", "obj/", "other/"]
    below = store.list("dir/")
    assert below.objects == [("dir/", 0), ("dir/x", 3)]
    assert below.prefixes == ["dir/sub/"]
    assert store.list("dir/sub/").objects == [("dir/sub/y", 4), ("dir/sub/z", 5)]
    assert store.list("obj/").objects == [("obj/child", 1)]
    assert store.list("other/").objects == []
    assert store.list("other/").prefixes == ["other/deep/"]
    assert store.list("nothing/") == Listing([], [])


def test_list_recursive(store: Store) -> None:
    for key, data in TREE.items():
        store.put(key, data)
    everything = store.list("", None)
    assert everything.objects == sorted((k, len(v)) for k, v in TREE.items())
    assert everything.prefixes == []
    assert keys_of(store.list("dir/", None).objects) == ["dir/", "dir/sub/y", "dir/sub/z", "dir/x"]


def test_marker_beside_object_of_same_name(store: Store, request: pytest.FixtureRequest) -> None:
    """S3 keeps "a", "a/" and "a/x" apart; SeaweedFS stores "a" and "a/" as one entry."""
    if isinstance(store, S3Store):
        reason = "SeaweedFS: an object 'a' and a marker 'a/' cannot coexist"
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    for key in ("a/x", "a", "a/"):
        store.put(key, key.encode())
    assert store.list("").objects == [("a", 1)]
    assert store.list("a/").objects == [("a/", 2), ("a/x", 3)]
    assert store.get("a") == b"a" and store.get("a/") == b"a/"


def test_list_arbitrary_prefix(store: Store) -> None:
    for key in ("data/ab", "data/abc", "data/abd", "data/ab/x", "data/b", "dat"):
        store.put(key, b"x")
    listing = store.list("data/ab")
    assert keys_of(listing.objects) == ["data/ab", "data/abc", "data/abd"]
    assert listing.prefixes == ["data/ab/"]
    recursive = ["data/ab", "data/ab/x", "data/abc", "data/abd"]
    assert keys_of(store.list("data/ab", None).objects) == recursive
    assert store.list("da").objects == [("dat", 1)]
    assert store.list("da").prefixes == ["data/"]
    assert store.list("data/a", None) == store.list("data/ab", None)


def test_copy(store: Store) -> None:
    store.put("src/a", b"payload")
    store.put("dst/b", b"old")
    store.copy("src/a", "dst/b")
    store.copy("src/a", "new/dir/c")
    assert store.get("dst/b") == store.get("new/dir/c") == store.get("src/a") == b"payload"
    with pytest.raises(NotFoundError):
        store.copy("src/absent", "dst/d")
    assert store.head("dst/d") is None


ODD_KEYS = [
    "with space/a b.txt",
    "unicode/ünïcødé/文件.bin",
    "pct/100%",
    "pct/%o",
    "pct/%",
    "pct/a%25b",
    "pct%o/x%t-1",
    "pct%25/y",
]


def test_odd_keys(store: Store) -> None:
    for i, key in enumerate(ODD_KEYS):
        store.put(key, key.encode() + bytes([i]))
    for i, key in enumerate(ODD_KEYS):
        assert store.get(key) == key.encode() + bytes([i])
        assert store.head(key) == len(key.encode()) + 1
    assert keys_of(store.list("", None).objects) == sorted(ODD_KEYS)
    assert keys_of(store.list("pct/").objects) == [k for k in sorted(ODD_KEYS) if k[:4] == "pct/"]
    assert store.list("").prefixes == ["pct%25/", "pct%o/", "pct/", "unicode/", "with space/"]
    assert keys_of(store.list("pct%").objects) == []
    assert store.list("pct%").prefixes == ["pct%25/", "pct%o/"]


def test_concurrent_puts_and_deletes(store: Store) -> None:
    """16 threads write and delete in shared directories (races mkdir against pruning)."""

    def value(t: int, i: int) -> bytes:
        return f"{t}-{i}".encode() * 100

    def work(t: int) -> None:
        for i in range(12):
            key = f"conc/{i % 3}/{t % 2}/k{t}-{i}"
            store.put(key, value(t, i))
            store.put("conc/shared", value(t, i))
            if i % 2:
                store.delete(key)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, range(16)))
    kept = {f"conc/{i % 3}/{t % 2}/k{t}-{i}": value(t, i)
            for t in range(16) for i in range(0, 12, 2)}
    assert keys_of(store.list("conc/", None).objects) == sorted([*kept, "conc/shared"])
    for key, data in kept.items():
        assert store.get(key) == data
    assert store.get("conc/shared") in {value(t, 11) for t in range(16)}  # some thread's last


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_parent_is_one_level_up(kind: str, request: pytest.FixtureRequest) -> None:
    """parent(): the directory or key prefix one level up, up to the top (None there)."""
    outer: Store = request.getfixturevalue("s3_store" if kind == "s3" else "local_store")
    outer.put("ckptfs.json", b"{}")
    if isinstance(outer, S3Store):
        inner: Store = S3Store(outer.bucket, outer.prefix + "run/step-3",
                               endpoint_url=outer.endpoint)
        levels_above = 1  # outer's prefix is one segment: then the bucket's root
    else:
        assert isinstance(outer, LocalStore)
        inner = LocalStore(outer.root / "run" / "step-3")
        levels_above = len(outer.root.parts) - 1  # its parent directories up to /
    up = inner.parent()
    assert up is not None and up.head("ckptfs.json") is None
    up = up.parent()
    assert up is not None and up.head("ckptfs.json") == 2 and up.url == outer.url
    for _ in range(levels_above):
        up = up.parent()
        assert up is not None
    assert up.parent() is None
    inner.close()  # the parents share its connections


# -- LocalStore


UNSAFE_KEYS = ["../x", "/abs", "a/../../b", "a\0b", "a//b", ".", "..", "a/./b", "", "/"]


@pytest.mark.parametrize("key", UNSAFE_KEYS)
def test_local_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    root = tmp_path / "deep" / "root"
    root.mkdir(parents=True)
    store = LocalStore(root)
    store.put("ok", b"x")
    calls: list[Callable[[], object]] = [
        lambda: store.put(key, b"evil"),
        lambda: store.get(key),
        lambda: store.get_range(key, 0, 1),
        lambda: store.head(key),
        lambda: store.delete(key),
        lambda: store.copy("ok", key),
        lambda: store.copy(key, "ok2"),
    ]
    for call in calls:
        with pytest.raises(InvalidKeyError):
            call()
    created = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert created == ["deep", "deep/root", "deep/root/ok%o"]


@pytest.mark.parametrize("prefix", ["../", "/", "a/../", "a//", "./x"])
def test_local_rejects_unsafe_list_prefixes(local_store: LocalStore, prefix: str) -> None:
    with pytest.raises(InvalidKeyError):
        local_store.list(prefix)


def test_local_layout(local_store: LocalStore) -> None:
    """The key -> file mapping is part of the on-disk format: pin it."""
    for key in ("files/a/b.pt", "files/a/", "files/a", "ckptfs.json", "100%/x"):
        local_store.put(key, b"x")
    root = local_store.root
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == ["100%25/x%o", "ckptfs.json%o", "files/a%o", "files/a/%o", "files/a/b.pt%o"]
    assert local_store.url == f"file://{root}"


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if "%t-" in p.name]


def test_local_failed_rename_keeps_old_object(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_store.put("dir/k", b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(TransientStoreError, match="injected I/O error"):
        local_store.put("dir/k", b"new")
    monkeypatch.undo()
    assert local_store.get("dir/k") == b"old"
    assert temp_files(local_store.root) == []


def test_local_disk_full_midway_keeps_old_object(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_store.put("k", b"old")
    real_write = os.write

    def write_then_fill_disk(fd: int, data: bytes | memoryview) -> int:
        monkeypatch.setattr(os, "write", disk_full)
        return real_write(fd, memoryview(data)[:3])  # a short write, then ENOSPC

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write_then_fill_disk)
    with pytest.raises(PermanentStoreError, match="No space left"):
        local_store.put("k", b"new and longer")
    monkeypatch.undo()
    assert local_store.get("k") == b"old"
    assert temp_files(local_store.root) == []


def test_local_list_ignores_temp_and_foreign_files(local_store: LocalStore) -> None:
    local_store.put("dir/k", b"x")
    root = local_store.root
    (root / "dir" / "k%t-0123abcd").write_bytes(b"partial")
    (root / "top%t-99").write_bytes(b"partial")
    (root / "README").write_bytes(b"not an object")
    (root / "tmponly").mkdir()
    (root / "tmponly" / "z%t-1").write_bytes(b"partial")
    (root / "empty" / "deeper").mkdir(parents=True)
    assert local_store.list("").objects == []
    assert local_store.list("").prefixes == ["dir/"]
    assert local_store.list("", None).objects == [("dir/k", 1)]
    assert local_store.list("dir/").objects == [("dir/k", 1)]


def test_local_delete_prunes_empty_directories(local_store: LocalStore) -> None:
    local_store.put("a/b/c/k", b"x")
    local_store.put("a/keep", b"y")
    local_store.delete("a/b/c/k")
    assert sorted(p.name for p in local_store.root.rglob("*")) == ["a", "keep%o"]
    local_store.delete("a/keep")
    assert list(local_store.root.iterdir()) == []


def test_local_missing_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "gone")
    with pytest.raises(PermanentStoreError, match="is gone"):
        store.put("a/b", b"x")
    with pytest.raises(NotFoundError):
        store.get("a/b")
    assert store.list("") == Listing([], [])
    assert not (tmp_path / "gone").exists()


def test_local_without_fsync(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, fsync=False)
    store.put("a/b", b"x")
    store.copy("a/b", "c")
    assert store.get("c") == b"x"
    assert temp_files(tmp_path) == []


def test_local_leaves_no_temp_files(local_store: LocalStore) -> None:
    put_all(local_store, {f"t/{i % 4}/{i}": b"z" * i for i in range(200)})
    local_store.copy("t/1/1", "t/copy")
    assert temp_files(local_store.root) == []


# -- S3Store


def assert_one_line_without_secrets(*errors: BaseException) -> None:
    """Error messages go to logs: one line each, and never the credentials in use."""
    secrets = [os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]]
    for error in errors:
        assert "\n" not in str(error)
        assert not any(secret in str(error) for secret in secrets), str(error)


def test_s3_missing_bucket_is_permanent(seaweed: SeaweedServer) -> None:
    store = S3Store("ckptfs-no-such-bucket", endpoint_url=seaweed.endpoint)
    with pytest.raises(PermanentStoreError) as check:
        store.check()
    assert str(check.value) == f"bucket ckptfs-no-such-bucket does not exist at {seaweed.endpoint}"
    with pytest.raises(PermanentStoreError, match="NoSuchBucket") as get:
        store.get("k")
    assert "ckptfs-no-such-bucket" in str(get.value) and seaweed.endpoint in str(get.value)
    with pytest.raises(PermanentStoreError, match="NoSuchBucket") as put:
        store.put("k", b"x")
    assert_one_line_without_secrets(check.value, get.value, put.value)


def test_s3_wrong_credentials_are_permanent(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDWRONGKEY123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-LEAKCHECK")
    store = S3Store(s3_store.bucket, endpoint_url=s3_store.endpoint)
    errors = []
    for call in (store.check, lambda: store.get("k"), lambda: store.put("k", b"x")):
        with pytest.raises(PermanentStoreError) as failure:
            call()
        errors.append(failure.value)
    assert str(errors[0]).startswith(f"access to bucket {s3_store.bucket} at {s3_store.endpoint}")
    assert "InvalidAccessKeyId" in str(errors[1])
    assert_one_line_without_secrets(*errors)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_s3_refused_connection_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDLEAKCHECK1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-LEAKCHECK")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store("bucket", endpoint_url=endpoint, connect_timeout=1, read_timeout=1)
    started = time.monotonic()
    with pytest.raises(TransientStoreError) as check:
        store.check()
    assert str(check.value) == f"cannot connect to {endpoint}: Connection refused"
    errors: list[StoreError] = [check.value]
    for call in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: store.list("")):
        with pytest.raises(TransientStoreError) as failure:
            call()
        assert endpoint in str(failure.value)
        errors.append(failure.value)
    assert time.monotonic() - started < 15
    assert_one_line_without_secrets(*errors)


def test_s3_without_credentials_is_permanent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3Store("bucket", endpoint_url=f"http://127.0.0.1:{free_port()}", region="us-east-1")
    with pytest.raises(PermanentStoreError, match="Unable to locate credentials"):
        store.get("k")


def test_s3_prefix_isolation(seaweed: SeaweedServer) -> None:
    bucket = seaweed.new_bucket()
    one = S3Store(bucket, prefix="/team/one", endpoint_url=seaweed.endpoint)
    two = S3Store(bucket, prefix="team/two/", endpoint_url=seaweed.endpoint)
    bare = S3Store(bucket, endpoint_url=seaweed.endpoint)
    one.put("k", b"1")
    two.put("k", b"2")
    assert one.list("", None).objects == [("k", 1)]
    assert two.get("k") == b"2"
    assert keys_of(bare.list("", None).objects) == ["team/one/k", "team/two/k"]
    assert bare.list("team/").prefixes == ["team/one/", "team/two/"]
    assert one.url == f"s3://{bucket}/team/one/ at {seaweed.endpoint}"
    for store in (one, two, bare):
        store.close()
    seaweed.drop_bucket(bucket)


# -- FaultyStore


@pytest.fixture
def faulty(local_store: LocalStore) -> FaultyStore:
    """A FaultyStore around a LocalStore."""
    return FaultyStore(local_store, seed=1)


def test_faulty_counts(faulty: FaultyStore) -> None:
    faulty.put("a", b"1")
    faulty.put("b", b"2")
    faulty.get("a")
    faulty.get_range("a", 0, 1)
    faulty.head("a")
    faulty.list("")
    faulty.copy("a", "c")
    faulty.delete_many(["a", "b"])
    expected = {"put": 2, "get": 1, "get_range": 1, "head": 1, "list": 1, "copy": 1, "delete": 2}
    assert faulty.counts == expected


def test_faulty_fail(faulty: FaultyStore) -> None:
    faulty.put("a", b"1")
    faulty.fail("get", times=2)
    faulty.fail("head", error=PermanentStoreError("gone"))
    for _ in range(2):
        with pytest.raises(TransientStoreError):
            faulty.get("a")
    assert faulty.get("a") == b"1"
    with pytest.raises(PermanentStoreError, match="gone"):
        faulty.head("a")
    assert faulty.head("a") == 1
    with pytest.raises(ValueError):
        faulty.fail("rename")


def test_faulty_fail_rate(faulty: FaultyStore) -> None:
    faulty.put("a", b"1")
    faulty.fail_rate("head", 0.5)
    outcomes = []
    for _ in range(200):
        try:
            outcomes.append(faulty.head("a") == 1)
        except TransientStoreError:
            outcomes.append(False)
    assert 50 < outcomes.count(True) < 150
    faulty.heal()
    assert faulty.head("a") == 1


def test_faulty_hang_and_release(faulty: FaultyStore) -> None:
    faulty.put("a", b"1")
    faulty.hang("get")
    results: list[bytes] = []
    thread = threading.Thread(target=lambda: results.append(faulty.get("a")))
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive() and faulty.counts["get"] == 1
    assert faulty.head("a") == 1  # other operations are not affected
    faulty.release()
    thread.join(5)
    assert results == [b"1"]


def test_faulty_hang_is_bounded(local_store: LocalStore) -> None:
    faulty = FaultyStore(local_store, max_hang=0.2)
    faulty.hang("head")
    started = time.monotonic()
    assert faulty.head("a") is None
    assert 0.15 < time.monotonic() - started < 5


def test_faulty_partial_put(faulty: FaultyStore) -> None:
    faulty.partial_put_next(3)
    with pytest.raises(TransientStoreError):
        faulty.put("k", b"abcdef")
    assert faulty.inner.get("k") == b"abc"
    faulty.put("k", b"abcdef")
    assert faulty.get("k") == b"abcdef"


def test_faulty_latency(faulty: FaultyStore) -> None:
    faulty.set_latency("head", 0.2)
    started = time.monotonic()
    faulty.head("a")
    assert time.monotonic() - started >= 0.2


def test_faulty_corrupt_get(faulty: FaultyStore) -> None:
    data = bytes(100)
    faulty.put("k", data)
    faulty.corrupt_get("k")
    corrupted = faulty.get("k")
    assert sum(a != b for a, b in zip(corrupted, data, strict=True)) == 1
    assert faulty.get_range("k", 0, 10) != data[:10]
    faulty.heal()
    assert faulty.get("k") == data


def test_importing_stores_does_not_import_boto3() -> None:
    code = "import sys, ckptfs.store; assert 'boto3' not in sys.modules, 'boto3 imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
