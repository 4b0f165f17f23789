"""Real multi-host Orbax, unmodified, on ckptfs: two JAX processes joined by
`jax.distributed.initialize`, each on its own mount of one store (scripts/orbax_multihost.py).

Orbax's commit waits at a barrier for every process, then lists the per-process metadata
files once on process 0: a node that answered that listing from its own past failed the
save ("ArrayMetadata Store contains metadata from just one process").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mounting import MountedStore, Nodes

pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is in the test extra")

SCRIPT = Path(__file__).parents[2] / "scripts" / "orbax_multihost.py"


def orbax(mode: str, *dirs: Path, steps: int = 20) -> str:
    r = subprocess.run([sys.executable, str(SCRIPT), mode, "--steps", str(steps),
                        "--timeout", "400", *map(str, dirs)],
                       capture_output=True, text=True, timeout=450)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_async_saves_on_two_hosts_then_a_restore_on_two_fresh_nodes(
        store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    a, b = store.node(nodes, tmp_path, "a"), store.node(nodes, tmp_path, "b")
    out = orbax("save", a / "run", b / "run")
    assert "process 0: saved steps [17, 18, 19]" in out, out
    a.umount()
    b.umount()
    c, d = store.node(nodes, tmp_path, "c"), store.node(nodes, tmp_path, "d")
    assert sorted(p.name for p in (c / "run").iterdir()) == ["17", "18", "19"]
    out = orbax("restore", d / "run", c / "run")  # the hosts swapped, on fresh caches
    assert out.count("restored step 19, bit for bit") == 2, out
