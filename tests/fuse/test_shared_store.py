"""A directory store that another local user can write (a shared scratch disk, an NFS
export), with a real second user made by useradd: what that user plants in the store never
makes root's ckptfs (a mount, prune, ls, fsck) follow a link, publish a file that user may
not read, hang or run out of memory; and what root's mount writes, that user cannot read.
The mount over a fuzzed tree (tests/treefuzz.py) is here too; the store tools over one:
tests/contract/test_store_tree_fuzz.py."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mounting import CKPTFS, Mount, Nodes, run_cli
from treefuzz import SECRET, crafted_store, fuzz, limit_memory, outside_tree

#: the system's interpreter, which any user may run (the standard library is all the
#: other user's scripts need); this one may live in root's home
PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.fixture(scope="module")
def intruder() -> Iterator[pwd.struct_passwd]:
    """A throwaway unprivileged local user (useradd), removed with its home after the
    module's tests (userdel -r); skipped where this cannot be done."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a second local user with useradd")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd and userdel (Debian package passwd)")
    if PYTHON is None:
        pytest.skip("needs a python3 in /usr/bin or /bin for the second user")
    name = f"ckpt{secrets.token_hex(4)}"
    r = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"useradd {name} failed: {r.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True)


def as_user(user: pwd.struct_passwd, code: str, timeout: float = 60) -> Any:
    """Run Python `code` as `user` (no supplementary groups, in /): what it printed last,
    as JSON."""
    assert PYTHON is not None
    r = subprocess.run([PYTHON, "-c", "import json, os\n" + textwrap.dedent(code)],
                       user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
                       env={"PATH": "/usr/bin:/bin", "HOME": user.pw_dir},
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]) if r.stdout.strip() else None


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory everyone can write, as /tmp (mode 1777): the store directory."""
    path = Path(tempfile.mkdtemp(prefix="ckptfs-shared-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may read."""
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return path


