"""The S3 store's chunk GETs and PUTs through obstore, against a scripted S3 server on
the loopback: every answer a server can give maps to the error class boto3's would,
no body is read past a GET's limit or taken short, and the fetcher never returns a
chunk whose bytes do not match its name."""

from __future__ import annotations

import http.server
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from support import random_bytes

from ckptfs.common.errors import (
    BadObjectError,
    CorruptChunkError,
    NotFoundError,
    PermanentStoreError,
    TransientStoreError,
)
from ckptfs.format import codec
from ckptfs.format.manifests import chunk_key
from ckptfs.pipeline.cache import LocalCache
from ckptfs.pipeline.fetcher import Fetcher
from ckptfs.store.s3 import S3Store

BUCKET = "bucket"


@dataclass
class Answer:
    """What the server answers for one key: `status` with an S3 error `code`, or 200
    with `body`, of which only the first `send` bytes are sent before the connection
    is closed (None: all)."""

    status: int = 200
    code: str = ""
    body: bytes = b""
    send: int | None = None


@dataclass
class FakeS3:
    """A path-style S3 server: PUT stores a body, GET answers as `answers` says."""

    endpoint: str = ""
    objects: dict[str, bytes] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)
    put_headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeS3]:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fake = FakeS3()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _key(self) -> str:
            return self.path.split("?")[0].removeprefix(f"/{BUCKET}/")

        def do_PUT(self) -> None:
            fake.agents.append(self.headers.get("User-Agent", ""))
            fake.put_headers.append({k.lower(): v for k, v in self.headers.items()})
            fake.objects[self._key()] = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("ETag", '"x"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            fake.agents.append(self.headers.get("User-Agent", ""))
            body = fake.objects.get(self._key())
            self.send_response(404 if body is None else 200)
            self.send_header("Content-Length", str(len(body or b"")))
            self.send_header("ETag", '"x"')
            self.send_header("Last-Modified", "Fri, 04 Dec 2026 00:00:00 GMT")
            self.end_headers()

        def do_GET(self) -> None:
            fake.agents.append(self.headers.get("User-Agent", ""))
            key = self._key()
            answer = fake.answers.get(key) or (
                Answer(body=fake.objects[key]) if key in fake.objects
                else Answer(404, "NoSuchKey"))
            body = answer.body if answer.status == 200 else (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{answer.code}</Code>"
                f"<Message>m</Message></Error>".encode())
            self.send_response(answer.status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", '"x"')
            self.send_header("Last-Modified", "Fri, 04 Dec 2026 00:00:00 GMT")
            self.end_headers()
            self.wfile.write(body[:answer.send])
            if answer.send is not None:
                self.close_connection = True

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def test_chunk_requests_map_every_answer_to_the_error_class_boto3_gives(
        s3: FakeS3) -> None:
    """A chunk's GET, HEAD and PUT go through obstore (its user agent, not botocore's; one
    PutObject, unsigned on the loopback, with no checksum header), and what the server
    answers is the StoreError a caller retries or not by: a missing
    object NotFoundError, refused credentials or a missing bucket permanent, SlowDown
    and 500 transient; a body shorter than its Content-Length transient; an object
    longer than the GET's limit refused before its body is taken."""
    store = S3Store(BUCKET, "", s3.endpoint, read_timeout=5)
    data = random_bytes(300_000)
    store.put_parts("chunks/ab/c1", [data[:100], memoryview(data)[100:]])
    assert s3.objects["chunks/ab/c1"] == data
    assert bytes(store.get_buffer("chunks/ab/c1", len(data))) == data
    assert store.head("chunks/ab/c1") == len(data)
    assert store.head("chunks/ab/none") is None
    assert store.chunks_through_boto3 is None
    assert s3.agents and not any("Botocore" in agent for agent in s3.agents)
    (headers,) = s3.put_headers  # one PutObject, unsigned on the loopback, no checksum
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert not [k for k in headers if k.startswith("x-amz-checksum") or k in (
        "content-md5", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")]

    with pytest.raises(BadObjectError, match="300000 bytes, more than the 299999 bytes"):
        store.get_buffer("chunks/ab/c1", len(data) - 1)
    with pytest.raises(NotFoundError, match="NoSuchKey"):
        store.get_buffer("chunks/ab/none")
    cases = [
        (Answer(403, "AccessDenied"), PermanentStoreError),
        (Answer(404, "NoSuchBucket"), PermanentStoreError),
        (Answer(503, "SlowDown"), TransientStoreError),
        (Answer(500, "InternalError"), TransientStoreError),
        (Answer(body=data, send=1000), TransientStoreError),  # cut short
    ]
    for answer, error in cases:
        s3.answers["chunks/ab/c2"] = answer
        with pytest.raises(error) as caught:
            store.get_buffer("chunks/ab/c2")
        assert type(caught.value) is error, answer
        assert "chunks/ab/c2" in str(caught.value)


@pytest.mark.parametrize("var", ["AWS_SERVER_SIDE_ENCRYPTION", "AWS_REQUEST_PAYER"])
def test_a_variable_only_obstore_reads_sends_chunks_through_boto3(
        s3: FakeS3, monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    """obstore reads AWS_* variables of its own whatever it is given: with one set that
    botocore ignores (server-side encryption, requester pays), chunks would be written
    otherwise than records, so they go through boto3 and the log says why."""
    monkeypatch.setenv(var, "aws:kms" if "ENCRYPTION" in var else "requester")
    store = S3Store(BUCKET, "", s3.endpoint, read_timeout=5)
    data = random_bytes(1000)
    store.put_parts("chunks/ab/c1", [data])
    assert bytes(store.get_buffer("chunks/ab/c1")) == data
    assert store.chunks_through_boto3 == f"${var} is set, which obstore alone would apply"
    assert s3.agents and all("Botocore" in agent for agent in s3.agents)
    assert not [h for h in s3.put_headers if "x-amz-server-side-encryption" in h
                or "x-amz-request-payer" in h]


def test_a_forked_child_sends_its_chunk_requests_through_boto3(s3: FakeS3) -> None:
    """obstore's runtime does not survive a fork (a child's request would wait forever):
    a child forked after the parent's chunk requests sends its own through boto3."""
    store = S3Store(BUCKET, "", s3.endpoint, read_timeout=5)
    data = random_bytes(1000)
    store.put_parts("chunks/ab/c1", [data])
    assert store.chunks_through_boto3 is None
    pid = os.fork()
    if pid == 0:  # the child: exits 0 if it read the chunk, 1 if not; killed if stuck
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # killed, even inside Rust
            signal.alarm(10)
            code = 0 if bytes(store.get_buffer("chunks/ab/c1")) == data else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "Botocore" in s3.agents[-1]


def test_fetcher_never_returns_a_chunk_whose_bytes_do_not_match_its_name(
        s3: FakeS3, tmp_path: Path) -> None:
    """A chunk GET through obstore is verified against the chunk's name: bytes that
    decode but are not the chunk's are a CorruptChunkError, and nothing is cached;
    the right bytes, raw or zstd4, are returned as they were written."""
    store = S3Store(BUCKET, "", s3.endpoint, read_timeout=5)
    raw = random_bytes(100_000)
    packed = bytes(range(64)) * 4096  # zstd4 shrinks it: decoded into memory
    for data in (raw, packed):
        store.put(chunk_key(codec.chunk_hash(data)), codec.encode_chunk(data, "zstd4")[0])
    # a well-formed chunk of other bytes under the name of these
    h_wrong = codec.chunk_hash(b"the bytes this name stands for")
    s3.answers[chunk_key(h_wrong)] = Answer(body=codec.encode_chunk(random_bytes(1000))[0])

    for memory_limit in (0, 1 << 30):
        cache = LocalCache(str(tmp_path / f"cache{memory_limit}"), limit_bytes=1 << 30,
                           memory_bytes=memory_limit)
        fetcher = Fetcher(store, cache, workers=2, missing_timeout=0.5)

        async def body(f: Fetcher = fetcher, c: LocalCache = cache) -> None:
            for data in (raw, packed):
                got = await f.read(codec.chunk_hash(data), 0, len(data))
                assert bytes(got) == data
            with pytest.raises(CorruptChunkError, match="does not match"):
                await f.read(h_wrong, 0, 100)
            assert not c.has(h_wrong)

        try:
            trio.run(body)
        finally:
            cache.close()
    assert not any("Botocore" in agent for agent in s3.agents[2:])
