"""The store tools over a directory store's tree fuzzed with what another writer of the
store directory can leave in it (tests/treefuzz.py: links to /dev/zero, to a root-only file
and to other directories, FIFOs, devices, directories and 4 GiB files where records
belong): each one answers, with one-line messages, within a timeout and a memory limit, and
none follows a link, prints what one points to, or writes or deletes through one. Through a
mount: tests/fuse/test_shared_store.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from treefuzz import SECRET, check_answers, crafted_store, fuzz, outside_tree, run_tools

#: a few seeds keep this to seconds; scripts can run many more
SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_store_tool_answers_a_fuzzed_tree(tmp_path: Path, seed: int) -> None:
    store = crafted_store(tmp_path / "store")
    outside = outside_tree(tmp_path / "outside")
    planted = fuzz(store, outside, seed)
    check_answers(run_tools(str(store.root)), planted)
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(os.listdir(outside / "dir")) == ["model.pt%o", "x%o"]
