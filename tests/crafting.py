"""A store crafted as a writer leaves it (chunks, then the manifest), for the store tools'
tests: complete files, missing and corrupt chunks, any writer and mtime; and reading it
back as a reader would."""

from __future__ import annotations

import json
import subprocess

import pytest
from mounting import run_cli
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.format.codec import HEADER_SIZE, chunk_hash, decode_chunk, encode_chunk
from ckptfs.format.manifests import Manifest, StoreInfo
from ckptfs.store.azure import AzureStore
from ckptfs.store.base import Store
from ckptfs.store.gcs import GcsStore
from ckptfs.store.local import LocalStore
from ckptfs.store.s3 import S3Store

CHUNK = 64 * 1024
T0 = 1_700_000_000 * 10**9  # a fixed mtime, in ns


def new_store(store: Store) -> Store:
    store.put(manifests.INFO_KEY, StoreInfo(chunk_size=CHUNK).to_json())
    return store


def put_file(store: Store, path: str, data: bytes, writer: str = "node-a",
             mtime_ns: int = T0, skip: tuple[int, ...] = ()) -> list[str]:
    """Write a file as a writer would: its chunks (except indexes in `skip`), its manifest."""
    hashes = []
    chunks = []
    for i, start in enumerate(range(0, len(data), CHUNK)):
        piece = data[start:start + CHUNK]
        h = chunk_hash(piece)
        hashes.append(h)
        chunks.append((h, len(piece)))
        if i not in skip:
            store.put(manifests.chunk_key(h), encode_chunk(piece)[0])
    m = Manifest(size=len(data), mode=0o100644, mtime_ns=mtime_ns, chunks=tuple(chunks),
                 chunk_size=CHUNK, writer=writer)
    store.put(manifests.file_key(path), m.to_json())
    return hashes


def flip_byte(store: Store, chunk: str) -> None:
    """Damage one payload byte of a stored chunk (random data: stored raw)."""
    key = manifests.chunk_key(chunk)
    blob = bytearray(store.get(key))
    blob[HEADER_SIZE + 10] ^= 0xFF
    store.put(key, bytes(blob))


def checkpoint(store: Store, dir_path: str, writer: str = "node-a", mtime_ns: int = T0,
               skip: tuple[int, ...] = ()) -> None:
    put_file(store, f"{dir_path}/model.pt", random_bytes(3 * CHUNK + 100), writer, mtime_ns, skip)
    put_file(store, f"{dir_path}/config.json", b'{"lr": 0.1}', writer, mtime_ns)


def s3_url(store: S3Store) -> str:
    return f"s3://{store.bucket}/{store.prefix.rstrip('/')}"


def azure_url(store: AzureStore) -> str:
    return f"az://{store.container}/{store.prefix.rstrip('/')}"


def gcs_url(store: GcsStore) -> str:
    return f"gs://{store.bucket_name}/{store.prefix.rstrip('/')}"


def make_st(kind: str, request: pytest.FixtureRequest) -> StoreUnderTest:
    """A StoreUnderTest of `kind` ("local", "s3", "azure", "gcs"), from the fixtures."""
    if kind == "local":
        local: LocalStore = request.getfixturevalue("local_store")
        return StoreUnderTest(local, str(local.root), [])
    if kind == "s3":
        s3: S3Store = request.getfixturevalue("s3_store")
        return StoreUnderTest(s3, s3_url(s3), ["--endpoint-url", s3.endpoint])
    if kind == "azure":  # the session's AZURE_STORAGE_CONNECTION_STRING names Azurite
        azure: AzureStore = request.getfixturevalue("azure_store")
        return StoreUnderTest(azure, azure_url(azure), [])
    gcs: GcsStore = request.getfixturevalue("gcs_store")
    return StoreUnderTest(gcs, gcs_url(gcs), ["--endpoint-url", gcs.endpoint])


def read_back(store: Store, path: str, fossils: bool = False) -> bytes:
    """The bytes of the file at `path`, from its manifest and its chunks (verified) in
    chunks/ or, with `fossils`, also in fossils/ as readers fall back to them."""
    m = Manifest.from_json(store.get(manifests.file_key(path)))
    parts = []
    for h, _ in m.chunks:
        keys = [manifests.chunk_key(h)] + ([manifests.fossil_key(h)] if fossils else [])
        for key in keys:
            if store.head(key) is not None:
                parts.append(bytes(decode_chunk(store.get(key), h)))
                break
        else:
            raise AssertionError(f"{path}: chunk {h} is in neither "
                                 f"{' nor '.join(k.split('/')[0] for k in keys)}")
    return b"".join(parts)


def stored_names(store: Store, prefix: str = manifests.CHUNKS) -> set[str]:
    """The chunk names under chunks/ (or fossils/)."""
    return {name for key, _ in store.list(prefix, None).objects
            if (name := manifests.chunk_name(key, prefix)) is not None}


def snapshot(store: Store) -> dict[str, str]:
    """Every object of the store and its token: equal snapshots, unchanged store."""
    return {info.key: info.token for info in store.scan("")}


class StoreUnderTest:
    """A crafted store (made a new ckptfs store) plus the CLI arguments that name it."""

    def __init__(self, store: Store, url: str, extra: list[str]) -> None:
        self.store = new_store(store)
        self.url = url
        self.extra = extra
        #: "local", "s3", "azure" or "gcs"
        self.kind = {"s3": "s3", "az": "azure", "gs": "gcs"}.get(url.partition("://")[0],
                                                                "local")
        self.local = self.kind == "local"

    def cli(self, command: str, *args: str, check: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`ckptfs COMMAND STORE ARGS...` (with the store's options)."""
        return run_cli(command, self.url, *args, *self.extra, check=check, timeout=120,
                       env=env)

    def json(self, command: str, *args: str, env: dict[str, str] | None = None
             ) -> dict[str, object]:
        """`ckptfs COMMAND STORE ARGS... --json`, which must exit 0: its answer."""
        r = self.cli(command, *args, "--json", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return dict(json.loads(r.stdout))
