"""A store in a Google Cloud Storage bucket (GCS, fake-gcs-server), through google-cloud-storage."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import google.auth
import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.resumable_media import common as media
from urllib3.util.retry import Retry

from ckptfs.common.errors import ConfigError, PermanentStoreError, StoreError, TransientStoreError
from ckptfs.common.redact import redact
from ckptfs.store.base import ObjectInfo, one_line, root_cause, too_large
from ckptfs.store.bucket import PrefixedStore, pool_connections, status_class

#: where the google-cloud-storage client (and gsutil, gcloud) find an emulator
EMULATOR_VAR = "STORAGE_EMULATOR_HOST"
#: HTTP statuses whose request the client sends a second time at once
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: the scopes a store needs (read and write objects, list them)
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)


def error_class(status: int, message: str = "") -> type[StoreError]:
    """The StoreError subclass for an HTTP status (0 if none) and the error's message."""
    # the bucket itself missing is no missing object: nothing will bring it back
    return status_class(status, permanent=status == 404 and "bucket" in message.lower())


def _credentials(endpoint_url: str | None) -> tuple[str | None, Any, str | None]:
    """(endpoint, credentials, project): Application Default Credentials; anonymous for an
    emulator (STORAGE_EMULATOR_HOST, or an --endpoint-url where ADC finds none)."""
    emulator = os.environ.get(EMULATOR_VAR) or None
    if emulator:  # as google-cloud-storage does: an emulator takes no credentials
        if "://" not in emulator:
            emulator = f"http://{emulator}"
        return endpoint_url or emulator, AnonymousCredentials(), None  # type: ignore[no-untyped-call]
    try:
        credentials, project = google.auth.default(scopes=SCOPES)
    except auth.DefaultCredentialsError as e:
        if endpoint_url:
            return endpoint_url, AnonymousCredentials(), None  # type: ignore[no-untyped-call]
        reason = one_line(e).split(". ")[0]
        raise ConfigError(f"no Google credentials (Application Default Credentials: "
                          f"GOOGLE_APPLICATION_CREDENTIALS, gcloud auth "
                          f"application-default login, or the metadata server): "
                          f"{reason}") from None
    return endpoint_url, credentials, project


