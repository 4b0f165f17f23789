"""A store in an S3-compatible bucket (AWS S3, MinIO, SeaweedFS, Ceph RGW), through botocore."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    DataNotFoundError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    ConfigError,
    KeyTooLongError,
    NotFoundError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ckptfs.common.redact import redact
from ckptfs.store import s3chunks
from ckptfs.store.base import ObjectInfo, one_line, restamp_if_slow, root_cause, too_large
from ckptfs.store.bucket import PrefixedStore, status_class

log = logging.getLogger(__name__)

#: error codes of a missing object
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
#: error codes that retrying cannot fix: a wrong bucket, endpoint or credentials
PERMANENT_CODES = frozenset(
    {
        "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
        "AllAccessDisabled", "AccountProblem", "InvalidBucketName", "ExpiredToken",
        "InvalidToken", "RequestTimeTooSkewed", "403",
    }
)
#: 4xx error codes that are nevertheless worth retrying (throttling, torn requests)
TRANSIENT_CODES = frozenset(
    {
        "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestTimeout",
        "RequestLimitExceeded", "BandwidthLimitExceeded", "OperationAborted",
        "PriorRequestNotComplete", "IncompleteBody", "BadDigest", "XAmzContentSHA256Mismatch",
    }
)
#: client-side errors that retrying cannot fix
PERMANENT_BOTOCORE = (
    NoCredentialsError, PartialCredentialsError, ProfileNotFound, NoRegionError,
    ParamValidationError,
)
#: most keys one DeleteObjects request may carry
DELETE_BATCH = 1000
#: bodies from put_parts at least this large are joined into a reused buffer (BodyPool)
POOLED_BODY = 1 << 20


def signs_payload(endpoint_url: str | None) -> bool:
    """Whether PUT bodies to `endpoint_url` (None: AWS, https) are SHA-256 signed. Only
    over plain http to another host: there nothing else guards a body on its way (over
    TLS, its record MACs do; on the loopback there is no wire). Everywhere else requests
    say UNSIGNED-PAYLOAD, and no second checksum (CRC32, MD5) is computed either: every
    chunk is named by the xxh3-128 of its bytes and checked against it on every read
    (docs/_cpu_results.md, "Integrity per request")."""
    if endpoint_url is None:
        return False
    parts = urlsplit(endpoint_url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: some other machine


def client_config(endpoint_url: str | None, max_pool_connections: int = 32,
                  connect_timeout: float = 5, read_timeout: float = 60) -> Config:
    """The botocore Config of every S3Store client."""
    s3: dict[str, Any] = {"payload_signing_enabled": signs_payload(endpoint_url)}
    if endpoint_url:
        s3["addressing_style"] = "path"
    return Config(
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        # 2 attempts in all (botocore's "max_attempts" would be 2 *retries*, 3 attempts):
        # ckptfs retries with its own backoff
        retries={"total_max_attempts": 2, "mode": "standard"},
        s3=s3,
        # no CRC32 on every PUT and no validation on GET (botocore >= 1.36 does both by
        # default): xxh3 names and verifies every chunk end to end, and many S3-compatible
        # servers reject the flexible checksums. Requests that S3 requires a checksum on
        # (DeleteObjects) still carry one.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class S3DataLoader(botocore.loaders.Loader):  # type: ignore[misc]  # botocore is untyped
    """botocore's loader of its service models, which, asked which services exist (to
    check that the client's service is one), looks for S3's models only instead of into
    the directories of all ~400 services: a quarter of the CPU time of making a client."""

    def list_available_services(self, type_name: str) -> list[str]:
        try:
            return ["s3"] if self.list_api_versions("s3", type_name) else []
        except DataNotFoundError:
            return []


def s3_session(region: str | None) -> Any:
    """A botocore session as boto3's Session(region_name=region) makes one (the same
    credential chain and configuration, AWS_DATA_PATH included), without importing boto3
    and s3transfer (~0.1 s of a mount), its data loader an S3DataLoader."""
    session = botocore.session.get_session()
    if region is not None:
        session.set_config_variable("region", region)
    data_path = session.get_config_variable("data_path")  # as botocore.loaders.create_loader
    extra = ([os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)]
             if data_path is not None else None)
    session.register_component("data_loader", S3DataLoader(extra_search_paths=extra))
    return session


class BodyPool:
    """Reused bytearrays for the bodies of chunk PUTs (botocore takes bytes or bytearray,
    not a memoryview): each chunk is joined once into one of these instead of into fresh
    memory, whose page faults are the expensive part of moving gigabytes on some VMs. At
    most `keep` are kept; a buffer botocore still holds a view of is let go."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def join(self, parts: Sequence[bytes | bytearray | memoryview]) -> bytearray | None:
        """The concatenation of `parts` in a reused buffer (give it back with release());
        None when no kept buffer fits it without shrinking it below half its size."""
        size = sum(len(p) for p in parts)
        with self._lock:
            buf = max(self._free, key=len, default=None)
            if buf is not None:
                if size * 2 < len(buf):
                    return None  # CPython would give a major part of it back: keep it
                self._free.remove(buf)
        if buf is None:
            buf = bytearray(size)
        try:
            if len(buf) > size:
                del buf[size:]  # no realloc: it stays above half
            elif len(buf) < size:
                buf.extend(bytes(size - len(buf)))
        except BufferError:  # still exported somewhere: a new one
            buf = bytearray(size)
        import numpy as np  # here: a mount loads numpy after it answers (codec.preload)

        out = np.frombuffer(buf, np.uint8)
        pos = 0
        for part in parts:  # numpy copies with the GIL released (memoryview's holds it)
            out[pos:pos + len(part)] = np.frombuffer(part, np.uint8)
            pos += len(part)
        del out
        return buf

    def release(self, buf: bytearray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)


