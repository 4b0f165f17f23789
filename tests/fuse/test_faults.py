"""Faults through real mounts and real servers: a store outage during a save, throttling and
hanging requests, permanent store errors, bad input, a full cache disk, corrupt chunks in
the store, and the security basics of the cache directory, control socket and mount."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultproxy import FaultProxy, chunk_put
from mounting import CKPTFS, Mount, Nodes, is_mounted, run_cli, training
from seaweed import SeaweedServer
from support import random_bytes, wait_until
from users import run_as

from ckptfs.format import manifests
from ckptfs.store.local import LocalStore

MiB = 2**20


# ---------------------------------------------------------------------------- helpers


def status(m: Mount) -> dict[str, Any]:
    """`ckptfs status --json` of a mount."""
    return dict(m.status())


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(4 * MiB):
            h.update(block)
    return h.hexdigest()


def one_line_error(r: object) -> str:
    """The single `ckptfs: ...` line a failed command must print on stderr."""
    rc, stderr = r.returncode, r.stderr  # type: ignore[attr-defined]
    assert rc != 0, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), stderr
    assert "Traceback" not in stderr
    return str(lines[0])


class PatternSave(threading.Thread):
    """A save in a thread: `phases` runs of 4 MiB blocks written to one file, each phase
    started by its gate. A 4 MiB random block is reused with a counter stamped into every
    MiB, so every 1 MiB chunk differs (no dedup) without generating hundreds of MiB of urandom."""

    BLOCK = 4 * MiB

    def __init__(self, path: Path, phases: list[int]) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.phases = phases  # blocks per phase
        self.gates = [threading.Event() for _ in phases]
        self.done = [threading.Event() for _ in phases]
        self.written = 0
        self.seconds = [0.0 for _ in phases]  # how long each phase's writes took
        self.sha = hashlib.sha256()
        self.error: BaseException | None = None
        self.closed = threading.Event()
        self.abort = False  # set by the test on failure: stop writing, close
        self._base = bytearray(random_bytes(self.BLOCK))

    def block(self, i: int) -> bytes:
        for j in range(0, self.BLOCK, MiB):
            self._base[j:j + 16] = struct.pack("<QQ", i, j)
        return bytes(self._base)

    def run(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                i = 0
                for i_phase, (gate, done, n) in enumerate(
                        zip(self.gates, self.done, self.phases, strict=True)):
                    if not gate.wait(300) or self.abort:
                        raise TimeoutError("aborted")
                    start = time.monotonic()
                    for _ in range(n):
                        if self.abort:
                            raise TimeoutError("aborted")
                        data = self.block(i)
                        view = memoryview(data)
                        while view:
                            view = view[os.write(fd, view):]
                        self.sha.update(data)
                        self.written += len(data)
                        i += 1
                    self.seconds[i_phase] = time.monotonic() - start
                    done.set()
            finally:
                os.close(fd)
            self.closed.set()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
            for d in self.done:
                d.set()


# ---------------------------------------------------------------------------- 1. outage
def test_store_outage_during_a_360mib_save(tmp_path: Path, nodes: Nodes,
                                          seaweed: SeaweedServer) -> None:
    """The S3 server goes down in the middle of a save: writes go on at local speed (as
    fast as before the outage, measured side by side), status shows the outage, the server
    comes back, umount exits 0, another node reads it exactly."""
    server = SeaweedServer(tmp_path / "w")  # our own server, to take down (the `seaweed`
    server.start()  # fixture put the test credentials, the same for every server, in the env)
    started: list[PatternSave] = []
    try:
        url = f"s3://{server.new_bucket()}/job"
        extra = ["--endpoint-url", server.endpoint, "--chunk-size", "1M"]
        a = nodes.mount(url, tmp_path, "a", *extra)
        # 160 MiB before the outage, 2 x 80 MiB during it, 40 MiB after: 360 MiB
        save = PatternSave(a / "model.bin", [40, 20, 20, 10])
        started.append(save)
        save.start()
        save.gates[0].set()
        assert save.done[0].wait(120) and save.error is None, save.error
        server.stop()  # the store goes down in the middle of the save
        down_at = time.monotonic()
        save.gates[1].set()
        seen: dict[str, Any] = {}

        def outage_shown() -> bool:
            st = status(a)
            seen.update(st)
            return bool(st["errors"]) and st["retrying_since"] is not None

        wait_until(outage_shown, 30, "status shows the outage")
        assert not seen["durable"] and seen["dirty_bytes"] > 0
        assert save.done[1].wait(120) and save.error is None, save.error
        before = save.written
        save.gates[2].set()  # writes go on while status shows the outage
        assert save.done[2].wait(120) and save.error is None, save.error
        assert save.written == before + 80 * MiB
        # local speed: MiB/s while the store is down vs before, when uploads kept up (a
        # write path that waited on the store would crawl, or stop, here)
        rate_before = 160 / save.seconds[0]
        rate_during = 80 / save.seconds[2]
        assert rate_during > rate_before / 3, (rate_before, rate_during)
        st = status(a)
        assert st["errors"] and st["retrying_since"] is not None, st
        assert st["dirty_bytes"] >= 80 * MiB, st  # at least what was written since
        text = run_cli("status", str(a.path)).stdout
        assert "error" in text and "retrying" in text, text
        time.sleep(max(0.0, 3 - (time.monotonic() - down_at)))  # a few seconds of outage
        server.start()  # same data directory and ports
        save.gates[3].set()
        save.join(120)
        assert save.closed.is_set() and save.error is None, save.error
        assert save.written == 360 * MiB
        r = a.umount()
        assert r.returncode == 0 and "everything is in the store" in r.stdout
        b = nodes.mount(url, tmp_path, "b", "--endpoint-url", server.endpoint)
        assert os.stat(b / "model.bin").st_size == 360 * MiB
        assert file_sha256(b / "model.bin") == save.sha.hexdigest()
        b.umount()
    finally:
        for save in started:  # after a failure: let the writer close its file and end
            save.abort = True
            for gate in save.gates:
                gate.set()
            save.join(30)
        nodes.cleanup()
        server.stop()


# ---------------------------------------------------------------------------- 2. throttling
def test_throttled_store_everything_lands(proxy: FaultProxy, seaweed: SeaweedServer,
                                          tmp_path: Path, nodes: Nodes) -> None:
    """Every request (chunk HEAD/PUT, marker and manifest PUTs, LISTs, the copy and delete
    of a file rename) gets 503 SlowDown on its first two tries (botocore's two attempts, so
    ckptfs must retry itself) and 10% of the time after that while saving, and so do the
    chunk GETs while loading: all of it lands, byte-exact."""
    url = f"s3://{seaweed.new_bucket()}/job"
    extra = ["--endpoint-url", proxy.endpoint, "--chunk-size", "1M"]
    a = nodes.mount(url, tmp_path, "a", *extra)
    proxy.throttle(0.1, lambda m, p: True, first=2)  # after the mount (it needs the store)
    files = {f"ckpt/rank{i}.bin": random_bytes(4 * MiB + i) for i in range(2)}
    (a / "ckpt").mkdir()
    for name, data in files.items():
        (a / f"{name}.tmp").write_bytes(data)
        os.rename(a / f"{name}.tmp", a / name)  # save to a temporary name, then rename
    r = a.umount()
    assert r.returncode == 0 and "everything is in the store" in r.stdout
    injected = list(proxy.injected)
    assert any(m == "PUT" and "/chunks/" in p for m, p in injected)
    assert any(m == "PUT" and "/files/" in p for m, p in injected)
    log = (a.cache / "ckptfs.log").read_text()
    assert "upload failed (retrying)" in log and "SlowDown" in log
    assert re.search(r"metadata (op \S+ \S+|\S+) failed \(retrying\): .*SlowDown", log), log

    proxy.throttle(0.0, lambda m, p: False)
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", proxy.endpoint)
    assert sorted(os.listdir(b / "ckpt")) == ["rank0.bin", "rank1.bin"]
    proxy.throttle(0.1, lambda m, p: m == "GET" and "/chunks/" in p, first=2)
    before = len(proxy.injected)
    for name, data in files.items():
        assert (b / name).read_bytes() == data, name
    n_chunks = sum(-(-len(d) // MiB) for d in files.values())
    assert len(proxy.injected) - before >= 2 * n_chunks  # every chunk GET was throttled twice
    proxy.throttle(0.0, lambda m, p: False)
    b.umount()


def test_s3_store_makes_two_attempts_per_call(proxy: FaultProxy, seaweed: SeaweedServer) -> None:
    """botocore tries each call twice (docs/OPERATIONS.md), then ckptfs's own retries take
    over; a throttled call surfaces as a TransientStoreError naming the S3 error code."""
    from ckptfs.common.errors import TransientStoreError
    from ckptfs.store.s3 import S3Store

    bucket = seaweed.new_bucket()
    store = S3Store(bucket, "p", endpoint_url=proxy.endpoint)
    try:
        proxy.throttle(0.0, lambda m, p: m == "PUT", first=10)
        with pytest.raises(TransientStoreError, match="SlowDown"):
            store.put("x", b"data")
        assert proxy.tries == {("PUT", f"/{bucket}/p/x"): 2}
    finally:
        store.close()
        seaweed.drop_bucket(bucket)


def test_hanging_chunk_requests_are_waited_for(proxy: FaultProxy, seaweed: SeaweedServer,
                                               tmp_path: Path, nodes: Nodes) -> None:
    """Chunk PUTs that hang (no answer) hold the data in the cache without blocking close;
    sync waits for them; once the server answers, everything lands. The same for GETs."""
    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M")
    proxy.hold(lambda m, p: m == "PUT" and "/chunks/" in p)
    data = random_bytes(6 * MiB)
    (a / "f.bin").write_bytes(data)
    # close returned while every chunk PUT was held (none has passed): it waited for
    # the manifest only
    assert proxy.requests_where(chunk_put, status=200) == []
    assert proxy.requests_where(lambda m, p: m == "PUT" and "/files/" in p, status=200)
    wait_until(lambda: proxy.held > 0, 30, "a chunk PUT is hanging")
    st = status(a)
    assert st["pending_chunks"] > 0 and not st["durable"], st
    assert st["uploading_bytes"] > 0, st
    r = run_cli("sync", str(a.path), "--timeout", "2", check=False)
    assert r.returncode == 1 and "not durable after 2s" in r.stderr.splitlines()[-1], r.stderr
    proxy.release()
    run_cli("sync", str(a.path), "--timeout", "60")
    assert status(a)["durable"]
    a.umount()

    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", proxy.endpoint)
    assert os.path.getsize(b / "f.bin") == len(data)
    proxy.hold(lambda m, p: m == "GET" and "/chunks/" in p)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((b / "f.bin").read_bytes()),
                              daemon=True)
    reader.start()
    wait_until(lambda: proxy.held > 0, 30, "a chunk GET is hanging")
    time.sleep(1)
    assert not got  # the read waits for the hanging GET
    proxy.release()
    reader.join(60)
    assert got == [data]
    b.umount()


def chunk_objects(seaweed: SeaweedServer, bucket: str, prefix: str) -> set[str]:
    """The chunk names under s3://bucket/prefix, asked of the server directly."""
    pages = seaweed.s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/chunks/")
    return {o["Key"].rsplit("/", 1)[-1] for p in pages for o in p.get("Contents", [])}


