"""Named crash points for fault-injection tests: CKPTFS_CRASH_AT=<name>[:<n>] kills the
process (the daemon, or a store tool such as `ckptfs gc`) with SIGKILL the n-th time
(default 1st) execution passes `crash_point(name)`.

Unset (the normal case) it costs one dict lookup. Tests use it to prove that a kill at
any of these points loses nothing that was acknowledged (docs/OPERATIONS.md).
"""

from __future__ import annotations

import os
import signal

_target: tuple[str, int] | None = None
_seen: dict[str, int] = {}


def _parse() -> tuple[str, int] | None:
    spec = os.environ.get("CKPTFS_CRASH_AT", "")
    if not spec:
        return None
    name, _, count = spec.partition(":")
    return name, int(count or 1)


_target = _parse()


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup) if the environment asks for it."""
    if _target is None or _target[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] >= _target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
