"""The launcher recipes of docs/OPERATIONS.md, run as a launcher runs them: SLURM's
prolog (mount once per node), the job, and the epilog (unmount, failing when the
checkpoints are not in the store); torchrun through scripts/launch/torchrun.sh."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from faultproxy import FaultProxy, chunk_put
from mounting import Mount, Nodes, is_mounted, run_cli
from seaweed import SeaweedServer

SLURM = Path(__file__).parents[2] / "scripts" / "slurm"


def slurm_env(store: str, m: Mount, **more: str) -> dict[str, str]:
    """What /etc/default/ckptfs would set for the prolog and epilog of node `m`."""
    return {**os.environ, "CKPTFS": f"{sys.executable} -m ckptfs.cli", "CKPTFS_STORE": store,
            "CKPTFS_MOUNTPOINT": str(m.path), "CKPTFS_CACHE_DIR": str(m.cache),
            "CKPTFS_NODE_ID": m.path.name, **more}


def play(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SLURM / script)], env=env, capture_output=True,
                          text=True, timeout=300)


def test_slurm_prolog_job_epilog(tmp_path: Path, nodes: Nodes) -> None:
    """The prolog mounts with the options of its environment (twice: the second job on
    the node finds it mounted); the job saves; the epilog exits 0 once the checkpoint
    is in the store, and unmounts."""
    store = str(tmp_path / "store")
    os.mkdir(store)
    m = Mount(store, tmp_path, "node1")
    nodes.append(m)
    env = slurm_env(store, m, CKPTFS_CACHE_SIZE="1G")
    for _ in range(2):
        r = play("prolog.sh", env)
        assert r.returncode == 0, r.stderr
    assert is_mounted(m.path)
    status = m.status()
    m.pid = int(status["pid"])
    assert status["cache_dir"] == str(m.cache) and status["cache_limit"] == 1 << 30
    data = os.urandom(3 << 20)
    (m / "step-1").mkdir()
    (m / "step-1" / "model.pt").write_bytes(data)
    r = play("epilog.sh", env)
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.path)
    assert m.wait_exit() == 0
    listed = run_cli("ls", store, "step-1").stdout
    assert "model.pt" in listed and str(len(data)) in listed


def test_slurm_epilog_fails_when_the_checkpoint_is_not_durable(
        tmp_path: Path, nodes: Nodes, seaweed: SeaweedServer, proxy: FaultProxy) -> None:
    """The store refuses every chunk upload: the epilog gives up after its timeout,
    exits 1 (SLURM drains the node) and says what is not in the store."""
    store = f"s3://{seaweed.new_bucket()}/run"
    m = Mount(store, tmp_path, "node1")
    nodes.append(m)
    env = slurm_env(store, m, CKPTFS_ENDPOINT_URL=proxy.endpoint, CKPTFS_UMOUNT_TIMEOUT="3")
    r = play("prolog.sh", env)
    assert r.returncode == 0, r.stderr
    m.pid = int(m.status()["pid"])
    proxy.refuse(503, b"SlowDown", chunk_put)
    (m / "model.pt").write_bytes(os.urandom(1 << 20))
    r = play("epilog.sh", env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "not all in the store" in r.stderr and "not durable" in r.stderr


TRAIN = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(7 + rank)
    state = {f"rank{rank}.w": torch.randn(512, 1024), "step": torch.tensor(100)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(sys.argv[1]))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_launch_script(tmp_path: Path, nodes: Nodes) -> None:
    """scripts/launch/torchrun.sh mounts, runs torchrun (2 ranks, gloo on the CPU), which
    saves a torch.distributed.checkpoint into the mount, and syncs: it exits 0 only
    once the checkpoint is in the store, where another node reads it whole."""
    store = tmp_path / "store"
    store.mkdir()
    m = Mount(str(store), tmp_path, "node1")
    nodes.append(m)
    (tmp_path / "train.py").write_text(TRAIN)
    env = slurm_env(str(store), m, TORCHRUN=f"{sys.executable} -m torch.distributed.run")
    r = subprocess.run(["sh", str(SLURM.parent / "launch" / "torchrun.sh"),
                        "--nproc-per-node", "2", "--master-port", str(free_port()),
                        str(tmp_path / "train.py"), str(m / "run" / "step-100")],
                       env=env, capture_output=True, text=True, timeout=300)
    m.pid = int(m.status()["pid"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert m.status()["durable"]
    b = nodes.mount(str(store), tmp_path, "node2")
    names = sorted(p.name for p in (b / "run" / "step-100").iterdir())
    assert ".metadata" in names and sum(n.endswith(".distcp") for n in names) == 2
    assert run_cli("verify", str(store), "run/step-100").returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
