"""A mount through an Azure SAS connection string (on Azurite) shows its store without the
token everywhere it names it: `status` (text and --json), the log's "mounted" line, the
metrics' labels; a cache directory whose journal recorded the store's URL with the
token (as ckptfs did before) is taken as the same store's, its record rewritten."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from azurite import ACCOUNT, KEY, AzuriteServer
from mounting import Nodes, run_cli

from ckptfs.pipeline.journal import Journal


def test_a_sas_token_is_in_no_status_log_line_or_metric(
        azurite: AzuriteServer, tmp_path: Path, nodes: Nodes) -> None:
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    container = azurite.new_container()
    sas = generate_account_sas(
        ACCOUNT, KEY, ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, write=True, delete=True, list=True, add=True,
                              create=True), expiry=datetime.now(UTC) + timedelta(hours=1))
    sig = urllib.parse.parse_qs(sas)["sig"][0]
    secrets = (sig, urllib.parse.quote(sig, safe=""), sas)
    env = {**os.environ,
           "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={azurite.endpoint};"
                                              f"SharedAccessSignature={sas}"}
    store = f"az://{container}/run/ at {azurite.endpoint}"  # how ckptfs names it
    cache = tmp_path / "a-cache"
    cache.mkdir(mode=0o700)
    journal = Journal(str(cache / "journal.sqlite"))  # as a mount before this ckptfs left it
    journal.set_meta("store", f"az://{container}/run/ at {azurite.endpoint}/?{sas}")
    journal.close()

    a = nodes.mount(f"az://{container}/run", tmp_path, "a", "--metrics-addr", "127.0.0.1:0",
                    env=env)
    (a / "model.bin").write_bytes(b"weights" * 1000)
    a.sync()
    text = run_cli("status", str(a.path)).stdout
    as_json = run_cli("status", str(a.path), "--json").stdout
    st = json.loads(as_json)
    with urllib.request.urlopen(f"http://{st['metrics_addr']}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    assert f"store        {store}\n" in text
    assert st["store"] == store
    assert f'store="{store}"' in metrics
    assert a.umount().returncode == 0
    log = a.log()
    assert f"mounted {store} on {a.path}" in log
    for shown in (text, as_json, metrics, log):
        assert not any(secret in shown for secret in secrets), shown
    journal = Journal(str(cache / "journal.sqlite"))
    try:
        assert journal.get_meta("store") == store
    finally:
        journal.close()
    azurite.drop_container(container)
