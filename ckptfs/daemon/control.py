"""The control socket (<cache>/ctl.sock, mode 0600): status, sync, latest and warmup for
the CLI and the Python API.

Protocol: the client sends one JSON line {"cmd": "status"}, {"cmd": "sync"} or {"cmd":
"latest", "dir": DIR, "pattern": PATTERN}; the server answers JSON lines. `status`
answers once. `sync` answers a status line every half second until everything closed
before the request is in the store (later saves do not delay it), then {"done": true,
...}; with "fast": true, until it is in the fast tier (--fast-tier). `latest` answers
{"latest": PATH or null}: the newest complete checkpoint directory under DIR (both
relative to the filesystem root), as `ckptfs latest` finds it in the store; or {"error":
...}. `warmup` ({"cmd": "warmup", "target": PATH, "wait": BOOL}) starts fetching the
chunks of the file or directory PATH into this node's cache (warmup.py), in a job that
outlives the request; it answers {"started": PROGRESS} at once without "wait", else
{"progress": PROGRESS} every half second and {"done": true, "warmup": PROGRESS} once the
job has ended; or {"error": ...} (no such path in the store).
Only the mount's owner (or root) may connect (checked with SO_PEERCRED).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ckptfs.common.redact import redact
from ckptfs.daemon.client import request as request  # the client, re-exported
from ckptfs.pipeline.warmup import WarmupProgress

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.5


class ControlServer:
    """Serves status/sync/latest requests in the mount's nursery."""

    def __init__(self, path: str, status: Callable[[], dict[str, Any]],
                 sync_target: Callable[[], Any], reached: Callable[[Any], bool],
                 changed: Callable[[], Any],
                 latest: Callable[[str, str], Awaitable[str | None]],
                 reached_fast: Callable[[Any], bool] | None = None,
                 warmup: Callable[[str], Awaitable[WarmupProgress]] | None = None) -> None:
        self.path = path
        self.status = status
        self.sync_target = sync_target  # what is journaled now
        self.reached = reached  # is that target in the store?
        self.changed = changed  # async: returns after the next upload progress
        self.latest = latest  # async (dir, pattern): the newest complete checkpoint, or None
        #: is that target in the fast tier (--fast-tier; else: reached)
        self.reached_fast = reached_fast or reached
        self.warmup = warmup  # async (path): a warm-up job started

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with contextlib.suppress(FileNotFoundError):  # a socket a killed daemon left
            os.unlink(self.path)  # (in a private directory: the link itself, if one)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            await sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()
        try:
            await trio.serve_listeners(self._handle, [listener])
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _allowed(self, stream: trio.SocketStream) -> bool:
        creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                         struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        return uid in (0, os.getuid())

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                if not self._allowed(stream):
                    # read the request first: closing before the client has sent it would
                    # give the client EPIPE instead of this answer
                    with trio.move_on_after(1):
                        await self._read_line(stream)
                    await self._send(stream, {"error": "permission denied"})
                    return
                line = await self._read_line(stream)
                req = json.loads(line)
                cmd = req.get("cmd")
                if cmd == "status":
                    await self._send(stream, self.status())
                elif cmd == "sync":
                    target = self.sync_target()
                    reached = self.reached_fast if req.get("fast") else self.reached
                    while not reached(target):
                        await self._send(stream, {"progress": self.status()})
                        with trio.move_on_after(PROGRESS_INTERVAL):
                            await self.changed()
                    await self._send(stream, {"done": True, "status": self.status()})
                elif cmd == "latest":
                    await self._send(stream, await self._latest(req))
                elif cmd == "warmup" and self.warmup is not None:
                    await self._warmup(stream, req)
                else:
                    await self._send(stream, {"error": f"unknown command {cmd!r}"})
            except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError) as e:
                log.debug("control connection ended: %s", e)

    async def _latest(self, req: dict[str, Any]) -> dict[str, Any]:
        where, pattern = req.get("dir", ""), req.get("pattern", "*")
        if not isinstance(where, str) or not isinstance(pattern, str):
            return {"error": "latest: 'dir' and 'pattern' must be strings"}
        try:
            return {"latest": await self.latest(where, pattern)}
        except Exception as e:  # the store's error, a bad pattern: the client's to report
            log.warning("latest %r %r: %s", where, pattern, e)
            return {"error": redact(" ".join(str(e).split())) or type(e).__name__}

    async def _warmup(self, stream: trio.SocketStream, req: dict[str, Any]) -> None:
        path = req.get("target", "")
        if not isinstance(path, str) or self.warmup is None:
            await self._send(stream, {"error": "warmup: 'target' must be a string"})
            return
        try:
            job = await self.warmup(path)
        except Exception as e:  # the store's error, no such path: the client's to report
            log.warning("warmup %r: %s", path, e)
            await self._send(stream, {"error": redact(" ".join(str(e).split()))
                                      or type(e).__name__})
            return
        if not req.get("wait"):
            await self._send(stream, {"started": job.answer()})
            return
        while job.state == "running":
            await self._send(stream, {"progress": job.answer()})
            await trio.sleep(PROGRESS_INTERVAL)
        await self._send(stream, {"done": True, "warmup": job.answer()})

    @staticmethod
    async def _read_line(stream: trio.SocketStream) -> bytes:
        data = b""
        while not data.endswith(b"\n") and len(data) < 65536:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
        return data

    @staticmethod
    async def _send(stream: trio.SocketStream, obj: dict[str, Any]) -> None:
        await stream.send_all(json.dumps(obj).encode() + b"\n")
