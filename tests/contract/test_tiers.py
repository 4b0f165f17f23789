"""The store tools with a fast tier (`--fast-tier DIR`) on two crafted directory stores:
a chunk is sound when either tier has a sound copy, a file is durable once the object
store has its version, and what is in neither tier is an error. The same through real
mounts with S3 held back: tests/fuse/test_fast_tier_views.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crafting import CHUNK, checkpoint, flip_byte, new_store, put_file
from mounting import run_cli
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.store.local import LocalStore


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[Path, Path]:
    """(the object store, its fast tier): directories, the fast tier holding the store's
    ckptfs.json as a mount leaves it."""
    slow, fast = tmp_path / "store", tmp_path / "fast"
    slow.mkdir()
    fast.mkdir()
    store = new_store(LocalStore(slow))
    LocalStore(fast).put(manifests.INFO_KEY, store.get(manifests.INFO_KEY))
    return slow, fast


def both(slow: Path, fast: Path, path: str, data: bytes) -> list[str]:
    """A file moved to the object store and still in the fast tier (trim keeps it)."""
    put_file(LocalStore(slow), path, data)
    return put_file(LocalStore(fast), path, data)


def test_a_chunk_is_sound_when_either_tier_has_a_sound_copy(tiers: tuple[Path, Path]) -> None:
    slow, fast = tiers
    hashes = both(slow, fast, "step-1/model.pt", random_bytes(2 * CHUNK))
    flip_byte(LocalStore(fast), hashes[0])  # the store's copy is sound: a warning
    r = run_cli("fsck", str(slow), "--fast-tier", str(fast), "--deep")
    assert (f"warning      {manifests.chunk_key(hashes[0])} is damaged in the fast tier"
            in r.stdout), r.stdout
    got = json.loads(run_cli("fsck", str(slow), "--fast-tier", str(fast), "--deep",
                             "--json").stdout)
    assert got["clean"] is True
    assert [d["store_has_good_copy"] for d in got["fast_tier"]["damaged_chunks"]] == [True]
    flip_byte(LocalStore(slow), hashes[1])  # the fast tier's is sound: the store's is bad
    r = run_cli("fsck", str(slow), "--fast-tier", str(fast), "--deep", check=False)
    assert r.returncode == 1, r
    assert (f"DAMAGED      {manifests.chunk_key(hashes[1])}: damaged in the store: "
            in r.stdout), r.stdout
    assert "the fast tier's copy is sound" in r.stdout
    flip_byte(LocalStore(slow), hashes[0])  # no sound copy left: data loss
    r = run_cli("verify", str(slow), "--fast-tier", str(fast), "--deep", check=False)
    assert r.returncode == 1 and "and in the store (" in r.stdout, r


def test_latest_durable_wants_the_object_store_to_have_it_all(
        tiers: tuple[Path, Path]) -> None:
    slow, fast = tiers
    checkpoint(LocalStore(fast), "step-1")  # the fast tier alone
    tier = ["--fast-tier", str(fast)]
    assert run_cli("latest", str(slow), *tier).stdout == "step-1\n"
    r = run_cli("latest", str(slow), *tier, "--durable", "--json", check=False)
    assert r.returncode == 1 and json.loads(r.stdout)["path"] is None, r
    assert "no durable checkpoint directory matching '*'" in r.stderr
    r = run_cli("latest", str(slow), check=False)  # without the fast tier: nothing
    assert r.returncode == 1, r
    listed = json.loads(run_cli("ls", str(slow), *tier, "--json").stdout)
    assert [(f["path"], f["complete"], f["durable"]) for f in listed] == [
        ("step-1/config.json", True, False), ("step-1/model.pt", True, False)]
    checkpoint(LocalStore(slow), "step-1")  # moved: gen 0 in both, durable
    got = json.loads(run_cli("latest", str(slow), *tier, "--durable", "--json").stdout)
    assert (got["path"], got["durable"], got["files"]) == ("step-1", True, 2)


def test_a_chunk_in_neither_tier_is_missing(tiers: tuple[Path, Path]) -> None:
    slow, fast = tiers
    hashes = put_file(LocalStore(fast), "step-1/model.pt", random_bytes(2 * CHUNK),
                      skip=(1,))
    r = run_cli("fsck", str(slow), "--fast-tier", str(fast), check=False)
    assert r.returncode == 1 and "MISSING      step-1/model.pt: chunk 1 (" in r.stdout, r
    assert manifests.chunk_key(hashes[1]) in r.stdout
    r = run_cli("verify", str(slow), "--fast-tier", str(fast), check=False)
    assert r.returncode == 1 and r.stdout.startswith("INCOMPLETE  step-1/model.pt: 1 of 2"), r


def test_a_directory_that_is_no_fast_tier_of_the_store_is_refused(
        tiers: tuple[Path, Path], tmp_path: Path) -> None:
    slow, _ = tiers
    other = tmp_path / "other"
    other.mkdir()
    for tool in ("du", "verify", "ls", "latest", "fsck"):
        r = run_cli(tool, str(slow), "--fast-tier", str(other), check=False)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (tool, r)
        assert f"--fast-tier {other} is not a fast tier of" in r.stderr, r.stderr
