"""The one retry policy of ckptfs: exponential backoff with jitter, and its constants.

Every store request that can fail transiently (timeouts, 5xx, throttling, refused
connections: errors.TransientStoreError) is retried; permanent errors (no such bucket,
access denied) are not retried in place. Three uses, one schedule each:

- STORE_CALL: one metadata request (LIST, manifest GET, a step of a directory rename),
  retried in place for about 3 s, so that a throttled request does not fail its file
  call or restart a whole rename;
- BACKGROUND: uploads and metadata ops, retried forever from 0.2 s up to 30 s apart
  (PERMANENT_DELAY apart after a permanent error: someone has to fix the cause);
- a read waiting for a chunk that is not in the store yet: CHUNK_WAIT, until the
  caller's deadline (--missing-chunk-timeout).

Every wait before a new try is counted in RETRIES, by what is retried (the metric
ckptfs_retries_total).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import trio

from ckptfs.common.errors import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays first, first*2, first*4, ... capped at `maximum`, each times a random
    factor in [0.5, 1.5) so that many clients do not retry in step; `attempts` tries in
    all (None: no limit)."""

    first: float
    maximum: float
    attempts: int | None = None

    def delays(self) -> Iterator[float]:
        """The waits between tries (one fewer than `attempts`)."""
        delay = self.first
        n = 1
        while self.attempts is None or n < self.attempts:
            yield delay * random.uniform(0.5, 1.5)
            delay = min(delay * 2, self.maximum)
            n += 1


#: tries made again after a failure, by what: "metadata" (one request in place),
#: "metadata op", "upload", "journal check", "fetch" (a chunk not in the store yet, or a
#: failed GET); one count per process, read by the metrics endpoint
RETRIES: Counter[str] = Counter()
_retries_lock = threading.Lock()


def retried(what: str) -> None:
    """Count one more try of `what` (called from any thread)."""
    with _retries_lock:
        RETRIES[what] += 1


def retry_counts() -> dict[str, int]:
    """A copy of RETRIES."""
    with _retries_lock:
        return dict(RETRIES)


STORE_CALL = Backoff(first=0.1, maximum=2.0, attempts=6)  # ~3 s of waits in all
BACKGROUND = Backoff(first=0.2, maximum=30.0)
CHUNK_WAIT = Backoff(first=0.1, maximum=5.0)
PERMANENT_DELAY = 30.0


def retrying(fn: Callable[..., T], policy: Backoff = STORE_CALL) -> Callable[..., T]:
    """`fn` (blocking) with its transient StoreErrors retried in the calling thread."""

    def call(*args: object, **kwargs: object) -> T:
        for delay in policy.delays():
            try:
                return fn(*args, **kwargs)
            except StoreError as e:
                if e.permanent:
                    raise
                log.warning("metadata %s failed (retrying): %s",
                            getattr(fn, "__name__", "call"), e)
                retried("metadata")
                time.sleep(delay)
        return fn(*args, **kwargs)

    return call


async def retrying_async(fn: Callable[..., Awaitable[T]], *args: object,
                         policy: Backoff = STORE_CALL) -> T:
    """await fn(*args), its transient StoreErrors retried (trio.sleep between tries)."""
    for delay in policy.delays():
        try:
            return await fn(*args)
        except StoreError as e:
            if e.permanent:
                raise
            retried("metadata")
            await trio.sleep(delay)
    return await fn(*args)
