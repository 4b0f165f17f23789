"""Store formats through a real mount: a format 1 store stays format 1 (fixed chunks,
lz4) when this ckptfs mounts it, `ckptfs upgrade` moves it to format 2, after which new
files are cut at tensor boundaries and stored with zstd4, and the files written before
still read back byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from mounting import Nodes, run_cli
from training import assert_same

from ckptfs.format import codec, manifests
from ckptfs.format.manifests import Manifest
from ckptfs.store.local import LocalStore

CHUNK = 1 << 20
FORMAT_1 = {"format": 1, "chunk_size": CHUNK, "hash": "xxh3-128", "created_by": "ckptfs 0.0.9",
            "created_at": 1.0}


def state() -> dict[str, torch.Tensor]:
    """Weights with some structure (zstd4 finds it; lz4 does not), 3 tensors > CHUNK."""
    g = torch.Generator().manual_seed(1)
    return {f"layer{i}.weight": torch.randn(700_000, generator=g) * 0.02 for i in range(3)}


def chunks_of(store: LocalStore, path: str) -> list[tuple[str, int]]:
    return list(Manifest.from_json(store.get(manifests.file_key(path))).chunks)


def codec_ids(store: LocalStore, path: str) -> set[int]:
    return {store.get(manifests.chunk_key(h))[4] for h, _ in chunks_of(store, path)}


def test_a_format_1_store_stays_so_until_upgraded(tmp_path: Path, nodes: Nodes) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = LocalStore(store_dir)
    store.put(manifests.INFO_KEY, json.dumps(FORMAT_1).encode())
    sd = state()

    m = nodes.mount(str(store_dir), tmp_path, "old")
    assert "is format 1 (fixed chunks, lz4) and stays so" in m.log()
    torch.save(sd, m / "before.pt")
    m.umount()
    assert json.loads(store.get(manifests.INFO_KEY)) == FORMAT_1
    lengths = [n for _, n in chunks_of(store, "before.pt")]
    assert all(n == CHUNK for n in lengths[:-1]) and len(lengths) >= 3  # fixed cuts
    assert codec_ids(store, "before.pt") <= {codec.CODEC_RAW, codec.CODEC_LZ4}

    dry = run_cli("upgrade", str(store_dir))
    assert "would upgrade" in dry.stdout and "format 1: fixed 1.0 MiB chunks, lz4" in dry.stdout
    assert json.loads(store.get(manifests.INFO_KEY)) == FORMAT_1
    run_cli("upgrade", str(store_dir), "--yes")
    info = json.loads(store.get(manifests.INFO_KEY))
    assert (info["format"], info["chunking"], info["codec"], info["chunk_size"]) == (
        2, "records", "zstd4", CHUNK)
    again = run_cli("upgrade", str(store_dir), "--json")
    assert json.loads(again.stdout)["changed"] is False

    m2 = nodes.mount(str(store_dir), tmp_path, "new")
    assert "stays so" not in m2.log()
    torch.save(sd, m2 / "after.pt")
    assert_same(torch.load(m2 / "before.pt"), sd)  # written as format 1, read as format 2
    m2.umount()
    assert codec.CODEC_ZSTD4 in codec_ids(store, "after.pt")
    starts, content = chunk_starts(store, "after.pt")
    for name, t in sd.items():  # each tensor begins a chunk (cut at records)
        assert content.index(t.numpy().tobytes()) in starts, name


def chunk_starts(store: LocalStore, path: str) -> tuple[set[int], bytes]:
    """The offsets where the stored file's chunks begin, and its bytes."""
    starts, pos, parts = set(), 0, []
    for h, n in chunks_of(store, path):
        starts.add(pos)
        pos += n
        parts.append(bytes(codec.decode_chunk(store.get(manifests.chunk_key(h)), h)))
    return starts, b"".join(parts)


def test_codec_of_a_new_store(tmp_path: Path, nodes: Nodes) -> None:
    """--codec lz4 makes a format 2 store that keeps weights uncompressed (cut at
    tensors all the same); a later --codec is ignored with a warning."""
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = LocalStore(store_dir)
    m = nodes.mount(str(store_dir), tmp_path, "first", "--codec", "lz4", "--chunk-size", "1M")
    torch.save(state(), m / "w.pt")
    m.umount()
    info = json.loads(store.get(manifests.INFO_KEY))
    assert (info["format"], info["chunking"], info["codec"]) == (2, "records", "lz4")
    assert codec_ids(store, "w.pt") <= {codec.CODEC_RAW, codec.CODEC_LZ4}
    m2 = nodes.mount(str(store_dir), tmp_path, "second", "--codec", "zstd4")
    assert "--codec zstd4 is ignored" in m2.log() and "compresses with lz4" in m2.log()
    m2.umount()
