"""A store in a local or shared directory (local disk, NFS, Lustre): one file per object."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import InvalidKeyError, NotFoundError, PermanentStoreError, TransientStoreError
from .base import Listing, Store, check_key

#: suffix of every object file; escaped names never contain it, so it never names a directory
OBJECT_SUFFIX = "%o"
#: marks a temp file being written (followed by random hex); never listed
TEMP_MARK = "%t-"
#: errnos that retrying cannot fix
PERMANENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG}
)
#: how often put re-creates parent directories that a concurrent delete removed
MKDIR_ATTEMPTS = 20
COPY_BUFFER = 1 << 20


def escape(segment: str) -> str:
    """A key segment as a file name: '%' becomes '%25', so '%o' and '%t-' never appear."""
    return segment.replace("%", "%25")


def unescape(name: str) -> str:
    """Inverse of escape()."""
    return name.replace("%25", "%")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of `data` to `fd` (os.write may write less), without copying."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def write_parts(fd: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    for part in parts:
        write_all(fd, part)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable (file systems that cannot do this are skipped)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


class LocalStore(Store):
    """Objects as files under `root`: key 'a/b' is the file 'a/b%o' (see escape())."""

    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(os.path.abspath(root))
        self.fsync = fsync
        self.url = f"file://{self.root}"

    def parent(self) -> LocalStore | None:
        up = self.root.parent
        return None if up == self.root else LocalStore(up, self.fsync)

    # -- key <-> path

    def _path(self, key: str) -> Path:
        """The object file of `key`; InvalidKeyError if the key is unsafe."""
        *dirs, last = check_key(key).split("/")
        return self._checked(self.root.joinpath(*map(escape, dirs), escape(last) + OBJECT_SUFFIX))

    def _dir(self, dir_prefix: str) -> Path:
        """The directory of a prefix ending in '/' (or of '')."""
        if not dir_prefix:
            return self.root
        check_key(dir_prefix)
        return self._checked(self.root.joinpath(*map(escape, dir_prefix.split("/")[:-1])))

    def _checked(self, path: Path) -> Path:
        """`path` if it is inside the root, else InvalidKeyError."""
        if os.path.commonpath([self.root, os.path.normpath(path)]) != str(self.root):
            raise InvalidKeyError(f"store key escapes {self.root}: {path}")
        return path

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate OSError into the StoreError family."""
        try:
            yield
        except FileNotFoundError:
            raise NotFoundError(f"{op} {key}: no such object in {self.url}") from None
        except OSError as e:
            cls = PermanentStoreError if e.errno in PERMANENT_ERRNOS else TransientStoreError
            raise cls(f"{op} {key} in {self.url}: {e.strerror or e}") from e

    # -- writing

    def _make_dirs(self, path: Path) -> list[Path]:
        """mkdir -p `path` below the root; return the directories it created."""
        missing = []
        while path != self.root and not path.is_dir():
            missing.append(path)
            path = path.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                d.mkdir()
        return missing

    def _open_temp(self, path: Path) -> tuple[Path, int, list[Path]]:
        """Create a temp file next to `path`: (its path, an fd, directories created)."""
        created: list[Path] = []
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        stem = path.name[: -len(OBJECT_SUFFIX)]
        for _ in range(MKDIR_ATTEMPTS):
            tmp = path.with_name(f"{stem}{TEMP_MARK}{secrets.token_hex(8)}")
            try:
                created += self._make_dirs(path.parent)
                return tmp, os.open(tmp, flags, 0o644), created
            except FileNotFoundError:
                if not self.root.is_dir():
                    raise PermanentStoreError(f"store directory {self.root} is gone") from None
                # else a concurrent delete pruned an (empty) parent: create it again
        raise TransientStoreError(f"cannot create the directory {path.parent}: keeps vanishing")

    def _publish(self, path: Path, fill: Callable[[int], None]) -> None:
        """Write a temp file with `fill(fd)`, then atomically rename it onto `path`."""
        tmp, fd, created = self._open_temp(path)
        try:
            try:
                fill(fd)
                if self.fsync:
                    os.fsync(fd)
                    # the page cache copy is clean now and nobody here reads it again
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if self.fsync:
            for d in {path.parent, *(c.parent for c in created)}:
                fsync_dir(d)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.put_parts(key, [data])

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        path = self._path(key)
        with self._errors("put", key):
            self._publish(path, lambda fd: write_parts(fd, parts))

    def copy(self, src: str, dst: str) -> None:
        src_path, dst_path = self._path(src), self._path(dst)
        with self._errors("copy", src), open(src_path, "rb", buffering=0) as f:
            self._publish(dst_path, lambda fd: _copy_fd(f.fileno(), fd))

    # -- reading

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors("get", key), open(path, "rb", buffering=0) as f:
            return f.readall()

    def local_path(self, key: str) -> str | None:
        return str(self._path(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0:
            raise ValueError(f"negative range start: {start}")
        path = self._path(key)
        with self._errors("get_range", key), open(path, "rb", buffering=0) as f:
            return _pread(f.fileno(), start, max(0, end - start))

    def head(self, key: str) -> int | None:
        path = self._path(key)
        with self._errors("head", key):
            try:
                return path.stat().st_size
            except FileNotFoundError:
                return None

    # -- deleting

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._errors("delete", key):
            try:
                path.unlink()
            except FileNotFoundError:
                return
        self._prune(path.parent)

    def _prune(self, path: Path) -> None:
        """Remove `path` and its parents below the root while they are empty (best effort)."""
        while path != self.root:
            try:
                path.rmdir()
            except OSError:
                return
            path = path.parent

    # -- listing

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        if delimiter not in ("/", None):
            raise ValueError(f"LocalStore lists with delimiter '/' or None, not {delimiter!r}")
        dir_prefix = prefix[: prefix.rfind("/") + 1]
        name_prefix = prefix[len(dir_prefix) :]
        directory = self._dir(dir_prefix)
        objects: list[tuple[str, int]] = []
        prefixes: list[str] = []
        with self._errors("list", prefix):
            for entry, name, is_object in _entries(directory):
                if not name.startswith(name_prefix):
                    continue
                key = dir_prefix + name
                if is_object:
                    _append_object(objects, key, entry)
                elif delimiter is None:
                    objects += _walk(Path(entry.path), key + "/")
                elif _has_objects(Path(entry.path)):
                    prefixes.append(key + "/")
        return Listing(sorted(objects), sorted(prefixes))


def _copy_fd(src: int, dst: int) -> None:
    """Copy the rest of file `src` into `dst`."""
    while chunk := os.read(src, COPY_BUFFER):
        write_all(dst, chunk)


def _pread(fd: int, start: int, size: int) -> bytes:
    """Up to `size` bytes at `start` (fewer only at the end of the file)."""
    parts = []
    while size > 0 and (chunk := os.pread(fd, size, start)):
        parts.append(chunk)
        start += len(chunk)
        size -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _entries(directory: Path) -> Iterator[tuple[os.DirEntry[str], str, bool]]:
    """(entry, unescaped key segment, is an object) for each object file and subdirectory.

    Temp files and foreign files are skipped; a directory that vanished is empty.
    """
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if TEMP_MARK in entry.name:
            continue
        if entry.name.endswith(OBJECT_SUFFIX):
            yield entry, unescape(entry.name[: -len(OBJECT_SUFFIX)]), True
        elif entry.is_dir(follow_symlinks=False):
            yield entry, unescape(entry.name), False


def _append_object(objects: list[tuple[str, int]], key: str, entry: os.DirEntry[str]) -> None:
    """Add (key, size) unless the file was deleted meanwhile."""
    with contextlib.suppress(FileNotFoundError):
        objects.append((key, entry.stat(follow_symlinks=False).st_size))


def _walk(directory: Path, key_prefix: str) -> list[tuple[str, int]]:
    """Every object under `directory`, whose keys start with `key_prefix`."""
    objects: list[tuple[str, int]] = []
    for entry, name, is_object in _entries(directory):
        if is_object:
            _append_object(objects, key_prefix + name, entry)
        else:
            objects += _walk(Path(entry.path), key_prefix + name + "/")
    return objects


def _has_objects(directory: Path) -> bool:
    """Whether any object lives under `directory` (leftover empty directories do not count)."""
    return any(
        is_object or _has_objects(Path(entry.path))
        for entry, _, is_object in _entries(directory)
    )
