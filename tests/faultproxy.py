"""FaultProxy: an HTTP proxy on the loopback in front of an object store's server (S3,
Azurite, fake-gcs-server) that injects faults (503 SlowDown, held or delayed requests),
can cap the bandwidth (a store slower than the node, as a real one is) and records every
request it saw."""

from __future__ import annotations

import http.client
import http.server
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

Match = Callable[[str, str], bool]  # (method, path) -> does the fault apply?


def never(method: str, path: str) -> bool:
    return False


def is_chunk(method: str, path: str) -> bool:
    """A request for a chunk object."""
    return "/chunks/" in path


def chunk_put(method: str, path: str) -> bool:
    return method == "PUT" and "/chunks/" in path


@dataclass
class Request:
    """One request the proxy answered: when it came and left, and what it got."""

    method: str
    path: str
    start: float  # time.monotonic()
    end: float = 0.0
    status: int = 0  # 0 while in progress; 503 when a SlowDown was injected


class FaultProxy:
    """An HTTP proxy on the loopback in front of an S3 server that injects S3 faults.

    Requests pass through unchanged (the Host header too, so SigV4 signatures still match).
    `throttle(p, match, first)` answers 503 SlowDown to the first `first` tries of every
    matching request (same method and path) and then to a fraction `p` of them (seeded);
    `refuse(status, body, match)` answers every matching request with that status and
    JSON body instead (401/403: credentials the server does not accept);
    `hold(match)` keeps matching requests waiting until `release()`; `delay(s, match)`
    forwards matching requests `s` seconds late. `log` records every request (`Request`),
    `injected` the (method, path) of each 503 sent, `held` how many requests were held.
    """

    SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                b'<Message>Please reduce your request rate.</Message></Error>')
    HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                     "expect", "te", "upgrade"})

    def __init__(self, upstream: str, seed: int = 1) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.p = 0.0
        self.first = 0
        self.tries: dict[tuple[str, str], int] = {}
        self.throttle_match: Match = never
        self.hold_match: Match = never
        self.delay_match: Match = never
        self.delay_seconds = 0.0
        self.refuse_match: Match = never
        self.refusal = (0, b"")  # (status, JSON body) of refuse()
        self.released = threading.Event()
        self.released.set()
        self.injected: list[tuple[str, str]] = []
        self.log: list[Request] = []
        self.held = 0
        self.requests = 0
        self.rate = 0.0  # bytes per second through the proxy, both ways together (0: no cap)
        self.free_at = 0.0  # when the capped link is free again (monotonic)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def limit_bandwidth(self, bytes_per_second: float) -> None:
        """Cap the bytes of request and response bodies, all connections sharing one link."""
        self.rate = bytes_per_second

    def _pace(self, nbytes: int) -> None:
        """Wait until `nbytes` more have gone through the capped link."""
        if not self.rate or not nbytes:
            return
        with self.lock:
            self.free_at = max(time.monotonic(), self.free_at) + nbytes / self.rate
            done = self.free_at
        time.sleep(max(0.0, done - time.monotonic()))

    def throttle(self, p: float, match: Match, first: int = 0) -> None:
        with self.lock:
            self.p, self.throttle_match, self.first = p, match, first
            self.tries.clear()

    def refuse(self, status: int, body: bytes, match: Match) -> None:
        with self.lock:
            self.refusal, self.refuse_match = (status, body), match

    def hold(self, match: Match) -> None:
        with self.lock:
            self.hold_match = match
            self.released.clear()

    def release(self) -> None:
        with self.lock:
            self.hold_match = never
            self.released.set()

    def delay(self, seconds: float, match: Match) -> None:
        with self.lock:
            self.delay_seconds, self.delay_match = seconds, match

    def intervals(self, match: Match, status: int | None = 200) -> list[tuple[float, float]]:
        """(start, end) of the finished requests that `match` (support.max_overlap)."""
        return [(r.start, r.end) for r in self.requests_where(match, status)]

    def requests_where(self, match: Match, status: int | None = None) -> list[Request]:
        """The requests logged so far that `match` (and got `status`, if given)."""
        with self.lock:
            return [r for r in self.log if match(r.method, r.path)
                    and (status is None or r.status == status)]

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        method, path = h.command, h.path
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        request = Request(method, path, time.monotonic())
        with self.lock:
            self.requests += 1
            self.log.append(request)
            throttled = False
            if self.throttle_match(method, path):
                n = self.tries[method, path] = self.tries.get((method, path), 0) + 1
                throttled = n <= self.first or self.random.random() < self.p
            if throttled:
                self.injected.append((method, path))
            refused = not throttled and self.refuse_match(method, path)
            holding = not throttled and not refused and self.hold_match(method, path)
            if holding:
                self.held += 1
            delay = self.delay_seconds if self.delay_match(method, path) else 0.0
        try:
            if throttled:
                request.status = 503
                self._answer(h, 503, "application/xml", self.SLOWDOWN)
                return
            if refused:
                request.status, body = self.refusal
                self._answer(h, request.status, "application/json", body)
                return
            if holding:
                self.released.wait(60)
            if delay:
                time.sleep(delay)
            self._pace(len(body))
            request.status = self._forward(h, method, path, body)
        finally:
            request.end = time.monotonic()

    @staticmethod
    def _answer(h: http.server.BaseHTTPRequestHandler, status: int, content_type: str,
                body: bytes) -> None:
        """Answer the request here, without forwarding it."""
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _forward(self, h: http.server.BaseHTTPRequestHandler, method: str, path: str,
                 body: bytes) -> int:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in h.headers.items():
                if k.lower() not in self.HOP:
                    conn.putheader(k, v)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        h.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in self.HOP and (k.lower() != "content-length" or method == "HEAD"):
                h.send_header(k, v)
        if method != "HEAD":
            h.send_header("Content-Length", str(len(data)))
            self._pace(len(data))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(data)
        return resp.status

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    """`python tests/faultproxy.py UPSTREAM MB/S`: a bandwidth-capped proxy in a process of
    its own (scripts/bench.py: in the benchmark's process, a torch.save blocked in the
    mount while holding the GIL would stop the proxy that the mount waits for). Prints
    its endpoint, then serves until killed."""
    import sys

    proxy = FaultProxy(sys.argv[1])
    proxy.limit_bandwidth(float(sys.argv[2]) * 1e6)
    print(proxy.endpoint, flush=True)
    proxy.thread.join()


if __name__ == "__main__":
    main()
