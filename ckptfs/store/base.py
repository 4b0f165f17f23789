"""The object-store interface: a blocking client every store implements, and its async facade."""

from __future__ import annotations

import abc
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from ckptfs.common.config import LIMITS
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import BadObjectError, InvalidKeyError, PermanentStoreError, StoreError
from ckptfs.common.redact import redact
from ckptfs.common.retry import retrying

T = TypeVar("T")

#: seconds: the most that a renamed object's mtime may lag the moment its old key vanished
#: (a rename that copies and then deletes, and took longer, stamps the copy again); gc's
#: safe minimum grace counts on it (docs/FORMAT.md, "Garbage collection")
RESTAMP_AFTER = 30.0


def restamp_if_slow(start: float, dst: str, restamp: Callable[[], None]) -> None:
    """The last step of a rename that copies and then deletes: if the move took longer
    than RESTAMP_AFTER since `start` (time.monotonic()), stamp `dst` again (`restamp`).

    Its transient errors are retried here, alone (retry.STORE_CALL): the source is gone
    by now, so running the whole rename again would only find it missing (gc would count
    the chunk as vanished, and its fossil would keep a time from before the move). If
    the stamp still fails, a PermanentStoreError says so, which no caller retries.
    """
    if time.monotonic() - start <= RESTAMP_AFTER:
        return
    try:
        retrying(restamp)()
    except StoreError as e:
        raise PermanentStoreError(f"moved {dst}, but could not stamp it with the time of "
                                  f"the move: {e}") from e


@dataclass(frozen=True)
class Listing:
    """One LIST answer: objects (key, size) and, with a delimiter, common prefixes."""

    objects: list[tuple[str, int]] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ObjectInfo:
    """One object as a scan or a stat sees it."""

    key: str
    size: int
    #: when the object was written, in seconds since the epoch, by the *store's* clock (S3:
    #: LastModified, whole seconds; a directory store: the file's mtime, which its file
    #: system sets); never the reader's clock
    mtime: float
    #: changes whenever the object is replaced by different bytes (S3: size and ETag; a
    #: directory store: size, mtime_ns and inode, since every put renames a new file in)
    token: str


def check_key(key: str) -> str:
    """Return `key` if it is a safe relative store key, else raise InvalidKeyError.

    Safe: non-empty, relative, no NUL, no empty, '.' or '..' segment (a trailing '/' is
    allowed: it names a directory marker).
    """
    if not key or key.startswith("/") or "\0" in key:
        raise InvalidKeyError(f"unsafe store key: {key!r}")
    parts = key.split("/")
    if parts[-1] == "":
        parts = parts[:-1]
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise InvalidKeyError(f"unsafe store key: {key!r}")
    return key


