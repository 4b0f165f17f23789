"""Object stores: the Store interface, its implementations, open_store() for a store URL.

May import ckptfs.common only (never the format: callers pass what a store must know)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ckptfs.common.errors import ConfigError
from ckptfs.common.redact import redact
from ckptfs.store.base import AsyncStore, Listing, ObjectInfo, Store
from ckptfs.store.local import LocalStore

if TYPE_CHECKING:
    from ckptfs.store.azure import AzureStore
    from ckptfs.store.gcs import GcsStore
    from ckptfs.store.s3 import S3Store

__all__ = ["AsyncStore", "AzureStore", "GcsStore", "Listing", "LocalStore", "ObjectInfo",
           "S3Store", "Store", "check_endpoint", "default_endpoint", "directory_of",
           "open_store"]

#: the environment variable that names the endpoint of each cloud's stores, as its own
#: tools read it (Azure's is in its connection string)
ENDPOINT_VARS = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}


def __getattr__(name: str) -> object:
    """Import a cloud store (and with it its SDK) only when someone asks for it."""
    if name == "S3Store":
        from ckptfs.store.s3 import S3Store

        return S3Store
    if name == "AzureStore":
        from ckptfs.store.azure import AzureStore

        return AzureStore
    if name == "GcsStore":
        from ckptfs.store.gcs import GcsStore

        return GcsStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_endpoint(url: str) -> str | None:
    """The endpoint the environment names for the store at `url` (None: the cloud's own)."""
    var = ENDPOINT_VARS.get(url.partition("://")[0].lower())
    return (os.environ.get(var) or None) if var else None


def check_endpoint(endpoint: str, url: str) -> str:
    """`endpoint` if it is an http(s) URL with a host (and a valid port); else a one-line
    ConfigError naming where it came from (--endpoint-url or the environment)."""
    scheme = url.partition("://")[0].lower()
    var = ENDPOINT_VARS.get(scheme)
    origin = f"${var}" if var and os.environ.get(var) == endpoint else "--endpoint-url"
    try:
        parts = urlsplit(endpoint)
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname)
              and not any(c.isspace() for c in endpoint))
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"invalid endpoint {redact(endpoint)!r} ({origin}): want "
                          f"http://HOST[:PORT] or https://HOST[:PORT], e.g. "
                          f"http://127.0.0.1:8333")
    return endpoint


def open_store(
    url: str,
    endpoint_url: str | None = None,
    region: str | None = None,
    max_pool_connections: int = 32,
    storage_class: str | None = None,
    storage_class_prefix: str = "",
) -> Store:
    """The store at `url`: s3://bucket[/prefix], az://container[/prefix],
    gs://bucket[/prefix], file:///abs/path, or a directory path.

    `endpoint_url`: the endpoint of the cloud the URL names (an S3-compatible server, an
    Azure blob endpoint such as Azurite's, a GCS endpoint such as an emulator's).
    `region`, `storage_class` (of the objects whose keys start with
    `storage_class_prefix`: the format's chunks): S3 stores only."""
    scheme, sep, rest = url.partition("://")
    if storage_class and scheme.lower() != "s3":
        raise ConfigError(f"--storage-class applies to s3:// stores only, not {url}")
    directory = directory_of(url)
    if directory is not None:
        if not os.path.isdir(directory):
            raise ConfigError(f"store directory does not exist: {directory}")
        return LocalStore(directory)
    if scheme.lower() in ("s3", "az", "gs"):
        if any(seg in (".", "..") for seg in rest.split("/")):
            raise ConfigError(f"store URL with a '.' or '..' in its path: {url}")
        endpoint = endpoint_url or default_endpoint(url)
        if endpoint:
            check_endpoint(endpoint, url)
    if scheme.lower() == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"store URL names no bucket: {url}")
        from ckptfs.store.s3 import S3Store

        return S3Store(bucket, prefix, endpoint_url, region, max_pool_connections,
                       storage_class=storage_class, storage_class_prefix=storage_class_prefix)
    if scheme.lower() in ("az", "gs"):
        container, _, prefix = rest.partition("/")
        if not container:
            kind = "container" if scheme.lower() == "az" else "bucket"
            raise ConfigError(f"store URL names no {kind}: {url}")
        if scheme.lower() == "az":
            from ckptfs.store.azure import AzureStore

            return AzureStore(container, prefix, endpoint_url, max_pool_connections)
        from ckptfs.store.gcs import GcsStore

        return GcsStore(container, prefix, endpoint_url, max_pool_connections)
    raise ConfigError(f"unsupported store URL (want s3://, az://, gs://, file:// or a path): "
                      f"{url}")


def directory_of(url: str) -> str | None:
    """The directory a directory store URL (file:///abs/path, or a path) names, whether
    or not it exists; None for the other stores; ConfigError if malformed."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        if not url:
            raise ConfigError("empty store path")
        return os.path.expanduser(url)
    if scheme.lower() != "file":
        return None
    if not rest.startswith("/"):
        raise ConfigError(f"file store URL needs an absolute path (file:///...): {url}")
    return rest
