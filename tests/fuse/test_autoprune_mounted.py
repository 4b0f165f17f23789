"""Auto-prune through real mounts (`ckptfs mount --keep-last N --keep-pattern GLOB`): a
two-node Hugging Face Trainer-style run in which only one node has the option, and the
option's bad input (the policy itself: tests/contract/test_prune.py; the task's timing:
tests/core/test_autoprune.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mounting import Mount, Nodes, is_mounted, run_cli
from seaweed import SeaweedServer
from support import random_bytes, wait_until

STEPS = [100, 200, 300, 400, 500, 600]
PATTERN = "checkpoint-*"


def rank0_files(step: int) -> dict[str, bytes]:
    """What rank 0 saves in checkpoint-N (small stand-ins for the weights)."""
    return {"config.json": b'{"model_type": "llama"}',
            "model.safetensors": random_bytes(600_000 + step, seed=step),
            "trainer_state.json": f'{{"global_step": {step}}}'.encode()}


def rank1_files(step: int) -> dict[str, bytes]:
    """What the other node saves there: its shard of the optimizer state."""
    return {"optimizer-rank1.pt": random_bytes(400_000, seed=50_000 + step)}


def listing(node: Mount) -> list[str]:
    return sorted(os.listdir(node / "run"))


def eventually(check: object, what: str) -> None:
    """Within a bound many times what it takes (a quiet delay of 2 s, then the prune)."""
    wait_until(check, 60, what, interval=0.1, ignore=(OSError,))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_one_node_prunes_a_two_node_run(kind: str, tmp_path: Path, nodes: Nodes,
                                        request: pytest.FixtureRequest) -> None:
    """Node A mounts with --keep-last 2 --keep-pattern 'checkpoint-*', node B without;
    both save into run/checkpoint-N. After each step, A's mount removes the older ones
    (B's view and a fresh node's agree), the kept files read back exactly, and a newest
    checkpoint that is not complete keeps its complete predecessor."""
    if kind == "local":
        store_dir = tmp_path / "store"
        store_dir.mkdir()
        url, extra = str(store_dir), ["--chunk-size", "256K"]
    else:
        seaweed: SeaweedServer = request.getfixturevalue("seaweed")
        url = f"s3://{seaweed.new_bucket()}/job"
        extra = ["--chunk-size", "256K", "--endpoint-url", seaweed.endpoint]
    a = nodes.mount(url, tmp_path, "a", *extra, "--keep-last", "2", "--keep-pattern", PATTERN)
    b = nodes.mount(url, tmp_path, "b", *extra)
    (a / "run" / "runs").mkdir(parents=True)  # tensorboard logs: never a candidate
    (a / "run" / "runs" / "events.out").write_bytes(b"scalars")
    assert a.status()["autoprune"]["pattern"] == PATTERN and b.status()["autoprune"] is None

    for i, step in enumerate(STEPS):
        name = f"checkpoint-{step}"
        (a / "run" / name).mkdir()
        for file, data in rank0_files(step).items():
            (a / "run" / name / file).write_bytes(data)
        eventually(lambda name=name: (b / "run" / name).is_dir(), f"B sees {name}")
        for file, data in rank1_files(step).items():
            (b / "run" / name / file).write_bytes(data)
        run_cli("sync", str(b.path))
        kept = [f"checkpoint-{s}" for s in STEPS[max(0, i - 1):i + 1]]
        eventually(lambda kept=kept: listing(a) == [*kept, "runs"],
                   f"A keeps {kept} after step {step}")
        eventually(lambda kept=kept: listing(b) == [*kept, "runs"],
                   f"B sees {kept} after step {step}")

    st = a.status()["autoprune"]
    assert st["removed"] == 4 and st["errors"] == 0 and st["last_error"] is None, st
    text = run_cli("status", str(a.path)).stdout
    assert f"auto-prune   --keep-last 2 --keep-pattern '{PATTERN}': " in text, text
    assert "auto-prune" not in run_cli("status", str(b.path)).stdout
    log = a.log()
    for step in STEPS[:4]:
        assert f"auto-prune: removed run/checkpoint-{step} (keep-last 2)" in log, log

    c = nodes.mount(url, tmp_path, "c", *extra)  # a fresh node
    assert listing(c) == ["checkpoint-500", "checkpoint-600", "runs"]
    for step in (500, 600):
        for file, data in {**rank0_files(step), **rank1_files(step)}.items():
            for node in (a, b, c):
                path = node / "run" / f"checkpoint-{step}" / file
                assert path.read_bytes() == data, (node.path, step, file)
    assert (c / "run" / "runs" / "events.out").read_bytes() == b"scalars"

    # the newest checkpoints are not complete (no files yet): the newest complete one,
    # checkpoint-600, stays as well, whatever --keep-last says
    runs = a.status()["autoprune"]["runs"]
    (a / "run" / "checkpoint-700").mkdir()
    (a / "run" / "checkpoint-800").mkdir()
    eventually(lambda: a.status()["autoprune"]["runs"] > runs, "a prune after the mkdirs")
    expected = ["checkpoint-600", "checkpoint-700", "checkpoint-800", "runs"]
    eventually(lambda: listing(a) == expected, f"A keeps {expected}")
    eventually(lambda: listing(c) == expected, f"C sees {expected}")

    # what the mount removed is in the trash: checkpoint-500 comes back, byte for byte,
    # under a name outside the pattern (A's prune would remove it again otherwise)
    r = run_cli("trash", "ls", str(b / "run"), "--json")
    trashed = sorted(str(i["path"]) for i in json.loads(r.stdout)["items"])
    assert trashed == [f"run/checkpoint-{s}" for s in STEPS[:5]], trashed
    run_cli("trash", "restore", str(b / "run" / "checkpoint-500"), "--to", "run/kept-500")
    eventually(lambda: (c / "run" / "kept-500").is_dir(), "C sees kept-500")
    for file, data in {**rank0_files(500), **rank1_files(500)}.items():
        assert (c / "run" / "kept-500" / file).read_bytes() == data, file

    for node in (c, b, a):
        node.umount()
    r = run_cli("fsck", url, *extra[2:])
    assert "PROBLEMS" not in r.stdout, r.stdout


@pytest.mark.parametrize(("options", "message"), [
    (["--keep-last", "0", "--keep-pattern", PATTERN], "--keep-last must be 1 or more, not 0"),
    (["--keep-last", "-2", "--keep-pattern", PATTERN], "--keep-last must be 1 or more"),
    (["--keep-last", "2", "--keep-every", "0", "--keep-pattern", PATTERN],
     "--keep-every must be 1 or more"),
    (["--keep-every", "1000"], "--keep-every needs --keep-last N"),
    (["--keep-pattern", PATTERN], "--keep-pattern needs --keep-last N"),
    (["--keep-last", "3"], "--keep-last needs --keep-pattern GLOB"),
    (["--keep-last", "3", "--keep-pattern", "run/checkpoint-*"], "one directory name"),
    (["--fast-size", "1G"], "--fast-size needs --fast-tier DIR"),
    (["--fast-keep", "3", "--fast-size", "1G"], "--fast-keep and --fast-size need --fast-tier"),
])
def test_bad_auto_prune_options_are_one_line(options: list[str], message: str,
                                             tmp_path: Path) -> None:
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    store.mkdir()
    mnt.mkdir()
    r = run_cli("mount", str(store), str(mnt), "--cache-dir", str(tmp_path / "cache"),
                *options, check=False, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: ") and message in lines[0], (
        r.stderr)
    assert "Traceback" not in r.stderr
    assert not is_mounted(mnt) and os.listdir(store) == []