def root_cause(e: BaseException) -> str:
    """The innermost OS reason of a connection failure ('Connection refused'), else `e`."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        # azure-core keeps the transport's exception in `inner_exception`
        cause = cause.__cause__ or cause.__context__ or getattr(cause, "inner_exception", None)
    return one_line(e)


def too_large(op: str, key: str, url: str, limit: int, size: int | None = None
              ) -> BadObjectError:
    """The error of a get() whose object has more than `limit` bytes (`size`, if known)."""
    most = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
    what = f"{size} bytes, more" if size is not None else "more"
    return BadObjectError(f"{op} {key} in {url}: {what} than the {most} it may have; not "
                          f"read")


def one_line(text: object) -> str:
    """`text` as a single line (error messages go to logs and to the status file), any
    credential in it redacted (an SDK's message may quote a URL with its SAS token)."""
    return redact(" ".join(str(text).split()))


class Store(abc.ABC):
    """A flat key space of immutable-ish objects; every method blocks and is thread-safe.

    Keys are relative to the store's root (bucket prefix or directory). Errors are the
    StoreError family of ckptfs.common.errors: NotFoundError, TransientStoreError (retry),
    PermanentStoreError (do not retry).
    """

    #: where the store lives, without credentials (for logs and status)
    url: str = ""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store `data` under `key`, atomically replacing any old object."""

    #: whether put_if_absent() is atomic here (a conditional write the store enforces);
    #: False: it checks, then writes, and a writer in between is overwritten
    atomic_create: bool = False

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Store `data` under `key` only if no object is there; True if it was stored,
        False if an object was there (left as it was). Here a HEAD, then a put: not
        atomic (atomic_create); stores with a conditional write override this."""
        if self.head(key) is not None:
            return False
        self.put(key, data)
        return True

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """put() of the concatenation of `parts` (stores that can write them one after
        the other without joining them first override this)."""
        self.put(key, b"".join(parts))

    @abc.abstractmethod
    def get(self, key: str, limit: int | None = None) -> bytes:
        """Whole object; NotFoundError if absent. With `limit`, an object of more bytes is
        refused (BadObjectError, too_large) without reading more than `limit` + 1 of them:
        a record's GET (get_record) takes no more memory than a record may have."""

    def get_buffer(self, key: str, limit: int | None = None) -> bytes | memoryview:
        """get() of a chunk's object (the fetcher's GETs), in any bytes-like memory:
        stores whose client can hand over its own buffer, with the GIL released while
        the bytes arrive, override it (S3: obstore)."""
        return self.get(key, limit)

    def get_record(self, key: str) -> bytes:
        """get() of a record (ckptfs.json, a manifest, a marker, an intent, a trash entry):
        at most LIMITS.record_bytes; a larger one is a BadObjectError, which is also a
        FormatError: the record is damaged."""
        return self.get(key, LIMITS.record_bytes)

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (shorter at its end); NotFoundError if absent."""

    @abc.abstractmethod
    def head(self, key: str) -> int | None:
        """Size of the object, or None if absent."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; absent is not an error."""

    def delete_many(self, keys: Iterable[str]) -> None:
        """Remove many objects (batched where the store can); absent ones are ignored."""
        for key in keys:
            self.delete(key)

    @abc.abstractmethod
    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        """Every object whose key starts with `prefix` (all pages).

        With delimiter '/', keys with a further '/' after the prefix are rolled up into
        `prefixes` (each ending in '/'), as S3 does. With None, the listing is recursive.
        """

    def list_entry(self, prefix: str, name: str) -> Listing:
        """What list(prefix) shows of the one entry `name`: the object prefix+name and the
        common prefix prefix+name+'/', each if present. Here one LIST of the keys that
        start with prefix+name, filtered: its cost grows with the names that begin with
        `name`, not with the directory; stores that can look one name up directly
        override it."""
        key = prefix + name
        listing = self.list(key)
        return Listing([(k, size) for k, size in listing.objects if k == key],
                       [p for p in listing.prefixes if p == key + "/"])

    @abc.abstractmethod
    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, recursively, streamed: one page
        (S3) or one directory (a directory store) in memory at a time, so that a store of
        millions of objects can be walked in bounded memory. S3 yields keys in key order;
        a directory store, directory by directory, each in name order. An object created
        or deleted during the scan may or may not be yielded; one that exists throughout
        is yielded exactly once."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's size, store mtime and token, or None if absent."""

    def rename(self, src: str, dst: str) -> None:
        """Move an object to another key, replacing any object there: afterwards `src` is
        gone and `dst` holds its bytes, with an mtime (store clock) no earlier than the
        start of this call, and no earlier than RESTAMP_AFTER before the moment `src`
        vanished. NotFoundError if `src` is absent. Here: copy, then delete (not
        atomic: a crash in between leaves both), and copy again when that took longer
        than RESTAMP_AFTER (restamp_if_slow); stores that can do better override it."""
        start = time.monotonic()
        self.copy(src, dst)
        crash_point("store_rename_copied")
        self.delete(src)
        restamp_if_slow(start, dst, lambda: self._restamp(dst))

    def _restamp(self, key: str) -> None:
        """Give the object at `key` a new mtime (rename, when the move was slow): here a
        copy onto itself; stores with a cheaper request override this."""
        self.copy(key, key)

    def check_length(self, key: str) -> None:
        """Raise KeyTooLongError if the store cannot hold `key` because it is too long as
        a whole (S3: 1024 bytes with the prefix; a directory store: the longest path its
        file system takes). No I/O. put() and copy() check their target key so; the
        filesystem checks before it accepts a name, to answer ENAMETOOLONG at once."""
        return None  # this store has no such limit

    def local_path(self, key: str) -> str | None:
        """The object's file, for a store on a local or shared file system (None for
        others): a reader can then read the bytes where they are instead of copying them."""
        return None

    def copy(self, src: str, dst: str) -> None:
        """Copy one object (server-side where the store can; a directory store copies
        only a regular file, never through a symbolic link: BadObjectError)."""
        self.put(dst, self.get(src))

    def parent(self) -> Store | None:
        """The store one level up (the parent directory; the key prefix without its last
        segment), sharing this store's connections: close only this one. None at the top,
        and for stores without such a place."""
        return None

    def close(self) -> None:  # noqa: B027 - optional: most stores hold nothing to release
        """Release connections; the store is unusable afterwards."""


class AsyncStore:
    """Async facade: each call runs the blocking store in a thread behind `limiter`.

    `get_limit`: the most bytes get() takes (Store.get's `limit`): by default a record's,
    since the file system reads only records through this facade (chunks go through the
    fetcher, in threads of its own)."""

    def __init__(self, store: Store, limiter: trio.CapacityLimiter,
                 get_limit: int | None = LIMITS.record_bytes) -> None:
        self.store = store
        self.limiter = limiter
        self.get_limit = get_limit

    def check_length(self, key: str) -> None:
        """Store.check_length (no I/O, so not in a thread)."""
        self.store.check_length(key)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run any blocking callable behind this store's limiter."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self.limiter)

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self.run(self.store.put, key, data)

    async def get(self, key: str) -> bytes:
        return await self.run(self.store.get, key, self.get_limit)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await self.run(self.store.get_range, key, start, end)

    async def head(self, key: str) -> int | None:
        return await self.run(self.store.head, key)

    async def delete(self, key: str) -> None:
        await self.run(self.store.delete, key)

    async def delete_many(self, keys: list[str]) -> None:
        await self.run(self.store.delete_many, keys)

    async def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        return await self.run(self.store.list, prefix, delimiter)

    async def list_entry(self, prefix: str, name: str) -> Listing:
        return await self.run(self.store.list_entry, prefix, name)

    async def copy(self, src: str, dst: str) -> None:
        await self.run(self.store.copy, src, dst)