def test_fsync_to_store_waits_for_held_chunk_puts(proxy: FaultProxy, seaweed: SeaweedServer,
                                                  tmp_path: Path, nodes: Nodes) -> None:
    """With --fsync-to-store, fsync returns only once the file's chunks are in the store:
    while the server holds every chunk PUT, fsync waits; once the PUTs go through, it
    returns and each chunk of the file is in the store."""
    bucket = seaweed.new_bucket()
    url = f"s3://{bucket}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M", "--fsync-to-store")
    proxy.hold(lambda m, p: m == "PUT" and "/chunks/" in p)
    data = random_bytes(3 * MiB + 100)
    fd = os.open(a / "f.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        outcome: list[object] = []

        def do_fsync() -> None:
            try:
                os.fsync(fd)
                outcome.append(None)
            except OSError as e:
                outcome.append(e)

        syncer = threading.Thread(target=do_fsync, daemon=True)
        syncer.start()
        wait_until(lambda: proxy.held > 0, 30, "a chunk PUT is held")
        time.sleep(2)
        assert syncer.is_alive() and not outcome, outcome  # still waiting for the PUTs
        assert chunk_objects(seaweed, bucket, "job") == set()
        proxy.release()
        syncer.join(60)
        assert not syncer.is_alive() and outcome == [None], outcome
        # durable when fsync returned: every chunk of the file is in the store
        manifest = json.loads(seaweed.s3.get_object(
            Bucket=bucket, Key="job/files/f.bin")["Body"].read())
        assert {h for h, _ in manifest["chunks"]} <= chunk_objects(seaweed, bucket, "job")
        assert len(manifest["chunks"]) == 4
        r = run_cli("verify", url, "f.bin", "--endpoint-url", seaweed.endpoint)
        assert "f.bin" in r.stdout, r.stdout
    finally:
        os.close(fd)
    a.umount()


def test_umount_waits_for_held_chunk_puts(proxy: FaultProxy, seaweed: SeaweedServer,
                                          tmp_path: Path, nodes: Nodes) -> None:
    """`ckptfs umount` does not return (nor unmount) while chunk PUTs of a closed file
    are held by the server; once they go through it exits 0, and a new node with an
    empty cache reads the file exactly."""
    import subprocess

    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M")
    proxy.hold(lambda m, p: m == "PUT" and "/chunks/" in p)
    data = random_bytes(4 * MiB + 7)
    (a / "f.bin").write_bytes(data)  # closed: its manifest is in the store, chunks held
    wait_until(lambda: proxy.held > 0, 30, "a chunk PUT is held")
    umount = subprocess.Popen([*CKPTFS, "umount", str(a.path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        assert umount.poll() is None, umount.communicate()
        assert is_mounted(a.path) and status(a)["pending_chunks"] > 0
        proxy.release()
        out, err = umount.communicate(timeout=120)
    finally:
        if umount.poll() is None:
            umount.kill()
            umount.wait()
    assert umount.returncode == 0, err
    assert "everything is in the store" in out, out
    assert not is_mounted(a.path)
    assert a.wait_exit() == 0
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
    assert (b / "f.bin").read_bytes() == data
    b.umount()


def checkpoint_from_another_node(proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path,
                                 nodes: Nodes) -> Mount:
    """Node a writes ckpt/model.bin (1000 bytes) and unmounts; returns node b, a new
    mount of the same store that has listed nothing yet (both through the proxy)."""
    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M")
    (a / "ckpt").mkdir()
    (a / "ckpt" / "model.bin").write_bytes(b"w" * 1000)
    a.umount()
    return nodes.mount(url, tmp_path, "b", "--endpoint-url", proxy.endpoint)


def test_throttled_listing_never_reports_an_existing_file_missing(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """A node that has not listed a directory yet, while the store throttles LIST and
    manifest GETs for a few seconds, must not answer ENOENT for a file that exists (a
    loader would conclude there is no checkpoint): it may wait, or fail with EIO."""
    b = checkpoint_from_another_node(proxy, seaweed, tmp_path, nodes)
    proxy.throttle(1.0, lambda m, p: "/chunks/" not in p)
    lift = threading.Timer(3.0, proxy.throttle, (0.0, lambda m, p: False))
    lift.start()
    try:
        outcomes: list[tuple[str, object]] = []
        for path in (b / "ckpt" / "model.bin", b / "ckpt"):
            try:
                outcomes.append(("ok", os.stat(path).st_size if path.name != "ckpt"
                                 else sorted(os.listdir(path))))
            except OSError as e:
                outcomes.append(("errno", errno.errorcode.get(e.errno or 0, str(e.errno))))
    finally:
        lift.join()
    throttled = proxy.requests_where(lambda m, p: "/chunks/" not in p, status=503)
    # the listing and manifest requests were throttled indeed
    assert any(r.method == "GET" and "list-type=2" in r.path for r in throttled), [
        (r.method, r.path) for r in throttled]
    assert ("errno", "ENOENT") not in outcomes, outcomes
    for _, value in outcomes:
        assert value in (1000, ["model.bin"], "EIO"), outcomes
    assert (b / "ckpt" / "model.bin").read_bytes() == b"w" * 1000  # after the throttling
    b.umount()


def test_directory_never_listed_is_eio_during_an_outage_never_empty(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """An outage longer than the retries: a directory this node listed before keeps its
    view, but one it never listed fails with EIO; an empty listing or ENOENT would tell a
    resume script there is no checkpoint, and it would start training over."""
    b = checkpoint_from_another_node(proxy, seaweed, tmp_path, nodes)
    assert os.listdir(b.path) == ["ckpt"]  # the root is listed before the outage

    def outcome(fn: Callable[[], object]) -> object:
        try:
            return fn()
        except OSError as e:
            return errno.errorcode.get(e.errno or 0, str(e.errno))

    proxy.throttle(1.0, lambda m, p: True)  # every request: 503 SlowDown
    try:
        time.sleep(1.2)  # past --metadata-ttl: every call below asks the store first
        during = [outcome(lambda: os.listdir(b.path)),
                  outcome(lambda: os.listdir(b / "ckpt")),
                  outcome(lambda: os.stat(b / "ckpt" / "model.bin").st_size)]
    finally:
        proxy.throttle(0.0, lambda m, p: False)
    assert during == [["ckpt"], "EIO", "EIO"], during
    assert os.listdir(b / "ckpt") == ["model.bin"]
    assert (b / "ckpt" / "model.bin").read_bytes() == b"w" * 1000
    b.umount()


def test_listing_after_a_crash_waits_for_the_journals_files(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """Killed after a file was closed but before its manifest reached the store: the next
    mount publishes it from the journal, and a listing made meanwhile waits for that
    (up to the publish timeout) rather than list a store that lacks the file; a resume
    script would take an older checkpoint for the latest."""
    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M")
    (a / "step-1.pt").write_bytes(b"1" * 1000)
    proxy.hold(lambda m, p: m == "PUT" and "/files/" in p)  # manifests wait at the proxy
    (a / "step-2.pt").write_bytes(b"2" * 1000)  # closed: journaled, manifest held
    a.kill()
    release = threading.Timer(2.0, proxy.release)
    a.mount()  # recovery: its publish of step-2.pt is held too, until the timer
    release.start()
    try:
        names = sorted(os.listdir(a.path))
    finally:
        release.join()
    assert names == ["step-1.pt", "step-2.pt"]
    assert (a / "step-2.pt").read_bytes() == b"2" * 1000
    a.umount()


# ---------------------------------------------------------------------------- 3. permanent
SECRETS = ("ckptfs-test-access-key", "ckptfs-test-secret-key")


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def test_permanent_store_error_keeps_the_data_in_the_cache(
        seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """The bucket disappears under a mount: status names the permanent error, the data stays
    readable here and journaled in the cache, umount --timeout fails with one line, and no
    credential is ever printed. Once the bucket is back, a new mount of the same cache
    uploads everything."""
    import signal

    assert os.environ["AWS_ACCESS_KEY_ID"] == SECRETS[0]  # what must never be printed
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRETS[1]
    bucket = seaweed.new_bucket()
    url = f"s3://{bucket}/job"
    extra = ["--endpoint-url", seaweed.endpoint, "--chunk-size", "1M"]
    a = nodes.mount(url, tmp_path, "a", *extra)
    seaweed.drop_bucket(bucket)  # the bucket and everything in it are gone
    files = {f"f{i}.bin": random_bytes(3 * MiB + i) for i in range(2)}
    for name, data in files.items():
        start = time.monotonic()
        (a / name).write_bytes(data)
        # close gives up waiting for the manifest after the publish timeout (10 s), and
        # does not wait for the PERMANENT_DELAY (30 s) retry; a wide margin for load
        assert time.monotonic() - start < 25
    wait_until(lambda: len(status(a)["errors"]) == 2, 60, "both errors in status")
    st = status(a)
    assert all("PermanentStoreError" in e and "NoSuchBucket" in e for e in st["errors"]), st
    assert st["retrying_since"] is not None and not st["durable"]
    assert st["pending_chunks"] >= 6 and st["pending_ops"] >= 2, st
    for name, data in files.items():  # still readable on this node, from the cache
        assert (a / name).read_bytes() == data
    status_json = run_cli("status", str(a.path), "--json").stdout
    status_text = run_cli("status", str(a.path)).stdout
    assert "NoSuchBucket" in status_text
    r = run_cli("umount", str(a.path), "--timeout", "5", check=False)
    assert r.returncode == 1
    *progress, last = r.stderr.strip().splitlines()
    assert all(line.startswith("sync [") for line in progress), r.stderr
    assert last.startswith("ckptfs: ") and "Traceback" not in r.stderr
    assert "still mounted" in last and f"safe in the cache {a.cache}" in last, last
    assert "NoSuchBucket" in last, last  # says why
    assert is_mounted(a.path)
    # stop the daemon: SIGTERM unmounts and flushes, a second one abandons the flush
    assert a.pid is not None
    os.kill(a.pid, signal.SIGTERM)
    wait_until(lambda: not is_mounted(a.path), 30, "lazy unmount on SIGTERM")
    time.sleep(0.5)
    os.kill(a.pid, signal.SIGTERM)
    assert a.wait_exit(30) == 1  # the flush gave up: not everything is in the store
    log = (a.cache / "ckptfs.log").read_text()
    assert "flush interrupted" in log and "NoSuchBucket" in log
    assert_no_secret(status_json, status_text, r.stdout, r.stderr, log)
    from ckptfs.cli.umount import journal_counts

    chunks, ops = journal_counts(str(a.cache))
    assert chunks >= 6 and ops >= 2  # everything closed is still journaled in the cache
    # the bucket comes back (empty): a new mount of the same cache uploads it all
    seaweed.s3.create_bucket(Bucket=bucket)
    try:
        a.mount()
        assert a.umount().returncode == 0
        b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
        for name, data in files.items():
            assert (b / name).read_bytes() == data, name
        b.umount()
    finally:
        nodes.cleanup()
        seaweed.drop_bucket(bucket)


# ---------------------------------------------------------------------------- 4. bad input
def mounts_at(path: Path) -> int:
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return sum(line.split()[1] == real for line in f)


@pytest.mark.parametrize("case", ["no-bucket", "wrong-secret", "already-mounted",
                                  "newer-format", "chunk-size-1K", "upload-threads-0",
                                  "uploads-while-writing-negative"])
def test_bad_input_is_one_line_and_leaves_no_mount(
        case: str, tmp_path: Path, local_store_dir: Path, seaweed: SeaweedServer,
        nodes: Nodes) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    store = str(local_store_dir)
    args = ["--cache-dir", str(tmp_path / "cache")]
    env = dict(os.environ)
    mounted_before = 0
    if case == "no-bucket":
        store = "s3://ckptfs-no-such-bucket-7f3a/job"
        args += ["--endpoint-url", seaweed.endpoint]
    elif case == "wrong-secret":
        store = f"s3://{seaweed.new_bucket()}/job"
        args += ["--endpoint-url", seaweed.endpoint]
        env["AWS_SECRET_ACCESS_KEY"] = "wrong-secret-2b8e1d"
    elif case == "already-mounted":
        first = nodes.mount(store, tmp_path, "first")
        mnt = first.path  # a second mount on the same path, with its own cache
        mounted_before = 1
    elif case == "newer-format":
        (local_store_dir / "ckptfs.json%o").write_text(json.dumps(
            {"format": 99, "chunk_size": 2**20, "hash": "xxh3-128"}))
    elif case == "chunk-size-1K":
        args += ["--chunk-size", "1K"]
    elif case == "upload-threads-0":
        args += ["--upload-threads", "0"]
    elif case == "uploads-while-writing-negative":
        args += ["--uploads-while-writing", "-1"]
    r = run_cli("mount", store, str(mnt), *args, check=False, timeout=60, env=env)
    line = one_line_error(r)
    # options that are malformed are bad input (2); what the store or the mount point
    # refuses is an error (1)
    assert r.returncode == (2 if case in ("upload-threads-0",
                                          "uploads-while-writing-negative") else 1)
    assert mounts_at(mnt) == mounted_before
    assert_no_secret(r.stdout, r.stderr)
    assert "wrong-secret-2b8e1d" not in r.stderr
    expected = {
        "no-bucket": "does not exist",
        "wrong-secret": "check the credentials",
        "already-mounted": "already mounted",
        "newer-format": "newer than this ckptfs",
        "chunk-size-1K": "--chunk-size",
        "upload-threads-0": "--upload-threads must be at least 1",
        "uploads-while-writing-negative": "--uploads-while-writing must be at least 0",
    }[case]
    assert expected in line, line
    if case == "chunk-size-1K":  # refused before anything is written to the new store
        assert os.listdir(local_store_dir) == []
    if case == "already-mounted":  # the first mount is unharmed
        (mnt / "x").write_bytes(b"still works")
        assert (mnt / "x").read_bytes() == b"still works"


def test_missing_dev_fuse_is_a_clear_config_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/fuse cannot be removed safely here: check the message path of check_mountpoint."""
    from ckptfs.common.errors import ConfigError
    from ckptfs.daemon import mount

    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists",
                        lambda p: False if p == "/dev/fuse" else real_exists(p))
    with pytest.raises(ConfigError) as e:
        mount.check_mountpoint(str(tmp_path))
    message = str(e.value)
    assert "/dev/fuse is missing" in message and "\n" not in message


# ---------------------------------------------------------------------------- 5. disk full
@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (a small disk for the cache), always unmounted."""
    import subprocess

    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(path)], check=True)
    try:
        yield path
    finally:
        r = subprocess.run(["umount", str(path)], capture_output=True, check=False)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "tmpfs-cache", "64m") as d:
        yield d


def used_bytes(path: Path) -> int:
    s = os.statvfs(path)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def test_a_save_larger_than_the_cache_disk_stays_within_cache_size(
        seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """A 160 MiB cache disk, --cache-size 64M and a 300 MiB torch.save on S3: chunks of
    the open file leave the cache once uploaded, so the save succeeds, the cache stays
    near its limit, status never says durable while the file is open, and a fresh node
    loads identical tensors."""
    import torch

    from ckptfs.daemon.control import request

    url = f"s3://{seaweed.new_bucket()}/job"
    limit = 64 * MiB
    with tmpfs(tmp_path / "cache-disk", "160m") as disk:
        a = Mount(url, tmp_path, "a", extra=["--endpoint-url", seaweed.endpoint,
                                             "--cache-size", "64M"])
        a.cache = disk
        nodes.append(a)
        a.mount()
        sock = os.getxattr(a.path, "user.ckptfs.control").decode()
        peaks = {"cache_bytes": 0, "disk": 0}
        durable_while_open: list[dict[str, Any]] = []
        saving = threading.Event()
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                st = next(request(sock, "status"))
                peaks["cache_bytes"] = max(peaks["cache_bytes"], st["cache_bytes"])
                peaks["disk"] = max(peaks["disk"], used_bytes(disk))
                if saving.is_set() and st["durable"]:
                    durable_while_open.append(st)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        tensor = torch.randn(75 * MiB)  # 300 MiB of float32
        try:
            with open(a / "big.pt", "wb") as f:
                f.write(b"")  # the file is open with data from here until the with ends
                saving.set()
                torch.save({"w": tensor}, f)
                time.sleep(0.3)
                saving.clear()
        finally:
            stop.set()
            watcher.join()
        assert durable_while_open == [], durable_while_open[0]
        # measured: the limit plus a few hundred bytes (the zip header before the tensor)
        assert peaks["cache_bytes"] <= limit + 16 * MiB, peaks
        assert peaks["disk"] < limit + 32 * MiB, peaks
        assert a.umount().returncode == 0
        assert "Traceback" not in (disk / "ckptfs.log").read_text()
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
    loaded = torch.load(b / "big.pt")
    assert torch.equal(loaded["w"], tensor)
    b.umount()


def free_bytes(path: Path) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def fill(path: Path, limit: int = 100 * MiB) -> tuple[OSError | None, int]:
    """Write `path` in 1 MiB pieces until a write fails: (that error, bytes written)."""
    piece = random_bytes(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    failure: OSError | None = None
    written = 0
    try:
        while written < limit:
            written += os.write(fd, piece)
    except OSError as e:
        failure = e
    finally:
        try:
            os.close(fd)
        except OSError as e:  # the journal may not have room to record the close either
            assert e.errno in (errno.ENOSPC, errno.EIO), e
    return failure, written


def test_full_cache_disk_gives_enospc_and_recovers(
        small_tmpfs: Path, local_store_dir: Path, tmp_path: Path, nodes: Nodes) -> None:
    """A 64 MiB cache disk: a 100 MiB file fails with ENOSPC; once it is deleted, the mount
    works again, and everything that was acknowledged reaches the store intact."""
    store = str(local_store_dir)
    a = Mount(store, tmp_path, "a", extra=["--chunk-size", "1M"])
    a.cache = small_tmpfs  # the cache directory is the whole small disk
    nodes.append(a)
    a.mount()
    kept = {f"keep{i}.bin": random_bytes(4 * MiB) for i in range(3)}
    for name, data in kept.items():
        (a / name).write_bytes(data)
    run_cli("sync", str(a.path))  # (uploads finishing on the full disk: the next test)
    failure, written = fill(a / "big.bin")
    assert failure is not None and failure.errno == errno.ENOSPC, (failure, written)
    assert written < 64 * MiB
    assert is_mounted(a.path) and status(a)["pid"] == a.pid
    problems = []
    try:  # the obvious way out: remove the file that filled the disk
        os.unlink(a / "big.bin")
    except OSError as e:
        problems.append(f"unlink of the file that filled the cache failed: {e!r} (the "
                        f"daemon dropped the entry anyway, but keeps its staging file while "
                        f"the kernel holds the inode: the space is not freed)")
    if not problems:
        wait_until(lambda: free_bytes(small_tmpfs) > 32 * MiB, 10, "the cache space is freed")
    else:  # the space stays taken until the kernel forgets the inode: remount instead
        assert a.umount().returncode == 0  # what was closed before is in the store
        a.mount()
        assert free_bytes(small_tmpfs) > 32 * MiB
        assert not os.path.lexists(a / "big.bin")
    fresh = random_bytes(4 * MiB + 5)
    (a / "after.bin").write_bytes(fresh)
    assert (a / "after.bin").read_bytes() == fresh
    for name, data in kept.items():
        assert (a / name).read_bytes() == data
    assert a.umount().returncode == 0
    log = (small_tmpfs / "ckptfs.log").read_text()
    assert "write: the cache directory is full" in log, log[-3000:]
    b = nodes.mount(store, tmp_path, "b")
    assert sorted(os.listdir(b.path)) == ["after.bin", *sorted(kept)]
    assert (b / "after.bin").read_bytes() == fresh
    for name, data in kept.items():
        assert (b / name).read_bytes() == data
    b.umount()
    assert not problems, problems


def test_uploads_finishing_on_a_full_cache_disk_keep_the_mount_alive(
        small_tmpfs: Path, proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path,
        nodes: Nodes) -> None:
    """Closed files whose uploads are slow (held by the server) when the cache disk fills
    up: when those uploads then finish, recording them in the journal fails (disk full).
    The mount must survive that: still mounted, the daemon alive, the data in the store."""
    url = f"s3://{seaweed.new_bucket()}/job"
    a = Mount(url, tmp_path, "a", extra=["--endpoint-url", proxy.endpoint, "--chunk-size",
                                         "1M"])
    a.cache = small_tmpfs
    nodes.append(a)
    a.mount()
    proxy.hold(lambda m, p: m == "PUT" and "/chunks/" in p)
    kept = {f"keep{i}.bin": random_bytes(4 * MiB) for i in range(2)}
    for name, data in kept.items():
        (a / name).write_bytes(data)  # closed: journaled, uploads hanging
    failure, _ = fill(a / "big.bin")
    assert failure is not None and failure.errno == errno.ENOSPC, failure
    proxy.release()  # the uploads finish while the cache disk is still full

    def landed() -> bool:
        r = run_cli("status", str(a.path), "--json", check=False)
        return r.returncode != 0 or json.loads(r.stdout)["pending_chunks"] == 0

    wait_until(landed, 30, "the held uploads landed (or the daemon died)")
    time.sleep(1)
    r = run_cli("status", str(a.path), "--json", check=False)
    assert r.returncode == 0 and is_mounted(a.path), (
        f"the mount is gone: the daemon died on the full cache disk ({r.stderr.strip()})")
    for name, data in kept.items():
        assert (a / name).read_bytes() == data


def test_a_chunk_lost_in_the_cache_fails_umount_naming_the_file(
        proxy: FaultProxy, seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """The daemon dies before a closed file's chunks are uploaded, and its staged bytes
    are damaged meanwhile. The next mount cannot upload that chunk: status, the log and
    umount must say which file lost data (umount exits 1), at every mount, until the file
    is rewritten. A training script's ckptfs.wait_durable on the file or its directory
    raises DataLostError naming it, and ckptfs.state still says what it can."""
    url = f"s3://{seaweed.new_bucket()}/job"
    a = nodes.mount(url, tmp_path, "a", "--endpoint-url", proxy.endpoint,
                    "--chunk-size", "1M")
    proxy.hold(lambda m, p: m == "PUT" and "/chunks/" in p)
    data = random_bytes(3 * MiB)
    os.mkdir(a / "step-1")
    (a / "step-1" / "model.pt").write_bytes(data)
    a.kill()
    proxy.release()
    [staging] = os.listdir(a.cache / "staging")
    with open(a.cache / "staging" / staging, "r+b") as f:
        f.seek(MiB + 1)
        f.write(bytes([f.read(1)[0] ^ 1]))
    a.mount()
    run_cli("sync", str(a.path))
    st = status(a)
    assert not st["durable"], st
    assert any(e.startswith("DATA LOST: step-1/model.pt: chunk ") for e in st["errors"]), st
    assert "step-1/model.pt" in run_cli("status", str(a.path)).stdout
    raised = training(f"""
out = []
for where in ({str(a / "step-1" / "model.pt")!r}, {str(a / "step-1")!r}):
    try:
        ckptfs.wait_durable(where, timeout=30)
    except ckptfs.DataLostError as e:
        out.append([type(e).__name__, str(e), e.problems])
print(json.dumps(out))
""")
    assert len(raised) == 2, raised
    for name, message, problems in raised:
        assert name == "DataLostError" and "data lost" in message and "\n" not in message
        assert "step-1/model.pt" in message and problems and "DATA LOST" in problems[0]
    r = run_cli("umount", str(a.path), check=False)
    assert r.returncode == 1 and not is_mounted(a.path), r.stderr
    *progress, last = r.stderr.strip().splitlines()
    assert all(line.startswith("sync [") for line in progress), r.stderr
    assert last.startswith("ckptfs: ") and "Traceback" not in r.stderr, r.stderr
    assert "lost data" in last and "step-1/model.pt" in last, last
    log = (a.cache / "ckptfs.log").read_text()
    assert "DATA LOST: step-1/model.pt" in log and "Traceback" not in log
    a.mount()  # still said on the next mount, until the file is rewritten
    assert any("step-1/model.pt" in e for e in status(a)["errors"])
    (a / "step-1" / "model.pt").write_bytes(data)
    assert a.umount().returncode == 0
    b = nodes.mount(url, tmp_path, "b", "--endpoint-url", seaweed.endpoint)
    assert (b / "step-1" / "model.pt").read_bytes() == data
    b.umount()


# ---------------------------------------------------------------------------- 6. corruption
@pytest.mark.parametrize("damage", ["flip", "truncate", "s3-flip"])
def test_corrupt_chunk_in_the_store_gives_eio_never_wrong_bytes(
        damage: str, local_store_dir: Path, tmp_path: Path, nodes: Nodes,
        seaweed: SeaweedServer) -> None:
    """A chunk object flipped or truncated in the store after the file is durable: a fresh
    node's reads of that chunk fail with EIO at once (bytes before it are right), the log
    names file, chunk and writer, and fsck/verify --deep exit 1 naming the chunk."""
    if damage.startswith("s3"):
        bucket = seaweed.new_bucket()
        store, extra = f"s3://{bucket}/job", ["--endpoint-url", seaweed.endpoint]
    else:
        store, extra = str(local_store_dir), []
    a = nodes.mount(store, tmp_path, "a", *extra, "--chunk-size", "1M")
    data = random_bytes(3 * MiB + 100)
    (a / "model.bin").write_bytes(data)
    assert a.umount().returncode == 0
    if damage.startswith("s3"):
        body = seaweed.s3.get_object(Bucket=bucket, Key="job/files/model.bin")["Body"].read()
        victim = json.loads(body)["chunks"][1][0]
        key = f"job/chunks/{victim[:2]}/{victim}"
        blob = bytearray(seaweed.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        blob[len(blob) // 2] ^= 0x01
        seaweed.s3.put_object(Bucket=bucket, Key=key, Body=bytes(blob))
    else:
        manifest = json.loads((local_store_dir / "files" / "model.bin%o").read_bytes())
        victim = manifest["chunks"][1][0]  # bytes [1 MiB, 2 MiB) of the file
        obj = local_store_dir / "chunks" / victim[:2] / f"{victim}%o"
        blob = bytearray(obj.read_bytes())
        if damage == "flip":
            blob[len(blob) // 2] ^= 0x01
            obj.write_bytes(bytes(blob))
        else:
            obj.write_bytes(bytes(blob[:len(blob) // 2]))

    # a long wait for missing chunks: a read that waited for the bad chunk (instead of
    # failing at once) would take a minute, far above the bound below
    b = nodes.mount(store, tmp_path, "b", *extra, "--missing-chunk-timeout", "60")

    def read_range(fd: int, offset: int, size: int) -> str:
        """Read [offset, offset+size) like a loader: every byte returned must be right
        (a short read before the bad chunk is fine); 'EIO' or 'ok' at the end."""
        end = offset + size
        while offset < end:
            try:
                got = os.pread(fd, end - offset, offset)
            except OSError as e:
                assert e.errno == errno.EIO, e
                return "EIO"
            assert got, f"unexpected end of file at {offset}"
            assert got == data[offset:offset + len(got)], f"WRONG bytes at {offset}"
            offset += len(got)
        return "ok"

    with open(b / "model.bin", "rb", buffering=0) as f:
        fd = f.fileno()
        assert read_range(fd, 0, MiB) == "ok"  # the intact chunks read fine
        assert read_range(fd, 2 * MiB, MiB + 100) == "ok"
        for offset, size in ((MiB, 4096), (MiB + 12345, 100), (MiB - 10, 20), (0, 3 * MiB),
                             (MiB, 4096)):
            start = time.monotonic()
            assert read_range(fd, offset, size) == "EIO", (offset, size)
            assert time.monotonic() - start < 20  # at once, not after the wait
    with pytest.raises(OSError) as e:
        (b / "model.bin").read_bytes()
    assert e.value.errno == errno.EIO
    r = run_cli("umount", str(b.path))
    log = (b.cache / "ckptfs.log").read_text()
    assert "read of model.bin failed" in log and victim in log and "node a-mnt" in log, log
    r = run_cli("fsck", store, "--deep", *extra, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert victim in r.stdout and "model.bin" in r.stdout, r.stdout
    r = run_cli("verify", store, "--deep", *extra, check=False)
    assert r.returncode == 1 and "model.bin" in r.stdout and victim in r.stdout, r.stdout
    if damage.startswith("s3"):
        seaweed.drop_bucket(bucket)


def test_damaged_read_cache_is_fetched_again_after_a_remount(
        seaweed: SeaweedServer, tmp_path: Path, nodes: Nodes) -> None:
    """Chunks in a node's read cache are damaged while it is unmounted (a flipped byte,
    a file cut short), raw and lz4-stored chunks alike: mounted again on the same cache
    directory, the node reads the file exactly, fetching only the damaged chunks again."""
    url = f"s3://{seaweed.new_bucket()}/job"
    extra = ["--endpoint-url", seaweed.endpoint, "--chunk-size", "1M"]
    a = nodes.mount(url, tmp_path, "a", *extra)
    raw, lz4 = random_bytes(MiB), b"layer.0.weight " * (MiB // 15)
    lz4 += b"." * (MiB - len(lz4))
    # chunks: raw (flipped), raw (cut), lz4 (flipped), lz4 (cut), raw and lz4 (intact)
    blocks = [raw[:-1] + bytes([i]) if i in (0, 1, 4) else lz4[:-1] + bytes([i])
              for i in range(6)]
    data = b"".join(blocks) + b"tail"
    (a / "model.bin").write_bytes(data)
    a.umount()
    # (with --read-memory 0 every fetched chunk goes to the read cache on disk; by
    # default a chunk read once is dropped from memory, and never written there)
    b = nodes.mount(url, tmp_path, "b", *extra, "--read-memory", "0")
    assert (b / "model.bin").read_bytes() == data  # fills b's read cache
    b.umount()
    from ckptfs.format.codec import chunk_hash

    hashes = [chunk_hash(c) for c in blocks]
    bucket, prefix = url[5:].split("/")
    sizes = [seaweed.s3.head_object(Bucket=bucket, Key=f"{prefix}/chunks/{h[:2]}/{h}")
             ["ContentLength"] for h in hashes]
    assert [n == MiB + 16 for n in sizes] == [True, True, False, False, True, False], sizes
    cached = {i: b.cache / "chunks" / h[:2] / h for i, h in enumerate(hashes)}
    assert all(p.exists() for p in cached.values())
    for i in (0, 2):  # a flipped bit
        blob = bytearray(cached[i].read_bytes())
        blob[12345] ^= 0x10
        cached[i].write_bytes(bytes(blob))
    for i in (1, 3):  # cut short
        cached[i].write_bytes(cached[i].read_bytes()[:MiB // 2])
    b.mount()
    assert (b / "model.bin").read_bytes() == data
    st = status(b)
    assert st["fetched_bytes"] == 4 * MiB, st  # the damaged ones, and only those
    b.umount()
    log = (b.cache / "ckptfs.log").read_text()
    assert log.count("is damaged") == 4, log


# ---------------------------------------------------------------------------- 7. security
NOBODY = 65534


def as_nobody(fn: Callable[[], object]) -> object:
    """Run `fn` in a forked child with uid/gid 65534 and no groups; its result (JSON)."""
    return run_as(NOBODY, NOBODY, [], fn)


def try_call(fn: Callable[[], object]) -> object:
    try:
        return ["ok", fn()]
    except OSError as e:
        return ["errno", errno.errorcode.get(e.errno or 0, str(e.errno))]


def cli_error(fn: Callable[[], object]) -> object:
    """The message of the CliError that `fn` raises (or what it returned)."""
    from ckptfs.cli.errors import CliError

    try:
        return ["returned", fn()]
    except CliError as e:
        return str(e)


def ask_socket(path: str) -> object:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b'{"cmd": "status"}\n')
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data) if data else None


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may traverse (pytest's tmp_path is private to root)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="ckptfs-faults-"))
    d.chmod(0o755)
    yield d
    for p in d.iterdir():
        if p.name.endswith("-mnt"):
            from mounting import lazy_unmount
            lazy_unmount(p)
    shutil.rmtree(d, ignore_errors=True)


def test_cache_control_socket_and_mount_are_private(
        open_dir: Path, local_store_dir: Path, nodes: Nodes) -> None:
    """Cache dir 0700 and its files 0600; another user can neither read the cache, nor use
    the control socket, nor enter the mount (default_permissions, no allow_other)."""
    from ckptfs.cli import control

    a = nodes.mount(str(local_store_dir), open_dir, "a")
    (a / "weights.bin").write_bytes(b"secret weights" * 1000)

    def mode(p: Path) -> str:
        return oct(os.stat(p).st_mode & 0o7777)

    assert mode(a.cache) == "0o700"
    sock = a.cache / "ctl.sock"
    assert os.getxattr(a.path, "user.ckptfs.control").decode() == str(sock)
    for name in ("journal.sqlite", "ctl.sock", "ckptfs.log", "lock"):
        assert mode(a.cache / name) == "0o600", name
    for name in ("journal.sqlite-wal", "journal.sqlite-shm"):
        if (a.cache / name).exists():
            assert mode(a.cache / name) == "0o600", name
    for name in ("staging", "chunks"):
        assert mode(a.cache / name) == "0o700", name
    for st in (a.cache / "staging").iterdir():
        assert mode(st) == "0o600", st
    with open("/proc/mounts") as f:
        [options] = [line.split()[3].split(",") for line in f
                     if line.split()[1] == str(a.path)]
    assert "default_permissions" in options and "allow_other" not in options, options

    seen = as_nobody(lambda: {
        "cache": try_call(lambda: os.listdir(a.cache)),
        "staging": try_call(lambda: os.listdir(a.cache / "staging")),
        "socket": try_call(lambda: ask_socket(str(sock))),
        "mount": try_call(lambda: os.listdir(a.path)),
        "file": try_call(lambda: (a / "weights.bin").read_bytes()[:5].decode()),
    })
    assert seen == {"cache": ["errno", "EACCES"], "staging": ["errno", "EACCES"],
                    "socket": ["errno", "EACCES"], "mount": ["errno", "EACCES"],
                    "file": ["errno", "EACCES"]}, seen
    # even with the file modes loosened, the daemon answers only its owner (SO_PEERCRED)
    os.chmod(a.cache, 0o711)
    os.chmod(sock, 0o666)
    try:
        seen = as_nobody(lambda: try_call(lambda: ask_socket(str(sock))))
        said = as_nobody(lambda: cli_error(lambda: next(control.request(str(a.path), "status",
                                                                        str(sock)))))
    finally:
        os.chmod(sock, 0o600)
        os.chmod(a.cache, 0o700)
    assert seen == ["ok", {"error": "permission denied"}], seen
    assert said == f"the ckptfs daemon of {a.path}: permission denied", said  # the CLI
    assert status(a)["pid"] == a.pid  # and still answers root
    assert a.umount().returncode == 0


def test_unsafe_names_and_manifests_in_the_store_are_ignored(
        local_store_dir: Path, tmp_path: Path, nodes: Nodes) -> None:
    """Keys and manifests crafted in the store to escape (a '..' name, a chunk named
    '../../etc/passwd', a rename intent out of the tree) are refused; the mount goes on."""
    root = local_store_dir
    a = nodes.mount(str(root), tmp_path, "a", "--chunk-size", "1M")
    good = random_bytes(MiB + 7)
    (a / "good.bin").write_bytes(good)
    (a / "sub").mkdir()
    assert a.umount().returncode == 0
    template = json.loads((root / "files" / "good.bin%o").read_bytes())

    def manifest(**changes: object) -> bytes:
        return json.dumps({**template, **changes}).encode()

    files = root / "files"
    (files / "..%o").write_bytes(manifest())  # key files/.. : the name '..'
    (files / "sub" / "..%o").write_bytes(manifest())  # files/sub/..
    (files / ".%o").write_bytes(manifest())  # files/.
    (files / "evil.bin%o").write_bytes(manifest(chunks=[["../../etc/passwd", MiB + 7]]))
    (files / "evil2.bin%o").write_bytes(manifest(
        chunks=[["../" + template["chunks"][0][0][3:], MiB], template["chunks"][1]]))
    (files / "bad-size.bin%o").write_bytes(manifest(size=10**15))
    (files / "garbage.bin%o").write_bytes(b"\x00\xff not json")
    (files / "..%2f..%2fetc%o").write_bytes(manifest())  # an odd but harmless name
    (root / "intents").mkdir()
    (root / "intents" / "evil.json%o").write_text(json.dumps(
        {"v": 1, "op": "rename_dir", "src": "../..", "dst": "stolen", "writer": "x"}))
    (root / "intents" / "evil2.json%o").write_text(json.dumps(
        {"v": 1, "op": "rename_dir", "src": "sub", "dst": "../../outside", "writer": "x"}))
    before = sorted(p.name for p in tmp_path.iterdir())
    # the objects an intent acted on would change: the intents themselves (deleted when
    # done) and the directory marker of `sub` (moved by evil2)
    watched = {key: LocalStore(root).get(key) for key in (
        "intents/evil.json", "intents/evil2.json", manifests.dir_key("sub"))}

    b = nodes.mount(str(root), tmp_path, "b", "--missing-chunk-timeout", "2")
    # the mount rolled every intent forward before it answered: none was acted on
    assert {key: LocalStore(root).get(key) for key in watched} == watched
    assert LocalStore(root).list("intents/").objects == [
        ("intents/evil.json", len(watched["intents/evil.json"])),
        ("intents/evil2.json", len(watched["intents/evil2.json"]))]
    names = sorted(os.listdir(b.path))
    # '..%2f..%2fetc' is no escaped name LocalStore writes: listed, unsafe, left out; the
    # damaged manifests are listed, and give EIO
    damaged = ["bad-size.bin", "evil.bin", "evil2.bin", "garbage.bin"]
    assert names == [*damaged, "good.bin", "sub"], names
    assert os.listdir(b / "sub") == []
    for bad in damaged:
        with pytest.raises(OSError) as e:
            open(b / bad, "rb")
        assert e.value.errno == errno.EIO, (bad, e.value)
    assert (b / "good.bin").read_bytes() == good
    (b / "sub" / "new.bin").write_bytes(b"new")
    assert (b / "sub" / "new.bin").read_bytes() == b"new"
    assert status(b)["pid"] == b.pid  # the daemon is alive and well
    assert b.umount().returncode == 0
    log = (b.cache / "ckptfs.log").read_text()
    assert "unsafe" in log and "damaged manifest" in log, log
    assert "damaged rename intent" in log
    after = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("b-"))
    assert after == before  # nothing written outside the store
    # still left alone after the unmount, not acted on
    assert {key: LocalStore(root).get(key) for key in watched} == watched
