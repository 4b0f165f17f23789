"""`mount -t fuse.ckptfs` and an /etc/fstab line: mount(8) runs mount.fuse3, which runs
`ckptfs STORE MOUNTPOINT -o OPTIONS` from the system's PATH."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import CKPTFS, Mount, Nodes, is_mounted, run_cli

#: where mount.fuse3 finds `ckptfs`: mount(8) runs helpers with a fixed PATH
SYSTEM_CKPTFS = Path("/usr/local/bin/ckptfs")


@pytest.fixture
def ckptfs_on_system_path() -> Iterator[None]:
    """/usr/local/bin/ckptfs running this checkout, for the test's length, as an operator
    installs it (`ln -s /opt/ckptfs/.venv/bin/ckptfs /usr/local/bin/ckptfs`)."""
    if SYSTEM_CKPTFS.exists() or SYSTEM_CKPTFS.is_symlink():
        pytest.skip(f"{SYSTEM_CKPTFS} exists already; not replaced by a test")
    checkout = Path(__file__).parents[2]
    SYSTEM_CKPTFS.write_text(f"#!/bin/sh\nPYTHONPATH={checkout} exec {sys.executable} -m "
                             f'ckptfs.cli "$@"\n')
    SYSTEM_CKPTFS.chmod(0o755)
    try:
        yield
    finally:
        SYSTEM_CKPTFS.unlink()


def test_mount_t_fuse_ckptfs_and_an_fstab_line(tmp_path: Path, nodes: Nodes,
                                               ckptfs_on_system_path: None) -> None:
    store = tmp_path / "store"
    store.mkdir()
    a = Mount(str(store), tmp_path, "a")
    nodes.append(a)
    r = subprocess.run(["mount", "-t", "fuse.ckptfs", str(store), str(a.path), "-o",
                        f"cache_dir={a.cache},cache_size=1G,node_id=a,_netdev,nofail"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert is_mounted(a.path)
    st = a.status()
    a.pid = int(st["pid"])
    assert (st["cache_dir"], st["cache_limit"]) == (str(a.cache), 1 << 30)
    (a / "model.pt").write_bytes(b"w" * 100_000)
    run_cli("umount", str(a.path))
    assert a.wait_exit() == 0

    b = Mount(str(store), tmp_path, "b")
    nodes.append(b)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# a test fstab\n{store} {b.path} fuse.ckptfs "
                     f"cache_dir={b.cache},noauto,_netdev,metadata_ttl=0.5,uid=4242,"
                     f"file_mode=0640 0 0\n")
    r = subprocess.run(["mount", "--fstab", str(fstab), str(b.path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    b.pid = int(b.status()["pid"])
    assert (b / "model.pt").read_bytes() == b"w" * 100_000
    shown = os.stat(b / "model.pt")  # uid= and file_mode= reach ckptfs through mount(8)
    assert (shown.st_uid, shown.st_gid, stat.S_IMODE(shown.st_mode)) == (
        4242, os.getgid(), 0o640)
    run_cli("umount", str(b.path))
    assert b.wait_exit() == 0


def test_a_bad_mount_option_is_one_line(tmp_path: Path) -> None:
    """The helper form refuses an unknown option with one line and exit 2; nothing is
    mounted."""
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "mnt").mkdir()
    r = run_cli(str(store), str(tmp_path / "mnt"), "-o", "rw,cache_dirr=/x", check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "unknown mount option -o cache_dirr" in r.stderr
    assert not is_mounted(tmp_path / "mnt")
    assert not os.listdir(tmp_path / "mnt")


def test_foreground_mount_tells_systemd_when_it_is_ready(tmp_path: Path,
                                                         nodes: Nodes) -> None:
    """A Type=notify unit: `ckptfs mount -f` sends READY=1 to $NOTIFY_SOCKET once the
    mount is up (not before), and `ckptfs umount` (ExecStop=) ends the process with 0."""
    store = tmp_path / "store"
    store.mkdir()
    m = Mount(str(store), tmp_path, "a")
    nodes.append(m)
    m.path.mkdir(parents=True, exist_ok=True)
    where = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(where))
        listener.settimeout(120)
        env = {**os.environ, "NOTIFY_SOCKET": str(where)}
        proc = subprocess.Popen([*CKPTFS, "mount", str(store), str(m.path), "-f",
                                 "--cache-dir", str(m.cache)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m.pid = proc.pid
        message = listener.recv(4096).decode()
    assert message.split("\n")[0] == "READY=1", message
    assert is_mounted(m.path)
    (m / "model.pt").write_bytes(b"w" * 100_000)
    run_cli("umount", str(m.path))
    assert proc.wait(timeout=120) == 0
    assert not is_mounted(m.path)
