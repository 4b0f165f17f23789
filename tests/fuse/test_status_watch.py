"""`ckptfs status --watch`: live in a pseudo-terminal during a save, one line per sample
through a pipe, and a clean exit on Ctrl-C."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mounting import CKPTFS, Nodes

PIECE = 1 << 20


def slow_save(path: Path, pieces: int, stop: threading.Event) -> None:
    """Write up to `pieces` MiB into `path`, a piece every 50 ms, until `stop`, and keep it
    open until then."""
    with open(path, "wb") as f:
        for _ in range(pieces):
            if stop.is_set():
                break
            f.write(os.urandom(PIECE))
            f.flush()
            time.sleep(0.05)
        stop.wait(60)


def read_for(fd: int, seconds: float, until: Callable[[str], bool] = lambda _: False) -> str:
    """What `fd` prints in `seconds`, or until `until` holds of it."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not until(out.decode(errors="replace")):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out.decode(errors="replace")


def uploads(text: str) -> set[str]:
    """The distinct upload figures a watcher has shown."""
    return set(re.findall(r"uploaded\s+(\d+(?:\.\d+)? \w+)", text))


def stuck(proc: subprocess.Popen[Any]) -> str:
    """Why a watcher did not exit after SIGINT: where it waits and its signal masks."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
    except OSError as e:
        return f"(gone: {e})"
    masks = [line for line in status if line.startswith(("State", "Sig"))]
    return f"wchan {wchan!r}; " + "; ".join(masks)


def interruptible() -> None:
    """In the watcher before exec: SIGINT as a terminal's foreground job has it (a test
    run started in the background, as `cmd &` from a script, inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_watch_in_a_terminal_during_a_save(tmp_path: Path, nodes: Nodes) -> None:
    store = tmp_path / "store"
    store.mkdir()
    a = nodes.mount(str(store), tmp_path, "a", "--chunk-size", "1M")
    stop = threading.Event()
    writer = threading.Thread(target=slow_save, args=(a / "step-7.pt", 200, stop))
    writer.start()
    master, slave = pty.openpty()
    watcher = subprocess.Popen([*CKPTFS, "status", str(a.path), "--watch", "--interval",
                                "0.3"], stdin=slave, stdout=slave, stderr=slave,
                               env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
                               preexec_fn=interruptible)
    os.close(slave)
    try:
        # read samples as they come (a slow start must not leave too few): until the
        # upload figure has changed, or 30 s
        text = read_for(master, 30.0, lambda seen: len(uploads(seen)) >= 3)
        watcher.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            assert watcher.wait(30) == 0
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit after SIGINT: {stuck(watcher)}") from None
        text += read_for(master, 0.5)
    finally:
        stop.set()
        writer.join()
        if watcher.poll() is None:
            watcher.kill()
        os.close(master)
    assert "step-7.pt" in text and "files being saved" in text, text[-3000:]
    uploaded = uploads(text)
    assert len(uploaded) >= 2, uploaded  # the upload figure changed while it watched
    assert "Traceback" not in text and "Ctrl-C to stop" in text


def test_watch_through_a_pipe_prints_a_line_per_sample(tmp_path: Path, nodes: Nodes) -> None:
    store = tmp_path / "store"
    store.mkdir()
    a = nodes.mount(str(store), tmp_path, "a")
    (a / "x.pt").write_bytes(b"x" * 1000)
    watcher = subprocess.Popen([*CKPTFS, "status", str(a.path), "--watch", "--interval",
                                "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=interruptible)
    # read samples as they come (a slow start must not leave too few): until three lines
    # and one that says durable, or 30 s (then SIGINT ends the loop's reads)
    deadline = threading.Timer(30, watcher.send_signal, (signal.SIGINT,))
    deadline.start()
    lines: list[str] = []
    assert watcher.stdout is not None
    while len(lines) < 3 or not any("   durable" in line for line in lines):
        line = watcher.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    deadline.cancel()
    watcher.send_signal(signal.SIGINT)
    try:
        out, err = watcher.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        why = stuck(watcher)
        watcher.kill()
        raise AssertionError(f"no exit after SIGINT: {why}") from None
    assert watcher.returncode == 0 and err == ""
    lines += out.splitlines()
    assert len(lines) >= 3 and all(" rate " in line and "\x1b" not in line for line in lines)
    assert any("   durable" in line for line in lines)  # x.pt reached the store
