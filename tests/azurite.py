"""Run Azurite (the Azure Blob Storage emulator, npm `azurite`) on a free loopback port."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

from azure.storage.blob import ContainerClient
from seaweed import HOST, _die_with_parent, free_ports

#: Azurite's documented development account and key (public, the same everywhere)
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
       "KBHBeksoGMGw==")
#: where scripts/setup.sh installs it (npm install --prefix .tools)
TOOLS = Path(__file__).resolve().parent.parent / ".tools" / "node_modules" / ".bin"


def azurite_binary() -> str:
    """The `azurite-blob` executable: installed by scripts/setup.sh, or on PATH."""
    local = TOOLS / "azurite-blob"
    found = str(local) if local.exists() else shutil.which("azurite-blob")
    if not found:
        raise RuntimeError("Azurite not found: run scripts/setup.sh (npm install --prefix "
                           ".tools azurite)")
    return found


class AzuriteServer:
    """One `azurite-blob` process (disk persistence under `workdir`), stopped by pid."""

    def __init__(self, workdir: Path, start_timeout: float = 30.0) -> None:
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "azurite.log"
        self.start_timeout = start_timeout
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The blob endpoint URL (the account is the first path segment)."""
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint};")

    def command(self) -> list[str]:
        return [
            azurite_binary(), "--blobHost", HOST, "--blobPort", str(self.port),
            "--location", str(self.workdir / "data"), "--skipApiVersionCheck",
            "--disableTelemetry", "--silent", "--loose",
        ]

    def start(self) -> None:
        """Start Azurite and wait until its blob service answers."""
        if self.proc is not None:
            raise RuntimeError("Azurite is already running")
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, preexec_fn=_die_with_parent if on_main_thread else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"azurite exited with {self.proc.returncode}; see "
                                   f"{self.log_path}")
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
                conn.request("GET", f"/{ACCOUNT}?comp=list")
                conn.getresponse().read()  # any HTTP answer: it listens
                conn.close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Azurite not ready after {self.start_timeout}s: {e}; "
                                       f"see {self.log_path}") from e
                time.sleep(0.1)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server by pid: SIGTERM, then SIGKILL after `timeout` seconds."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def container_client(self, name: str) -> ContainerClient:
        return ContainerClient.from_connection_string(self.connection_string, name)

    def new_container(self) -> str:
        """Create a container with a fresh unique name and return the name."""
        name = f"ckptfs-{uuid.uuid4().hex[:16]}"
        self.container_client(name).create_container()
        return name

    def drop_container(self, name: str) -> None:
        """Delete a container with everything in it."""
        self.container_client(name).delete_container()
