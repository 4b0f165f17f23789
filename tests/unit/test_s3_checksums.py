"""What the S3 client computes on each request (no network: botocore's `before-send`
event answers in place of a server): no SHA-256 of PUT bodies where TLS or the loopback
already carries them, no CRC32 or MD5 beside xxh3, no checksum validation on GET; chunk
bodies joined once into reused memory (docs/PERFORMANCE.md, "CPU per GiB")."""

from __future__ import annotations

import io
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from ckptfs.store.s3 import BodyPool, S3Store, signs_payload

ENDPOINT = "http://127.0.0.1:1"  # never reached: before-send answers


class _Raw(io.BytesIO):
    """The raw stream of a canned response (botocore's StreamingBody reads it)."""

    def stream(self, amt: int = 1024, decode_content: bool = True) -> Any:
        while chunk := self.read(amt):
            yield chunk


class Server:
    """Records each request botocore would send and answers it with 200."""

    def __init__(self, store: S3Store, body: bytes = b"", headers: dict[str, str] | None
                 = None) -> None:
        self.requests: list[Any] = []
        self.body, self.headers = body, headers or {}
        store._client.meta.events.register_first("before-send.s3", self.answer)

    def answer(self, request: Any, **_: Any) -> AWSResponse:
        self.requests.append(request)
        body = self.body if request.method == "GET" else b""
        headers = {"Content-Length": str(len(body)), "ETag": '"x"', **self.headers}
        return AWSResponse(request.url, 200, headers, _Raw(body))

    def put(self) -> Any:
        (put,) = [r for r in self.requests if r.method == "PUT"]
        return put


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return S3Store("bucket", "p", endpoint_url=ENDPOINT)


def extra_checksums(headers: Any) -> list[str]:
    """The checksum headers a request carries beyond its SigV4 signature."""
    names = [k.lower() for k in headers]
    return [n for n in names if n.startswith("x-amz-checksum") or n in (
        "content-md5", "x-amz-sdk-checksum-algorithm", "x-amz-trailer",
        "x-amz-decoded-content-length")]


def test_client_config_computes_and_validates_no_extra_checksum(store: S3Store) -> None:
    config = store._client.meta.config
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert config.s3["payload_signing_enabled"] is False  # loopback: no SHA-256


@pytest.mark.parametrize(("endpoint", "signed"), [
    (None, False),  # AWS: https
    ("https://s3.example.com", False),
    ("http://127.0.0.1:8333", False),
    ("http://localhost:8333", False),
    ("http://[::1]:8333", False),
    ("http://10.0.0.5:8333", True),  # plain http to another machine: nothing else guards it
    ("http://minio.internal:9000", True),
])
def test_payload_signed_only_over_plain_http_to_another_host(endpoint: str | None,
                                                            signed: bool) -> None:
    assert signs_payload(endpoint) is signed


@pytest.mark.parametrize("via", ["put", "put_parts"])
def test_put_sends_no_sha256_crc_or_md5(store: S3Store, via: str) -> None:
    """A PUT through boto3 (a record's; a chunk's where obstore cannot have the client's
    settings: through obstore, tests/pipeline/test_s3_chunk_path.py) carries
    UNSIGNED-PAYLOAD and no checksum header: a chunk's bytes are hashed once, by xxh3,
    for its name."""
    store.chunks_through_boto3 = "a test"
    server = Server(store)
    parts = [b"CKC1" + bytes(12), bytes(range(256)) * 8192, b"tail"]  # 2 MiB: pooled
    if via == "put":
        store.put("chunks/ab/abc", b"".join(parts))
    else:
        store.put_parts("chunks/ab/abc", parts)
    put = server.put()
    assert put.headers["X-Amz-Content-SHA256"] == b"UNSIGNED-PAYLOAD"
    assert extra_checksums(put.headers) == []
    assert bytes(put.body) == b"".join(parts)


def test_get_does_not_validate_a_server_checksum(store: S3Store) -> None:
    """The GET asks for no checksum and checks none the server sends (here a wrong one):
    the fetcher verifies the chunk against its name instead."""
    server = Server(store, body=b"chunk bytes", headers={"x-amz-checksum-crc32": "AAAAAA=="})
    assert store.get("chunks/ab/abc") == b"chunk bytes"
    (get,) = server.requests
    assert "x-amz-checksum-mode" not in [k.lower() for k in get.headers]
    assert extra_checksums(get.headers) == []


def test_delete_objects_keeps_the_checksum_s3_requires(store: S3Store) -> None:
    """DeleteObjects is the one call S3 requires a checksum on: it still has one."""
    server = Server(store)
    store.delete_many(["a", "b"])
    (post,) = server.requests
    assert extra_checksums(post.headers) != []


def test_body_pool_reuses_its_buffers() -> None:
    pool = BodyPool(keep=1)
    first = pool.join([b"a" * 1000, b"b" * 24])
    assert first is not None and bytes(first) == b"a" * 1000 + b"b" * 24
    pool.release(first)
    again = pool.join([b"c" * 900])  # smaller, above half: the same buffer, cut
    assert again is first and bytes(again) == b"c" * 900
    pool.release(again)
    grown = pool.join([b"d" * 1500])
    assert grown is first and bytes(grown) == b"d" * 1500
    pool.release(grown)
    assert pool.join([b"e" * 10]) is None  # far below half: left to a join of its own
    held = memoryview(first)  # botocore still holding it: a new buffer, not a failure
    other = pool.join([b"f" * 1400])
    assert other is not None and other is not first and bytes(other) == b"f" * 1400
    held.release()