def error_class(code: str, status: int) -> type[StoreError]:
    """The StoreError subclass for an S3 error code and HTTP status (0 if unknown)."""
    return status_class(status, permanent=code in PERMANENT_CODES,
                        missing=code in NOT_FOUND_CODES, transient=code in TRANSIENT_CODES)


def error_code(e: ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status or 0) of a ClientError."""
    code = str(e.response.get("Error", {}).get("Code", ""))
    return code, int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


class S3Store(PrefixedStore):
    """Objects under `prefix` in one bucket; one shared, thread-safe botocore client."""

    service = "S3"
    scheme = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        max_pool_connections: int = 32,
        connect_timeout: float = 5,
        read_timeout: float = 60,
        storage_class: str | None = None,
        storage_class_prefix: str = "",
    ) -> None:
        self.bucket = bucket
        # S3 storage class of the objects under storage_class_prefix (the format's chunks,
        # named by the caller); all other objects get the bucket's default
        self.storage_class = storage_class
        self.storage_class_prefix = storage_class_prefix
        self._region = region
        self._no_batch_delete = False  # set once the server refuses DeleteObjects
        self._bodies = BodyPool()  # at most 8 kept: the default --upload-threads
        #: None until the first put_if_absent finds out (_probe_conditional_put)
        self.atomic_create: bool | None = None  # type: ignore[assignment]
        super().__init__(bucket, prefix, endpoint_url, max_pool_connections, connect_timeout,
                         read_timeout)

    def _connect(self, endpoint_url: str | None, max_pool_connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        config = client_config(endpoint_url, max_pool_connections, connect_timeout,
                               read_timeout)
        session = s3_session(self._region)
        self._client: Any = session.create_client("s3", endpoint_url=endpoint_url,
                                                  config=config)
        self.endpoint = redact(self._client.meta.endpoint_url)  # in messages: no password
        self.url_endpoint = redact(endpoint_url) if endpoint_url else None
        self._session = session
        self._chunk_settings = (endpoint_url, max_pool_connections, connect_timeout,
                                read_timeout)
        self._chunk_lock = threading.Lock()
        #: obstore's client of the chunk requests, made on the first (_chunk_store)
        self._chunk_client: Any = None
        #: why chunk requests go through boto3 instead ("" until the first is known)
        self.chunks_through_boto3: str | None = ""
        self._chunk_pid = os.getpid()  # the process that decided it

    def _chunk_store(self, key: str) -> Any:
        """obstore's client for a chunk request on `key`, or None: the request then goes
        through boto3 (a key obstore would spell otherwise, or settings it cannot give:
        s3chunks.unusable, said once in the log)."""
        if not s3chunks.PLAIN_KEY.fullmatch(self._key(key)):
            return None
        if self._chunk_pid != os.getpid():  # a forked child: obstore is not for it
            self._chunk_lock = threading.Lock()
            self._chunk_pid, self._chunk_client = os.getpid(), None
            self.chunks_through_boto3 = ""
        if self.chunks_through_boto3 == "":
            with self._chunk_lock:
                if self.chunks_through_boto3 == "":
                    endpoint_url, connections, connect, read = self._chunk_settings
                    why = s3chunks.unusable(self._client, endpoint_url, self._session)
                    if why is None:
                        self._chunk_client = s3chunks.open_chunk_store(
                            self._client, self._session, self.bucket, endpoint_url,
                            signs_payload(endpoint_url), connections, connect, read)
                    else:
                        log.info("chunk GETs and PUTs go through boto3, holding the GIL "
                                 "(%s)", why)
                    self.chunks_through_boto3 = why
        return self._chunk_client

    @contextlib.contextmanager
    def _chunk_errors(self, op: str, key: str) -> Iterator[None]:
        with s3chunks.errors(lambda detail: self._message(op, key, detail), error_class):
            yield

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate botocore exceptions into the StoreError family, never naming secrets."""
        try:
            yield
        except ClientError as e:
            code, status = error_code(e)
            if code == "KeyTooLongError":  # e.g. SeaweedFS: 255 bytes per segment
                raise KeyTooLongError(self._message(op, key, code)) from e
            cls = error_class(code, status)
            raise cls(self._message(op, key, f"{code or 'error'} (HTTP {status})")) from e
        except PERMANENT_BOTOCORE as e:
            raise PermanentStoreError(self._message(op, key, one_line(e))) from e
        except BotoCoreError as e:
            raise TransientStoreError(self._message(op, key, one_line(e))) from e

    def check(self) -> None:
        """Verify that the bucket exists and answers; raise a one-line StoreError if not."""
        with self._errors("check", ""):
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except ClientError as e:
                code, status = error_code(e)
                if code == "NoSuchBucket" or error_class(code, status) is NotFoundError:
                    message = f"bucket {self.bucket} does not exist at {self.endpoint}"
                    raise PermanentStoreError(message) from e
                if status == 403:
                    message = f"access to bucket {self.bucket} at {self.endpoint} denied (HTTP 403)"
                    raise PermanentStoreError(f"{message}: check the credentials") from e
                raise
            except (BotoConnectionError, HTTPClientError) as e:
                raise TransientStoreError(
                    f"cannot connect to {self.endpoint}: {root_cause(e)}"
                ) from e

    def put(self, key: str, data: bytes | memoryview) -> None:
        """One PutObject through boto3 (the records'; put_parts is the chunks')."""
        self.check_length(key)
        self._put_parts(key, [data], None, self._storage_class_of(key))

    def _storage_class_of(self, key: str) -> str | None:
        return (self.storage_class if key.startswith(self.storage_class_prefix)
                else None)

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """One PutObject of the parts joined once (a chunk's header, planes and tail),
        into a reused buffer when it is large; through obstore (no GIL held while the
        body is sent) unless _chunk_store() says boto3, or the object gets a storage
        class (--storage-class: boto3 sets it). Always a bytearray: botocore wraps a
        bytes body in a BytesIO, which http.client then sends 16 KiB at a time (a copy
        and a send call each), after an Expect: 100-continue round trip."""
        self.check_length(key)
        storage_class = self._storage_class_of(key)
        self._put_parts(key, parts, None if storage_class else self._chunk_store(key),
                        storage_class)

    def _put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview],
                   chunks: Any, storage_class: str | None = None) -> None:
        """put_parts() through obstore's client `chunks`, or boto3's if None."""
        body = (self._bodies.join(parts) if sum(len(p) for p in parts) >= POOLED_BODY
                else None)
        owned = body is not None
        if body is None:
            body = bytearray().join(parts)
        try:
            if chunks is None:
                self._put(key, body, storage_class)
            else:
                with self._chunk_errors("put", key):
                    s3chunks.put(chunks, self._key(key), body)
        finally:
            if owned:
                self._bodies.release(body)

    def _put(self, key: str, body: bytes | bytearray, storage_class: str | None) -> None:
        extra = {"StorageClass": storage_class} if storage_class else {}
        with self._errors("put", key):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                    **extra)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """PutObject with If-None-Match: * (412 if the key exists, 409 if a concurrent
        conditional write won). A server that ignores the header (it stores over an
        object that exists, as SeaweedFS does) is found out by one probe the first time,
        and then gets the check-then-put of Store.put_if_absent (atomic_create False)."""
        if self.atomic_create is None:
            self.atomic_create = self._probe_conditional_put()
        if not self.atomic_create:
            return super().put_if_absent(key, data)
        self.check_length(key)
        body = bytes(data) if isinstance(data, memoryview) else data
        with self._errors("put_if_absent", key):
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                        IfNoneMatch="*")
            except ClientError as e:
                if error_code(e)[1] in (409, 412):
                    return False
                raise
        return True

    def _probe_conditional_put(self) -> bool:
        """Whether the server refuses a PutObject with If-None-Match: * over an object
        that exists (two PUTs, a HEAD and a DELETE of a probe object)."""
        probe = f"ckptfs-conditional-put-probe-{os.getpid()}-{time.monotonic_ns()}"
        self._put(probe, b"1", None)
        try:
            with self._errors("put_if_absent", probe):
                try:
                    self._client.put_object(Bucket=self.bucket, Key=self._key(probe),
                                            Body=b"22", IfNoneMatch="*")
                except ClientError as e:
                    if error_code(e)[1] in (409, 412):
                        return True
                    if error_class(*error_code(e)) is not PermanentStoreError:
                        raise
                    # else (e.g. NotImplemented) the header is not understood
        finally:
            self.delete(probe)
        log.warning("%s ignores If-None-Match on PUT: trash restore checks, then writes "
                    "(docs/FORMAT.md, Trash)", self.endpoint)
        return False

    def check_storage_class(self) -> None:
        """PUT (and delete) a small probe object with the chunk storage class, so that a
        class the server refuses is a one-line error at mount, not a failing upload."""
        if not self.storage_class:
            return
        probe = "ckptfs-storage-class-probe"
        try:
            self._put(probe, b"probe", self.storage_class)
        except StoreError as e:
            raise ConfigError(f"the store refused --storage-class "
                              f"{self.storage_class}: {e}") from None
        self.delete(probe)

    def get(self, key: str, limit: int | None = None) -> bytes:
        with self._errors("get", key):
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            body = response["Body"]
            if limit is None:
                return bytes(body.read())
            # the length is checked before the body is read, and no more than `limit` + 1
            # bytes are read of a body longer than it says
            size = int(response.get("ContentLength") or 0)
            data = b"" if size > limit else bytes(body.read(limit + 1))
            if size > limit or len(data) > limit:
                body.close()
                raise too_large("get", key, self.url, limit, max(size, len(data)))
            return data

    def get_buffer(self, key: str, limit: int | None = None) -> bytes | memoryview:
        """get() through obstore (no GIL held while the body arrives; its own buffer,
        not copied), unless _chunk_store() says boto3."""
        chunks = self._chunk_store(key)
        if chunks is None:
            return self.get(key, limit)
        with self._chunk_errors("get", key):
            return s3chunks.get(chunks, self._key(key), limit, key, self.url)

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}"
            )
        except ClientError as e:
            if error_code(e)[0] == "InvalidRange":
                return b""  # start is at or past the end of the object
            raise
        body = bytes(response["Body"].read())
        # a server that ignores Range answers 200 with the whole object
        return body if "ContentRange" in response else body[start:end]

    def _head_object(self, op: str, key: str) -> Any:
        return self._if_present(op, key, lambda: self._client.head_object(
            Bucket=self.bucket, Key=self._key(key)))

    def head(self, key: str) -> int | None:
        """HeadObject; through obstore where _chunk_store() allows (the uploader's HEAD
        before each chunk PUT among them: a HEAD answers a size or a status, the same
        through either client), else boto3."""
        chunks = self._chunk_store(key)
        if chunks is not None:
            try:
                with self._chunk_errors("head", key):
                    return s3chunks.head(chunks, self._key(key))
            except NotFoundError:
                return None
        response = self._head_object("head", key)
        return None if response is None else int(response["ContentLength"])

    def stat(self, key: str) -> ObjectInfo | None:
        response = self._head_object("stat", key)
        if response is None:
            return None
        size = int(response["ContentLength"])
        return ObjectInfo(key, size, response["LastModified"].timestamp(),
                          f"{size}:{response.get('ETag', '')}")

    def rename(self, src: str, dst: str) -> None:
        """CopyObject (which gives the copy a new LastModified, and here keeps the
        source's storage class: a copy would otherwise land in STANDARD), then
        DeleteObject. Not atomic: a crash in between leaves both. When the two took longer
        than RESTAMP_AFTER, the copy is copied onto itself to stamp it again, that request
        alone retried (restamp_if_slow)."""
        self.check_length(dst)
        start = time.monotonic()
        with self._errors("rename", src):
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(src))
        storage_class = head.get("StorageClass")  # absent for STANDARD
        self._copy(src, dst, storage_class)
        crash_point("store_rename_copied")
        self.delete(src)
        restamp_if_slow(start, dst, lambda: self._copy(dst, dst, storage_class))

    def _copy(self, src: str, dst: str, storage_class: str | None) -> None:
        extra: dict[str, str] = {"StorageClass": storage_class} if storage_class else {}
        if src == dst:
            extra["MetadataDirective"] = "REPLACE"  # S3 refuses a copy onto itself without
        with self._errors("copy", src):
            self._client.copy_object(
                Bucket=self.bucket, Key=self._key(dst),
                CopySource={"Bucket": self.bucket, "Key": self._key(src)}, **extra)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        full_keys = [self._key(k) for k in keys]
        n = len(self.prefix)
        for i in range(0, len(full_keys), DELETE_BATCH):
            batch = full_keys[i : i + DELETE_BATCH]
            if self._no_batch_delete:
                for key in batch:
                    self.delete(key[n:])
                continue
            first = batch[0][n:]
            with self._errors("delete_many", first):
                try:
                    response = self._client.delete_objects(
                        Bucket=self.bucket,
                        Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                    )
                except ClientError as e:
                    if error_code(e)[0] != "NotImplemented":
                        raise
                    # GCS's S3 API (its XML API) has no DeleteObjects: one by one from now
                    self._no_batch_delete = True
                    for key in batch:
                        self.delete(key[n:])
                    continue
            self._raise_delete_errors(response.get("Errors", []))

    def _raise_delete_errors(self, errors: list[dict[str, str]]) -> None:
        """Raise for the first key DeleteObjects could not delete (a missing one is fine)."""
        for error in errors:
            code = error.get("Code", "")
            if code not in NOT_FOUND_CODES:
                key = error.get("Key", "")[len(self.prefix) :]
                cls = error_class(code, 0)
                raise cls(self._message("delete_many", key,
                                        f"{code} ({len(errors)} failed)"))

    def _list_entries(self, prefix: str, delimiter: str | None
                      ) -> Iterator[tuple[str, int | None]]:
        args = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter is not None:
            args["Delimiter"] = delimiter
        for page in self._client.get_paginator("list_objects_v2").paginate(**args):
            yield from ((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
            yield from ((p["Prefix"], None) for p in page.get("CommonPrefixes", []))

    def _scan_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        for page in pages:  # one page (up to 1000 objects) at a time
            for o in page.get("Contents", []):
                size = int(o["Size"])
                yield ObjectInfo(o["Key"], size, o["LastModified"].timestamp(),
                                 f"{size}:{o.get('ETag', '')}")

    def copy(self, src: str, dst: str) -> None:
        self.check_length(dst)
        self._copy(src, dst, None)

    def close(self) -> None:
        self._client.close()
