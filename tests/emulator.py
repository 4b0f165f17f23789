"""A test server run as one child process on a free loopback port, stopped by pid: the
common part of the Azurite and fake-gcs-server fixtures (tests/azurite.py, fakegcs.py)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from seaweed import _die_with_parent, free_ports


class EmulatorProcess:
    """Subclasses give `name`, `log_name`, command() and probe() (raises OSError until
    the server answers)."""

    name = "server"
    log_name = "server.log"

    def __init__(self, workdir: Path, start_timeout: float = 30.0) -> None:
        self.workdir = Path(workdir)
        self.log_path = self.workdir / self.log_name
        self.start_timeout = start_timeout
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def probe(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start the server and wait until probe() succeeds."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, preexec_fn=_die_with_parent if on_main_thread else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see "
                                   f"{self.log_path}")
            try:
                self.probe()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} not ready after {self.start_timeout}s: "
                                       f"{e}; see {self.log_path}") from e
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
