"""Store URLs: open_store() picks the store a URL names, or says in one line why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.common.errors import ConfigError
from ckptfs.format import manifests
from ckptfs.store import LocalStore, open_store
from ckptfs.store.s3 import S3Store


def test_open_store_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    plain = open_store("s3://bucket")
    assert isinstance(plain, S3Store) and (plain.bucket, plain.prefix) == ("bucket", "")
    assert plain.url == "s3://bucket/"
    prefixed = open_store("s3://bucket/some/prefix", endpoint_url="http://127.0.0.1:9")
    assert isinstance(prefixed, S3Store) and prefixed.prefix == "some/prefix/"
    assert prefixed.url == "s3://bucket/some/prefix/ at http://127.0.0.1:9"


def test_open_store_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for url in (f"file://{tmp_path}/rel", f"{tmp_path}/rel", "rel", "./rel/", "~/rel"):
        store = open_store(url)
        assert isinstance(store, LocalStore) and store.root == tmp_path / "rel", url


@pytest.mark.parametrize(
    "url, message",
    [
        ("/no/such/dir", "store directory does not exist: /no/such/dir"),
        ("file:///no/such/dir", "store directory does not exist: /no/such/dir"),
        ("hdfs://namenode/x", "unsupported store URL"),
        ("http://host/x", "unsupported store URL"),
        ("file://relative/path", "absolute path"),
        ("s3://", "names no bucket"),
        ("", "empty store path"),
    ],
)
def test_open_store_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        open_store(url)
    assert "\n" not in str(error.value)


def test_open_store_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(ConfigError, match="store directory does not exist"):
        open_store(str(tmp_path / "f"))


def test_storage_class_only_for_s3_chunks_and_refusal_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk PUTs carry the class, other PUTs do not; a class the server refuses is a
    one-line ConfigError from the mount's probe, naming the class and the server's code."""
    from botocore.exceptions import ClientError

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ConfigError, match="s3:// stores only"):
        open_store(str(tmp_path), storage_class="STANDARD_IA")
    store = open_store("s3://bucket/p", endpoint_url="http://127.0.0.1:9",
                       storage_class="STANDARD_IA", storage_class_prefix=manifests.CHUNKS)
    assert isinstance(store, S3Store)
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(store._client, "put_object", lambda **kw: sent.append(kw))
    store.put("chunks/ab/" + "ab" * 16, b"x")
    store.put("files/model.pt", b"{}")
    assert [kw.get("StorageClass") for kw in sent] == ["STANDARD_IA", None]

    def refuse(**kw: object) -> None:
        raise ClientError({"Error": {"Code": "InvalidStorageClass", "Message": "no"},
                           "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutObject")

    monkeypatch.setattr(store._client, "put_object", refuse)
    with pytest.raises(ConfigError) as e:
        store.check_storage_class()
    assert "--storage-class STANDARD_IA" in str(e.value)
    assert "InvalidStorageClass" in str(e.value) and "\n" not in str(e.value)
