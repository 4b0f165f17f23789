"""Run Azurite (the Azure Blob Storage emulator, npm `azurite`) on a free loopback port."""

from __future__ import annotations

import http.client
import shutil
import uuid
from pathlib import Path

from azure.storage.blob import ContainerClient
from emulator import EmulatorProcess
from seaweed import HOST

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


class AzuriteServer(EmulatorProcess):
    """One `azurite-blob` process (disk persistence under `workdir`), stopped by pid."""

    name = "Azurite"
    log_name = "azurite.log"

    @property
    def endpoint(self) -> str:
        """The blob endpoint URL (the account is the first path segment)."""
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint};")

    def command(self) -> list[str]:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        return [
            azurite_binary(), "--blobHost", HOST, "--blobPort", str(self.port),
            "--location", str(self.workdir / "data"), "--skipApiVersionCheck",
            "--disableTelemetry", "--silent", "--loose",
        ]

    def probe(self) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
        try:
            conn.request("GET", f"/{ACCOUNT}?comp=list")
            conn.getresponse().read()  # any HTTP answer: it listens
        finally:
            conn.close()

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
