"""A store in an Azure Blob Storage container (Azure, Azurite), through azure-storage-blob."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import requests
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobPrefix, BlobServiceClient, ContainerClient, LinearRetry

from ckptfs.common.errors import ConfigError, PermanentStoreError, StoreError, TransientStoreError
from ckptfs.common.redact import redact
from ckptfs.store.base import ObjectInfo, one_line, root_cause, too_large
from ckptfs.store.bucket import PrefixedStore, pool_connections, status_class

#: error codes of a 404 that is not about the blob: retrying cannot fix these
PERMANENT_404 = frozenset({"ContainerNotFound", "ContainerBeingDeleted", "AccountIsDisabled"})
#: 4xx error codes that are nevertheless worth retrying
TRANSIENT_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError",
                             "IncrementalCopyOfEarlierVersionSnapshotNotAllowed"})
#: the environment variables of Azure's tools, in the order they are tried
CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_VARS = ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_NAME")
KEY_VARS = ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY")
SAS_VAR = "AZURE_STORAGE_SAS_TOKEN"


def error_class(status: int, code: str) -> type[StoreError]:
    """The StoreError subclass for an HTTP status (0 if none) and Azure error code."""
    return status_class(status, permanent=status == 404 and code in PERMANENT_404,
                        transient=code in TRANSIENT_CODES)


def _env(*names: str) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _credential(endpoint_url: str | None) -> tuple[str, Any]:
    """(account URL, credential) from Azure's conventions: a connection string; else an
    account with a key or a SAS token; else DefaultAzureCredential (azure-identity)."""
    connection_string = os.environ.get(CONNECTION_STRING)
    if connection_string:
        try:
            service = BlobServiceClient.from_connection_string(connection_string)
        except ValueError as e:
            raise ConfigError(f"{CONNECTION_STRING} is not a valid connection string: "
                              f"{one_line(e).split(';')[0]}") from None
        # a SAS connection string puts its token in the client's URL: it goes back to
        # the SDK as the credential, and the store's URL (for messages) is without it
        account_url, _, token = service.url.partition("?")
        return endpoint_url or account_url.rstrip("/"), service.credential or token or None
    account = _env(*ACCOUNT_VARS)
    if not account and not endpoint_url:
        raise ConfigError(f"no Azure storage account: set {CONNECTION_STRING}, or "
                          f"{ACCOUNT_VARS[0]} (with {KEY_VARS[0]} or {SAS_VAR}, or an "
                          f"identity azure-identity finds), or give --endpoint-url")
    url = endpoint_url or f"https://{account}.blob.core.windows.net"
    key = _env(*KEY_VARS)
    if key:
        if not account:
            raise ConfigError(f"{KEY_VARS[0]} needs {ACCOUNT_VARS[0]} (the account's name)")
        return url, {"account_name": account, "account_key": key}
    sas = os.environ.get(SAS_VAR)
    if sas:
        return url, sas.lstrip("?")
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigError(f"no Azure credentials: set {CONNECTION_STRING}, or "
                          f"{KEY_VARS[0]} or {SAS_VAR} with {ACCOUNT_VARS[0]}, or install "
                          f"azure-identity (pip install 'ckptfs[azure-identity]') to use "
                          f"DefaultAzureCredential") from None
    return url, DefaultAzureCredential()


class AzureStore(PrefixedStore):
    """Blobs under `prefix` in one container; one shared, thread-safe ContainerClient."""

    service = "Azure"
    scheme = "az"
    object_noun = "blob"
    key_unit = "characters"  # of the longest blob name Azure allows (max_key_length)

    def _connect(self, endpoint_url: str | None, max_pool_connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        self.container = self.space
        account_url, credential = _credential(endpoint_url)
        self.endpoint = self.url_endpoint = redact(account_url)  # in messages
        session = requests.Session()
        pool_connections(session, max_pool_connections)
        transport = RequestsTransport(session=session, session_owner=True,
                                      connection_timeout=connect_timeout,
                                      read_timeout=read_timeout)
        # 2 attempts in all, 0.2 s apart, as on S3: ckptfs retries further with its own
        # backoff (retry.py); the SDK's default would be 4 attempts 15 s and more apart
        seconds: Any = 0.2  # typed int, yet it takes seconds as floats
        retry = LinearRetry(backoff=seconds, retry_total=1, random_jitter_range=seconds / 2)
        service = BlobServiceClient(account_url, credential=credential, transport=transport,
                                    retry_policy=retry)
        self._client: ContainerClient = service.get_container_client(self.container)
        self._service = service

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate azure-core exceptions into the StoreError family, naming no secret."""
        try:
            yield
        except ClientAuthenticationError as e:
            status = e.status_code or 0
            code = getattr(e, "error_code", None) or "authentication failed"
            raise PermanentStoreError(self._message(op, key, f"{code} (HTTP {status}); check "
                                                    f"the credentials")) from e
        except HttpResponseError as e:
            status, code = e.status_code or 0, str(getattr(e, "error_code", None) or "")
            cls = error_class(status, code)
            raise cls(self._message(op, key, f"{code or 'error'} (HTTP {status})")) from e
        except (ServiceRequestError, ServiceResponseError) as e:
            raise TransientStoreError(self._message(op, key, root_cause(e))) from e
        except AzureError as e:
            raise TransientStoreError(self._message(op, key, one_line(e))) from e

    def check(self) -> None:
        """Verify that the container exists and answers; raise a one-line StoreError if not."""
        try:
            self._client.get_container_properties()
        except ResourceNotFoundError as e:
            raise PermanentStoreError(f"container {self.container} does not exist at "
                                      f"{self.endpoint}") from e
        except ClientAuthenticationError as e:
            raise PermanentStoreError(
                f"access to container {self.container} at {self.endpoint} denied "
                f"(HTTP {e.status_code or 0}): check the credentials") from e
        except HttpResponseError as e:
            if e.status_code == 403:
                raise PermanentStoreError(
                    f"access to container {self.container} at {self.endpoint} denied "
                    f"(HTTP 403): check the credentials") from e
            with self._errors("check", ""):
                raise
        except ServiceRequestError as e:
            raise TransientStoreError(f"cannot connect to {self.endpoint}: "
                                      f"{root_cause(e)}") from e
        except AzureError:
            with self._errors("check", ""):
                raise

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.check_length(key)
        body = bytes(data) if isinstance(data, memoryview) else data
        with self._errors("put", key):
            # one Put Blob up to 64 MiB; above, blocks and one Put Block List: atomic both
            self._client.upload_blob(self._key(key), body, overwrite=True, max_concurrency=1)

    #: Put Blob with If-None-Match: * (409 BlobAlreadyExists if the blob exists)
    atomic_create = True

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self._create(key, data, lambda body: self._client.upload_blob(
            self._key(key), body, overwrite=False, max_concurrency=1), ResourceExistsError)

    def get(self, key: str, limit: int | None = None) -> bytes:
        with self._errors("get", key):
            if limit is None:
                return bytes(self._client.download_blob(self._key(key),
                                                        max_concurrency=1).readall())
            try:  # the first `limit` + 1 bytes, and the blob's size, before reading them
                downloader = self._client.download_blob(self._key(key), offset=0,
                                                        length=limit + 1, max_concurrency=1)
            except HttpResponseError as e:
                if e.status_code == 416:  # an empty blob has no byte 0
                    return b""
                raise
            if downloader.size > limit:
                raise too_large("get", key, self.url, limit)
            return bytes(downloader.readall())

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            downloader = self._client.download_blob(self._key(key), offset=start,
                                                    length=end - start, max_concurrency=1)
            return bytes(downloader.readall())
        except HttpResponseError as e:
            if e.status_code == 416:  # start is at or past the end of the blob
                return b""
            raise

    def _properties(self, op: str, key: str) -> Any:
        blob = self._client.get_blob_client(self._key(key))
        return self._if_present(op, key, blob.get_blob_properties)

    def head(self, key: str) -> int | None:
        props = self._properties("head", key)
        return None if props is None else int(props.size)

    def stat(self, key: str) -> ObjectInfo | None:
        props = self._properties("stat", key)
        if props is None:
            return None
        return self._info(key, props.size, props.last_modified, props.etag)

    @staticmethod
    def _info(key: str, size: int, modified: datetime, etag: str) -> ObjectInfo:
        return ObjectInfo(key, int(size), modified.timestamp(),
                          f"{int(size)}:{etag.strip(chr(34))}")  # listings quote it

    def copy(self, src: str, dst: str) -> None:
        self.check_length(dst)
        source = self._client.get_blob_client(self._key(src))
        target = self._client.get_blob_client(self._key(dst))
        with self._errors("copy", src):
            # within one account the copy is synchronous (status "success"); wait otherwise
            copy_props: Any = target.start_copy_from_url(source.url, requires_sync=None)
            status = copy_props.get("copy_status")
            while status == "pending":
                time.sleep(0.1)
                status = target.get_blob_properties().copy.status
            if status not in (None, "success"):
                raise TransientStoreError(self._message("copy", src, f"copy {status}"))

    def _restamp(self, key: str) -> None:
        """Set the blob's metadata, which gives it a new Last-Modified (rename, as
        Store.rename: Copy Blob, which gives the copy a new Last-Modified, then Delete
        Blob)."""
        with self._errors("rename", key):
            self._client.get_blob_client(self._key(key)).set_blob_metadata(
                {"ckptfs_restamped": str(int(time.time()))})

    def delete(self, key: str) -> None:
        self._if_present("delete", key, lambda: self._client.delete_blob(self._key(key)))

    def _list_entries(self, prefix: str, delimiter: str | None
                      ) -> Iterator[tuple[str, int | None]]:
        if delimiter is None:
            for blob in self._client.list_blobs(name_starts_with=prefix):
                yield blob.name, int(blob.size)
            return
        for item in self._client.walk_blobs(name_starts_with=prefix, delimiter=delimiter):
            yield item.name, None if isinstance(item, BlobPrefix) else int(item.size)

    def _scan_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self._client.list_blobs(name_starts_with=prefix).by_page()
        for page in pages:  # one page (up to 5000 blobs) at a time
            for blob in page:
                yield self._info(blob.name, blob.size, blob.last_modified, blob.etag)

    def close(self) -> None:
        self._service.close()
