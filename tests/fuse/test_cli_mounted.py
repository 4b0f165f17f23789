"""The command line around a real mount: status and sync given a path inside it, umount
of such a path refused with the command that works, status into a closed pipe, and the
hints of a mount of a path below a store (never a path in the store's own layout)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mounting import CKPTFS, Mount, Nodes, is_mounted, run_cli

pytestmark = pytest.mark.fuse


def one_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr[len("ckptfs: "):].rstrip("\n")


def test_status_and_sync_of_a_path_inside_a_mount(tmp_path: Path, nodes: Nodes) -> None:
    store = tmp_path / "store"
    store.mkdir()
    m = nodes.mount(str(store), tmp_path, "a")
    (m / "run" / "step-1").mkdir(parents=True)
    (m / "run" / "step-1" / "w.pt").write_bytes(b"weights")
    inside = str(m / "run" / "step-1")
    r = run_cli("status", inside, check=False, timeout=60)
    whole = run_cli("status", str(m.path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == whole.stdout.splitlines()[:2]  # store, mountpoint
    r = run_cli("sync", inside, check=False, timeout=60)
    assert r.returncode == 0 and r.stdout == f"durable: everything closed under {inside} is " \
                                             f"in the store\n", r.stderr
    line = one_line(run_cli("umount", inside, check=False, timeout=60), 1)
    assert line == f"{inside} is a path inside the ckptfs mount {m.path}: ckptfs umount {m.path}"
    assert is_mounted(m.path)

    read_end, write_end = os.pipe()
    os.close(read_end)  # `ckptfs status MNT | head -4`, the reader gone before the answer
    try:
        p = subprocess.run([*CKPTFS, "status", str(m.path)], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (p.returncode, p.stderr) == (141, "")


def test_a_mount_below_a_store_says_what_to_mount(tmp_path: Path, nodes: Nodes) -> None:
    store = tmp_path / "s1"
    store.mkdir()
    nodes.mount(str(store), tmp_path, "a").umount()  # a store, with its files/ and chunks/
    for arg, hint in (
        (f"{store}/run2", f"{store} is a ckptfs store; mount it and use the path run2 "
                          f"inside it"),  # not there: the directory does not exist
        (f"{store}/files", f"{store}/files lies in files/ of the ckptfs store {store}, "
                           f"where it keeps the manifests of its files; mount the store"),
        (f"{store}/chunks", f"{store}/chunks lies in chunks/ of the ckptfs store {store}, "
                            f"where it keeps the chunks; mount the store"),
    ):
        m = Mount(arg, tmp_path, "b")
        nodes.append(m)
        r = run_cli("mount", arg, str(m.path), "--cache-dir", str(m.cache), check=False,
                    timeout=60)
        line = one_line(r, 1)
        assert hint in line and line.endswith(f"ckptfs mount {store} {m.path}"), line
        assert "use the path files" not in line and "use the path chunks" not in line
        assert not is_mounted(m.path)
        nodes.remove(m)
    assert sorted(os.listdir(store / "files")) == ["%o"]  # nothing written into the store
