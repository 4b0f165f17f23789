"""TEMP until helper writes it."""
from .base import AsyncStore, Listing, Store
from ..errors import ConfigError
import os
def open_store(url, endpoint_url=None, region=None, max_pool_connections=32):
    if url.startswith("s3://"):
        from .s3 import S3Store
        b, _, p = url[5:].partition("/")
        return S3Store(b, p, endpoint_url=endpoint_url, region=region, max_pool_connections=max_pool_connections)
    from .local import LocalStore
    path = os.path.expanduser(url[7:] if url.startswith("file://") else url)
    if not os.path.isdir(path):
        raise ConfigError(f"store directory does not exist: {path}")
    return LocalStore(os.path.abspath(path))
