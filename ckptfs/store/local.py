"""A store in a local or shared directory (local disk, NFS, Lustre): one file per object."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from ckptfs.common.config import dir_mode
from ckptfs.common.crashpoints import crash_point
from ckptfs.common.errors import (
    BadObjectError,
    InvalidKeyError,
    KeyTooLongError,
    NotFoundError,
    PermanentStoreError,
    TransientStoreError,
)
from ckptfs.store.base import Listing, ObjectInfo, Store, check_key, too_large

log = logging.getLogger(__name__)

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
    {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG,
     errno.EISDIR}
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


def fsync_dir(fd: int) -> None:
    """Make the entries of the directory open on `fd` (O_PATH will do) durable (file
    systems that cannot do this are skipped)."""
    dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        os.fsync(dfd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(dfd)


def kind_of(mode: int) -> str:
    """What a file of `mode` (st_mode) is, in words."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "of an unknown type"


def process_umask() -> int | None:
    """This process's umask (from /proc; None where it cannot be read)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


class Foreign(Exception):
    """An entry on the way to an object, or the object itself, that ckptfs never writes
    there (a symbolic link, FIFO, device, socket; a directory where a file belongs, or
    anything but a directory where one does): never followed, opened or replaced.
    LocalStore._errors raises it as a BadObjectError naming the operation and the key."""

    def __init__(self, path: str, kind: str, want: str) -> None:
        super().__init__(f"{path} is {kind}, where ckptfs keeps {want}")
        self.path = path
        self.kind = kind
        self.want = want


#: the entries (store url, path) that a listing skipped and logged: each is logged once
#: per process (at most REPORTED_MAX of them)
_reported: set[tuple[str, str]] = set()
REPORTED_MAX = 10_000


def report_skipped(url: str, path: str, kind: str) -> None:
    """Log, once, that a listing skipped `path` (relative to the store) for being `kind`."""
    if (url, path) in _reported or len(_reported) >= REPORTED_MAX:
        return
    _reported.add((url, path))
    log.warning("%s in the store %s is %s, which ckptfs never writes there: skipped (not "
                "followed, not read; remove it)", path, url, kind)


class LocalStore(Store):
    """Objects as files under `root`: key 'a/b' is the file 'a/b%o' (see escape()); a
    segment too long for a file name is mapped (see file_name()).

    Below the root nothing is followed: every file and directory is reached one directory
    at a time (openat) with O_NOFOLLOW, so that whoever else can write the store directory
    cannot make this store read, write or delete anything outside it through a symbolic
    link; an object is read only if it is a regular file (opened with O_NONBLOCK: a FIFO
    never blocks a reader), and listings skip (and log once) what is neither a regular
    file nor a directory. Files are written with `file_mode` (ckptfs.json's store_mode,
    set_file_mode; directories: config.dir_mode), exactly, whatever the umask; None, a
    store without one: 0644 and 0777 less the umask, as before there was one."""

    def __init__(self, root: str | Path, fsync: bool = True,
                 file_mode: int | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.fsync = fsync
        self.url = f"file://{self.root}"
        self.file_mode = file_mode

    def set_file_mode(self, mode: int | None) -> None:
        """Write files with `mode` from now on (directories with config.dir_mode of it);
        None: 0644 (0777) less the umask. ckptfs.json says which (store_mode)."""
        self.file_mode = mode

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

    def _split(self, path: Path) -> tuple[list[str], str]:
        """The directories below the root on the way to the file `path`, and its name."""
        *dirs, name = path.relative_to(self.root).parts
        return dirs, name

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
        """Translate OSError into the StoreError family, Foreign into BadObjectError."""
        try:
            yield
        except FileNotFoundError:
            raise NotFoundError(f"{op} {key}: no such object in {self.url}") from None
        except Foreign as e:
            raise BadObjectError(f"{op} {key} in {self.url}: {e}; left alone") from None
        except OSError as e:
            cls = PermanentStoreError if e.errno in PERMANENT_ERRNOS else TransientStoreError
            raise cls(f"{op} {key} in {self.url}: {e.strerror or e}") from e

    # -- directories, one at a time

    def _dirs(self, dirs: Sequence[str], create: bool = False) -> list[int]:
        """The root and each directory dirs[:1], dirs[:2], ... below it, opened (O_PATH)
        without following a symbolic link: their fds, the root's first, which the caller
        closes (close_all). With `create`, a missing directory is made (its parent synced
        with fsync); else FileNotFoundError. Foreign if one is anything but a directory."""
        fds = [os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            for i, name in enumerate(dirs):
                try:
                    fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
                    continue
                except FileNotFoundError:
                    if not create:
                        raise
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    raise self._foreign(fds[-1], name, dirs[:i + 1], "a directory") from None
                self._mkdir(fds[-1], name)
                try:
                    fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
                except OSError as e:
                    if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    raise self._foreign(fds[-1], name, dirs[:i + 1], "a directory") from None
        except BaseException:
            close_all(fds)
            raise
        return fds

    def _foreign(self, dir_fd: int, name: str, parts: Sequence[str], want: str) -> Foreign:
        """The Foreign error of the entry `name` in `dir_fd` (at `parts` below the root)."""
        try:
            kind = kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            kind = "not " + want
        return Foreign("/".join(parts), kind, want)

    def _mkdir(self, dir_fd: int, name: str) -> None:
        """Make the directory `name` in `dir_fd` (already there: nothing), with the store's
        directory mode exactly (setgid, which a directory inherits, kept), and sync its
        parent."""
        mode = 0o777 if self.file_mode is None else dir_mode(self.file_mode)
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            return
        if self.file_mode is not None and not self._umask_keeps(mode):
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=dir_fd)
            try:
                os.fchmod(fd, mode | (os.fstat(fd).st_mode & stat.S_ISGID))
            finally:
                os.close(fd)
        if self.fsync:
            fsync_dir(dir_fd)

    @staticmethod
    def _umask_keeps(mode: int) -> bool:
        """Whether a file created with `mode` gets it whole (the umask takes none of it)."""
        umask = process_umask()
        return umask is not None and not mode & umask

    # -- writing

    def _publish(self, path: Path, fill: Callable[[int], None], exclusive: bool = False
                 ) -> bool:
        """Write a temp file with `fill(fd)`, then atomically rename it onto `path`; or,
        `exclusive`, link it there (which fails if `path` exists: then False) and remove
        the temp file. Directories missing on the way are made."""
        dirs, name = self._split(path)
        mode = 0o644 if self.file_mode is None else self.file_mode
        for _ in range(MKDIR_ATTEMPTS):
            tmp = temp_name(name)
            try:
                fds = self._dirs(dirs, create=True)
            except FileNotFoundError:
                if not self.root.is_dir():
                    raise PermanentStoreError(f"store directory {self.root} is gone") from None
                continue  # a concurrent delete pruned a new (empty) parent: create it again
            try:
                try:
                    fd = os.open(tmp, CREATE_FLAGS, mode, dir_fd=fds[-1])
                except FileNotFoundError:
                    continue  # the directory was pruned (empty) meanwhile: create it again
                return self._place(fds[-1], tmp, name, fd, fill, mode, exclusive)
            finally:
                close_all(fds)
        raise TransientStoreError(f"cannot create the directory {path.parent}: keeps vanishing")

    def _place(self, dir_fd: int, tmp: str, name: str, fd: int, fill: Callable[[int], None],
               mode: int, exclusive: bool) -> bool:
        """_publish() once the temp file `tmp` in `dir_fd` is open on `fd`."""
        try:
            try:
                if self.file_mode is not None and not self._umask_keeps(mode):
                    os.fchmod(fd, mode)  # before a byte is written: never readable by more
                fill(fd)
                if self.fsync:
                    os.fsync(fd)
                    # the page cache copy is clean now and nobody here reads it again
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            if not exclusive:
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                try:
                    os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except FileExistsError:
                    return False
                finally:
                    os.unlink(tmp, dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        if self.fsync:
            fsync_dir(dir_fd)
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
        """Copy the regular file of `src` (never through a symbolic link: BadObjectError),
        read from the descriptor that was checked, into a new file of the store's mode."""
        src_path, write = self._path(src), self._writer(dst)
        with self._errors("copy", src), self._reading(src_path) as (fd, _):
            write(lambda out: _copy_fd(fd, out))

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
        if not os.path.lexists(name_path):
            self._publish(name_path, lambda fd: write_all(fd, utf8(segment)))

    def _drop_name(self, dir_fd: int, directory: Path, stem: str, segment: str) -> None:
        """Delete the name file of the mapped segment `stem` in `directory` (open on
        `dir_fd`) once neither its object nor its directory exists (best effort). A put
        racing with this may have created one meanwhile: then the name is written again."""
        def used() -> bool:
            return any(_lexists(dir_fd, n) for n in (stem + OBJECT_SUFFIX, stem))

        with contextlib.suppress(OSError):
            if used():
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stem + NAME_SUFFIX, dir_fd=dir_fd)
            if used():
                self._keep_name(directory / (stem + NAME_SUFFIX), segment)

    # -- reading

    @contextlib.contextmanager
    def _reading(self, path: Path) -> Iterator[tuple[int, os.stat_result]]:
        """The object file `path` open for reading, and its fstat: only a regular file,
        reached and opened without following a symbolic link (Foreign otherwise); a
        FIFO, device or socket is never opened, and a FIFO swapped in meanwhile never
        blocks (O_NONBLOCK)."""
        dirs, name = self._split(path)
        fds = self._dirs(dirs)
        try:
            st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise Foreign("/".join([*dirs, name]), kind_of(st.st_mode), "a regular file")
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=fds[-1])
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
                raise self._foreign(fds[-1], name, [*dirs, name], "a regular file") from None
        finally:
            close_all(fds)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped in since the stat above
                raise Foreign("/".join([*dirs, name]), kind_of(st.st_mode), "a regular file")
            yield fd, st
        finally:
            os.close(fd)

    def get(self, key: str, limit: int | None = None) -> bytes:
        path = self._path(key)
        with self._errors("get", key), self._reading(path) as (fd, st):
            if limit is not None and st.st_size > limit:
                raise too_large("get", key, self.url, limit, st.st_size)
            return _pread(fd, 0, st.st_size)

    def local_path(self, key: str) -> str | None:
        return str(self._path(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0:
            raise ValueError(f"negative range start: {start}")
        path = self._path(key)
        with self._errors("get_range", key), self._reading(path) as (fd, _):
            return _pread(fd, start, max(0, end - start))

    def _lstat(self, op: str, key: str) -> os.stat_result | None:
        """The object's lstat, or None where there is no regular file (a path through
        anything but directories holds none; what is there instead is logged once)."""
        dirs, name = self._split(self._path(key))
        with self._errors(op, key):
            try:
                fds = self._dirs(dirs)
            except FileNotFoundError:
                return None
            except Foreign as e:
                report_skipped(self.url, e.path, e.kind)
                return None
            try:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                return None
            finally:
                close_all(fds)
        if not stat.S_ISREG(st.st_mode):
            report_skipped(self.url, "/".join([*dirs, name]), kind_of(st.st_mode))
            return None
        return st

    def head(self, key: str) -> int | None:
        st = self._lstat("head", key)
        return None if st is None else st.st_size

    def stat(self, key: str) -> ObjectInfo | None:
        st = self._lstat("stat", key)
        return None if st is None else _info(key, st)

    # -- renaming

    def rename(self, src: str, dst: str) -> None:
        """os.rename, atomic: `src` vanishes as `dst` appears; only a regular file
        (BadObjectError otherwise). The file's mtime is set to the present before the
        rename (so that `dst` never shows the old mtime, not even for a moment) and after
        it (so that it is no earlier than the moment `src` vanished). On NFS, utime with no
        times sets the server's time, the clock that sets every other mtime in the store."""
        src_path, src_names = self._locate(src)
        dst_path, dst_names = self._locate(dst)
        if src_names or dst_names:
            super().rename(src, dst)  # name files to keep in step: copy and delete
            return
        self._check_length(dst, dst_path, dst_names)
        src_dirs, src_name = self._split(src_path)
        dst_dirs, dst_name = self._split(dst_path)
        with self._errors("rename", src):
            src_fds = self._dirs(src_dirs)
            try:
                st = os.stat(src_name, dir_fd=src_fds[-1], follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise Foreign("/".join([*src_dirs, src_name]), kind_of(st.st_mode),
                                  "a regular file")
                os.utime(src_name, dir_fd=src_fds[-1], follow_symlinks=False)
                crash_point("store_rename_touched")
                self._move(src_fds[-1], src_name, dst_dirs, dst_name)
                self._prune(src_fds, src_dirs, {})
            finally:
                close_all(src_fds)

    def _move(self, src_fd: int, src_name: str, dst_dirs: list[str], dst_name: str) -> None:
        """rename(): the move itself, once `src_name` in `src_fd` is checked and stamped."""
        for _ in range(MKDIR_ATTEMPTS):
            try:
                dst_fds = self._dirs(dst_dirs, create=True)
            except FileNotFoundError:
                continue  # a concurrent delete pruned a new (empty) parent: create it again
            try:
                try:
                    os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fds[-1])
                except FileNotFoundError:
                    if not _lexists(src_fd, src_name):
                        raise
                    continue  # a concurrent delete pruned dst's (empty) parent: create it again
                with contextlib.suppress(FileNotFoundError):  # unless deleted meanwhile
                    os.utime(dst_name, dir_fd=dst_fds[-1], follow_symlinks=False)
                if self.fsync:
                    for fd in {dst_fds[-1], src_fd}:
                        with contextlib.suppress(FileNotFoundError):
                            fsync_dir(fd)
                return
            finally:
                close_all(dst_fds)
        raise TransientStoreError(f"cannot create the directory {'/'.join(dst_dirs)} in "
                                  f"{self.url}: keeps vanishing")

    # -- deleting

    def delete(self, key: str) -> None:
        path, names = self._locate(key)
        dirs, name = self._split(path)
        with self._errors("delete", key):
            try:
                fds = self._dirs(dirs)
            except (FileNotFoundError, Foreign):
                return  # a path through anything but directories holds no object
            try:
                try:
                    os.unlink(name, dir_fd=fds[-1])
                except FileNotFoundError:
                    return
                segments = {name_path.name[: -len(NAME_SUFFIX)]: s for name_path, s in names}
                stem = name[: -len(OBJECT_SUFFIX)]
                if stem in segments:
                    self._drop_name(fds[-1], path.parent, stem, segments[stem])
                self._prune(fds, dirs, segments)
            finally:
                close_all(fds)

    def _prune(self, fds: list[int], dirs: list[str], segments: dict[str, str]) -> None:
        """Remove the directories `dirs` below the root (fds: theirs and the root's, as
        _dirs gives them), the deepest first, while they are empty, with the name files
        of mapped ones (`segments`: file name -> segment); best effort."""
        for i in range(len(dirs) - 1, -1, -1):
            try:
                os.rmdir(dirs[i], dir_fd=fds[i])
            except OSError:
                return
            if dirs[i] in segments:
                self._drop_name(fds[i], self.root.joinpath(*dirs[:i]), dirs[i],
                                segments[dirs[i]])

    # -- listing

    @contextlib.contextmanager
    def _listed_dir(self, dir_prefix: str) -> Iterator[int | None]:
        """The directory of `dir_prefix` open for listing (None if there is none)."""
        dirs = list(self._dir(dir_prefix).relative_to(self.root).parts)
        try:
            fds = self._dirs(dirs)
        except FileNotFoundError:
            yield None
            return
        except Foreign as e:
            report_skipped(self.url, e.path, e.kind)
            yield None
            return
        try:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fds[-1])
        finally:
            close_all(fds)
        try:
            yield fd
        finally:
            os.close(fd)

    def list(self, prefix: str, delimiter: str | None = "/") -> Listing:
        if delimiter not in ("/", None):
            raise ValueError(f"LocalStore lists with delimiter '/' or None, not {delimiter!r}")
        dir_prefix = prefix[: prefix.rfind("/") + 1]
        name_prefix = prefix[len(dir_prefix) :]
        objects: list[tuple[str, int]] = []
        prefixes: list[str] = []
        lister = _Lister(self.url, self._dir(dir_prefix).relative_to(self.root).as_posix())
        with self._errors("list", prefix), self._listed_dir(dir_prefix) as fd:
            if fd is None:
                return Listing()
            for entry, name, is_object in lister.entries(fd):
                if not name.startswith(name_prefix):
                    continue
                key = dir_prefix + name
                if is_object:
                    lister.append_object(objects, key, entry)
                elif delimiter is None:
                    objects += lister.walk(fd, entry.name, key + "/")
                elif lister.has_objects(fd, entry.name):
                    prefixes.append(key + "/")
        return Listing(sorted(objects), sorted(prefixes))

    def list_entry(self, prefix: str, name: str) -> Listing:
        """Two lstat calls in the directory, whatever its size (a mapped name is listed);
        like list(), no link is followed and only a regular file is an object."""
        names = (file_name(name, OBJECT_SUFFIX), file_name(name, ""))
        if "/" in name or any(MAPPED_MARK in n for n in names):
            return super().list_entry(prefix, name)
        key = prefix + name
        found = Listing()
        lister = _Lister(self.url, self._dir(prefix).relative_to(self.root).as_posix())
        with self._errors("list", key), self._listed_dir(prefix) as fd:
            if fd is None:
                return found
            try:
                st = os.stat(names[0], dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    found.objects.append((key, st.st_size))
            except (FileNotFoundError, NotADirectoryError):
                pass
            if lister.has_objects(fd, names[1]):
                found.prefixes.append(key + "/")
        return found

    def scan(self, prefix: str) -> Iterator[ObjectInfo]:
        dir_prefix = prefix[: prefix.rfind("/") + 1]
        name_prefix = prefix[len(dir_prefix) :]
        lister = _Lister(self.url, self._dir(dir_prefix).relative_to(self.root).as_posix())
        with self._errors("scan", prefix), self._listed_dir(dir_prefix) as fd:
            yield from lister.scan(fd, dir_prefix, name_prefix)


#: flags of a directory opened on the way to a file: never through a symbolic link
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of a directory opened to be listed
LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of an object opened to be read: not a symbolic link, and no waiting for a writer
#: of a FIFO (fstat then refuses anything but a regular file)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: flags of a temp file created to be written
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: the most bytes a name file (NAME_SUFFIX) may have: a segment, one path at most
NAME_FILE_MAX = PATH_MAX


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


def _lexists(dir_fd: int, name: str) -> bool:
    """Whether `name` exists in `dir_fd` (a symbolic link itself counts)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


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


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, st.st_mtime_ns / 1e9,
                      f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")


class _Lister:
    """A listing's walk of the directories below one (each opened with O_NOFOLLOW from its
    parent's descriptor): objects are regular files named *%o, subdirectories are
    directories; anything else there that ckptfs never writes is skipped and logged once
    (report_skipped). `top`: the directory's path below the root, for those lines."""

    def __init__(self, url: str, top: str) -> None:
        self.url = url
        self.top = "" if top == "." else top

    def _where(self, rel: str, name: str) -> str:
        return "/".join(p for p in (self.top, rel, name) if p)

    def entries(self, fd: int | None, rel: str = "") -> Iterator[tuple[os.DirEntry[str], str,
                                                                        bool]]:
        """(entry, key segment, is an object) for each object file and subdirectory of the
        directory open on `fd` (None: none), at `rel` below the top.

        Temp files, name files and foreign regular files are skipped, and so are mapped
        names whose name file is missing or does not map back to them; a directory that
        vanished is empty."""
        if fd is None:
            return
        try:
            with os.scandir(fd) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if TEMP_MARK in entry.name:
                continue
            try:
                is_file = entry.is_file(follow_symlinks=False)
                if entry.name.endswith(OBJECT_SUFFIX) and is_file:
                    stem, suffix = entry.name[: -len(OBJECT_SUFFIX)], OBJECT_SUFFIX
                elif not entry.name.endswith(OBJECT_SUFFIX) and entry.is_dir(
                        follow_symlinks=False):
                    stem, suffix = entry.name, ""
                else:  # a foreign regular file (skipped quietly, as a name file) or worse
                    if not is_file:
                        kind = kind_of(entry.stat(follow_symlinks=False).st_mode)
                        report_skipped(self.url, self._where(rel, entry.name), kind)
                    continue
            except FileNotFoundError:
                continue  # deleted since the directory was read
            if MAPPED_MARK not in stem:
                yield entry, unescape(stem), suffix == OBJECT_SUFFIX
            elif (segment := _mapped_segment(fd, stem)) is not None and (
                    file_name(segment, suffix) == entry.name):
                yield entry, segment, suffix == OBJECT_SUFFIX

    def _open(self, fd: int, name: str) -> int | None:
        """The subdirectory `name` of `fd` opened for listing (None: gone, or not one)."""
        try:
            return os.open(name, LIST_FLAGS, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            return None  # replaced by a symbolic link since it was listed

    def append_object(self, objects: list[tuple[str, int]], key: str,
                      entry: os.DirEntry[str]) -> None:
        """Add (key, size) unless the file was deleted meanwhile."""
        with contextlib.suppress(FileNotFoundError):
            objects.append((key, entry.stat(follow_symlinks=False).st_size))

    def walk(self, fd: int, name: str, key_prefix: str, rel: str = "") -> list[tuple[str, int]]:
        """Every object under the subdirectory `name` of `fd`, whose keys start with
        `key_prefix`."""
        objects: list[tuple[str, int]] = []
        sub = self._open(fd, name)
        if sub is None:
            return objects
        rel = "/".join(p for p in (rel, name) if p)
        try:
            for entry, segment, is_object in self.entries(sub, rel):
                if is_object:
                    self.append_object(objects, key_prefix + segment, entry)
                else:
                    objects += self.walk(sub, entry.name, key_prefix + segment + "/", rel)
        finally:
            os.close(sub)
        return objects

    def scan(self, fd: int | None, key_prefix: str, name_prefix: str = "", rel: str = ""
             ) -> Iterator[ObjectInfo]:
        """Every object under the directory open on `fd` whose name starts with
        `name_prefix` (at this level only), lazily: one directory's entries in memory at
        a time, in name order."""
        for entry, name, is_object in sorted(self.entries(fd, rel), key=lambda e: e[1]):
            if not name.startswith(name_prefix):
                continue
            key = key_prefix + name
            if not is_object:
                assert fd is not None
                sub = self._open(fd, entry.name)
                if sub is None:
                    continue
                try:
                    yield from self.scan(sub, key + "/", "",
                                         "/".join(p for p in (rel, entry.name) if p))
                finally:
                    os.close(sub)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted since the directory was read
            yield _info(key, st)

    def has_objects(self, fd: int, name: str, rel: str = "") -> bool:
        """Whether any object lives under the subdirectory `name` of `fd` (leftover empty
        directories do not count)."""
        sub = self._open(fd, name)
        if sub is None:
            return False
        rel = "/".join(p for p in (rel, name) if p)
        try:
            return any(is_object or self.has_objects(sub, entry.name, rel)
                       for entry, _, is_object in self.entries(sub, rel))
        finally:
            os.close(sub)


def _mapped_segment(dir_fd: int, stem: str) -> str | None:
    """The segment a mapped file name stands for, from its name file in `dir_fd` (None if
    missing, or not a regular file of at most NAME_FILE_MAX bytes)."""
    try:
        fd = os.open(stem + NAME_SUFFIX, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > NAME_FILE_MAX:
            return None
        blob = _pread(fd, 0, st.st_size)
    finally:
        os.close(fd)
    segment = blob.decode("utf-8", "surrogateescape")
    return None if "/" in segment or segment in ("", ".", "..") else segment
