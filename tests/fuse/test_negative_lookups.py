"""What another node closed is seen at once: a node never answers "no such name" from its
own past (close-to-open for names; docs/SEMANTICS.md, "Consistency across mounts").

Each check is the very next call after the other node's call returned: no polling, no
sleep. Two real mounts of one store, on the directory store and on SeaweedFS.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from mounting import MountedStore, Nodes, run_cli


def test_files_closed_on_another_node_in_a_directory_made_here_are_seen_at_once(
        store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    """The Orbax and torch.distributed.checkpoint pattern: A makes the step directory and
    writes its own file; B writes its file there and closes it; then (after a barrier)
    A lists the directory and stats B's file. 50 steps, no miss."""
    a, b = store.node(nodes, tmp_path, "a"), store.node(nodes, tmp_path, "b")
    for step in range(50):
        d = f"step-{step}"
        (a / d).mkdir()
        (a / d / "process_0").write_bytes(b"a" * step)
        assert os.listdir(a / d) == ["process_0"]  # A has listed it before B's close
        (b / d / "process_1").write_bytes(b"b" * (step + 1))  # B finds A's new directory
        assert sorted(os.listdir(a / d)) == ["process_0", "process_1"], step
        assert (a / d / "process_1").stat().st_size == step + 1
        assert (a / d / "process_1").read_bytes() == b"b" * (step + 1)
    # latest and prune, through A's mount right after B's close (and sync): they read the
    # store itself, and A's next listing shows what prune left
    (b / "step-50").mkdir()
    (b / "step-50" / "process_1").write_bytes(b"new")
    run_cli("sync", str(b.path))
    latest = run_cli("latest", str(a.path), "--pattern", "step-*").stdout.strip()
    assert latest.endswith("step-50"), latest
    run_cli("prune", str(a.path), "--keep-last", "1", "--pattern", "step-*")
    assert os.listdir(a.path) == ["step-50"]


def test_names_made_and_removed_elsewhere_are_seen_by_the_next_call(
        store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    a, b = store.node(nodes, tmp_path, "a"), store.node(nodes, tmp_path, "b")
    (a / "run").mkdir()
    assert os.listdir(a / "run") == []
    with pytest.raises(FileNotFoundError):
        (a / "run" / "latest").stat()  # a negative answer A has just given
    (b / "run" / "latest").write_text("100")
    assert (a / "run" / "latest").read_text() == "100"  # not from A's past
    # a directory made elsewhere, and a file in it, at once
    tmp = b / "run" / "5.orbax-checkpoint-tmp"
    (tmp / "default" / "ocdbt.process_0" / "d").mkdir(parents=True)
    (tmp / "default" / "ocdbt.process_0" / "d" / "ab12").write_bytes(b"m")
    assert sorted(os.listdir(a / "run")) == ["5.orbax-checkpoint-tmp", "latest"]
    assert (a / "run" / tmp.name / "default" / "ocdbt.process_0" / "d" / "ab12"
            ).read_bytes() == b"m"
    # a rename elsewhere of a directory tree A has listed: the next listing has the new
    # name only (on SeaweedFS, no emptied directory is left listed under the old one),
    # and the new name resolves at once
    tmp.rename(b / "run" / "5")
    assert sorted(os.listdir(a / "run")) == ["5", "latest"]
    assert (a / "run" / "5" / "default" / "ocdbt.process_0" / "d" / "ab12"
            ).read_bytes() == b"m"
    # an unlink elsewhere (journaled, not waited for: in the store once B's sync
    # returns) is gone from A's next listing
    (b / "run" / "latest").unlink()
    run_cli("sync", str(b.path))
    assert os.listdir(a / "run") == ["5"]
    # O_CREAT without O_EXCL of a name another node closed opens that file: it is not
    # replaced by an empty one
    (b / "run" / "counter").write_text("7")
    with open(a / "run" / "counter", "a") as f:
        f.write("8")
    assert (a / "run" / "counter").read_text() == "78"  # appended to the one B closed
    # O_EXCL sees it too
    (b / "run" / "lock").write_text("b")
    with pytest.raises(FileExistsError):
        os.close(os.open(a / "run" / "lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    with pytest.raises(OSError) as e:
        (a / "run" / "5").mkdir()
    assert e.value.errno == errno.EEXIST
    # an rm -rf elsewhere leaves nothing listed (nor an emptied directory on SeaweedFS)
    shutil.rmtree(b / "run")
    run_cli("sync", str(b.path))
    assert os.listdir(a.path) == []
