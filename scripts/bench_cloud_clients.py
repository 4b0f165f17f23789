"""Benchmark: the Azure and GCS client libraries on their emulators (PUT then GET).

For each client (the official SDK, and obstore, whose one Rust client speaks S3, GCS and
Azure), 8 threads PUT then GET --objects objects of 16 MiB each; reported per phase:
throughput, and CPU seconds per GiB of this process (the client's cost; the emulator runs
in its own process and is not counted). Runs are interleaved; medians of --runs.

Emulators started here on 127.0.0.1: Azurite (scripts/setup.sh installs it in .tools/)
and fake-gcs-server (memory backend). obstore's GCS client speaks the XML API, whose
object PUT fake-gcs-server does not implement: that pair is reported as not measurable.

    .venv/bin/python scripts/bench_cloud_clients.py --objects 32 --runs 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from azurite import ACCOUNT, KEY, AzuriteServer  # noqa: E402
from fakegcs import FakeGcsServer  # noqa: E402

if TYPE_CHECKING:
    from obstore.store import GCSCredential  # a type only, not importable at run time

MIB = 1 << 20
THREADS = 8
Put = Callable[[str, bytes], None]
Get = Callable[[str], bytes]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def azure_sdk(server: AzuriteServer, container: str) -> tuple[Put, Get]:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(server.connection_string)
    client = service.get_container_client(container)

    def put(key: str, data: bytes) -> None:
        client.upload_blob(key, data, overwrite=True, max_concurrency=1)

    def get(key: str) -> bytes:
        return client.download_blob(key, max_concurrency=1).readall()

    return put, get


def azure_obstore(server: AzuriteServer, container: str) -> tuple[Put, Get]:
    import obstore
    from obstore.store import AzureStore

    store = AzureStore(container, config={"account_name": ACCOUNT, "account_key": KEY,
                                          "endpoint": server.endpoint},
                       client_options={"allow_http": True})

    def put(key: str, data: bytes) -> None:
        obstore.put(store, key, data)

    def get(key: str) -> bytes:
        return bytes(obstore.get(store, key).bytes())

    return put, get


def gcs_sdk(server: FakeGcsServer, bucket: str) -> tuple[Put, Get]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="bench", credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                            client_options={"api_endpoint": server.endpoint})
    handle = client.bucket(bucket)

    def put(key: str, data: bytes) -> None:
        handle.blob(key).upload_from_string(data, checksum=None)

    def get(key: str) -> bytes:
        return bytes(handle.blob(key).download_as_bytes(checksum=None))

    return put, get


def gcs_obstore(server: FakeGcsServer, bucket: str) -> tuple[Put, Get]:
    import obstore
    from obstore.store import GCSStore

    def anonymous() -> GCSCredential:
        return {"token": "anonymous", "expires_at": None}

    store = GCSStore(bucket, config={"base_url": server.endpoint},
                     client_options={"allow_http": True},
                     credential_provider=anonymous)

    def put(key: str, data: bytes) -> None:
        obstore.put(store, key, data)

    def get(key: str) -> bytes:
        return bytes(obstore.get(store, key).bytes())

    return put, get


def phase(fn: Callable[[str], object], keys: list[str]) -> tuple[float, float]:
    """(seconds, CPU seconds) of fn over keys from THREADS threads."""
    cpu, start = cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(fn, keys))
    return time.perf_counter() - start, cpu_seconds() - cpu


def bench(put: Put, get: Get, objects: int, data: list[bytes], run: int) -> dict[str, float]:
    keys = [f"run{run}/obj-{i:04d}" for i in range(objects)]
    put_s, put_cpu = phase(lambda k: put(k, data[int(k[-4:]) % len(data)]), keys)
    got: list[int] = []
    get_s, get_cpu = phase(lambda k: got.append(len(get(k))), keys)
    assert got == [16 * MIB] * objects, "short GET"
    gib = objects * 16 * MIB / (1 << 30)
    return {"put_mibs": gib * 1024 / put_s, "put_cpu": put_cpu / gib,
            "get_mibs": gib * 1024 / get_s, "get_cpu": get_cpu / gib}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=32, help="16 MiB objects per run")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    data = [os.urandom(16 * MIB) for _ in range(4)]
    with tempfile.TemporaryDirectory(prefix="bench-clouds-") as tmp:
        azurite = AzuriteServer(Path(tmp) / "azurite")
        gcs = FakeGcsServer(Path(tmp) / "gcs")
        azurite.start()
        gcs.start()
        try:
            container = azurite.new_container()
            bucket = gcs.new_bucket()
            clients = {
                "azure sdk (azure-storage-blob)": azure_sdk(azurite, container),
                "azure obstore": azure_obstore(azurite, container),
                "gcs sdk (google-cloud-storage)": gcs_sdk(gcs, bucket),
                "gcs obstore": gcs_obstore(gcs, bucket),
            }
            results: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
            failed: dict[str, str] = {}
            for run in range(a.runs):
                for name, (put, get) in clients.items():
                    if name in failed:
                        continue
                    try:
                        results[name].append(bench(put, get, a.objects, data, run))
                    except Exception as e:  # noqa: BLE001 - reported, the others go on
                        failed[name] = " ".join(str(e).split())[:160]
                print(f"run {run + 1}/{a.runs} done", file=sys.stderr)
        finally:
            azurite.stop()
            gcs.stop()
    print(f"{THREADS} threads, 16 MiB objects, {a.objects} per run, median of {a.runs} runs")
    print(f"{'client':32} {'PUT MiB/s':>10} {'CPU s/GiB':>10} {'GET MiB/s':>10} {'CPU s/GiB':>10}")
    for name, runs in results.items():
        if name in failed:
            print(f"{name:32} not measurable: {failed[name]}")
            continue

        def med(k: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[k] for r in runs)

        print(f"{name:32} {med('put_mibs'):10.0f} {med('put_cpu'):10.2f} "
              f"{med('get_mibs'):10.0f} {med('get_cpu'):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
