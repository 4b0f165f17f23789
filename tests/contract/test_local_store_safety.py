"""The directory store in a tree that others can write: nothing below its root is followed,
nothing but a regular file is read (a FIFO never blocks), no record is read past its cap,
and every file and directory it makes has the store's mode, whatever the umask."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from crafting import new_store
from mounting import run_cli

from ckptfs.common.config import LIMITS, STORE_MODES, dir_mode
from ckptfs.common.errors import BadObjectError, FormatError, NotFoundError
from ckptfs.store import LocalStore
from ckptfs.tools import inspection

SECRET = b"root-only bytes"


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set this process's umask for the test; the old one comes back after."""
    old = os.umask(0o022)

    def set_umask(mask: int) -> None:
        os.umask(mask)

    yield set_umask
    os.umask(old)


def modes_under(root: Path) -> dict[str, int]:
    """The permission bits of everything below `root`, by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o000])
@pytest.mark.parametrize("mode", [*STORE_MODES, None])
def test_every_file_and_directory_gets_the_store_mode(
        local_store: LocalStore, umask: Callable[[int], None], mode: int | None,
        mask: int) -> None:
    """Puts, exclusive puts, copies, renames and long (mapped) names all write their
    files with the store's mode and their directories with dir_mode of it, exactly,
    whatever the umask; a store that records no mode (None) writes 0644 and 0777 less
    the umask, as every store did before."""
    umask(mask)
    local_store.set_file_mode(mode)
    long = "n" * 300  # a mapped segment: its name file is written too
    local_store.put("chunks/ab/c1", b"chunk")
    assert local_store.put_if_absent("files/run/x", b"{}")
    local_store.copy("files/run/x", "trash/b/run/x")
    local_store.rename("chunks/ab/c1", "fossils/ab/c1")
    local_store.put(f"files/{long}/y", b"{}")
    found = modes_under(local_store.root)
    files = {p: m for p, m in found.items() if (local_store.root / p).is_file()}
    dirs = {p: m for p, m in found.items() if p not in files}
    assert len(files) == 5 and len(dirs) == 8, found  # chunks/ went with the rename
    want_file = 0o644 & ~mask if mode is None else mode
    want_dir = 0o777 & ~mask if mode is None else dir_mode(mode)
    assert set(files.values()) == {want_file}, files
    assert set(dirs.values()) == {want_dir}, dirs


def test_new_directories_keep_the_setgid_of_a_group_store(
        local_store: LocalStore, umask: Callable[[int], None]) -> None:
    """A group-shared store's root is setgid (new files take its group): the directories
    the store makes keep the bit they inherit, with the mode made exact."""
    umask(0o022)
    os.chmod(local_store.root, 0o2770)
    local_store.set_file_mode(0o660)
    local_store.put("files/a/b", b"{}")
    for d in ("files", "files/a"):
        assert stat.S_IMODE((local_store.root / d).stat().st_mode) == 0o2770, d
    assert stat.S_IMODE((local_store.root / "files/a/b%o").stat().st_mode) == 0o660


def plant(root: Path, rel: str, kind: str, outside: Path) -> None:
    """Put something ckptfs never writes at `rel` below the store's `root`."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        os.symlink(outside / "secret", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        import socket

        cwd = os.getcwd()
        os.chdir(path.parent)  # a socket's path has at most 107 bytes
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(cwd)
    else:
        raise AssertionError(kind)


def within(seconds: float, fn: Callable[[], object]) -> object:
    """fn() in a thread: its result or exception, or AssertionError if it still runs
    after `seconds` (a read that blocks on a FIFO)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still blocked after {seconds}s"
    return out[0]


KINDS = ["symlink", "fifo", "directory", "socket"] + (["device"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_that_is_not_a_regular_file_is_never_read(
        local_store: LocalStore, tmp_path: Path, kind: str) -> None:
    """A symbolic link (to a root-only file), FIFO, device, socket or directory where an
    object belongs: get, get_range, copy and rename refuse it at once with one line that
    names the key, the file and what it is (BadObjectError: a damaged record to record
    readers, permanent to the rest); head and stat say there is no object; listings skip
    it; a delete removes the entry itself, never what a link points to."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    os.chmod(outside / "secret", 0o600)
    local_store.put("files/run/ok", b"{}")
    plant(local_store.root, "files/run/bad%o", kind, outside)
    key = "files/run/bad"
    for op, call in [("get", lambda: local_store.get(key)),
                     ("get", lambda: local_store.get_record(key)),
                     ("get_range", lambda: local_store.get_range(key, 0, 100)),
                     ("copy", lambda: local_store.copy(key, "trash/1/run/bad")),
                     ("rename", lambda: local_store.rename(key, "files/run/moved"))]:
        e = within(5, call)
        assert isinstance(e, BadObjectError) and isinstance(e, FormatError), (op, e)
        assert e.permanent and "\n" not in str(e), e
        assert str(e).startswith(f"{op} {key} in {local_store.url}: files/run/bad%o is a"), e
    assert local_store.head(key) is None and local_store.stat(key) is None
    assert local_store.list("files/run/").objects == [("files/run/ok", 2)]
    assert [i.key for i in local_store.scan("")] == ["files/run/ok"]
    assert not (local_store.root / "trash").exists()
    assert not (local_store.root / "files/run/moved%o").exists()
    if kind != "directory":
        local_store.delete(key)
        assert not os.path.lexists(local_store.root / "files/run/bad%o")
    assert (outside / "secret").read_bytes() == SECRET


