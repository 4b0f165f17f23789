"""The trash through real mounts, on the local store and SeaweedFS S3: an accidental
`rm -rf` of a torch checkpoint undone from another node, byte for byte; a save by
rename over the last checkpoint keeps the replaced one; `--trash-hours 0`. The trash's
rules on crafted stores: tests/contract/test_trash.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from mounting import MountedStore, Nodes, run_cli
from support import wait_until
from training import assert_same, training_state


def trash_ls(target: Path, *extra: str) -> list[dict[str, object]]:
    r = run_cli("trash", "ls", str(target), "--json", *extra)
    return list(json.loads(r.stdout)["items"])


def test_rm_rf_of_a_checkpoint_is_undone_from_another_node(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """Node a saves step-100 and step-200, then removes step-100 with rm -rf. Node b,
    which never saw it, lists it in the trash and restores it; both nodes and a fresh
    third one then read exactly the tensors that were saved; node a's own listing shows
    the directory again; and gc (grace 0, no writers) frees nothing the trash keeps."""
    state = training_state(24)
    a = store.node(nodes, tmp_path, "a")
    for step in (100, 200):
        d = a / "run" / f"step-{step}"
        d.mkdir(parents=True)
        torch.save(state, d / "model.pt")
        (d / "trainer_state.json").write_text(json.dumps({"step": step}))
    original = (a / "run" / "step-100" / "model.pt").read_bytes()
    run_cli("sync", str(a.path))
    shutil.rmtree(a / "run" / "step-100")
    assert sorted(os.listdir(a / "run")) == ["step-200"]
    run_cli("sync", str(a.path))

    b = store.node(nodes, tmp_path, "b")
    assert sorted(os.listdir(b / "run")) == ["step-200"]
    [item] = trash_ls(b.path)
    assert (item["path"], item["dir"], item["files"]) == ("run/step-100", True, 2), item
    assert str(item["node"]).startswith("a-mnt-")  # the node id, then its cache's id
    assert item["shown"] == f"{b.path}/run/step-100/"
    r = run_cli("trash", "restore", str(b / "run" / "step-100"))
    assert r.stdout.splitlines()[-1].startswith("restored 2 files"), r.stdout
    assert trash_ls(b.path) == []

    wait_until(lambda: sorted(os.listdir(a / "run")) == ["step-100", "step-200"], timeout=10)
    for node in (a, b):
        restored = node / "run" / "step-100" / "model.pt"
        wait_until(restored.exists, timeout=10)
        assert restored.read_bytes() == original
    c = store.node(nodes, tmp_path, "c")  # a fresh node, empty cache
    assert_same(state, torch.load(c / "run" / "step-100" / "model.pt", weights_only=False))
    assert json.loads((c / "run" / "step-100" / "trainer_state.json").read_text()) == {
        "step": 100}
    for node in (c, b, a):
        node.umount()
    r = run_cli("fsck", store.url, "--deep", *store.extra)
    assert "clean" in r.stdout.splitlines()[-1], r.stdout


def test_a_save_by_rename_keeps_the_replaced_checkpoint(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """Saving to a temporary name and renaming it over `last.pt` (as many trainers do)
    puts the replaced version in the trash; `--to` brings it back beside the new one."""
    a = store.node(nodes, tmp_path, "a")
    first, second = training_state(8), {"step": 2, "w": torch.arange(10)}
    torch.save(first, a / "last.pt")
    run_cli("sync", str(a.path))
    torch.save(second, a / "last.pt.tmp")
    os.replace(a / "last.pt.tmp", a / "last.pt")
    run_cli("sync", str(a.path))
    [item] = trash_ls(a.path)
    assert (item["path"], item["dir"]) == ("last.pt", False), item
    run_cli("trash", "restore", str(a / "last.pt"), "--to", str(a / "previous.pt"))
    wait_until(lambda: (a / "previous.pt").exists(), timeout=10)
    assert_same(first, torch.load(a / "previous.pt", weights_only=False))
    assert_same(second, torch.load(a / "last.pt", weights_only=False))


def test_torch_save_over_latest_keeps_the_versions_it_replaces(
        store: MountedStore, nodes: Nodes, tmp_path: Path) -> None:
    """torch.save over run/latest.pt three times: `trash ls` of the mounted run/ lists
    the two replaced versions, numbered newest first, and ends with a restore command
    that works as printed; `restore --version 2 --to` brings back the first save, and a
    fresh mount reads exactly the bytes each save wrote. A version is never restored over
    the file that exists (exit 1)."""
    a = store.node(nodes, tmp_path, "a")
    (a / "run").mkdir()
    latest = a / "run" / "latest.pt"
    saved = []
    for step in range(3):
        torch.save({"step": step, "w": torch.arange(5000) * step}, latest)
        saved.append(latest.read_bytes())
        run_cli("sync", str(a.path))
    assert [(i["path"], i["version"]) for i in trash_ls(a / "run")] == [
        ("run/latest.pt", 1), ("run/latest.pt", 2)]
    r = run_cli("trash", "ls", str(a / "run"))
    hint = r.stdout.splitlines()[-1].split("put one back with: ")[1]
    assert hint == f"ckptfs trash restore {latest}", r.stdout
    r = run_cli("trash", "restore", str(latest), "--version", "1", check=False)
    assert r.returncode == 1 and f"{latest} exists" in r.stdout, r.stdout + r.stderr
    r = run_cli("trash", "restore", str(latest), "--version", "2", "--to",
                str(a / "run" / "first.pt"))
    assert r.stdout.splitlines()[0].startswith(
        f"restored {latest} to {a / 'run' / 'first.pt'}"), r.stdout
    a.umount()
    c = store.node(nodes, tmp_path, "c")  # a fresh node, empty cache
    assert (c / "run" / "first.pt").read_bytes() == saved[0]
    assert (c / "run" / "latest.pt").read_bytes() == saved[2]
    run_cli("trash", "restore", str(c / "run" / "latest.pt"), "--version", "1", "--to",
            str(c / "run" / "second.pt"))
    wait_until(lambda: (c / "run" / "second.pt").exists(), timeout=10)
    assert (c / "run" / "second.pt").read_bytes() == saved[1]


def test_trash_hours_0_deletes_at_once(store: MountedStore, nodes: Nodes,
                                       tmp_path: Path) -> None:
    a = store.node(nodes, tmp_path, "a", "--trash-hours", "0")
    (a / "d").mkdir()
    (a / "d" / "f").write_bytes(b"x" * 1000)
    run_cli("sync", str(a.path))
    shutil.rmtree(a / "d")
    run_cli("sync", str(a.path))
    assert trash_ls(a.path) == []
    r = run_cli("trash", "restore", str(a / "d"), check=False)
    assert r.returncode == 2 and "nothing at d in the trash" in r.stderr, r.stderr


def test_a_negative_trash_time_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    r = run_cli("mount", str(tmp_path), str(tmp_path / "mnt"), "--trash-hours", "-1",
                check=False)
    assert r.returncode != 0 and r.stderr.strip() == (
        "ckptfs: --trash-hours must be 0 (no trash) or more hours, not -1"), r.stderr
