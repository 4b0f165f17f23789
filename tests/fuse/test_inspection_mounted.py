"""Store tools (`ckptfs verify/ls/latest/fsck`) given paths inside a real mount."""

from __future__ import annotations

from pathlib import Path

from crafting import CHUNK, put_file, s3_url
from mounting import Mount, Nodes, run_cli
from support import random_bytes

from ckptfs.store.s3 import S3Store


def test_mounted_paths_and_the_writer_that_died(s3_store: S3Store, tmp_path: Path,
                                                nodes: Nodes) -> None:
    store = s3_store
    m: Mount = nodes.mount(s3_url(store), tmp_path, "writer", "--endpoint-url",
                           store.endpoint, "--chunk-size", "64K")
    (m / "run").mkdir()
    (m / "run" / "step-10").mkdir()
    payload = random_bytes(5 * CHUNK + 7)
    (m / "run" / "step-10" / "model.pt").write_bytes(payload)
    (m / "run" / "step-10" / "meta.json").write_text("{}")
    run_cli("sync", str(m.path), timeout=60)

    r = run_cli("verify", str(m / "run" / "step-10"), check=False, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "complete: 2 files" in r.stdout and str(m / "run" / "step-10") in r.stdout
    r = run_cli("ls", s3_url(store), "--endpoint-url", store.endpoint, timeout=60)
    lines = r.stdout.splitlines()
    model = next(line for line in lines if line.endswith("run/step-10/model.pt"))
    assert str(5 * CHUNK + 7) in model and "writer-mnt" in model and " ok " in model

    # another node saved step-20, published its manifest, and died before uploading
    put_file(store, "run/step-20/model.pt", random_bytes(2 * CHUNK), writer="node-dead", skip=(1,))
    r = run_cli("verify", str(m / "run" / "step-20"), check=False, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "node-dead" in r.stdout and str(m / "run" / "step-20" / "model.pt") in r.stdout
    r = run_cli("latest", str(m / "run"), "--pattern", "step-*", timeout=60)
    assert r.stdout == f"{m / 'run' / 'step-10'}\n"
    r = run_cli("fsck", str(m.path), check=False, timeout=60)
    assert r.returncode == 1 and "node-dead" in r.stdout
    m.umount()
