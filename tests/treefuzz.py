"""A fuzz of a directory store's tree: what another writer of the store directory can leave
in it (symbolic links, FIFOs, devices, sockets, directories where files belong, files where
directories belong, huge sparse files where records belong), planted at random, seeded; and
the store tools run over it in one process with a memory limit, each with what it printed."""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from crafting import CHUNK, new_store, put_file
from support import random_bytes

from ckptfs.format import manifests
from ckptfs.format.manifests import RenameIntent
from ckptfs.store.local import LocalStore
from ckptfs.tools import trash

#: what stands in for a file or a directory of the store
KINDS = ["zero", "secret", "dangling", "fifo", "device", "directory", "huge", "outside"]
#: bytes that must never be printed or published: the content of a root-only file
SECRET = b"root-only secret bytes 3f1c"
#: the address space a store tool may take (the tools take a few hundred MiB; reading a
#: link to /dev/zero or a 4 GiB file whole would not fit)
MEMORY_LIMIT = 3 << 30


def crafted_store(root: Path) -> LocalStore:
    """A directory store as writers leave it: run/step-1..3 (step-3 complete), a file at
    the top, a trash batch, a rename intent and a fossil."""
    root.mkdir(parents=True)
    store = LocalStore(root)
    new_store(store)
    for n in (1, 2, 3):  # the same bytes, and so the same chunk names, every time
        put_file(store, f"run/step-{n}/model.pt", random_bytes(3 * CHUNK + 100, seed=n))
        put_file(store, f"run/step-{n}/config.json", b'{"lr": 0.1}')
    put_file(store, "notes.txt", b"notes")
    store.put(manifests.dir_key("run"), manifests.DirMarker().to_json())
    put_file(store, "old/model.pt", b"old weights")
    trash.keep_all(store, [manifests.file_key("old/model.pt")],
                   trash.batch_id(3600.0, 0, "node-a", when=1_700_000_000))
    store.delete(manifests.file_key("old/model.pt"))
    store.put("intents/node-a-7.json",
              RenameIntent("tmp/a", "tmp/b", "node-a").to_json())
    name = next(k for k, _ in store.list(manifests.CHUNKS, None).objects).rpartition("/")[2]
    store.put(manifests.fossil_key(name), store.get(manifests.chunk_key(name)))
    return store


def outside_tree(base: Path) -> Path:
    """A root-only file and a directory of object-looking files outside any store."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "secret").write_bytes(SECRET)
    os.chmod(base / "secret", 0o600)
    (base / "dir").mkdir(exist_ok=True)
    (base / "dir" / "x%o").write_bytes(SECRET)
    (base / "dir" / "model.pt%o").write_bytes(SECRET)
    return base


def place(path: Path, kind: str, outside: Path) -> None:
    """Make `path` (removed first, whatever it was) a `kind` from KINDS."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "zero":
        os.symlink("/dev/zero", path)
    elif kind == "secret":
        os.symlink(outside / "secret", path)
    elif kind == "dangling":
        os.symlink(outside / "nothing-here", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() == 0:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        else:
            os.symlink("/dev/null", path)
    elif kind == "directory":
        path.mkdir()
        (path / "inner%o").write_bytes(b"{}")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(4 << 30)  # sparse: 4 GiB that take no disk
    elif kind == "outside":
        os.symlink(outside / "dir", path)
    else:
        raise AssertionError(kind)


def fuzz(store: LocalStore, outside: Path, seed: int, count: int = 8,
         keep_info: bool = False) -> list[str]:
    """Replace `count` files and directories of the store (or add entries beside them)
    with random KINDS; what was done, one line each. `keep_info`: ckptfs.json stays."""
    rng = random.Random(seed)
    done = []
    for _ in range(count):
        entries = sorted(Path(d) / n for d, dirs, files in os.walk(store.root)
                         for n in dirs + files)  # never below a planted link
        target = rng.choice([p for p in entries
                             if not (keep_info and p.name == "ckptfs.json%o")])
        if rng.random() < 0.3:  # a new entry beside it
            parent = target.parent if not target.is_dir() or target.is_symlink() else target
            suffix = rng.choice(["%o", ""])
            target = parent / f"planted-{rng.randrange(1000)}{suffix}"
        kind = rng.choice(KINDS)
        place(target, kind, outside)
        done.append(f"{target.relative_to(store.root)}: {kind}")
    return done


#: the tools that only read, as `ckptfs ARGS` (STORE is put after the command)
READ_TOOLS = [["ls"], ["du"], ["fsck"], ["verify"], ["latest", "run", "--pattern", "step-*"],
              ["prune", "run", "--keep-last", "1", "--pattern", "step-*", "--dry-run"],
              ["gc", "--dry-run", "--grace", "0", "--no-writers"], ["trash", "ls"]]

_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    from ckptfs.cli.main import main
    for argv in json.loads(sys.argv[1]):
        print(json.dumps({"start": argv}), flush=True)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except BaseException as e:
                code = repr(e)
        print(json.dumps({"argv": argv, "code": code, "stdout": out.getvalue(),
                          "stderr": err.getvalue()}), flush=True)
""")


def limit_memory() -> None:
    """In the child: at most MEMORY_LIMIT bytes of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_tools(store: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Every READ_TOOLS command on `store`, one after the other in one Python process (a
    memory limit of MEMORY_LIMIT, `timeout` for them all): for each, its argv, exit code
    (or the repr of what it raised), stdout and stderr. AssertionError naming the command
    that still ran at the timeout."""
    argvs = [[tool[0], *(["ls"] if tool[0] == "trash" else []), store,
              *tool[1 + (tool[0] == "trash"):]] for tool in READ_TOOLS]
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    try:
        r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)], env=env,
                           capture_output=True, text=True, timeout=timeout,
                           preexec_fn=limit_memory)
    except subprocess.TimeoutExpired as e:
        started = [json.loads(line)["start"] for line in (e.stdout or b"").decode().splitlines()
                   if line.startswith('{"start"')]
        raise AssertionError(f"still running after {timeout}s: ckptfs "
                             f"{' '.join(started[-1]) if started else '?'}") from None
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"argv"')]


def check_answers(results: list[dict[str, Any]], planted: list[str]) -> None:
    """Each tool answered (exit 0, 1 or 2, nothing raised), with no traceback, never the
    secret's bytes, and every line of stderr one line of its own."""
    assert len(results) == len(READ_TOOLS), results
    for r in results:
        where = f"ckptfs {' '.join(r['argv'])} (planted: {planted})"
        assert r["code"] in (0, 1, 2), f"{where}: {r['code']}\n{r['stderr']}"
        out, err = str(r["stdout"]), str(r["stderr"])
        for text in (out, err):
            assert "Traceback" not in text and "MemoryError" not in text, f"{where}: {text}"
            assert SECRET.decode() not in text, f"{where}: {text}"
        for line in err.splitlines():
            assert line.strip() and not line.startswith(" "), f"{where}: {err}"
