"""Storage efficiency: scripts/bench_efficiency.py's small series meets every target, and
what it saved reads back identical through fresh mounts."""

from __future__ import annotations

import sys
from pathlib import Path

from mounting import Nodes
from training import assert_same

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_efficiency as bench  # noqa: E402

# the stores read back: one file twice (the DDP replica), ZeRO-1 shards sharing weights,
# safetensors + torch + JSON files of an HF-style directory
READ_BACK = ("fp32", "zero1", "hf")


def test_small_series_meets_its_targets_and_reads_back(nodes: Nodes, tmp_path: Path) -> None:
    work = tmp_path / "bench"
    saved: list[tuple[Path, str, object]] = []
    rows = bench.Bench(bench.SIZES["small"], work,
                       lambda store, name, obj: saved.append((store, name, obj))).run()

    targeted = [r for r in rows if r.target is not None]
    assert len(targeted) == 7, bench.table(rows)
    missed = [r for r in targeted if not r.passed]
    assert not missed, "missed targets:\n" + bench.table(missed)

    for name in READ_BACK:
        store = work / name / "store"
        files = [(path, obj) for s, path, obj in saved if s == store]
        assert files, name
        m = nodes.mount(str(store), tmp_path, f"read-{name}")  # its own, empty cache
        for path, obj in files:
            assert_same(obj, bench.read(m / path), f"{name}/{path}")
        m.umount()
