"""The control socket's blocking client (no trio): one request, the daemon's JSON answers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any


def request(path: str, cmd: str, timeout: float | None = 10.0, **args: Any) -> Iterator[Any]:
    """Yield each JSON answer of the daemon at socket `path` to {"cmd": cmd, **args}."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield json.loads(line)
