"""trash.py's names and grouping, without a store."""

from __future__ import annotations

import math

from ckptfs.store.base import ObjectInfo
from ckptfs.tools import trash


def entry(key: str, deleted: float) -> trash.Entry:
    e = trash.parse(ObjectInfo(key, 10, deleted, "t"))
    assert e is not None
    return e


def test_a_batch_names_its_time_keep_sequence_and_node() -> None:
    b = trash.batch_id(24 * 3600, 41, "gpu-node-07/x", when=0)
    assert b == "19700101T000000Z-24h-41-gpu-node-07_x"
    e = entry(f"trash/{b}/ckpt/step-1/", 5.0)
    assert (e.path, e.is_dir, e.keep, e.node, e.expires) == (
        "ckpt/step-1", True, 86400.0, "gpu-node-07_x", 86405.0)
    odd = entry("trash/by-hand/x", 5.0)  # not a batch ckptfs wrote: kept until emptied
    assert math.isinf(odd.keep) and odd.node == "?"
    assert trash.parse(ObjectInfo("trash/b/../x", 1, 0, "t")) is None
    assert trash.parse(ObjectInfo("trash/b/", 1, 0, "t")) is None


def test_rm_rf_is_one_item_and_later_deletions_of_a_name_are_others() -> None:
    """rm -rf d: d's files go before d's marker (one item); a file deleted after d's
    deletion, or outside d, is an item of its own; a directory deleted twice is two."""
    b1 = trash.batch_id(3600, 1, "n", when=0)
    b2 = trash.batch_id(3600, 2, "n", when=0)
    b3 = trash.batch_id(3600, 3, "n", when=0)
    found = sorted([
        entry(f"trash/{b1}/d/a", 1), entry(f"trash/{b1}/d/sub/b", 1),
        entry(f"trash/{b2}/d/sub/", 2), entry(f"trash/{b2}/d/", 2),
        entry(f"trash/{b3}/d/a", 5), entry(f"trash/{b3}/d/", 5), entry(f"trash/{b3}/x", 5),
    ], key=lambda e: (e.deleted, e.key))
    got = [(it.head.path, it.head.deleted, sorted(e.path for e in it.members))
           for it in trash.items(found)]
    assert got == [("x", 5, ["x"]), ("d", 5, ["d", "d/a"]),
                   ("d", 2, ["d", "d/a", "d/sub", "d/sub/b"])]
    assert [(e.path, e.deleted) for e in trash.newest(found)] == [
        ("d", 5), ("d/a", 5), ("d/sub", 2), ("d/sub/b", 1), ("x", 5)]