def in_mount(mount: Mount, code: str, timeout: float = 30) -> Any:
    """Run Python `code` (file calls on `mount`) in a child process: what it printed last,
    as JSON. If it still runs after `timeout` seconds, the mount's daemon is killed (a
    file call the kernel sent to a daemon that never answers ends only so) and the test
    fails."""
    child = subprocess.Popen([sys.executable, "-c", "import json, os\n" + textwrap.dedent(code)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        assert mount.pid is not None
        os.kill(mount.pid, signal.SIGKILL)
        child.kill()
        child.communicate()
        raise AssertionError(f"a file call through the mount still blocked after {timeout}s "
                             f"(its daemon was killed)") from None
    assert child.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def limited_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`ckptfs ARGS` with a 3 GiB address space and a timeout (AssertionError if it still
    runs then)."""
    try:
        return subprocess.run([*CKPTFS, *args], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit_memory,
                              env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"ckptfs {' '.join(args)} still runs after {timeout}s") from None


def owned_by_root(root: Path) -> dict[str, os.stat_result]:
    """lstat of everything below `root` that root owns."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_uid == 0:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = st
    return out


READ_EVERYTHING = """
    found, read, refused = [], 0, 0
    for dirpath, dirnames, filenames in os.walk({root!r}):
        for name in filenames:
            try:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    data = f.read(1 << 20)
            except OSError:
                refused += 1
                continue
            read += 1
            if {secret!r} in data:
                found.append(os.path.join(dirpath, name))
    print(json.dumps({{"found": found, "read": read, "refused": refused}}))
"""


def test_another_users_link_is_never_copied_and_weights_stay_private(
        intruder: pwd.struct_passwd, shared: Path, secret: Path, tmp_path: Path,
        nodes: Nodes) -> None:
    """The other user makes files/ckpt-1/leak%o a link to a root-only file before root's
    first mount. Root saves ckpt-1..3 through a mount and prunes the two older ones into
    the trash: the link is skipped (one log line), never copied, so no file in the store
    holds the root-only bytes, and the other user reads none of them. Every file root's
    mount and prune wrote is 0600 and every directory 0700 (the store's default mode): the
    other user cannot list the chunks nor read one."""
    as_user(intruder, f"""
        os.makedirs("{shared}/files/ckpt-1")
        os.chmod("{shared}/files", 0o777)
        os.chmod("{shared}/files/ckpt-1", 0o777)
        os.symlink("{secret}", "{shared}/files/ckpt-1/leak%o")
    """)
    a = nodes.mount(str(shared), tmp_path, "a")
    assert in_mount(a, f"""
        for n in (1, 2, 3):
            os.makedirs("{a.path}/ckpt-%d" % n, exist_ok=True)
            with open("{a.path}/ckpt-%d/model.pt" % n, "wb") as f:
                f.write(os.urandom(300_000))
        print(json.dumps(sorted(os.listdir("{a.path}/ckpt-1"))))
    """) == ["model.pt"]
    a.umount()
    assert "files/ckpt-1/leak%o in the store" in a.log()

    r = run_cli("prune", str(shared), "--keep-last", "1", "--pattern", "ckpt-*")
    assert "ckpt-1" in r.stdout and "ckpt-2" in r.stdout
    assert [line for line in r.stderr.splitlines() if "leak%o" in line] == [
        f"files/ckpt-1/leak%o in the store file://{shared} is a symbolic link, which ckptfs "
        f"never writes there: skipped (not followed, not read; remove it)"], r.stderr
    assert any(p.startswith("trash/") for p in owned_by_root(shared))  # pruned to the trash

    written = owned_by_root(shared)
    assert [p for p, st in written.items()
            if stat.S_ISREG(st.st_mode) and SECRET in (shared / p).read_bytes()] == []
    seen = as_user(intruder, READ_EVERYTHING.format(root=str(shared), secret=SECRET))
    assert seen["found"] == [] and seen["read"] == 0 and seen["refused"] > 0, seen
    for path, st in written.items():
        want = 0o600 if stat.S_ISREG(st.st_mode) else 0o700
        assert stat.S_IMODE(st.st_mode) == want, (path, oct(st.st_mode))
    chunk = next(p for p in owned_by_root(shared) if p.startswith("chunks/") and
                 p.endswith("%o"))
    assert as_user(intruder, f"""
        out = []
        for call in (lambda: os.listdir("{shared}/chunks"),
                     lambda: open("{shared}/{chunk}", "rb")):
            try:
                call()
                out.append("allowed")
            except PermissionError:
                out.append("EACCES")
        print(json.dumps(out))
    """) == ["EACCES", "EACCES"]


def test_another_users_fifo_and_link_to_dev_zero_are_one_line_at_once(
        intruder: pwd.struct_passwd, shared: Path, tmp_path: Path, nodes: Nodes) -> None:
    """The other user leaves a FIFO and a link to /dev/zero where manifests belong: the
    mount lists the directory without them at once, and ls, fsck, verify and du answer in
    seconds within 3 GiB of memory, each with one line per skipped entry (the FIFO never
    blocks a reader; /dev/zero is never read)."""
    as_user(intruder, f"""
        os.makedirs("{shared}/files/run")
        os.chmod("{shared}/files", 0o777)
        os.chmod("{shared}/files/run", 0o777)
        os.symlink("/dev/zero", "{shared}/files/run/zero%o")
        os.mkfifo("{shared}/files/run/fifo%o")
    """)
    a = nodes.mount(str(shared), tmp_path, "a")
    run = a / "run"
    assert in_mount(a, f"""
        os.makedirs("{run}", exist_ok=True)  # its files/run holds no object of ckptfs's yet
        with open("{run}/model.pt", "w") as f:
            f.write("weights")
        names = sorted(os.listdir("{run}"))
        missing = [n for n in ("zero", "fifo") if not os.path.exists("{run}/" + n)]
        print(json.dumps([names, missing, open("{run}/model.pt").read()]))
    """) == [["model.pt"], ["zero", "fifo"], "weights"]
    a.umount()
    skipped = {f"files/run/{n}%o in the store file://{shared} is {kind}, which ckptfs never "
               f"writes there: skipped (not followed, not read; remove it)"
               for n, kind in (("zero", "a symbolic link"), ("fifo", "a FIFO"))}
    for tool in ("ls", "fsck", "verify", "du"):
        r = limited_cli(tool, str(shared))
        assert r.returncode == 0, (tool, r.stdout, r.stderr)
        assert set(r.stderr.splitlines()) == skipped, (tool, r.stderr)
        assert "run/zero" not in r.stdout and "run/fifo" not in r.stdout, (tool, r.stdout)


def test_a_mount_answers_a_fuzzed_tree(tmp_path: Path, nodes: Nodes) -> None:
    """A mount of a directory store whose tree was fuzzed (treefuzz: links, FIFOs,
    devices, directories and 4 GiB files where objects belong): every directory lists,
    every entry stats, every file reads or fails with EIO, in seconds; nothing it reads
    holds what a link points to; the daemon stays within 1 GiB and unmounts cleanly."""
    store = crafted_store(tmp_path / "store")
    outside = outside_tree(tmp_path / "outside")
    planted = fuzz(store, outside, seed=2, keep_info=True)
    m: Mount = nodes.mount(str(store.root), tmp_path, "a")
    seen, errors = in_mount(m, f"""
        import errno
        seen, errors = 0, {{}}
        for dirpath, dirnames, filenames in os.walk({str(m.path)!r}):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    os.lstat(path)
                    with open(path, "rb") as f:
                        data = f.read()
                    assert {SECRET!r} not in data, path
                    seen += 1
                except OSError as e:
                    errors[path] = errno.errorcode[e.errno]
        print(json.dumps([seen, errors]))
    """, timeout=60)
    assert seen > 0 and set(errors.values()) <= {"EIO"}, (planted, errors)
    with open(f"/proc/{m.pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    assert peak < 1 << 20, f"the daemon's peak RSS: {peak} KiB (planted: {planted})"
    m.umount()
