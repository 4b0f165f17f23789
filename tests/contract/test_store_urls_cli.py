"""Store URLs as users type them, through the command line on every store: a URL below a
store names a path in it (found by walking up to its ckptfs.json), a URL into the
store's own layout or below it for a whole-store command is refused with the command that
works, the path forms, a malformed endpoint, and output into a closed pipe."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from crafting import StoreUnderTest, checkpoint, snapshot
from mounting import CKPTFS, run_cli

from ckptfs.daemon import locate
from ckptfs.format import manifests
from ckptfs.store.local import LocalStore


def one_line(r: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one line a refusal prints on stderr (nothing on stdout), without 'ckptfs: '."""
    assert r.returncode == code and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("ckptfs: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr[len("ckptfs: "):].rstrip("\n")


def runs(st: StoreUnderTest) -> None:
    for step in (1, 2, 10):
        checkpoint(st.store, f"job/run/step-{step}")


def hinted(line: str, st: StoreUnderTest) -> subprocess.CompletedProcess[str]:
    """Run the command a refusal ends with (after its last ': ckptfs '), which must work."""
    words = shlex.split(line.rpartition(": ckptfs ")[2])
    assert words[-len(st.extra):] == st.extra if st.extra else True  # the options kept
    return run_cli(*words, check=False, timeout=120)


def test_a_url_below_a_store_names_a_path_in_it(st: StoreUnderTest) -> None:
    runs(st)
    below = f"{st.url}/job/run"
    # du, ls, verify, latest and prune: the same as STORE PATH
    for command, more in (("du", []), ("ls", []),
                          ("prune", ["--keep-last", "1", "--dry-run"])):
        r = run_cli(command, below, *more, *st.extra, check=False, timeout=120)
        explicit = st.cli(command, "job/run", *more)
        assert r.returncode == explicit.returncode == 0, r.stderr + explicit.stderr
        assert r.stdout == explicit.stdout and "job/run/step-10" in r.stdout, command
    r = run_cli("latest", below, *st.extra, check=False, timeout=120)
    assert (r.returncode, r.stdout) == (0, "job/run/step-10\n"), r.stderr
    r = run_cli("verify", below, *st.extra, check=False, timeout=120)
    assert r.returncode == 0 and "6 files" in r.stdout and "under job/run;" in r.stdout
    r = run_cli("du", f"{below}/step-10", *st.extra, check=False, timeout=120)
    assert r.returncode == 0 and "job/run/step-10 (all)" in r.stdout, r.stderr
    # PATH goes on below the URL's path, or from the store's root with a leading '/'
    r = run_cli("ls", f"{st.url}/job", "run/step-2", *st.extra, check=False, timeout=120)
    assert r.returncode == 0 and "job/run/step-2/model.pt" in r.stdout, r.stderr
    r = run_cli("ls", below, "/job/run/step-1", *st.extra, check=False, timeout=120)
    assert r.returncode == 0 and "job/run/step-1/model.pt" in r.stdout, r.stderr
    assert "step-10" not in r.stdout
    # a path that is not there: what the explicit form says
    r = run_cli("du", f"{st.url}/job/nothing", *st.extra, check=False, timeout=120)
    assert one_line(r) == "no such directory in the store: job/nothing"


def test_a_path_deeper_than_the_bound_is_not_looked_for(st: StoreUnderTest) -> None:
    """Each level up costs a HEAD: MAX_LEVELS of them at most, then a clear refusal."""
    deep = "/".join(f"d{i}" for i in range(locate.MAX_LEVELS + 1))
    checkpoint(st.store, deep)
    r = run_cli("ls", f"{st.url}/{deep}", *st.extra, check=False, timeout=120)
    assert f"up to {locate.MAX_LEVELS} levels above it" in one_line(r)
    r = st.cli("ls", deep)  # the explicit form has no bound
    assert r.returncode == 0 and f"{deep}/model.pt" in r.stdout, r.stderr


def test_whole_store_commands_refuse_a_path_with_the_command_that_works(
        st: StoreUnderTest) -> None:
    runs(st)
    before = snapshot(st.store)
    below = f"{st.url}/job/run"
    for command, more in (("gc", ["--dry-run"]), ("fsck", []), ("upgrade", [])):
        r = run_cli(command, below, *more, *st.extra, check=False, timeout=120)
        line = one_line(r)
        assert line.startswith(f"{command} works on a whole store, and {below} is the path "
                               f"job/run inside the ckptfs store {st.url}"), line
        if command == "fsck":
            assert f"ckptfs verify {st.url} job/run" in line
            line = line.rpartition("; to check only")[0]
        assert line.endswith(shlex.join(["ckptfs", command, st.url, *more, *st.extra])), line
        assert hinted(line, st).returncode == 0
    assert snapshot(st.store) == before


def test_a_url_into_the_stores_layout_is_refused_with_the_path_it_names(
        st: StoreUnderTest) -> None:
    runs(st)
    before = snapshot(st.store)
    for inside in (manifests.FILES, manifests.CHUNKS, manifests.FOSSILS, manifests.TRASH):
        url = f"{st.url}/{inside}job/run"
        r = run_cli("prune", url, "--keep-last", "1", *st.extra, check=False, timeout=120)
        line = one_line(r)
        assert line.startswith(f"{url} is not a path of a filesystem: it lies in {inside} of "
                               f"the ckptfs store {st.url}"), line
        named = ["job/run"] if inside == manifests.FILES else []  # never files/...
        assert line.endswith(shlex.join(["ckptfs", "prune", st.url, *named, "--keep-last",
                                         "1", *st.extra])), line
    line = one_line(run_cli("du", f"{st.url}/files/job/run", *st.extra, check=False,
                            timeout=120))
    r = hinted(line, st)
    assert r.returncode == 0 and "job/run/step-10" in r.stdout, r.stderr
    assert snapshot(st.store) == before


@pytest.mark.parametrize("command", ["du", "prune", "trash ls"])
def test_path_forms_are_the_same_everywhere(st: StoreUnderTest, command: str) -> None:
    runs(st)
    more = ["--keep-last", "5", "--dry-run"] if command == "prune" else []
    words = command.split()
    plain = run_cli(*words, st.url, "job/run", *more, *st.extra, check=False, timeout=120)
    assert plain.returncode == 0, plain.stderr
    for form in ("/job/run", ".//job/run/"):  # from the root; '.' and '' segments dropped
        r = run_cli(*words, st.url, form, *more, *st.extra, check=False, timeout=120)
        assert (r.returncode, r.stdout) == (0, plain.stdout), (form, r.stderr)
    for bad in ("..", "job/../job/run"):
        r = run_cli(*words, st.url, bad, *more, *st.extra, check=False, timeout=120)
        assert one_line(r).startswith(f"'..' in a path in the store: {bad}; "), bad


def refused_endpoint(r: subprocess.CompletedProcess[str], endpoint: str) -> None:
    assert one_line(r) == (f"invalid endpoint {endpoint!r} (--endpoint-url): want "
                           f"http://HOST[:PORT] or https://HOST[:PORT], e.g. "
                           f"http://127.0.0.1:8333"), r.args


def test_a_malformed_endpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for endpoint in ("not a url", "ftp://host", "http://", "http://[bad", "http://h:99999"):
        refused_endpoint(run_cli("ls", "s3://bucket/run", "--endpoint-url", endpoint,
                                 check=False, timeout=60), endpoint)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    endpoint = "localhost:9000"  # no scheme
    for url in ("s3://bucket/run", "az://container/run", "gs://bucket/run"):
        commands = [["du", url], ["mount", url, str(mnt), "--cache-dir",
                                  str(tmp_path / "cache")]]
        if url.startswith("s3:"):
            commands += [["gc", url], ["prune", url, "--keep-last", "1"],
                         ["trash", "ls", url], ["upgrade", url], ["fsck", url], ["ls", url],
                         ["verify", url], ["latest", url]]
        for args in commands:
            refused_endpoint(run_cli(*args, "--endpoint-url", endpoint, check=False,
                                     timeout=60), endpoint)
    assert os.listdir(mnt) == []
    env = {**os.environ, "AWS_ENDPOINT_URL": "localhost:9000"}
    r = run_cli("ls", "s3://bucket/run", check=False, timeout=60, env=env)
    assert "($AWS_ENDPOINT_URL)" in one_line(r)


def test_a_closed_output_pipe_ends_quietly(tmp_path: Path) -> None:
    """`ckptfs ls STORE | head -1`, and any command whose reader has gone: no traceback,
    exit 141 as a shell reports a coreutils command killed by SIGPIPE."""
    store = LocalStore(tmp_path / "store", fsync=False)  # 4,000 records made for the test
    (tmp_path / "store").mkdir()
    from crafting import new_store, put_file

    new_store(store)
    for i in range(2000):  # more than a pipe holds
        put_file(store, f"run/checkpoint-{i}/config.json", b"{}")
    shell = (f"{shlex.join(CKPTFS)} ls {shlex.quote(str(store.root))} | head -1; "
             f"echo status=${{PIPESTATUS[0]}} >&2")
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.stdout.count("\n") == 1 and "checkpoint-" in r.stdout
    assert r.stderr == "status=141\n", r.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        for args in (["--help"], ["gc", "--help"], ["ls", str(store.root)],
                     ["du", str(store.root)], ["trash", "ls", str(store.root)]):
            p = subprocess.run([*CKPTFS, *args], stdout=write_end, stderr=subprocess.PIPE,
                               text=True, timeout=120)
            assert (p.returncode, p.stderr) == (141, ""), (args, p.stderr)
    finally:
        os.close(write_end)


def test_small_refusals_and_orders(tmp_path: Path) -> None:
    """An invalid glob, a grace over 100 years: one line, exit 2; du rows in step order,
    as prune orders them; gc --help names every store kind with an example of each."""
    root = tmp_path / "store"
    root.mkdir()
    from crafting import new_store

    store = new_store(LocalStore(root))
    for step in (10, 2, 1):
        checkpoint(store, f"run/checkpoint-{step}")
    for args in (["prune", str(root), "run", "--keep-last", "1", "--pattern", "["],
                 ["latest", str(root), "run", "--pattern", "ckpt-[0-9"]):
        assert "is not a valid pattern" in one_line(run_cli(*args, check=False))
    line = one_line(run_cli("gc", str(root), "--grace", "99999999999d", check=False))
    assert line == "invalid value '99999999999d' for --grace: at most 36500d (100 years)"
    rows = run_cli("du", str(root), "run").stdout.splitlines()[1:4]
    assert [r.split()[0] for r in rows] == [f"run/checkpoint-{s}" for s in (1, 2, 10)]
    usage = " ".join(run_cli("gc", "--help").stdout.split())
    for example in ("ckptfs gc s3://bucket/run7", "ckptfs gc az://container/run7",
                    "ckptfs gc gs://bucket/run7", "ckptfs gc file:///data/ckpt",
                    "ckptfs gc ./store"):
        assert example in usage, example