class GcsStore(PrefixedStore):
    """Objects under `prefix` in one bucket; one shared, thread-safe storage.Client."""

    service = "GCS"
    scheme = "gs"

    def _connect(self, endpoint_url: str | None, max_pool_connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        self.bucket_name = self.space
        endpoint, credentials, project = _credentials(endpoint_url)
        session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
        # 2 attempts in all, as on S3 and Azure: ckptfs retries further with its own
        # backoff (retry.py); the SDK's own retries are off (retry=None in every call)
        retries = Retry(total=1, connect=1, read=1, status=1, other=0, allowed_methods=None,
                        status_forcelist=RETRY_STATUSES, backoff_factor=0.1,
                        raise_on_status=False)
        pool_connections(session, max_pool_connections, retries)
        options = {"api_endpoint": endpoint} if endpoint else None
        self._client = storage.Client(project=project, credentials=credentials, _http=session,
                                      client_options=options)
        # google-cloud-storage >= 3.10 fetches each bucket's metadata for its tracing spans
        # in a thread of its own (one more GET per bucket, fired and forgotten): off
        if getattr(self._client, "_bucket_metadata_cache", None) is not None:
            self._client._bucket_metadata_cache = None
        self._bucket = self._client.bucket(self.bucket_name)
        self.endpoint: str = redact(endpoint or "https://storage.googleapis.com")  # messages
        self.url_endpoint = redact(endpoint) if endpoint else None
        self._timeout = (connect_timeout, read_timeout)

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(self._key(key))

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate google-cloud exceptions into the StoreError family, naming no secret."""
        try:
            yield
        except api.GoogleAPICallError as e:
            status = int(e.code or 0)
            message = one_line(e.message)[:200]
            cls = error_class(status, message)
            raise cls(self._message(op, key, f"{message} (HTTP {status})")) from e
        except media.InvalidResponse as e:
            status = int(getattr(e.response, "status_code", 0) or 0)
            cls = error_class(status)
            raise cls(self._message(op, key, f"HTTP {status}")) from e
        except auth.RefreshError as e:
            cls = TransientStoreError if e.retryable else PermanentStoreError
            raise cls(self._message(op, key, f"credentials: {one_line(e)[:200]}")) from e
        except auth.GoogleAuthError as e:
            raise PermanentStoreError(self._message(op, key, f"credentials: "
                                                    f"{one_line(e)[:200]}")) from e
        except (requests.RequestException, OSError) as e:
            raise TransientStoreError(self._message(op, key, root_cause(e))) from e

    def check(self) -> None:
        """Verify that the bucket exists and answers (one LIST of at most one object, the
        permission a store needs anyway); raise a one-line StoreError if not."""
        try:
            pages = self._client.list_blobs(self._bucket, max_results=1, retry=None,
                                            timeout=self._timeout)
            list(pages)
        except api.NotFound as e:
            raise PermanentStoreError(f"bucket {self.bucket_name} does not exist at "
                                      f"{self.endpoint}") from e
        except (api.Forbidden, api.Unauthorized) as e:
            raise PermanentStoreError(
                f"access to bucket {self.bucket_name} at {self.endpoint} denied "
                f"(HTTP {e.code}): check the credentials") from e
        except requests.ConnectionError as e:
            raise TransientStoreError(f"cannot connect to {self.endpoint}: "
                                      f"{root_cause(e)}") from e
        except Exception as e:  # noqa: BLE001 - every other failure, classified as usual
            with self._errors("check", ""):
                raise e from None

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.check_length(key)
        body = bytes(data) if isinstance(data, memoryview) else data
        with self._errors("put", key):
            # a multipart upload up to 8 MiB, a resumable one above: atomic both
            self._blob(key).upload_from_string(body, content_type="application/octet-stream",
                                               checksum=None, retry=None,
                                               timeout=self._timeout)

    #: an upload with ifGenerationMatch=0 (412 if the object exists)
    atomic_create = True

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self._create(key, data, lambda body: self._blob(key).upload_from_string(
            body, content_type="application/octet-stream", checksum=None, retry=None,
            timeout=self._timeout, if_generation_match=0), api.PreconditionFailed)

    def get(self, key: str, limit: int | None = None) -> bytes:
        with self._errors("get", key):
            if limit is None:
                return bytes(self._blob(key).download_as_bytes(checksum=None, retry=None,
                                                               raw_download=True,
                                                               timeout=self._timeout))
            data = self._get_range(key, 0, limit + 1)  # no more than that is read
            if len(data) > limit:
                raise too_large("get", key, self.url, limit)
            return data

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            return bytes(self._blob(key).download_as_bytes(
                start=start, end=end - 1, checksum=None, retry=None, raw_download=True,
                timeout=self._timeout))
        except api.RequestRangeNotSatisfiable:
            return b""  # start is at or past the end of the object

    def _get_blob(self, op: str, key: str) -> Any:
        with self._errors(op, key):
            return self._bucket.get_blob(self._key(key), retry=None, timeout=self._timeout)

    def head(self, key: str) -> int | None:
        blob = self._get_blob("head", key)
        return None if blob is None else int(blob.size)

    def stat(self, key: str) -> ObjectInfo | None:
        blob = self._get_blob("stat", key)
        return None if blob is None else self._info(key, blob)

    @staticmethod
    def _info(key: str, blob: Any) -> ObjectInfo:
        size = int(blob.size)
        return ObjectInfo(key, size, blob.updated.timestamp(), f"{size}:{blob.generation}")

    def copy(self, src: str, dst: str) -> None:
        self.check_length(dst)
        source, target = self._blob(src), self._blob(dst)
        with self._errors("copy", src):
            token, _, _ = target.rewrite(source, retry=None, timeout=self._timeout)
            while token is not None:  # large objects across locations: several calls
                token, _, _ = target.rewrite(source, token=token, retry=None,
                                             timeout=self._timeout)

    def _restamp(self, key: str) -> None:
        """Patch the object's metadata, which updates `updated` (rename, as Store.rename:
        a rewrite, whose copy is a new generation with a new `updated`, then a delete)."""
        target = self._blob(key)
        target.metadata = {"ckptfs-restamped": str(int(time.time()))}
        with self._errors("rename", key):
            target.patch(retry=None, timeout=self._timeout)

    def delete(self, key: str) -> None:
        self._if_present("delete", key,
                         lambda: self._blob(key).delete(retry=None, timeout=self._timeout))

    def _pages(self, prefix: str, delimiter: str | None) -> Any:
        return self._client.list_blobs(self._bucket, prefix=prefix, delimiter=delimiter,
                                       retry=None, timeout=self._timeout).pages

    def _list_entries(self, prefix: str, delimiter: str | None
                      ) -> Iterator[tuple[str, int | None]]:
        for page in self._pages(prefix, delimiter):
            yield from ((blob.name, int(blob.size)) for blob in page)
            yield from ((p, None) for p in page.prefixes)

    def _scan_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        for page in self._pages(prefix, None):  # one page (up to 1000) at a time
            for blob in page:
                yield self._info(blob.name, blob)

    def close(self) -> None:
        self._client.close()
