"""The project's exceptions; errno is decided only at the FUSE edge (fuseops)."""

from __future__ import annotations


class CkptfsError(Exception):
    """Base of every error ckptfs raises on purpose."""


class ConfigError(CkptfsError):
    """Bad user input: an option value, a store URL, a mount point."""


class FormatError(CkptfsError):
    """The store's format is unknown, newer than this ckptfs, or a record is malformed."""


class StoreError(CkptfsError):
    """An object-store request failed. `permanent` errors are not worth retrying."""

    permanent = False


class TransientStoreError(StoreError):
    """Timeouts, 5xx, throttling, refused or reset connections: retry with backoff."""


class PartialListing(TransientStoreError):
    """A listing one tier of a TieredStore could not answer (the object store is
    unreachable): `objects` and `prefixes` are what the other tier holds, for a caller
    that can use them as additions to what it knows (never as the whole listing)."""

    def __init__(self, message: str, objects: list[tuple[str, int]],
                 prefixes: list[str]) -> None:
        super().__init__(message)
        self.objects = objects
        self.prefixes = prefixes


class PermanentStoreError(StoreError):
    """No such bucket, access denied, bad credentials: retrying will not help."""

    permanent = True


class Deferred(StoreError):
    """An op that must wait, not fail: with a fast tier that is unusable, an op applied
    straight to the object store waits until this mount's earlier records have left the
    fast tier (pipeline/fastfail.py). Retried quietly; never retried per call."""

    permanent = True


class NotFoundError(StoreError):
    """The key does not exist in the store."""

    permanent = True


class BadObjectError(PermanentStoreError, FormatError):
    """What the store holds under a key cannot be an object a writer made: in a directory
    store, a symbolic link, FIFO, device, socket or directory where a file belongs (or
    anything but a directory on its path); in any store, an object larger than the read
    takes (a record over LIMITS.record_bytes, a chunk object over its largest size). Never
    read: permanent for the store's callers, a damaged record for the readers of records."""


class CorruptChunkError(CkptfsError):
    """A chunk's bytes do not match its name (hash), or its header is malformed."""


class MissingChunkError(CkptfsError):
    """A chunk named by a manifest is not in the store (yet) after the bounded wait."""


class JournalError(CkptfsError):
    """The journal (the cache directory's SQLite database) failed; a file call gets EIO."""


class JournalFull(JournalError):
    """The cache disk is full: the journal cannot record a change (ENOSPC)."""


class InvalidKeyError(ConfigError):
    """A store key or a path from the store is unsafe (escapes the root, NUL, '..')."""


class KeyTooLongError(InvalidKeyError):
    """A key longer than the store can hold: S3 allows 1024 bytes with the prefix, a
    directory store the path length of its file system (Store.check_length)."""


class FsError(CkptfsError):
    """A POSIX-level failure of a filesystem operation; fuseops maps each kind to an errno."""


class NoEntry(FsError):
    """No such file or directory (ENOENT)."""


class Exists(FsError):
    """The name already exists (EEXIST)."""


class NotEmpty(FsError):
    """Directory not empty (ENOTEMPTY)."""


class IsADirectory(FsError):
    """A file operation on a directory (EISDIR)."""


class NotADirectory(FsError):
    """A directory operation on a non-directory (ENOTDIR)."""


class NameTooLong(FsError):
    """A name longer than the stores can hold (ENAMETOOLONG)."""


class NotPermitted(FsError):
    """Operation not permitted (EPERM): hard links, chown to another user."""


class InvalidArgument(FsError):
    """Invalid argument (EINVAL): e.g. moving a directory into itself."""


class NoAttribute(FsError):
    """No such extended attribute (ENODATA)."""


class NotSupported(FsError):
    """Operation not supported (ENOTSUP): setting extended attributes."""


class DamagedRecord(FsError):
    """A file whose manifest in the store is damaged (does not parse or validate): EIO on
    it, every other file unaffected."""


class StoreUnavailable(FsError):
    """The store cannot be reached and this node has no view of its own to answer from
    (EIO): a directory never listed must not look empty."""
