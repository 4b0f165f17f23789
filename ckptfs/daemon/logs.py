"""The daemon's log: to stderr or a size-bounded file that rotates, as text or JSON.

Every line has its credentials redacted (redact.py). The file, and each new one after a
rotation, is opened as a private file (private.py): never through a symbolic link, only
if it is this user's, and made with mode 0600.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
import sys
import time

from ckptfs.common import private
from ckptfs.common.config import LIMITS
from ckptfs.common.redact import redact

#: the attributes every LogRecord has: anything else was passed with `extra=` and goes
#: into a JSON line as a field of its own
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_NOISY = ("botocore", "boto3", "urllib3", "s3transfer", "azure", "google")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, the node
    and store of the mount, the fields a call passed with `extra=`, and the exception's
    text if any."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self.fields = fields

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage(), **self.fields}
        line.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return redact(json.dumps(line, default=str))


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, credentials redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


#: what to do when the log file is refused (private.py)
LOG_FIX = "remove it, or give a log file of your own (--log-file)"


def open_log(path: str) -> int:
    """The log file at `path` for appending (private.open_file), made with mode 0600."""
    return private.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "the log file",
                             LOG_FIX)


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """The standard rotating handler, whose file (each new one after a rotation too) is
    opened by open_log: never through a link, mode 0600 (the standard one makes it
    0644 under the usual umask, and follows a link)."""

    def _open(self) -> io.TextIOWrapper:
        return open(open_log(self.baseFilename), "a", encoding=self.encoding,
                    errors=self.errors)


def setup_logging(level: str = "info", path: str | None = None, fmt: str = "text",
                  fields: dict[str, str] | None = None) -> None:
    """Send the process's log to `path` (rotated at LIMITS.log_bytes, LIMITS.log_files
    old files kept), or to stderr when None; `level` is a logging level name, `fmt`
    text or json (then with `fields` on every line)."""
    handler: logging.Handler
    if path:
        handler = PrivateRotatingFileHandler(path, maxBytes=LIMITS.log_bytes,
                                             backupCount=LIMITS.log_files)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(fields or {}) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