def test_a_directory_on_the_way_is_never_followed(local_store: LocalStore,
                                                  tmp_path: Path) -> None:
    """A directory of the store replaced by a symbolic link to another directory: no
    read, write, rename or delete goes through it (BadObjectError naming it, or no
    object), and listings skip it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x%o").write_bytes(SECRET)
    local_store.put("files/ok", b"{}")
    os.symlink(outside, local_store.root / "files" / "run")
    os.symlink(outside, local_store.root / "chunks")
    calls: list[Callable[[], object]] = [
        lambda: local_store.get("files/run/x"),
        lambda: local_store.put("files/run/y", b"{}"),
        lambda: local_store.copy("files/ok", "files/run/z"),
        lambda: local_store.rename("files/ok", "chunks/ab/c")]
    for call in calls:
        with pytest.raises(BadObjectError, match="is a symbolic link, where ckptfs keeps a "
                                                 "directory"):
            call()
    assert local_store.head("files/run/x") is None
    local_store.delete("files/run/x")
    assert local_store.list("files/", None).objects == [("files/ok", 2)]
    assert local_store.list("files/run/", None).objects == []
    assert [i.key for i in local_store.scan("")] == ["files/ok"]
    assert sorted(os.listdir(outside)) == ["x%o"]
    assert (outside / "x%o").read_bytes() == SECRET


def test_a_record_larger_than_its_cap_is_refused_unread(local_store: LocalStore) -> None:
    """A 4 GiB (sparse) file where a record belongs: get_record refuses it by its size,
    at once, with one line naming the key and both sizes; ranged reads still work."""
    local_store.put("files/big", b"")
    with open(local_store.root / "files" / "big%o", "r+b") as f:
        f.truncate(4 << 30)
    e = within(5, lambda: local_store.get_record("files/big"))
    assert isinstance(e, BadObjectError) and isinstance(e, FormatError), e
    assert str(e) == (f"get files/big in {local_store.url}: 4294967296 bytes, more than the "
                      f"{LIMITS.record_bytes >> 20} MiB it may have; not read")
    assert local_store.get_range("files/big", 0, 4) == b"\0" * 4
    local_store.put("files/small", b"x" * 100)
    assert local_store.get("files/small", 100) == b"x" * 100
    with pytest.raises(BadObjectError, match="100 bytes, more than the 99 bytes"):
        local_store.get("files/small", 99)
    with pytest.raises(NotFoundError):
        local_store.get_record("files/absent")


def test_upgrade_gives_an_older_store_the_mode_of_its_files(
        local_store: LocalStore, umask: Callable[[int], None]) -> None:
    """A store made before ckptfs recorded a mode writes 0644 files (less the umask) until
    `ckptfs upgrade STORE --store-mode 0600 --yes` records one; from then on every tool
    that opens the store writes 0600 files and 0700 directories. A mode that is not one
    a store may have is refused on one line, and ckptfs.json is left as it was."""
    umask(0o022)
    new_store(local_store)
    info_file = local_store.root / "ckptfs.json%o"
    before = info_file.read_bytes()
    assert inspection.read_info(local_store).store_mode is None
    local_store.put("files/a", b"{}")
    assert stat.S_IMODE((local_store.root / "files/a%o").stat().st_mode) == 0o644

    url = str(local_store.root)
    r = run_cli("upgrade", url, "--store-mode", "0777", check=False)
    assert (r.returncode, r.stdout) == (2, "") and r.stderr == (
        "ckptfs: --store-mode '0777' is not a mode a directory store may give its files: "
        "want one of 0600, 0640, 0660, 0644, 0664\n")
    r = run_cli("upgrade", url, "--store-mode", "0600")
    assert "would upgrade" in r.stdout and r.stdout.splitlines()[2].endswith(", files 0600")
    assert info_file.read_bytes() == before
    r = run_cli("upgrade", url, "--store-mode", "0600", "--yes")
    assert r.stdout.startswith(f"upgraded file://{url}\n") and "modes 0600 and 0700" in r.stdout

    reopened = LocalStore(url)
    assert inspection.read_info(reopened).store_mode == 0o600
    reopened.put("files/d/b", b"{}")
    assert stat.S_IMODE((local_store.root / "files/d/b%o").stat().st_mode) == 0o600
    assert stat.S_IMODE((local_store.root / "files/d").stat().st_mode) == 0o700
    assert "is already at the current format 2" in run_cli(
        "upgrade", url, "--store-mode", "600").stdout
