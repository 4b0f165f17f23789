"""The Python API (ckptfs.state, wait_durable, latest_complete) called from a training
process of its own, against real mounts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from faultproxy import FaultProxy, chunk_put, never
from mounting import MountedStore, Nodes, training
from seaweed import SeaweedServer


def state_of(path: Path) -> str:
    return str(training(f"print(json.dumps(ckptfs.state({str(path)!r})))"))


def test_state_through_a_write(store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    """open while written, pending or durable once closed, durable after a sync. The file
    is written by a process of its own: a process that starts another while it holds the
    file open closes a copy of the descriptor (FUSE flush), which publishes the file."""
    m = nodes.mount(store.url, tmp_path, "a", *store.extra)
    f = m / "model.pt"
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys\nwith open({str(f)!r}, 'wb') as out:\n"
         f"    out.write(os.urandom(3 << 20)); out.flush(); print('written', flush=True)\n"
         f"    sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "written\n"
        assert state_of(f) == "open"
    finally:
        writer.communicate("", timeout=60)  # closes the file
    assert writer.returncode == 0
    assert state_of(f) in ("pending", "durable")
    m.sync()
    assert state_of(f) == "durable"


def test_wait_durable_on_a_file_a_directory_and_the_mount(
        store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    m = nodes.mount(store.url, tmp_path, "a", *store.extra)
    (m / "step-1" / "shards").mkdir(parents=True)
    (m / "step-1" / "model.pt").write_bytes(os.urandom(2 << 20))
    (m / "step-1" / "shards" / "rank0.pt").write_bytes(os.urandom(1 << 20))
    (m / "step-2").mkdir()
    (m / "step-2" / "model.pt").write_bytes(os.urandom(2 << 20))
    files = [m / "step-1" / "model.pt", m / "step-1" / "shards" / "rank0.pt",
             m / "step-2" / "model.pt"]
    states = training(f"""
ckptfs.wait_durable({str(files[2])!r}, timeout=60)
first = ckptfs.state({str(files[2])!r})
ckptfs.wait_durable({str(m / "step-1")!r}, timeout=60)
ckptfs.wait_durable({str(m.path)!r}, timeout=60)
print(json.dumps([first] + [ckptfs.state(f) for f in {[str(f) for f in files]!r}]))
""")
    assert states == ["durable"] * 4
    assert m.status()["durable"] is True
    assert store.count_chunks() > 0


def test_wait_durable_times_out_naming_the_files(
        tmp_path: Path, nodes: Nodes, seaweed: SeaweedServer, proxy: FaultProxy) -> None:
    """The store refuses every chunk upload: wait_durable gives up at its timeout with a
    NotDurableError (a TimeoutError) naming the file and its state, for the directory and
    for the whole mount; once the store answers again it returns."""
    m = nodes.mount(f"s3://{seaweed.new_bucket()}/run", tmp_path, "a",
                    "--endpoint-url", proxy.endpoint)
    proxy.refuse(503, b"SlowDown", chunk_put)
    (m / "step-1").mkdir()
    f = m / "step-1" / "model.pt"
    f.write_bytes(os.urandom(1 << 20))
    out = training(f"""
found = []
for where in ({str(m / "step-1")!r}, {str(m.path)!r}):
    try:
        ckptfs.wait_durable(where, timeout=2)
    except ckptfs.NotDurableError as e:
        assert isinstance(e, TimeoutError)
        found.append([str(e), e.files])
print(json.dumps(found))
""")
    assert len(out) == 2, out
    for message, files in out:
        assert "\n" not in message and "not durable after 2s" in message, message
        assert f"{f} (pending)" in message, message
        assert files == {str(f): "pending"}
    assert "SlowDown" in out[0][0] or "503" in out[0][0], out[0][0]
    proxy.refuse(503, b"", never)
    assert training(f"ckptfs.wait_durable({str(f)!r}, timeout=120)\n"
                    f"print(json.dumps(ckptfs.state({str(f)!r})))") == "durable"


def test_not_on_a_mount(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"x")
    out = training(f"""
caught = []
for call in (lambda: ckptfs.state({str(tmp_path / "model.pt")!r}),
             lambda: ckptfs.wait_durable({str(tmp_path)!r}, timeout=1),
             lambda: ckptfs.latest_complete({str(tmp_path)!r})):
    try:
        call()
    except ckptfs.NotCkptfsError as e:
        caught.append(str(e))
print(json.dumps(caught))
""")
    assert out == [f"not on a ckptfs mount: {tmp_path / 'model.pt'}",
                   f"not on a ckptfs mount: {tmp_path}", f"not on a ckptfs mount: {tmp_path}"]


def test_latest_complete(store: MountedStore, tmp_path: Path, nodes: Nodes) -> None:
    m = nodes.mount(store.url, tmp_path, "a", *store.extra)
    run = m / "run7"
    for step in (99, 100):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "model.pt").write_bytes(os.urandom(1 << 20))
    (run / "checkpoint-101").mkdir()  # no files: not a complete checkpoint
    (run / "logs").mkdir()
    (run / "logs" / "train.log").write_text("step 100\n")
    m.sync()
    out = training(f"""
print(json.dumps([ckptfs.latest_complete({str(run)!r}, "checkpoint-*"),
                  ckptfs.latest_complete({str(run)!r}, "epoch-*"),
                  ckptfs.latest_complete({str(m.path)!r})]))
""")
    assert out == [str(run / "checkpoint-100"), None, str(m / "run7")]
