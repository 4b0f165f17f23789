"""The daemon's log: to stderr or a size-bounded file that rotates, as text or JSON."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time

from ckptfs.common.config import LIMITS

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
        return json.dumps(line, default=str)


def setup_logging(level: str = "info", path: str | None = None, fmt: str = "text",
                  fields: dict[str, str] | None = None) -> None:
    """Send the process's log to `path` (rotated at LIMITS.log_bytes, LIMITS.log_files
    old files kept), or to stderr when None; `level` is a logging level name, `fmt`
    text or json (then with `fields` on every line)."""
    handler: logging.Handler
    if path:
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=LIMITS.log_bytes, backupCount=LIMITS.log_files)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(fields or {}) if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
