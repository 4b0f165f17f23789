"""S3Store.put_if_absent against a server that ignores If-None-Match (a stub client): the
first call finds it out with one probe, says so in the log, and from then on checks
before it writes; a server that honours it is trusted without a HEAD."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ckptfs.store.s3 import S3Store


class StubS3:
    """The few S3 calls put_if_absent makes, on a dict; `honours`: If-None-Match."""

    def __init__(self, honours: bool) -> None:
        self.honours = honours
        self.objects: dict[str, bytes] = {}
        self.calls: list[str] = []

    def put_object(self, Bucket: str, Key: str, Body: bytes, **extra: Any) -> None:  # noqa: N803
        self.calls.append("put" + ("?" if extra.get("IfNoneMatch") else ""))
        if extra.get("IfNoneMatch") == "*" and self.honours and Key in self.objects:
            raise ClientError({"Error": {"Code": "PreconditionFailed"},
                               "ResponseMetadata": {"HTTPStatusCode": 412}}, "PutObject")
        self.objects[Key] = Body

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        self.calls.append("head")
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "404"},
                               "ResponseMetadata": {"HTTPStatusCode": 404}}, "HeadObject")
        return {"ContentLength": len(self.objects[Key])}

    def delete_object(self, Bucket: str, Key: str) -> None:  # noqa: N803
        self.calls.append("delete")
        self.objects.pop(Key, None)


def stub_store(honours: bool) -> tuple[S3Store, StubS3]:
    store = S3Store.__new__(S3Store)
    store.bucket, store.prefix, store.endpoint = "b", "", "http://stub"
    store.storage_class, store.storage_class_prefix = None, ""
    store.atomic_create = None
    store.url = "s3://b/ at http://stub"
    # chunk requests (the HEAD among them) through the stub too, not obstore
    store._chunk_pid, store._chunk_client = os.getpid(), None
    store.chunks_through_boto3 = "a stub client"
    client = StubS3(honours)
    store._client = client
    return store, client


@pytest.mark.parametrize("honours", [True, False])
def test_the_first_put_if_absent_probes_the_server(
        honours: bool, caplog: pytest.LogCaptureFixture) -> None:
    store, client = stub_store(honours)
    with caplog.at_level(logging.WARNING):
        assert store.put_if_absent("k", b"one") is True
    assert store.atomic_create is honours
    assert ("ignores If-None-Match" in caplog.text) is not honours
    assert [k for k in client.objects if "probe" in k] == []
    client.calls.clear()
    assert store.put_if_absent("k", b"two") is False
    assert client.objects["k"] == b"one"
    # honoured: the server decides, no HEAD; ignored: a HEAD, then no PUT
    assert client.calls == (["put?"] if honours else ["head"])
