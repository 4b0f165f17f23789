"""AzureStore and GcsStore specifics: their bad inputs (an unknown container or bucket,
missing or wrong credentials, an endpoint that is down) give one-line errors that name no
secret, from the store and from the command line; two attempts per call under throttling."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
import uuid
from collections.abc import Callable
from pathlib import Path

import google.auth.credentials
import pytest
from azurite import KEY, AzuriteServer
from fakegcs import FakeGcsServer
from faultproxy import FaultProxy, never
from mounting import run_cli

from ckptfs.common.errors import (
    ConfigError,
    KeyTooLongError,
    PermanentStoreError,
    StoreError,
    TransientStoreError,
)
from ckptfs.store import open_store
from ckptfs.store.azure import AzureStore
from ckptfs.store.gcs import GcsStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def one_line_without(secrets: list[str], *errors: BaseException | str) -> None:
    for error in errors:
        text = str(error)
        assert "\n" not in text.strip(), text
        assert not any(secret in text for secret in secrets), text


def cli_error(args: list[str], env: dict[str, str] | None = None) -> str:
    """The one line `ckptfs ls ARGS` prints on stderr when it fails (exit 2)."""
    r: subprocess.CompletedProcess[str] = run_cli("ls", *args, check=False, timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == "", (args, r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


# ---------------------------------------------------------------------------- Azure


def test_azure_unknown_container(azurite: AzuriteServer) -> None:
    store = AzureStore("no-such-container")
    with pytest.raises(PermanentStoreError) as check:
        store.check()
    assert str(check.value) == f"container no-such-container does not exist at {azurite.endpoint}"
    with pytest.raises(PermanentStoreError, match="ContainerNotFound") as get:
        store.get("k")  # a 404, but not a missing blob: nothing will bring it back
    with pytest.raises(PermanentStoreError, match="ContainerNotFound") as put:
        store.put("k", b"x")
    line = cli_error(["az://no-such-container/run"])
    assert line == f"ckptfs: container no-such-container does not exist at {azurite.endpoint}"
    one_line_without([KEY], check.value, get.value, put.value, line)


def test_azure_wrong_key_is_permanent(azurite: AzuriteServer, azure_store: AzureStore,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = "d3Jvbmcta2V5LUxFQUtDSEVDSw=="  # base64 of "wrong-key-LEAKCHECK"
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_KEY", wrong)
    store = AzureStore(azure_store.container, endpoint_url=azurite.endpoint)
    errors: list[BaseException] = []
    for call in (store.check, lambda: store.get("k"), lambda: store.put("k", b"x")):
        with pytest.raises(PermanentStoreError) as failure:
            call()
        errors.append(failure.value)
    assert str(errors[0]).startswith(f"access to container {azure_store.container} at "
                                     f"{azurite.endpoint} denied (HTTP 403)")
    line = cli_error([f"az://{azure_store.container}", "--endpoint-url", azurite.endpoint],
                     env=dict(os.environ))
    assert "denied (HTTP 403): check the credentials" in line
    one_line_without([wrong, KEY], *errors, line)


def test_azure_key_or_sas_from_the_environment(azurite: AzuriteServer, azure_store: AzureStore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY, or with a SAS token, reach the data."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    azure_store.put("k", b"payload")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    keyed = AzureStore(azure_store.container, azure_store.prefix, azurite.endpoint)
    assert keyed.get("k") == b"payload"
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    sas = generate_container_sas(
        "devstoreaccount1", azure_store.container, account_key=KEY,
        permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1))
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", sas)
    signed = AzureStore(azure_store.container, azure_store.prefix, azurite.endpoint)
    assert signed.get("k") == b"payload"
    signed.put("k2", b"2")
    assert [k for k, _ in signed.list("").objects] == ["k", "k2"]


class StandInCredential:
    """DefaultAzureCredential where azure-identity is not installed: a token credential
    that is never asked for a token here."""

    def get_token(self, *scopes: str, **kwargs: object) -> object:
        raise AssertionError("no token is needed to open a store")


@pytest.mark.parametrize("identity", ["absent", "installed"])
def test_azure_missing_credentials(monkeypatch: pytest.MonkeyPatch, identity: str) -> None:
    """No account: one line saying what to set. An account and no key, SAS or connection
    string: without azure-identity, one line saying how to get it; with it, the store
    opens with DefaultAzureCredential on the account's endpoint (asks for no token yet)."""
    for name in list(os.environ):
        if name.startswith("AZURE_"):
            monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="no Azure storage account: set "
                       "AZURE_STORAGE_CONNECTION_STRING"):
        open_store("az://container/run")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "someaccount")
    if identity == "absent":
        monkeypatch.setitem(sys.modules, "azure.identity", None)  # import fails
        with pytest.raises(ConfigError, match=r"no Azure credentials: .*azure-identity"):
            open_store("az://container/run")
    else:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:  # the extra is not installed here: a stand-in module
            module = types.ModuleType("azure.identity")
            module.DefaultAzureCredential = StandInCredential  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, "azure.identity", module)
            DefaultAzureCredential = StandInCredential
        store = open_store("az://container/run")
        try:
            assert isinstance(store, AzureStore)
            assert store.url == "az://container/run/ at https://someaccount.blob.core.windows.net"
            assert isinstance(store._service.credential, DefaultAzureCredential)
        finally:
            store.close()
    if identity == "absent":  # (the same with it: one command line is enough)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
        line = cli_error(["az://container/run"], env=env)
        assert line.startswith("ckptfs: no Azure storage account")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=x;garbage")
    with pytest.raises(ConfigError, match="not a valid connection string"):
        open_store("az://container/run")


