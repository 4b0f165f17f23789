"""Credentials are never shown: an Azure SAS connection string, or an --endpoint-url with
a password, is in no store URL and no error, from the store or from the command line
(the status, the log and the metrics of a mount: tests/fuse/test_credentials_mounted.py)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from azurite import ACCOUNT, KEY, AzuriteServer
from mounting import run_cli

from ckptfs.common.errors import StoreError
from ckptfs.store import open_store
from ckptfs.store.azure import AzureStore
from ckptfs.store.gcs import GcsStore
from ckptfs.store.s3 import S3Store

SIG = "S3cr3tSig%2Bw%3D"  # an (URL-encoded) SAS signature, as a SAS token carries it
SAS = f"sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00%3A00%3A00Z&sig={SIG}"
PASSWORD = "pa55w0rd-Secret"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ls_error(args: list[str], env: dict[str, str]) -> str:
    """The one line `ckptfs ls ARGS` prints when it fails (exit 2)."""
    r: subprocess.CompletedProcess[str] = run_cli("ls", *args, check=False, timeout=60, env=env)
    assert r.returncode == 2 and r.stderr.startswith("ckptfs: "), (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip()


def store_errors(url: str, endpoint_url: str | None = None) -> list[str]:
    """The messages of check, get, put and list on the store at `url` (which is down)."""
    store = open_store(url, endpoint_url=endpoint_url)
    assert isinstance(store, S3Store | AzureStore | GcsStore)
    calls: list[Callable[[], object]] = [
        store.check, lambda: store.get("k"), lambda: store.put("k", b"x"),
        lambda: store.list("")]
    messages = []
    try:
        for call in calls:
            with pytest.raises(StoreError) as failed:
                call()
            messages.append(str(failed.value))
    finally:
        store.close()
    return messages


def test_a_sas_connection_string_is_in_no_url_and_no_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}/{ACCOUNT}"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={endpoint};SharedAccessSignature={SAS}")
    store = open_store("az://ckpt/run")
    try:
        assert store.url == f"az://ckpt/run/ at {endpoint}"
    finally:
        store.close()
    messages = store_errors("az://ckpt/run")
    assert messages[0] == f"cannot connect to {endpoint}: Connection refused"
    line = ls_error(["az://ckpt/run"], dict(os.environ))
    assert line == f"ckptfs: cannot connect to {endpoint}: Connection refused"
    for text in (*messages, line):
        assert "S3cr3tSig" not in text and SAS not in text, text


@pytest.mark.parametrize("scheme", ["s3", "az", "gs"])
def test_a_password_in_the_endpoint_url_is_in_no_url_and_no_error(
        scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):  # no cloud's environment: the endpoint given is used
        if name.startswith(("AZURE_", "AWS_", "STORAGE_EMULATOR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    port = closed_port()
    endpoint = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    shown = f"http://alice:REDACTED@127.0.0.1:{port}"
    store = open_store(f"{scheme}://ckpt/run", endpoint_url=endpoint)
    try:
        assert store.url == f"{scheme}://ckpt/run/ at {shown}"
    finally:
        store.close()
    messages = store_errors(f"{scheme}://ckpt/run", endpoint)
    assert messages[0] == f"cannot connect to {shown}: Connection refused"
    line = ls_error([f"{scheme}://ckpt/run", "--endpoint-url", endpoint], dict(os.environ))
    assert line == f"ckptfs: cannot connect to {shown}: Connection refused"
    for text in (*messages, line):
        assert PASSWORD not in text, text
    if scheme == "s3":  # (one check of the endpoint for every store)
        bad = ls_error([f"{scheme}://ckpt/run", "--endpoint-url", f"{endpoint}9999"],
                       dict(os.environ))  # a port out of range
        assert bad == (f"ckptfs: invalid endpoint '{shown}9999' (--endpoint-url): want "
                       f"http://HOST[:PORT] or https://HOST[:PORT], e.g. "
                       f"http://127.0.0.1:8333")


def test_a_sas_connection_string_reaches_the_data(azurite: AzuriteServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The SAS token of a connection string, kept out of the store's URL, still signs
    every request (the SDK gets it as the credential): the data is reached, copies too."""
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    container = azurite.new_container()
    sas = generate_account_sas(
        ACCOUNT, KEY, ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, write=True, delete=True, list=True, add=True,
                              create=True), expiry=datetime.now(UTC) + timedelta(hours=1))
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={azurite.endpoint};SharedAccessSignature={sas}")
    store = open_store(f"az://{container}/run")
    try:
        assert isinstance(store, AzureStore)
        assert store.url == f"az://{container}/run/ at {azurite.endpoint}"
        store.check()
        store.put("a", b"payload")
        store.copy("a", "b")
        assert store.get("b") == b"payload"
        assert [k for k, _ in store.list("").objects] == ["a", "b"]
        store.delete("a")
        with pytest.raises(StoreError):
            store.get("a")
    finally:
        store.close()
        azurite.drop_container(container)
