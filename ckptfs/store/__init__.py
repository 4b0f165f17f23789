"""Object stores: the Store interface, its implementations, and open_store() for a store URL."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .base import AsyncStore, Listing, ObjectInfo, Store
from .local import LocalStore

if TYPE_CHECKING:
    from .s3 import S3Store

__all__ = ["AsyncStore", "Listing", "LocalStore", "ObjectInfo", "S3Store", "Store", "open_store"]


def __getattr__(name: str) -> object:
    """Import S3Store (and with it boto3) only when someone asks for it."""
    if name == "S3Store":
        from .s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(
    url: str,
    endpoint_url: str | None = None,
    region: str | None = None,
    max_pool_connections: int = 32,
    storage_class: str | None = None,
) -> Store:
    """The store at `url`: s3://bucket[/prefix], file:///abs/path, or a directory path.

    `storage_class`: the S3 storage class of chunk objects (S3 stores only)."""
    scheme, sep, rest = url.partition("://")
    if storage_class and scheme.lower() != "s3":
        raise ConfigError(f"--storage-class applies to s3:// stores only, not {url}")
    if not sep:
        return _open_directory(os.path.expanduser(url))
    if scheme.lower() == "file":
        if not rest.startswith("/"):
            raise ConfigError(f"file store URL needs an absolute path (file:///...): {url}")
        return _open_directory(rest)
    if scheme.lower() == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"store URL names no bucket: {url}")
        from .s3 import S3Store

        return S3Store(bucket, prefix, endpoint_url, region, max_pool_connections,
                       chunk_storage_class=storage_class)
    raise ConfigError(f"unsupported store URL (want s3://, file:// or a path): {url}")


def _open_directory(path: str) -> LocalStore:
    if not path:
        raise ConfigError("empty store path")
    if not os.path.isdir(path):
        raise ConfigError(f"store directory does not exist: {path}")
    return LocalStore(path)
