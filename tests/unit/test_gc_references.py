"""gc.References: the one structure of a gc run that grows with the store."""

from __future__ import annotations

import os
import tracemalloc

from ckptfs.tools.gc import References


def test_references_hold_names_as_16_bytes() -> None:
    """Each name is held once, as 16 bytes: 49 bytes for the object and 27 to 53 for
    its slot in the set's table, which grows in steps (docs/OPERATIONS.md: 83 MB for a
    million referenced chunks)."""
    names = [os.urandom(16).hex() for _ in range(100_000)]
    tracemalloc.start()
    try:
        refs = References()
        for h in names:
            refs.add(h)
            refs.add(h)  # named twice (two files, or twice in one): counted once
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(refs) == len(names)
    assert all(h in refs for h in names[:1000])
    assert "0" * 32 not in refs and None not in refs
    assert used / len(names) < 105, used / len(names)
