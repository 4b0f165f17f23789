"""A store in a local or shared directory (local disk, NFS, Lustre): one file per object."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    InvalidKeyError,
    KeyTooLongError,
    NotFoundError,
    PermanentStoreError,
    TransientStoreError,
)
from ckptfs.store.base import Listing, ObjectInfo, Store, check_key

#: suffix of every object file; escaped names never contain it, so it never names a directory
OBJECT_SUFFIX = "%o"
#: marks a temp file being written (followed by random hex); never listed
TEMP_MARK = "%t-"
#: the longest file name, in bytes, on the file systems stores live on (ext4, xfs, NFS, Lustre)
NAME_MAX = 255
#: the longest path, in bytes, that a system call takes (Linux PATH_MAX without its NUL)
PATH_MAX = 4095
#: a temp file's name keeps at most this many bytes of its target's stem: NAME_MAX in all
TEMP_STEM = NAME_MAX - len(TEMP_MARK) - 16
#: in the file name of a mapped segment (one whose escaped file name is too long):
#: <head>%h<32 hex digits>; no escaped name contains it
MAPPED_MARK = "%h"
#: a mapped segment's file name keeps this many bytes of its escaped name, for people
MAPPED_HEAD = 200
#: suffix of the file beside a mapped segment that holds the segment itself (in UTF-8)
NAME_SUFFIX = "%n"
#: errnos that retrying cannot fix
PERMANENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG}
)
#: how often put re-creates parent directories that a concurrent delete removed
MKDIR_ATTEMPTS = 20
COPY_BUFFER = 1 << 20


def escape(segment: str) -> str:
    """A key segment as a file name: '%' becomes '%25', so that '%o', '%t-', '%h' and
    '%n' never appear in it."""
    return segment.replace("%", "%25")


def unescape(name: str) -> str:
    """Inverse of escape()."""
    return name.replace("%25", "%")


def utf8(text: str) -> bytes:
    """A key segment or file name as the bytes the kernel sees."""
    return text.encode("utf-8", "surrogateescape")


def cut(text: str, limit: int) -> str:
    """The longest prefix of `text` that has at most `limit` bytes."""
    size = 0
    for i, char in enumerate(text):
        size += len(utf8(char))
        if size > limit:
            return text[:i]
    return text


def mapped(segment: str) -> str:
    """The mapped form of a key segment: as much of its escaped name as fits in MAPPED_HEAD
    bytes (whole characters, whole escapes), MAPPED_MARK, and the first 32 hex digits of
    the SHA-256 of its UTF-8 bytes. At most 234 bytes, so that the suffixes fit."""
    head: list[str] = []
    size = 0
    for char in segment:
        part = escape(char)
        size += len(utf8(part))
        if size > MAPPED_HEAD:
            break
        head.append(part)
    return "".join(head) + MAPPED_MARK + hashlib.sha256(utf8(segment)).hexdigest()[:32]


def file_name(segment: str, suffix: str) -> str:
    """The file name of a key segment: escape(segment) + suffix (OBJECT_SUFFIX for an
    object, "" for a directory) or, when that is longer than NAME_MAX bytes,
    mapped(segment) + suffix. Names that fit are never mapped."""
    name = escape(segment) + suffix
    return name if len(utf8(name)) <= NAME_MAX else mapped(segment) + suffix


def temp_name(name: str) -> str:
    """A temp file's name for the file `name`: its stem (without the 2-character suffix)
    cut to TEMP_STEM bytes, TEMP_MARK and 16 random hex digits."""
    return f"{cut(name[:-2], TEMP_STEM)}{TEMP_MARK}{secrets.token_hex(8)}"


def written_length(path: Path) -> int:
    """Bytes of the longest path a write of the file `path` uses (the file or its temp)."""
    name = len(utf8(path.name))
    temp = min(name - 2, TEMP_STEM) + NAME_MAX - TEMP_STEM
    return len(utf8(str(path.parent))) + 1 + max(name, temp)


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
    """Objects as files under `root`: key 'a/b' is the file 'a/b%o' (see escape()); a
    segment too long for a file name is mapped (see file_name())."""

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
        return self._locate(key)[0]

    def _locate(self, key: str) -> tuple[Path, list[tuple[Path, str]]]:
        """The object file of `key`, and for each mapped segment on its way, the file that
        keeps the segment's name and the segment; InvalidKeyError if the key is unsafe."""
        *dirs, last = check_key(key).split("/")
        path = self.root
        names: list[tuple[Path, str]] = []
        for i, segment in enumerate([*dirs, last]):
            name = file_name(segment, "" if i < len(dirs) else OBJECT_SUFFIX)
            if MAPPED_MARK in name:
                names.append((path / (mapped(segment) + NAME_SUFFIX), segment))
            path = path / name
        return self._checked(path), names

    def _dir(self, dir_prefix: str) -> Path:
        """The directory of a prefix ending in '/' (or of '')."""
        if not dir_prefix:
            return self.root
        check_key(dir_prefix)
        segments = dir_prefix.split("/")[:-1]
        return self._checked(self.root.joinpath(*(file_name(s, "") for s in segments)))

    def check_length(self, key: str) -> None:
        self._check_length(key, *self._locate(key))

    def _check_length(self, key: str, path: Path, names: list[tuple[Path, str]]) -> None:
        longest = max(written_length(p) for p in [path, *(n for n, _ in names)])
        if longest > PATH_MAX:
            raise KeyTooLongError(f"key too long for {self.url}: its files would have paths "
                                  f"of {longest} bytes, the limit is {PATH_MAX}: {key}")

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
        for _ in range(MKDIR_ATTEMPTS):
            tmp = path.with_name(temp_name(path.name))
            try:
                created += self._make_dirs(path.parent)
                return tmp, os.open(tmp, flags, 0o644), created
            except FileNotFoundError:
                if not self.root.is_dir():
                    raise PermanentStoreError(f"store directory {self.root} is gone") from None
                # else a concurrent delete pruned an (empty) parent: create it again
        raise TransientStoreError(f"cannot create the directory {path.parent}: keeps vanishing")

    def _publish(self, path: Path, fill: Callable[[int], None], exclusive: bool = False
                 ) -> bool:
        """Write a temp file with `fill(fd)`, then atomically rename it onto `path`; or,
        `exclusive`, link it there (which fails if `path` exists: then False) and remove
        the temp file."""
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
            if not exclusive:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink()
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if self.fsync:
            for d in {path.parent, *(c.parent for c in created)}:
                fsync_dir(d)
        return True

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.put_parts(key, [data])

    def put_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        write = self._writer(key)
        with self._errors("put", key):
            write(lambda fd: write_parts(fd, parts))

    #: a link(2) of the written temp file fails if the name exists (NFS too)
    atomic_create = True

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        write = self._writer(key, exclusive=True)
        with self._errors("put_if_absent", key):
            return write(lambda fd: write_all(fd, data))

    def copy(self, src: str, dst: str) -> None:
        src_path, write = self._path(src), self._writer(dst)
        with self._errors("copy", src), open(src_path, "rb", buffering=0) as f:
            write(lambda fd: _copy_fd(f.fileno(), fd))

    def _writer(self, key: str, exclusive: bool = False
                ) -> Callable[[Callable[[int], None]], bool]:
        """A function that writes the object `key` with `fill(fd)`, together with the name
        files of its mapped segments, and returns whether it did (False: `exclusive`, and
        the object exists); KeyTooLongError (before any I/O) if it cannot fit."""
        path, names = self._locate(key)
        self._check_length(key, path, names)

        def write(fill: Callable[[int], None]) -> bool:
            # names first, so that a crash never leaves an object without its name; then
            # again, since a concurrent delete of their last user may have removed them
            for name_path, segment in names:
                self._keep_name(name_path, segment)
            written = self._publish(path, fill, exclusive)
            for name_path, segment in names:
                self._keep_name(name_path, segment)
            return written

        return write

    def _keep_name(self, name_path: Path, segment: str) -> None:
        """Write the name file of a mapped segment unless it exists."""
        if not name_path.exists():
            self._publish(name_path, lambda fd: write_all(fd, utf8(segment)))

    def _drop_name(self, directory: Path, stem: str, segment: str) -> None:
        """Delete the name file of the mapped segment `stem` in `directory` once neither
        its object nor its directory exists (best effort). A put racing with this may have
        created one meanwhile: then the name is written again."""
        name_path = directory / (stem + NAME_SUFFIX)

        def used() -> bool:
            return (directory / (stem + OBJECT_SUFFIX)).exists() or (directory / stem).is_dir()

        with contextlib.suppress(OSError):
            if used():
                return
            with contextlib.suppress(FileNotFoundError):
                name_path.unlink()
            if used():
                self._keep_name(name_path, segment)

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

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        with self._errors("stat", key):
            try:
                return _info(key, path.stat())
            except FileNotFoundError:
                return None

    # -- renaming

    def rename(self, src: str, dst: str) -> None:
        """os.rename, atomic: `src` vanishes as `dst` appears. The file's mtime is set to
        the present before the rename (so that `dst` never shows the old mtime, not even
        for a moment) and after it (so that it is no earlier than the moment `src`
        vanished). On NFS, utime with no times sets the server's time, the clock that
        sets every other mtime in the store."""
        src_path, src_names = self._locate(src)
        dst_path, dst_names = self._locate(dst)
        if src_names or dst_names:
            super().rename(src, dst)  # name files to keep in step: copy and delete
            return
        self._check_length(dst, dst_path, dst_names)
        created: list[Path] = []
        with self._errors("rename", src):
            os.utime(src_path)
            crash_point("store_rename_touched")
            for _ in range(MKDIR_ATTEMPTS):
                created += self._make_dirs(dst_path.parent)
                try:
                    os.rename(src_path, dst_path)
                    break
                except FileNotFoundError:
                    if not src_path.exists():
                        raise
                    # else a concurrent delete pruned dst's (empty) parent: create it again
            else:
                raise TransientStoreError(f"cannot create the directory {dst_path.parent}: "
                                          f"keeps vanishing")
            with contextlib.suppress(FileNotFoundError):  # unless deleted meanwhile
                os.utime(dst_path)
            if self.fsync:
                for d in {dst_path.parent, src_path.parent, *(c.parent for c in created)}:
                    with contextlib.suppress(FileNotFoundError):
                        fsync_dir(d)
        self._prune(src_path.parent, {})

    # -- deleting

    def delete(self, key: str) -> None:
        path, names = self._locate(key)
        with self._errors("delete", key):
            try:
                path.unlink()
            except FileNotFoundError:
                return
        segments = {name_path.name[: -len(NAME_SUFFIX)]: s for name_path, s in names}
        stem = path.name[: -len(OBJECT_SUFFIX)]
        if stem in segments:
            self._drop_name(path.parent, stem, segments[stem])
        self._prune(path.parent, segments)

    def _prune(self, path: Path, segments: dict[str, str]) -> None:
        """Remove `path` and its parents below the root while they are empty, with the
        name files of mapped ones (`segments`: file name -> segment); best effort."""
        while path != self.root:
            try:
                path.rmdir()
            except OSError:
                return
            if path.name in segments:
                self._drop_name(path.parent, path.name, segments[path.name])
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

    def list_entry(self, prefix: str, name: str) -> Listing:
        """Two lstat calls, whatever the directory's size (a mapped name is listed)."""
        names = (file_name(name, OBJECT_SUFFIX), file_name(name, ""))
        if "/" in name or any(MAPPED_MARK in n for n in names):
            return super().list_entry(prefix, name)
        directory = self._dir(prefix)
        key = prefix + name
        found = Listing()
        with self._errors("list", key):
            try:
                st = os.lstat(directory / names[0])
                if stat.S_ISREG(st.st_mode):
                    found.objects.append((key, st.st_size))
            except (FileNotFoundError, NotADirectoryError):
                pass
            sub = directory / names[1]
            if sub.is_dir() and not sub.is_symlink() and _has_objects(sub):
                found.prefixes.append(key + "/")
        return found

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        dir_prefix = prefix[: prefix.rfind("/") + 1]
        name_prefix = prefix[len(dir_prefix) :]
        directory = self._dir(dir_prefix)
        with self._errors("scan", prefix):
            yield from _scan(directory, dir_prefix, name_prefix)


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
    """(entry, key segment, is an object) for each object file and subdirectory.

    Temp files, name files and foreign files are skipped, and so are mapped names whose
    name file is missing or does not map back to them; a directory that vanished is empty.
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
            stem, suffix = entry.name[: -len(OBJECT_SUFFIX)], OBJECT_SUFFIX
        elif entry.is_dir(follow_symlinks=False):
            stem, suffix = entry.name, ""
        else:
            continue
        if MAPPED_MARK not in stem:
            yield entry, unescape(stem), suffix == OBJECT_SUFFIX
        elif (segment := _mapped_segment(directory, stem)) is not None and (
                file_name(segment, suffix) == entry.name):
            yield entry, segment, suffix == OBJECT_SUFFIX


def _mapped_segment(directory: Path, stem: str) -> str | None:
    """The segment a mapped file name stands for, from its name file (None if missing)."""
    try:
        blob = (directory / (stem + NAME_SUFFIX)).read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    segment = blob.decode("utf-8", "surrogateescape")
    return None if "/" in segment or segment in ("", ".", "..") else segment


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


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, st.st_mtime_ns / 1e9,
                      f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")


def _scan(directory: Path, key_prefix: str, name_prefix: str = "") -> Iterator[ObjectInfo]:
    """Every object under `directory` whose name starts with `name_prefix` (at this level
    only), lazily: one directory's entries in memory at a time, in name order."""
    for entry, name, is_object in sorted(_entries(directory), key=lambda e: e[1]):
        if not name.startswith(name_prefix):
            continue
        key = key_prefix + name
        if not is_object:
            yield from _scan(Path(entry.path), key + "/")
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # deleted since the directory was read
        yield _info(key, st)


def _has_objects(directory: Path) -> bool:
    """Whether any object lives under `directory` (leftover empty directories do not count)."""
    return any(
        is_object or _has_objects(Path(entry.path))
        for entry, _, is_object in _entries(directory)
    )
