"""Chunk GETs, HEADs and PUTs of the S3 store through obstore: no GIL held while bytes move."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config, S3Credential, S3Store

from ckptfs.common.errors import (
    NotFoundError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ckptfs.store.base import one_line, too_large
from ckptfs.store.bucket import status_class

#: the only keys sent through obstore: its paths (Rust object_store) encode some other
#: characters, and drop a trailing '/' (docs/PERFORMANCE.md, "Azure and GCS client
#: libraries"); every chunk key of the format is of these
PLAIN_KEY = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
#: variables through which botocore would send requests to a proxy: with any of them set,
#: chunks go through boto3 as everything else does
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
              "all_proxy")
#: variables obstore reads (it reads AWS_* variables whatever it is given) that botocore
#: does not, and that would change its requests: with one set, chunks would be written or
#: read otherwise than records (encrypted with another key, sent elsewhere, charged to
#: the requester), so they go through boto3 as everything else does. The settings
#: ckptfs gives obstore itself (region, endpoint, addressing, payload signing,
#: credentials) take precedence over the variables of the same name.
OBSTORE_ONLY_VARS = ("AWS_SERVER_SIDE_ENCRYPTION", "AWS_SSE_KMS_KEY_ID",
                     "AWS_SSE_BUCKET_KEY_ENABLED", "AWS_SSE_CUSTOMER_KEY_BASE64",
                     "AWS_REQUEST_PAYER", "AWS_CHECKSUM_ALGORITHM", "AWS_S3_EXPRESS",
                     "AWS_SKIP_SIGNATURE")
#: ... and the one that would send chunks to another endpoint when ckptfs names none
OBSTORE_ENDPOINT_VAR = "AWS_ENDPOINT"
#: how long obstore keeps a credential from boto3's chain before asking it again (boto3
#: refreshes an expiring one itself, on that call)
CREDENTIAL_TTL = timedelta(seconds=60)
#: the most a whole chunk request may take (object_store's default is 30 s): a bound
#: for a stalled transfer; a slow one is bounded by the read timeout between bytes
REQUEST_TIMEOUT = timedelta(minutes=10)
#: the process that made an obstore client: a child forked from it cannot use obstore
#: (the threads of its runtime are not in the child, and a request would wait forever),
#: so chunk requests there go through boto3
_started_in: int | None = None
_STATUS = re.compile(r"\b(?:status(?: code)?:?\s*)([1-5]\d\d)\b", re.IGNORECASE)
_CODE = re.compile(r"<Code>(\w+)</Code>")


def unusable(client: Any, endpoint_url: str | None, session: Any) -> str | None:
    """Why chunk requests cannot go through obstore with the same settings as the boto3
    `client` (None: they can): a proxy, an endpoint variant obstore does not build
    (accelerate, dual-stack, FIPS), no credentials or, on AWS, no region (boto3's
    request says what is missing), a variable only obstore would apply
    (OBSTORE_ONLY_VARS), or a process forked after obstore was started in its parent."""
    if _started_in not in (None, os.getpid()):
        return "obstore's runtime was started before this process was forked"
    only_obstore = [v for v in OBSTORE_ONLY_VARS if os.environ.get(v)]
    if not endpoint_url and os.environ.get(OBSTORE_ENDPOINT_VAR):
        only_obstore.append(OBSTORE_ENDPOINT_VAR)
    if only_obstore:
        return f"${only_obstore[0]} is set, which obstore alone would apply"
    config = client.meta.config
    s3 = config.s3 or {}
    if any(os.environ.get(v) for v in PROXY_VARS) or config.proxies:
        return "a proxy is configured"
    if s3.get("use_accelerate_endpoint") or s3.get("use_dualstack_endpoint") or getattr(
            config, "use_fips_endpoint", False) or getattr(config, "use_dualstack_endpoint",
                                                          False):
        return "an accelerate, dual-stack or FIPS endpoint is configured"
    if session.get_credentials() is None:
        return "no credentials"
    if not endpoint_url and not client.meta.region_name:
        return "no region"
    return None


class _Boto3Credentials:
    """obstore's credential callback: the credentials boto3's chain resolved (environment,
    profile, SSO, web identity, instance metadata), refreshed by boto3 as they expire."""

    def __init__(self, credentials: Any) -> None:
        self.credentials = credentials

    def __call__(self) -> S3Credential:
        frozen = self.credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.now(UTC) + CREDENTIAL_TTL}


def open_chunk_store(client: Any, session: Any, bucket: str, endpoint_url: str | None,
                     signs_payload: bool, max_pool_connections: int,
                     connect_timeout: float, read_timeout: float) -> S3Store:
    """An obstore S3Store of `bucket` as the boto3 `client` reaches it (check unusable()
    first): its endpoint and region, path-style addressing where the client's is, boto3's
    credential chain and CA bundle, the same timeouts and connections, 2 attempts per
    request, the payload signed where `signs_payload`."""
    from obstore.store import S3Store

    global _started_in
    _started_in = os.getpid()
    options: ClientConfig = {
        "connect_timeout": timedelta(seconds=connect_timeout),
        "read_timeout": timedelta(seconds=read_timeout),
        "timeout": REQUEST_TIMEOUT,
        "pool_max_idle_per_host": str(max_pool_connections),
    }
    ca_bundle = session.get_config_variable("ca_bundle")  # AWS_CA_BUNDLE
    if ca_bundle:
        with open(ca_bundle, "rb") as f:
            options["root_certificate"] = f.read()
    config: S3Config = {"region": client.meta.region_name or "us-east-1",
                              "unsigned_payload": not signs_payload}
    style = (client.meta.config.s3 or {}).get("addressing_style")
    if endpoint_url:
        if urlsplit(endpoint_url).scheme == "http":
            options["allow_http"] = True
        config["endpoint"] = endpoint_url.rstrip("/")
        config["virtual_hosted_style_request"] = style == "virtual"
    else:  # AWS: boto3's "auto" is virtual-hosted, except for names with a dot
        config["virtual_hosted_style_request"] = style == "virtual" or (
            style != "path" and "." not in bucket)
    retry: RetryConfig = {"max_retries": 1, "retry_timeout": timedelta(seconds=read_timeout),
             "backoff": {"init_backoff": timedelta(milliseconds=100),
                         "max_backoff": timedelta(seconds=1), "base": 2}}
    return S3Store(bucket, config=config, client_options=options, retry_config=retry,
                   credential_provider=_Boto3Credentials(session.get_credentials()))


def get(store: S3Store, full_key: str, limit: int | None, key: str, url: str
        ) -> memoryview:
    """The object at `full_key` in obstore's own buffer, not copied. With `limit`, an
    object of more bytes is refused (too_large, a BadObjectError) before its body is
    read; a body shorter than its Content-Length is a TransientStoreError (`key` and
    `url`: for their messages)."""
    import obstore

    result = obstore.get(store, full_key)
    size = int(result.meta["size"])
    if limit is not None and size > limit:
        del result  # its body is not read: the connection is dropped
        raise too_large("get", key, url, limit, size)
    data = memoryview(result.bytes())
    if len(data) != size:  # (object_store's HTTP client checks Content-Length too)
        raise TransientStoreError(f"get {key} in {url}: {len(data)} bytes of the {size} "
                                  f"announced")
    return data


def head(store: S3Store, full_key: str) -> int:
    """The size of the object at `full_key` (a HEAD; obstore's NotFoundError if none)."""
    import obstore

    return int(obstore.head(store, full_key)["size"])


def put(store: S3Store, key: str, body: bytes | bytearray | memoryview) -> None:
    """One PutObject of `body` (never a multipart upload) at full key `key`."""
    import obstore

    obstore.put(store, key, body, use_multipart=False)


@contextmanager
def errors(message: Callable[[str], str],
           error_class: Callable[[str, int], type[StoreError]]) -> Iterator[None]:
    """obstore's exceptions as the StoreError family, worded by `message(detail)` and
    classed by `error_class(S3 error code, HTTP status)` as boto3's are: not found,
    refused credentials and other 4xx permanent, the rest (5xx, connection errors,
    timeouts, a body shorter than its Content-Length) transient."""
    from obstore.exceptions import BaseError, PermissionDeniedError, UnauthenticatedError
    from obstore.exceptions import NotFoundError as ObNotFound

    try:
        yield
    except (ObNotFound, FileNotFoundError) as e:  # (obstore raises the builtin one)
        code = _CODE.search(str(e))
        cls = error_class(code.group(1), 404) if code else NotFoundError
        raise cls(message(detail(e, code.group(1) if code else "NoSuchKey", 404))) from None
    except (PermissionDeniedError, UnauthenticatedError) as e:
        code = _CODE.search(str(e))
        raise PermanentStoreError(message(detail(
            e, code.group(1) if code else "AccessDenied", 403))) from None
    except BaseError as e:
        status_match = _STATUS.search(str(e))
        code = _CODE.search(str(e))
        status = int(status_match.group(1)) if status_match else 0
        classed = error_class(code.group(1), status) if code else status_class(status)
        raise classed(message(detail(e, code.group(1) if code else "", status))) from None


def detail(e: Exception, code: str, status: int) -> str:
    """The part of an error message after the request and place: S3's code and the HTTP
    status where known, else the reason obstore gives (without its request line)."""
    if status:
        return f"{code or 'error'} (HTTP {status})"
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return one_line(first.rpartition(" - ")[2])  # after the request's method and URL
