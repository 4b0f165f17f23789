"""Mount lifecycle through the real CLI: flush on umount/SIGTERM/fusermount, back-pressure,
status, journal resume after a crash during a store outage, and one-line errors."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from faultproxy import FaultProxy, chunk_put
from mounting import Mount, Nodes, is_mounted, run_cli
from seaweed import SeaweedServer
from support import random_bytes

from ckptfs.daemon.control import request

MiB = 2**20


@pytest.fixture
def store(tmp_path: Path) -> str:
    root = tmp_path / "store"
    root.mkdir()
    return str(root)



def write_files(mnt: Mount, n: int = 3, size: int = 5 * 2**20) -> dict[str, bytes]:
    files = {f"f{i}.bin": random_bytes(size) for i in range(n)}
    for name, data in files.items():
        (mnt / name).write_bytes(data)
    return files


def assert_files(mnt: Mount, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (mnt / name).read_bytes() == data, name


@pytest.mark.parametrize("how", ["sigterm", "fusermount"])
def test_shutdown_without_ckptfs_umount_still_flushes(
        how: str, store: str, tmp_path: Path, nodes: Nodes) -> None:
    a = nodes.mount(store, tmp_path, "a", "--chunk-size", "1M")
    files = write_files(a)
    assert a.pid is not None
    if how == "sigterm":
        os.kill(a.pid, signal.SIGTERM)
    else:
        subprocess.run(["fusermount3", "-u", str(a.path)], check=True)
    assert a.wait_exit(60) == 0  # its final flush saved everything
    assert "flush complete: everything is in the store" in a.log()
    assert not is_mounted(a.path)
    b = nodes.mount(store, tmp_path, "b")
    assert_files(b, files)


def test_status_sync_and_umount_report_durability(
        store: str, tmp_path: Path, nodes: Nodes) -> None:
    a = nodes.mount(store, tmp_path, "a", "--chunk-size", "1M")
    files = write_files(a)
    st = a.status()
    for field in ("dirty_bytes", "uploading_bytes", "uploaded_bytes", "stored_bytes",
                  "logical_bytes", "cache_bytes", "upload_rate", "errors", "pending_chunks",
                  "pending_ops", "eta_seconds", "dedup_ratio", "compression_ratio"):
        assert field in st, field
    assert st["logical_bytes"] == sum(map(len, files.values()))
    r = run_cli("sync", str(a.path))
    assert "durable" in r.stdout
    st = a.status()
    assert st["durable"] and st["dirty_bytes"] == 0 and st["pending_chunks"] == 0
    assert st["uploaded_bytes"] >= sum(map(len, files.values()))
    assert os.getxattr(a / "f0.bin", "user.ckptfs.state") == b"durable"
    human = run_cli("status", str(a.path)).stdout
    assert "durable" in human and "uploaded" in human
    r = a.umount()
    assert r.returncode == 0 and "everything is in the store" in r.stdout


def test_writers_wait_at_the_cache_limit_and_nothing_fails(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """A 48 MiB file, 12x --cache-size, written to a store whose chunk PUTs are slowed
    down: the writer waits for uploads (back-pressure), so the dirty bytes, sampled all
    along the write, never exceed the limit by more than the chunk being written; the
    write never fails, and the file reads back through a cache smaller than itself."""
    url = f"s3://{seaweed.new_bucket()}/job"
    limit, chunk = 4 * MiB, MiB
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint, "--chunk-size",
                    "1M", "--cache-size", "4M")
    proxy.delay(0.2, chunk_put)  # uploads drain far slower than the writer fills
    sock = os.getxattr(a.path, "user.ckptfs.control").decode()
    samples: list[int] = []
    writing = threading.Event()

    def sample() -> None:
        while writing.is_set():
            samples.append(int(next(request(sock, "status"))["dirty_bytes"]))

    data = random_bytes(48 * MiB)
    writing.set()
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        (a / "big.bin").write_bytes(data)  # back-pressure, never an error
    finally:
        writing.clear()
        sampler.join()
    assert len(samples) > 20, samples  # sampled all along the write
    assert max(samples) > limit - chunk, max(samples)  # the writer reached the limit ...
    assert max(samples) <= limit + chunk, max(samples)  # ... and waited there
    proxy.delay(0.0, chunk_put)
    a.umount()
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint,
                    "--cache-size", "8M")
    assert (b / "big.bin").read_bytes() == data  # read through a cache smaller than the file
    cache_files = [p for p in (b.cache / "chunks").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in cache_files) <= 8 * MiB + MiB


def test_crash_during_store_outage_resumes_from_the_journal(
        tmp_path: Path, nodes: Nodes, seaweed: SeaweedServer) -> None:
    server = SeaweedServer(tmp_path / "weed")  # our own server, to take it down (the shared
    # `seaweed` fixture provides the test credentials in the environment)
    server.start()
    try:
        bucket = server.new_bucket()
        url, extra = f"s3://{bucket}/job", ["--endpoint-url", server.endpoint]
        a = nodes.mount(url, tmp_path, "a", *extra, "--chunk-size", "1M")
        server.stop()  # the store goes down; writes must still succeed
        files = write_files(a, n=2, size=3 * 2**20)
        st = a.status()
        assert st["pending_chunks"] > 0 or st["pending_ops"] > 0
        a.kill(9)  # the node's ckptfs crashes before anything reached the store
        server.restart()
        a.mount()  # same cache directory: the journal is replayed
        a.umount()
        b = nodes.mount(url, tmp_path, "b", *extra)
        assert_files(b, files)
        b.umount()
    finally:
        server.stop()


@pytest.mark.parametrize("case", ["no-store", "mnt-is-file", "bad-size", "mnt-not-empty",
                                  "refused-endpoint"])
def test_bad_input_is_one_line_and_leaves_no_mount(case: str, tmp_path: Path) -> None:
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    store.mkdir()
    mnt.mkdir()
    args = [str(store), str(mnt), "--cache-dir", str(tmp_path / "cache")]
    if case == "no-store":
        args[0] = str(tmp_path / "missing")
    elif case == "mnt-is-file":
        (tmp_path / "file").write_text("x")
        args[1] = str(tmp_path / "file")
    elif case == "bad-size":
        args += ["--cache-size", "12Q"]
    elif case == "mnt-not-empty":
        (mnt / "x").write_text("x")
    elif case == "refused-endpoint":
        args[0] = "s3://bucket-x/p"
        args += ["--endpoint-url", "http://127.0.0.1:9"]
    r = run_cli("mount", *args, check=False, timeout=60,
                env={**os.environ, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                     "AWS_DEFAULT_REGION": "us-east-1"})
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), r.stderr
    assert "Traceback" not in r.stderr
    assert not is_mounted(mnt)


def test_second_mount_on_the_same_cache_dir_is_refused(
        store: str, tmp_path: Path, nodes: Nodes) -> None:
    a = nodes.mount(store, tmp_path, "a")
    other = tmp_path / "other-mnt"
    other.mkdir()
    r = run_cli("mount", store, str(other), "--cache-dir", str(a.cache), check=False)
    assert r.returncode == 1 and "in use" in r.stderr
    assert not is_mounted(other)
    r = run_cli("status", str(tmp_path), check=False)
    assert r.returncode == 1 and "not a ckptfs mount" in r.stderr
    assert json.loads(run_cli("status", str(a.path), "--json").stdout)["pid"] == a.pid


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The single `ckptfs: ...` line a command printed on stderr."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_dead_mount_is_named_and_umount_detaches_it(
        store: str, tmp_path: Path, nodes: Nodes) -> None:
    # a file named `chunks` in the store: every chunk PUT fails (and is retried), while
    # manifests still publish, so the journal keeps the chunks when the daemon dies
    blocker = Path(store) / "chunks"
    blocker.write_text("not a directory")
    a = nodes.mount(store, tmp_path, "a", "--chunk-size", "1M")
    files = write_files(a, n=1, size=3 * 2**20)
    assert a.status()["pending_chunks"] == 3
    a.kill_daemon(9)
    assert is_mounted(a.path)
    with pytest.raises(OSError) as e:
        os.listdir(a.path)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)

    r = run_cli("status", str(a.path), check=False)
    line = one_line(r)
    assert r.returncode == 1
    assert "daemon" in line and "gone" in line and f"ckptfs umount {a.path}" in line, line
    r = run_cli("mount", store, str(a.path), "--cache-dir", str(a.cache), check=False,
                timeout=60)
    line = one_line(r)
    assert r.returncode == 1 and f"run ckptfs umount {a.path} first" in line, line
    assert is_mounted(a.path)

    r = run_cli("umount", str(a.path), check=False)
    line = one_line(r)
    assert not is_mounted(a.path)
    assert r.returncode == 1  # unmounted, but not everything is in the store
    assert str(a.cache) in line and "3 chunks" in line and "resume" in line, line
    r = run_cli("status", str(a.path), check=False)
    assert r.returncode == 1 and "not a ckptfs mount" in one_line(r)

    blocker.unlink()
    a.mount("--chunk-size", "1M")  # the same cache: the journal is replayed
    assert a.umount().returncode == 0
    b = nodes.mount(store, tmp_path, "b")
    assert_files(b, files)


def test_second_mount_with_the_default_cache_is_told_about_cache_dir(
        store: str, tmp_path: Path, nodes: Nodes) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    first, second = Mount(store, tmp_path, "first"), Mount(store, tmp_path, "second")
    nodes += [first, second]
    run_cli("mount", store, str(first.path), env=env, timeout=60)
    first.pid = int(first.status()["pid"])
    r = run_cli("mount", store, str(second.path), env=env, check=False, timeout=60)
    line = one_line(r)
    assert r.returncode == 1 and not is_mounted(second.path)
    assert "in use" in line and "--cache-dir" in line and str(first.path) in line, line
    second.mount()  # with its own --cache-dir
    assert first.umount().returncode == 0 and second.umount().returncode == 0


def mount_cli(m: Mount, *more: str) -> subprocess.CompletedProcess[str]:
    """`ckptfs mount` of `m` with its cache and options; the completed process (exit 0)."""
    r = run_cli("mount", m.store, str(m.path), "--cache-dir", str(m.cache), *m.extra, *more,
                timeout=60)
    m.pid = int(m.status()["pid"])
    return r


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_new_store_is_announced_and_never_made_inside_another(
        kind: str, tmp_path: Path, nodes: Nodes, request: pytest.FixtureRequest) -> None:
    if kind == "local":
        url, extra = str(tmp_path / "store"), []
        inner, deeper = f"{url}/step-3", f"{url}/run/step-4"
        for d in (inner, deeper):
            os.makedirs(d)  # a directory store must exist
    else:
        seaweed: SeaweedServer = request.getfixturevalue("seaweed")
        bucket = seaweed.new_bucket()
        url, extra = f"s3://{bucket}/run1", ["--endpoint-url", seaweed.endpoint]
        inner, deeper = f"{url}/step-3", f"{url}/run/step-4"
    a = Mount(url, tmp_path, "a", extra=extra)
    nodes.append(a)
    line = one_line(mount_cli(a, "--chunk-size", "1M"))
    files = ", files 0600" if kind == "local" else ""  # a directory store's mode
    assert "initialised a new ckptfs store at " in line and line.endswith(
        f"(chunk size 1 MiB{files})")
    a.umount()
    line = one_line(mount_cli(a, "--chunk-size", "4M"))  # ignored: the store has 1 MiB
    assert "--chunk-size 4 MiB is ignored" in line and "chunk size 1 MiB" in line, line
    if kind == "local":  # and so is the mode of an existing store's files
        assert stat.S_IMODE(os.stat(f"{url}/ckptfs.json%o").st_mode) == 0o600
        a.umount()
        line = one_line(mount_cli(a, "--store-mode", "0640"))
        assert line.endswith(f"--store-mode 0640 is ignored: the store at file://{url} exists "
                             f"and writes its files with mode 0600"), line
    a.umount()
    assert mount_cli(a).stderr == ""  # an existing store, no --chunk-size: nothing to say
    a.umount()
    assert mount_cli(a, "--chunk-size", "1M").stderr == ""
    a.umount()
    log = (a.cache / "ckptfs.log").read_text()
    assert "initialised a new ckptfs store at " in log and "--chunk-size 4 MiB is ignored" in log

    for name, store, path in (("b", inner, "step-3"), ("c", deeper, "run/step-4")):
        m = Mount(store, tmp_path, name, extra=extra)
        nodes.append(m)
        r = run_cli("mount", store, str(m.path), "--cache-dir", str(m.cache), *extra,
                    check=False, timeout=60)
        line = one_line(r)
        assert r.returncode == 1 and not is_mounted(m.path)
        assert (f"{url} is a ckptfs store; mount it and use the path {path} inside it: "
                f"ckptfs mount {url} {m.path}") in line, line
    if kind == "local":  # nothing was written in the enclosing store
        assert os.listdir(inner) == [] and os.listdir(deeper) == []
    else:
        from ckptfs.store.s3 import S3Store

        s3 = S3Store(bucket, "run1", endpoint_url=extra[1])
        keys = [k for k, _ in s3.list("", delimiter=None).objects]
        s3.close()
        assert keys and not [k for k in keys if k.startswith(("step-3/", "run/"))], keys


@pytest.mark.parametrize("where", ["local", "s3"])
def test_dedup_counts_only_chunks_the_store_already_had(
        where: str, store: str, tmp_path: Path, nodes: Nodes,
        request: pytest.FixtureRequest) -> None:
    """A save of random bytes into a new store deduplicates nothing, although its early
    uploads race the uploads that its close queues for the same chunks; a copy of the
    saved file then deduplicates exactly its size (every chunk is already stored)."""
    extra = ["--chunk-size", "1M"]
    if where == "s3":
        seaweed: SeaweedServer = request.getfixturevalue("seaweed")
        store = f"s3://{seaweed.new_bucket()}/job"
        extra += ["--endpoint-url", seaweed.endpoint]
    a = nodes.mount(store, tmp_path, "a", *extra)
    size = 96 * 2**20 + 12345  # 97 chunks, the last one partial
    data = random_bytes(size)
    with open(a / "model.bin", "wb", buffering=0) as f:  # as dd bs=1M does
        for offset in range(0, size, 2**20):
            f.write(data[offset:offset + 2**20])
    run_cli("sync", str(a.path))
    st = a.status()
    assert st["dedup_bytes"] == 0 and st["uploaded_bytes"] == size, st
    assert st["uploading_bytes"] == 0, st
    shutil.copyfile(a / "model.bin", a / "copy.bin")
    run_cli("sync", str(a.path))
    st = a.status()
    assert st["dedup_bytes"] == size and st["uploaded_bytes"] == size, st
    assert st["dedup_ratio"] == 2.0, st
    a.umount()