def test_azure_endpoint_down(monkeypatch: pytest.MonkeyPatch, azurite: AzuriteServer) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}/devstoreaccount1"
    store = AzureStore("container", endpoint_url=endpoint, connect_timeout=1, read_timeout=1)
    with pytest.raises(TransientStoreError) as check:
        store.check()
    assert str(check.value) == f"cannot connect to {endpoint}: Connection refused"
    errors: list[StoreError] = [check.value]
    for call in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: store.list("")):
        with pytest.raises(TransientStoreError) as failure:
            call()
        assert endpoint in str(failure.value)
        errors.append(failure.value)
    line = cli_error(["az://container", "--endpoint-url", endpoint])
    assert line == f"ckptfs: cannot connect to {endpoint}: Connection refused"
    one_line_without([KEY], *errors, line)


def test_azure_name_length_limit(azure_store: AzureStore) -> None:
    """Azure blob names have at most 1024 characters with the prefix (not bytes)."""
    room = 1024 - len(azure_store.prefix)
    fits = "/".join(["é" * 250] * 3) + "/"
    fits += "q" * (room - len(fits))
    azure_store.put(fits, b"fits")
    assert azure_store.get(fits) == b"fits"
    with pytest.raises(KeyTooLongError, match="1025 characters with the prefix"):
        azure_store.put(fits + "q", b"x")


# ---------------------------------------------------------------------------- GCS


def test_gcs_unknown_bucket(fakegcs: FakeGcsServer) -> None:
    store = GcsStore("no-such-bucket")
    with pytest.raises(PermanentStoreError) as check:
        store.check()
    assert str(check.value) == f"bucket no-such-bucket does not exist at {fakegcs.endpoint}"
    with pytest.raises(PermanentStoreError) as put:
        store.put("k", b"x")
    line = cli_error(["gs://no-such-bucket/run", "--endpoint-url", fakegcs.endpoint])
    assert line == f"ckptfs: bucket no-such-bucket does not exist at {fakegcs.endpoint}"
    one_line_without([], check.value, put.value, line)


