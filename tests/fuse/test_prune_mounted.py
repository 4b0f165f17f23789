"""`ckptfs prune` on a path in a real mount: a Hugging Face Trainer-style run
(output_dir/checkpoint-N) written on one node, pruned from the command line, then read
on another node (the crafted-store cases: tests/contract/test_prune.py)."""

from __future__ import annotations

import os
from pathlib import Path

from mounting import Nodes, run_cli
from support import random_bytes

STEPS = [100, 200, 300, 400, 500, 600]
KEPT = ["checkpoint-300", "checkpoint-500", "checkpoint-600"]  # last 2, every 300


def checkpoint_files(step: int) -> dict[str, bytes]:
    """What HF's Trainer saves in checkpoint-N (small stand-ins for the weights)."""
    return {"config.json": b'{"model_type": "llama"}',
            "model.safetensors": random_bytes(700_000 + step, seed=step),
            "optimizer.pt": random_bytes(300_000, seed=10_000 + step),
            "trainer_state.json": f'{{"global_step": {step}}}'.encode()}


def test_prune_through_a_mount_then_another_node_sees_the_kept_set(
        tmp_path: Path, nodes: Nodes) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    trainer = nodes.mount(str(store_dir), tmp_path, "trainer", "--chunk-size", "256K")
    run = trainer / "run"
    (run / "runs").mkdir(parents=True)  # tensorboard logs: not a checkpoint
    (run / "runs" / "events.out").write_bytes(b"scalars")
    for step in STEPS:
        d = run / f"checkpoint-{step}"
        d.mkdir()
        for name, data in checkpoint_files(step).items():
            (d / name).write_bytes(data)
    run_cli("sync", str(trainer.path))

    r = run_cli("prune", str(run), "--keep-last", "2", "--keep-every", "300",
                "--pattern", "checkpoint-*")
    lines = r.stdout.splitlines()
    # 4 manifests and the marker mkdir wrote
    assert f"removed      {run}/checkpoint-100 (5 manifests and markers)" in lines, r.stdout
    assert any(line.startswith(f"kept         {run}/checkpoint-600: ") for line in lines)
    assert lines[-1].startswith("done         removed 3 of 6 checkpoint directories"), r.stdout

    reader = nodes.mount(str(store_dir), tmp_path, "reader")  # a fresh node
    assert sorted(os.listdir(reader / "run")) == sorted([*KEPT, "runs"])
    for name in KEPT:
        step = int(name.split("-")[1])
        for file, data in checkpoint_files(step).items():
            assert (reader / "run" / name / file).read_bytes() == data, (name, file)
    assert (reader / "run" / "runs" / "events.out").read_bytes() == b"scalars"
    reader.umount()
    trainer.umount()
    r = run_cli("fsck", str(store_dir))
    assert "PROBLEMS" not in r.stdout, r.stdout
