"""What the bucket stores (S3, Azure, GCS) share around their own SDK calls."""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from ckptfs.common.config import LIMITS
from ckptfs.common.errors import (
    KeyTooLongError,
    NotFoundError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ckptfs.store.base import Listing, ObjectInfo, Store, check_key

if TYPE_CHECKING:  # the S3 store, which does not use it, need not load it
    import requests

T = TypeVar("T")


def status_class(status: int, permanent: bool = False, missing: bool = False,
                 transient: bool = False) -> type[StoreError]:
    """The StoreError subclass for an HTTP status (0 if none), after what the service's
    own error code says of it: `permanent` (retrying cannot fix it), `missing` (no such
    object), `transient` (worth retrying), in that order."""
    if permanent or status in (401, 403):
        return PermanentStoreError
    if missing or status == 404:
        return NotFoundError
    if transient or status in (0, 408, 429) or status >= 500:
        return TransientStoreError
    return PermanentStoreError  # any other 3xx/4xx: the request cannot succeed as sent


def normal_prefix(prefix: str) -> str:
    """A store's key prefix as kept: '' or the segments without outer '/', then '/'."""
    return prefix.strip("/") + "/" if prefix.strip("/") else ""


def pool_connections(session: requests.Session, most: int, retries: Any = 0) -> None:
    """Let `session` keep up to `most` connections to its host, over http and https
    alike (`retries`: the adapter's max_retries, a urllib3 Retry or a count)."""
    from requests.adapters import HTTPAdapter

    adapter = HTTPAdapter(pool_connections=1, max_retries=retries, pool_maxsize=most)
    session.mount("http://", adapter)
    session.mount("https://", adapter)


class PrefixedStore(Store):
    """A store whose objects live under a key prefix ('' or ending in '/') of one bucket
    or container: keys with the prefix, the store one level up, and what each such store
    does alike around its own requests (which a subclass makes: _errors and the hooks)."""

    prefix: str = ""
    #: the scheme of the store's URLs ("s3")
    scheme: str = ""
    #: the bucket or container
    space: str = ""
    #: where the service's answers come from (for messages)
    endpoint: str = ""
    #: the endpoint the store's url names (None: the cloud's own, named by no url)
    url_endpoint: str | None = None
    #: the service's name in messages ("S3")
    service: str = ""
    #: what the service calls an object, in messages
    object_noun: str = "object"
    #: the longest key the service allows, the prefix included, in key_unit (S3 and GCS:
    #: 1024 bytes of UTF-8; Azure: 1024 characters)
    max_key_length: int = 1024
    key_unit: Literal["bytes", "characters"] = "bytes"

    def __init__(
        self,
        space: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        max_pool_connections: int = 32,
        connect_timeout: float = 5,
        read_timeout: float = 60,
    ) -> None:
        """The store of the objects under `prefix` in bucket or container `space`, through
        the service at `endpoint_url` (None: the cloud's own), or as its environment says."""
        self.space = space
        self.prefix = normal_prefix(prefix)
        self._connect(endpoint_url, max_pool_connections, connect_timeout, read_timeout)
        self.url = self._url()

    @abc.abstractmethod
    def _connect(self, endpoint_url: str | None, max_pool_connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        """Make the client (sets endpoint and url_endpoint), with at most
        `max_pool_connections` connections and these timeouts (seconds)."""

    @abc.abstractmethod
    def _errors(self, op: str, key: str) -> AbstractContextManager[None]:
        """Translate the SDK's exceptions in the block into the StoreError family."""

    @abc.abstractmethod
    def _get_range(self, key: str, start: int, end: int) -> bytes:
        """get_range() once `start` < `end` are checked, inside _errors."""

    @abc.abstractmethod
    def _list_entries(self, prefix: str, delimiter: str | None) -> Iterable[tuple[str, int | None]]:
        """The LIST answer for the full-key `prefix`, inside _errors: (full key, size) of
        each object, (full common prefix, None) of each rolled-up prefix."""

    @abc.abstractmethod
    def _scan_objects(self, prefix: str) -> Iterable[ObjectInfo]:
        """scan() of the full-key `prefix`, inside _errors, the keys full."""

    def parent(self) -> Self | None:
        if not self.prefix:
            return None
        up = copy.copy(self)  # the same client
        up.prefix = self.prefix[:-1].rpartition("/")[0]
        up.prefix += "/" if up.prefix else ""
        up.url = up._url()
        return up

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _url(self) -> str:
        """The store's url for the current prefix (without credentials)."""
        at = f" at {self.url_endpoint}" if self.url_endpoint else ""
        return f"{self.scheme}://{self.space}/{self.prefix}{at}"

    def _where(self, key: str) -> str:
        """Where `key` is, for messages (without credentials)."""
        return f"{self.scheme}://{self.space}/{self.prefix}{key} at {self.endpoint}"

    def _message(self, op: str, key: str, detail: str) -> str:
        """An error message of request `op` on `key`: the service, the place, `detail`."""
        return f"{self.service} {op} {self._where(key)}: {detail}"

    def check_length(self, key: str) -> None:
        full = self._key(key)
        size = len(full) if self.key_unit == "characters" else len(
            full.encode("utf-8", "surrogateescape"))
        if size > self.max_key_length:
            raise KeyTooLongError(f"key too long for {self.url}: {size} {self.key_unit} with "
                                  f"the prefix, {self.service} allows {self.max_key_length}: "
                                  f"{key}")

    def _if_present(self, op: str, key: str, request: Callable[[], T]) -> T | None:
        """request() under _errors(op, key); None if it finds no such object."""
        try:
            with self._errors(op, key):
                return request()
        except NotFoundError:
            return None

    def _create(self, key: str, data: bytes | memoryview,
                create: Callable[[bytes], object], exists: type[Exception]) -> bool:
        """put_if_absent() through the service's conditional write: create(body) stores
        the body only if no object is at `key`, else raises `exists`."""
        self.check_length(key)
        body = bytes(data) if isinstance(data, memoryview) else data
        with self._errors("put_if_absent", key):
            try:
                create(body)
            except exists:
                return False
        return True

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0:
            raise ValueError(f"negative range start: {start}")
        if end <= start:
            if self.head(key) is None:
                raise NotFoundError(self._message("get_range", key,
                                                  f"no such {self.object_noun}"))
            return b""
        with self._errors("get_range", key):
            return self._get_range(key, start, end)

    def delete_many(self, keys: Iterable[str]) -> None:
        """One delete() a key, LIMITS.delete_threads at a time (no batch delete here)."""
        keys = list(keys)
        if len(keys) <= 1:
            for key in keys:
                self.delete(key)
            return
        with ThreadPoolExecutor(LIMITS.delete_threads) as pool:
            list(pool.map(self.delete, keys))

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        n = len(self.prefix)
        objects: list[tuple[str, int]] = []
        prefixes: list[str] = []
        with self._errors("list", prefix):
            for name, size in self._list_entries(self.prefix + prefix, delimiter):
                if size is None:
                    prefixes.append(name[n:])
                else:
                    objects.append((name[n:], size))
        return Listing(sorted(objects), sorted(prefixes))

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        n = len(self.prefix)
        with self._errors("scan", prefix):
            for info in self._scan_objects(self.prefix + prefix):
                yield ObjectInfo(info.key[n:], info.size, info.mtime, info.token)