def test_gcs_missing_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No emulator and no Application Default Credentials: one line saying where ADC
    looks (NO_GCE_CHECK, set for the tests, keeps google-auth off the metadata server)."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    with pytest.raises(ConfigError, match=r"^no Google credentials \(Application Default"):
        open_store("gs://bucket/run")
    line = cli_error(["gs://bucket/run"], env=dict(os.environ))
    assert line.startswith("ckptfs: no Google credentials")


def test_gcs_broken_credentials_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GOOGLE_APPLICATION_CREDENTIALS naming a file that is not a key: one line, and not
    the file's content."""
    secret = '{"type": "service_account", "private_key": "LEAKCHECK-not-a-key"}'
    (tmp_path / "key.json").write_text(secret)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    with pytest.raises(ConfigError) as failure:
        open_store("gs://bucket/run")
    one_line_without(["LEAKCHECK"], failure.value)


#: what GCS answers to a request whose credentials it does not accept (401: a token that
#: is not valid, even once refreshed) or that may not touch the bucket (403)
GCS_REFUSALS = {
    401: ("Invalid Credentials", "authError"),
    403: ("someone@example.iam.gserviceaccount.com does not have storage.objects.list "
          "access to the Google Cloud Storage bucket.", "forbidden"),
}
TOKEN = "ya29.LEAKCHECK-token"


class TokenCredentials(google.auth.credentials.Credentials):
    """Credentials holding an access token that a refresh renews (as a service account's
    do): on a 401, GCS's client (google-auth's AuthorizedSession) refreshes them and
    tries again, twice."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.token = TOKEN
        self.refreshes = 0

    def refresh(self, request: object) -> None:
        self.refreshes += 1
        self.token = TOKEN


@pytest.mark.parametrize("status", sorted(GCS_REFUSALS))
def test_gcs_wrong_credentials(fakegcs: FakeGcsServer, status: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """fake-gcs-server checks no credentials: a FaultProxy in front of it answers as GCS
    does to wrong ones. Every call is a PermanentStoreError, one line without the token,
    and is not retried (a 401 only after each of the two refreshes); the command
    line exits 2 saying to check the credentials."""
    from ckptfs.store import gcs

    message, reason = GCS_REFUSALS[status]
    body = json.dumps({"error": {"code": status, "message": message, "errors": [
        {"message": message, "domain": "global", "reason": reason}]}}).encode()
    bucket = fakegcs.new_bucket()
    proxy = FaultProxy(fakegcs.endpoint)
    credentials = TokenCredentials()
    monkeypatch.setattr(gcs, "_credentials", lambda endpoint: (endpoint, credentials, "p"))
    store = GcsStore(bucket, "p", proxy.endpoint)
    try:
        proxy.refuse(status, body, lambda m, p: True)
        with pytest.raises(PermanentStoreError) as check:
            store.check()
        assert str(check.value) == (f"access to bucket {bucket} at {proxy.endpoint} denied "
                                    f"(HTTP {status}): check the credentials")
        errors: list[BaseException] = [check.value]
        for call in (lambda: store.get("k"), lambda: store.put("k", b"x"),
                     lambda: store.list(""), lambda: store.delete("k")):
            requests, refreshes = proxy.requests, credentials.refreshes
            with pytest.raises(PermanentStoreError, match=f"HTTP {status}") as failure:
                call()
            tries = 1 + credentials.refreshes - refreshes
            assert tries == (3 if status == 401 else 1), (status, tries)
            assert proxy.requests - requests == tries, "a refused request was tried again"
            errors.append(failure.value)
        one_line_without([TOKEN], *errors)
        proxy.refuse(0, b"", never)  # the same store, once the credentials are accepted
        store.put("k", b"x")
        assert store.get("k") == b"x"
    finally:
        store.close()
        proxy.close()
        fakegcs.drop_bucket(bucket)
    # the command line (anonymous credentials, for the emulator's endpoint): one line, exit 2
    proxy = FaultProxy(fakegcs.endpoint)
    try:
        proxy.refuse(403, json.dumps({"error": {"code": 403, "message": message}}).encode(),
                     lambda m, p: True)
        line = cli_error([f"gs://{bucket}/p", "--endpoint-url", proxy.endpoint])
        assert line == (f"ckptfs: access to bucket {bucket} at {proxy.endpoint} denied "
                        f"(HTTP 403): check the credentials")
    finally:
        proxy.close()


def test_gcs_endpoint_down(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    store = GcsStore("bucket", connect_timeout=1, read_timeout=1)
    with pytest.raises(TransientStoreError) as check:
        store.check()
    assert str(check.value) == f"cannot connect to {endpoint}: Connection refused"
    errors: list[StoreError] = [check.value]
    for call in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: store.list("")):
        with pytest.raises(TransientStoreError) as failure:
            call()
        assert endpoint in str(failure.value)
        errors.append(failure.value)
    line = cli_error(["gs://bucket", "--endpoint-url", endpoint])
    assert line == f"ckptfs: cannot connect to {endpoint}: Connection refused"
    one_line_without([], *errors, line)


def test_gcs_key_length_limit(gcs_store: GcsStore) -> None:
    room = 1024 - len(gcs_store.prefix.encode())
    stem = "/".join(["é" * 127 + "x"] * 3) + "/"
    fits = stem + "q" * (room - len(stem.encode()))
    gcs_store.put(fits, b"fits")
    assert gcs_store.get(fits) == b"fits"
    with pytest.raises(KeyTooLongError, match="1025 bytes with the prefix"):
        gcs_store.put(fits + "q", b"x")


# ---------------------------------------------------------------------------- both


def test_error_classes() -> None:
    """How each cloud's answers map to ckptfs's classes (docs/PERFORMANCE.md lists them)."""
    from ckptfs.common.errors import NotFoundError
    from ckptfs.store import azure, gcs

    assert azure.error_class(404, "BlobNotFound") is NotFoundError
    assert azure.error_class(404, "ContainerNotFound") is PermanentStoreError
    assert azure.error_class(403, "AuthenticationFailed") is PermanentStoreError
    assert azure.error_class(503, "ServerBusy") is TransientStoreError
    assert azure.error_class(500, "OperationTimedOut") is TransientStoreError
    assert azure.error_class(429, "") is TransientStoreError
    assert azure.error_class(409, "LeaseIdMissing") is PermanentStoreError
    assert gcs.error_class(404, "No such object: b/k") is NotFoundError
    assert gcs.error_class(404, "The specified bucket does not exist.") is PermanentStoreError
    assert gcs.error_class(401) is PermanentStoreError
    assert gcs.error_class(403) is PermanentStoreError
    assert gcs.error_class(429) is TransientStoreError
    assert gcs.error_class(503) is TransientStoreError
    assert gcs.error_class(400) is PermanentStoreError


@pytest.fixture(params=["azure", "gcs"])
def throttled(request: pytest.FixtureRequest, tmp_path: Path
              ) -> tuple[Callable[[], AzureStore | GcsStore], FaultProxy, str]:
    """(a store factory reaching the emulator through a FaultProxy, the proxy, the kind)."""
    if request.param == "azure":
        azurite: AzuriteServer = request.getfixturevalue("azurite")
        container = azurite.new_container()
        proxy = FaultProxy(azurite.endpoint)
        request.addfinalizer(lambda: azurite.drop_container(container))
        request.addfinalizer(proxy.close)
        return (lambda: AzureStore(container, "p", f"{proxy.endpoint}/devstoreaccount1"),
                proxy, "azure")
    fakegcs: FakeGcsServer = request.getfixturevalue("fakegcs")
    bucket = fakegcs.new_bucket()
    proxy = FaultProxy(fakegcs.endpoint)
    request.addfinalizer(lambda: fakegcs.drop_bucket(bucket))
    request.addfinalizer(proxy.close)
    return lambda: GcsStore(bucket, "p", proxy.endpoint), proxy, "gcs"


def test_two_attempts_per_call_then_transient(
        throttled: tuple[Callable[[], AzureStore | GcsStore], FaultProxy, str]) -> None:
    """The SDK tries each call twice (as botocore does for S3), then ckptfs's own retries
    take over: a throttled call surfaces as a TransientStoreError naming HTTP 503."""
    factory, proxy, kind = throttled
    store = factory()
    try:
        proxy.throttle(0.0, lambda m, p: True, first=10)
        with pytest.raises(TransientStoreError, match=r"HTTP 503"):
            store.put("x", b"data")
        assert list(proxy.tries.values()) == [2], proxy.tries
        proxy.throttle(0.0, lambda m, p: True, first=1)  # one 503: the second try lands
        store.put("y", b"data")
        assert store.get("y") == b"data"
    finally:
        proxy.throttle(0.0, lambda m, p: False)
        store.close()


def test_open_store_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for url, want in (("az://", "names no container"), ("gs://", "names no bucket"),
                      ("gs:///x", "names no bucket")):
        with pytest.raises(ConfigError, match=want):
            open_store(url)
    with pytest.raises(ConfigError, match="--storage-class applies to s3:// stores only"):
        open_store(f"gs://b-{uuid.uuid4().hex[:6]}", storage_class="NEARLINE")
