"""The local cache directory: staging files of written data and the read cache of chunks.

Layout (docs/ARCHITECTURE.md):

    <cache>/journal.sqlite     what is not yet in the store (journal.py)
    <cache>/staging/<id>       bytes written on this node, one sparse file per file version
    <cache>/chunks/<h:2>/<h>   raw (decoded, verified) chunks fetched from the store

Every chunk this node can read without the network is in `read()`'s index: a region of
a staging file, a fetched chunk in memory (`put_in_memory`), a read-cache file, or, for a
raw chunk of a local-directory store, a region of the store's own object file, read in
place once verified (`put_in_place`). A fetched chunk is held in memory until it has been
read once, all of it, and is then dropped, its buffer decoding a later one once no read
still holds a view of it (reads are views, not copies: DecodeBuffer): a restore,
which reads each chunk once, writes nothing to the cache disk (the kernel's page cache of
the mounted file serves a second reader). Only chunks pushed out of that bounded memory
unread go to the read cache on disk.
Read-cache files found at startup are served only once re-hashed (`verify_cached`): a
bit flipped on the cache disk, or a file cut short by a crash, must never be read.
Nothing in the cache directory is reached through a symbolic link: the directory,
staging/ and chunks/ are opened once as private directories (private.py: this user's,
not a link, no one else may write them) and every file in them is opened, made (0600,
O_EXCL) and removed relative to those, never following a link; at startup whatever
else is found there is removed (a link itself, never its target) or left alone (a
directory where a file belongs).
Clean data (uploaded staging files, fetched chunks) is evicted least-recently-used first
when the cache is over its size limit; dirty data is never evicted (writers wait
instead, see filesystem.py), and neither is a staging file whose version's manifest is
not yet in the store (its chunks may be needed again: see publisher.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import stat
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckptfs.common import private
from ckptfs.common.errors import ConfigError
from ckptfs.format import codec
from ckptfs.format.chunking import MAX_CHUNK_SIZE

if TYPE_CHECKING:
    import numpy as np  # codec.new_array makes the arrays: numpy loads at the first fetch

log = logging.getLogger(__name__)

_scratch = threading.local()
VERIFY_BLOCK = 4 << 20  # verify_cached hashes a file in reads of this size
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)  # libc, as linked: find_library runs ldconfig
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the disk blocks of [offset, offset + length) of a file; it reads as zeros
    afterwards and keeps its size. OSError where the file system cannot (EOPNOTSUPP)."""
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def pread_scratch(fd: int, length: int, offset: int) -> memoryview:
    """Read into the calling thread's reusable buffer (no new memory per chunk).

    The view is valid until this thread's next call; it may be shorter at end of file.
    Fresh memory is the expensive part of moving gigabytes (page faults, and on VMs a
    fault in the host too), so the threads that hash and upload chunks reuse one buffer.
    """
    buf: memoryview | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < length:
        buf = _scratch.buf = codec.new_buffer(length)
    view = memoryview(buf)[:length]
    return view[:os.preadv(fd, [view], offset)]


def file_identity(path_or_fd: str | int) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of a file, or None if it does not exist: a file
    read in place is trusted only while this is what it was when it was verified."""
    try:
        st = os.stat(path_or_fd)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(eq=False)
class StagingFile:
    """One version of one file written on this node: a sparse file in <cache>/staging."""

    id: int
    path: str
    fd: int
    sealed: bool = False  # published: its bytes never change again
    extent: int = 0  # highest byte written + 1 (cache accounting)
    holes: dict[int, int] = field(default_factory=dict)  # chunk offset -> bytes punched out
    dirty: dict[int, int] = field(default_factory=dict)  # chunk offset -> bytes not in store
    pending: int = 0  # sealed chunks still to upload
    writers: int = 0  # open write buffers using this file
    # unapplied put_file ops of this version: their manifest may need its chunks again
    # (publisher.py, re-confirmation of an old manifest), so the file stays until applied
    unpublished: int = 0
    indexed: set[str] = field(default_factory=set)  # hashes readable from here (locate())


@dataclass(eq=False)
class DecodeBuffer:
    """Memory a fetched chunk is decoded into (LocalCache.memory_buffer), lent out as
    views by reads and reused for a later chunk only once none of them is alive: a read
    hands pyfuse3 a view, not a copy, and the kernel copies from it after read() returns
    (or a read over two chunks joins it with the next part, after an await)."""

    array: np.ndarray
    views: list[weakref.ref[np.ndarray]] = field(default_factory=list)

    def view(self, start: int, stop: int) -> memoryview:
        part = self.array[start:stop]
        self.views.append(weakref.ref(part))
        return part.data

    def in_use(self) -> bool:
        self.views = [v for v in self.views if v() is not None]
        return bool(self.views)


@dataclass(eq=False)
class Held:
    """A fetched chunk in memory (LocalCache.put_in_memory)."""

    data: codec.Buffer  # its verified raw bytes, which never change while held
    buffer: DecodeBuffer | None  # the reusable memory under `data`, if any
    unread: int  # bytes still to read before it is dropped


class LocalCache:
    """Owns the files under the cache directory and the index of locally readable chunks."""

    def __init__(self, root: str, limit_bytes: int, memory_bytes: int = 0) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.memory_limit = memory_bytes
        self.staging_dir = os.path.join(root, "staging")
        self.chunks_dir = os.path.join(root, "chunks")
        os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
        root_fd = private.open_dir(root, "the cache directory", private.CACHE_FIX)
        try:  # every file below is opened relative to these, never through a link
            self.staging_fd = private.open_dir("staging", "the staging directory",
                                               private.INSIDE_FIX, dir_fd=root_fd,
                                               shown=self.staging_dir)
            self.chunks_fd = private.open_dir("chunks", "the read cache directory",
                                              private.INSIDE_FIX, dir_fd=root_fd,
                                              shown=self.chunks_dir)
        finally:
            os.close(root_fd)
        self._lock = threading.Lock()  # guards the read-cache index (fetch threads add)
        self.staging: dict[int, StagingFile] = {}
        self._next_staging_id = 1
        # hash -> (staging file, offset, length) for chunks held in staging files
        self._in_staging: dict[str, tuple[StagingFile, int, int]] = {}
        # hash -> size of read-cache files, in LRU order (oldest first)
        self._cached: OrderedDict[str, int] = OrderedDict()
        # those found at startup and not yet re-hashed in this mount: never served
        self._unverified: set[str] = set()
        # hash -> fetched chunks in memory, in LRU order; those being written to the read
        # cache (pushed out unread) are in _spilling meanwhile
        self._memory: OrderedDict[str, Held] = OrderedDict()
        self.memory_bytes = 0
        self._spilling: set[str] = set()
        self._buffers: list[DecodeBuffer] = []  # of dropped chunks, for the next decodes
        # hash -> (object file of a local store, offset, file_identity when verified)
        self._in_place: dict[str, tuple[str, int, tuple[int, int, int, int]]] = {}
        self._clean_staging: OrderedDict[int, None] = OrderedDict()  # LRU of evictable ones
        self._fds: OrderedDict[str, int] = OrderedDict()  # open read-cache / in-place files
        self.dirty_bytes = 0  # bytes written here and not yet in the store
        self.hits = 0
        self.misses = 0
        self.evicted_bytes = 0
        self._punch_failed = False
        #: staging files kept at scan though the journal does not name them: id -> path
        self.unnamed: dict[int, str] = {}

    # -- startup -------------------------------------------------------------------
    def scan(self, keep_staging: set[int], keep_unnamed: bool = False) -> None:
        """Index the read cache (unverified: see verify_cached); delete staging files
        the journal no longer needs (`keep_staging`: Journal.staging_in_use(), those with
        journaled chunks or an unapplied put_file op). With `keep_unnamed` (the journal
        may have lost committed state: Journal.damage), the others are kept too, in
        `unnamed`, for the check against the store (recovery.py) to read and remove."""
        for name in os.listdir(self.staging_fd):
            sid = int(name) if name.isdigit() else -1
            self._next_staging_id = max(self._next_staging_id, sid + 1)
            if sid in keep_staging:
                continue
            if keep_unnamed and sid >= 0 and self._is_file(self.staging_fd, name):
                self.unnamed[sid] = os.path.join(self.staging_dir, name)
            else:
                self._remove(self.staging_fd, name, self.staging_dir)
        for sid in keep_staging:
            try:
                fd = private.open_file(str(sid), os.O_RDWR, "the staging file",
                                       "not used, and removed", dir_fd=self.staging_fd,
                                       shown=os.path.join(self.staging_dir, str(sid)))
            except FileNotFoundError:
                continue
            except ConfigError as e:  # as if missing: the uploader says which files lost
                log.error("%s", e)  # chunks (none can be read from it)
                self._remove(self.staging_fd, str(sid), self.staging_dir)
                continue
            info = os.fstat(fd)  # holes (chunks freed while open) take no space
            st = StagingFile(sid, os.path.join(self.staging_dir, str(sid)), fd, sealed=True,
                             extent=min(info.st_size, info.st_blocks * 512))
            self.staging[sid] = st
        entries = []
        for sub in os.listdir(self.chunks_fd):
            try:
                sub_fd = os.open(sub, private.DIR_FLAGS, dir_fd=self.chunks_fd)
            except OSError:  # not a directory (a link, a file): never looked into
                self._remove(self.chunks_fd, sub, self.chunks_dir)
                continue
            try:
                for name in os.listdir(sub_fd):
                    st_ = os.stat(name, dir_fd=sub_fd, follow_symlinks=False)
                    if ".tmp" in name or not stat.S_ISREG(st_.st_mode):
                        self._remove(sub_fd, name, os.path.join(self.chunks_dir, sub))
                        continue
                    entries.append((st_.st_atime_ns, name, st_.st_size))
            finally:
                os.close(sub_fd)
        for _, name, size in sorted(entries):
            self._cached[name] = size
            self._unverified.add(name)

    @staticmethod
    def _is_file(dir_fd: int, name: str) -> bool:
        """Whether `name` in the directory `dir_fd` is a regular file (not a link)."""
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)

    @staticmethod
    def _remove(dir_fd: int, name: str, shown_dir: str) -> None:
        """Remove what is at `name` in the directory `dir_fd` at startup: a file, or a link
        itself (never what it points to); a directory is left, with a warning."""
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("left %s in the cache directory: %s", os.path.join(shown_dir, name),
                        e.strerror)

    # -- staging files ---------------------------------------------------------------
    def new_staging(self) -> StagingFile:
        while True:  # O_EXCL: always a file of its own, made here (0600)
            sid = self._next_staging_id
            self._next_staging_id += 1
            path = os.path.join(self.staging_dir, str(sid))
            try:
                fd = os.open(str(sid), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=self.staging_fd)
                break
            except FileExistsError:
                continue
        st = StagingFile(sid, path, fd)
        self.staging[sid] = st
        return st

    def set_dirty(self, st: StagingFile, chunk_offset: int, nbytes: int) -> None:
        """The chunk at `chunk_offset` of `st` holds `nbytes` bytes not in the store."""
        self.dirty_bytes += nbytes - st.dirty.get(chunk_offset, 0)
        st.dirty[chunk_offset] = nbytes

    def clear_dirty(self, st: StagingFile, chunk_offset: int) -> None:
        """The chunk at `chunk_offset` of `st` is in the store (or no longer needed)."""
        self.dirty_bytes -= st.dirty.pop(chunk_offset, 0)

    def add_staged_chunk(self, chunk_hash: str, st: StagingFile, offset: int, length: int) -> None:
        """Make a chunk held in a staging file readable by hash."""
        if chunk_hash not in self._in_staging:
            self._in_staging[chunk_hash] = (st, offset, length)
            st.indexed.add(chunk_hash)

    def staging_fds(self, chunk_hashes: list[str]) -> set[int]:
        """The open staging files that hold any of these chunks."""
        return {self._in_staging[h][0].fd for h in chunk_hashes if h in self._in_staging}

    def forget_staged(self, chunk_hash: str) -> None:
        """Stop serving a chunk from staging (its staged bytes were found damaged)."""
        entry = self._in_staging.pop(chunk_hash, None)
        if entry is not None:
            entry[0].indexed.discard(chunk_hash)

    def hold(self, st: StagingFile) -> None:
        """Keep a staging file from eviction until let_go (as an unapplied op does)."""
        st.unpublished += 1

    def let_go(self, st: StagingFile) -> None:
        st.unpublished -= 1
        self.release_staging(st)
        self.evict()

    def release_staging(self, st: StagingFile) -> None:
        """Called when a staging file may have become clean: make it evictable, or drop it."""
        if st.writers or st.pending or st.unpublished or st.id not in self.staging:
            return
        if not st.sealed or not (st.indexed or st.dirty):
            # never published (deleted while open), or it serves no chunk (an empty
            # version, or one whose chunks are all served from another staging file)
            self.drop_staging(st)
        else:
            self._clean_staging[st.id] = None

    def drop_clean_copies(self, hashes: set[str]) -> None:
        """Drop the clean staging files that hold nothing but these chunks (those of a
        deleted file): its page cache and disk space are free at once, for the next
        checkpoint of a rotation to reuse, instead of when LRU eviction reaches them."""
        for st in {self._in_staging[h][0] for h in hashes if h in self._in_staging}:
            if (st.sealed and not st.writers and not st.pending and not st.unpublished
                    and not st.dirty and st.indexed <= hashes):
                self.drop_staging(st)

    def drop_staging(self, st: StagingFile) -> None:
        for offset in list(st.dirty):
            self.clear_dirty(st, offset)
        self.staging.pop(st.id, None)
        self._clean_staging.pop(st.id, None)
        for h in st.indexed:
            del self._in_staging[h]
        st.indexed.clear()
        try:
            os.close(st.fd)
            st.fd = -1
            os.unlink(str(st.id), dir_fd=self.staging_fd)
        except OSError as e:
            log.warning("could not remove staging file %s: %s", st.path, e)

    # -- lookups -----------------------------------------------------------------------
    def read(self, chunk_hash: str, offset: int, length: int) -> bytes | memoryview | None:
        """Up to `length` bytes at `offset` of the chunk's raw bytes, or None if this node
        does not hold it (fetch it, then ask again). Short only past the chunk's end."""
        with self._lock:
            held = self._memory.get(chunk_hash)
            if held is not None:  # a view, not a copy (DecodeBuffer)
                end = min(offset + length, len(held.data))
                out = (memoryview(held.data)[offset:end] if held.buffer is None
                       else held.buffer.view(offset, end))
                held.unread -= len(out)
                if held.unread <= 0 and chunk_hash not in self._spilling:
                    self._drop_held(chunk_hash)
                else:
                    self._memory.move_to_end(chunk_hash)
                self.hits += 1
                return out
        loc = self.locate(chunk_hash)
        if loc is None:
            return None
        fd, base = loc
        return os.pread(fd, length, base + offset)

    def locate(self, chunk_hash: str) -> tuple[int, int] | None:
        """(fd, offset) where the raw bytes of the chunk can be read, or None (also for a
        read-cache file not verified yet: see unverified())."""
        hit = self._in_staging.get(chunk_hash)
        if hit is not None:
            st, offset, _ = hit
            if st.id in self._clean_staging:
                self._clean_staging.move_to_end(st.id)
            self.hits += 1
            return st.fd, offset
        with self._lock:
            in_place = self._in_place.get(chunk_hash)
            if in_place is None and chunk_hash in self._unverified:
                return None  # the fetcher verifies it first
            if in_place is None and chunk_hash not in self._cached:
                self.misses += 1
                return None
            if in_place is None:
                self._cached.move_to_end(chunk_hash)
            fd = self._fds.get(chunk_hash)
            if fd is None:
                try:  # a store's file may have been swapped: no link, no FIFO wait
                    fd = (self._open_cached(chunk_hash) if in_place is None
                          else os.open(in_place[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
                except OSError:
                    if in_place is None:
                        raise
                    self._not_in_place(chunk_hash)
                    return None
                self._fds[chunk_hash] = fd
                while len(self._fds) > 64:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(chunk_hash)
            if in_place is not None and file_identity(fd) != in_place[2]:
                os.close(self._fds.pop(chunk_hash))
                self._not_in_place(chunk_hash)
                return None
            self.hits += 1
            return fd, 0 if in_place is None else in_place[1]

    def _not_in_place(self, chunk_hash: str) -> None:
        """A store file read in place was replaced, changed or removed since it was
        verified: forget it, so that the chunk is fetched (and verified) again."""
        del self._in_place[chunk_hash]
        self.misses += 1

    def has(self, chunk_hash: str) -> bool:
        """Whether locate() can serve the chunk without I/O elsewhere."""
        with self._lock:
            return (chunk_hash in self._in_staging or chunk_hash in self._in_place
                    or chunk_hash in self._memory
                    or (chunk_hash in self._cached and chunk_hash not in self._unverified))

    def unverified(self, chunk_hash: str) -> bool:
        """Whether the read cache holds a file for the chunk, from before this mount,
        that must be re-hashed (verify_cached) before it is served."""
        with self._lock:
            return chunk_hash in self._unverified

    # -- read cache (called from fetch threads) ---------------------------------------
    @staticmethod
    def _chunk_name(chunk_hash: str) -> str:
        """The read-cache file of a chunk, relative to chunks/ (chunks_fd)."""
        return f"{chunk_hash[:2]}/{chunk_hash}"

    def _open_cached(self, chunk_hash: str) -> int:
        """The read-cache file of a chunk, opened for reading; its directory chunks/<h:2>
        is one ckptfs made (scan removed anything else), and the file is no link."""
        return os.open(self._chunk_name(chunk_hash), os.O_RDONLY | os.O_NOFOLLOW
                       | os.O_CLOEXEC, dir_fd=self.chunks_fd)

    def put_fetched(self, chunk_hash: str, data: codec.Buffer) -> None:
        """Store a verified chunk in the read cache (atomically: temp file + rename)."""
        sub = chunk_hash[:2]
        try:
            os.mkdir(sub, 0o700, dir_fd=self.chunks_fd)
        except FileExistsError:
            pass
        sub_fd = os.open(sub, private.DIR_FLAGS, dir_fd=self.chunks_fd)
        try:
            tmp = f"{chunk_hash}.tmp{threading.get_ident()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=sub_fd)
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, chunk_hash, src_dir_fd=sub_fd, dst_dir_fd=sub_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=sub_fd)
                raise
        finally:
            os.close(sub_fd)
        with self._lock:
            self._cached[chunk_hash] = len(data)
            self._unverified.discard(chunk_hash)

    def memory_buffer(self, size: int) -> DecodeBuffer:
        """A buffer of at least `size` bytes to decode a chunk into for put_in_memory: one
        of a dropped chunk that no read still views, if there is one (fresh memory costs
        page faults), else new (its pages faulted in by the decode, GIL released)."""
        with self._lock:
            for i, buf in enumerate(self._buffers):
                if len(buf.array) >= size and not buf.in_use():
                    return self._buffers.pop(i)
        return DecodeBuffer(codec.new_array(size))

    def recycle(self, buf: DecodeBuffer | None) -> None:
        """Give back a buffer from memory_buffer() that holds nothing any more."""
        with self._lock:
            self._give_back(buf)

    def _give_back(self, buf: DecodeBuffer | None) -> None:
        """(with _lock held) keep at most 8 buffers for the next decodes"""
        if buf is not None and len(self._buffers) < 8:
            self._buffers.append(buf)

    def put_in_memory(self, chunk_hash: str, data: codec.Buffer,
                      buffer: DecodeBuffer | None = None) -> None:
        """Hold a verified chunk in memory until it has been read once (`data`, which
        must not change, is a view of `buffer` when it came from memory_buffer()). While
        more than memory_limit bytes are held, the least recently used ones are written
        to the read cache (put_fetched). In a fetch thread."""
        with self._lock:
            if chunk_hash in self._memory:
                self._give_back(buffer)
                return
            self._memory[chunk_hash] = Held(data, buffer, len(data))
            self.memory_bytes += len(data)
        while True:
            with self._lock:
                over = self.memory_bytes - sum(len(self._memory[h].data)
                                               for h in self._spilling)
                victim = next((h for h in self._memory if h not in self._spilling), None)
                if over <= self.memory_limit or victim is None:
                    return
                self._spilling.add(victim)
                held = self._memory[victim]
            try:  # readers keep finding it in memory until it is on disk
                self.put_fetched(victim, held.data)
            except OSError as e:  # (cache disk full?) dropped: fetched again if read
                log.debug("could not write chunk %s to the read cache: %s", victim, e)
            finally:
                with self._lock:
                    self._spilling.discard(victim)
                    self._drop_held(victim)

    def _drop_held(self, chunk_hash: str) -> None:
        """(with _lock held)"""
        held = self._memory.pop(chunk_hash)
        self.memory_bytes -= len(held.data)
        self._give_back(held.buffer)

    def verify_cached(self, chunk_hash: str) -> bool:
        """In a fetch thread: re-hash an unverified read-cache file. True: it holds the
        chunk, and is served from now on. False: it is damaged (wrong bytes, wrong size,
        unreadable) or gone, and it is removed: the caller fetches the chunk again."""
        hasher = codec.chunk_hasher()
        size = 0
        try:
            with open(self._open_cached(chunk_hash), "rb", buffering=0) as f:
                while size <= MAX_CHUNK_SIZE:
                    block = pread_scratch(f.fileno(), VERIFY_BLOCK, size)
                    if not block:
                        break
                    hasher.update(block)
                    size += len(block)
            ok = size <= MAX_CHUNK_SIZE and hasher.hexdigest() == chunk_hash
        except OSError:  # gone (evicted meanwhile), or the disk cannot read it
            ok = False
        with self._lock:
            self._unverified.discard(chunk_hash)
            if not ok:
                self._cached.pop(chunk_hash, None)
        if not ok:  # no fd of it is open: locate() never opens an unverified file
            try:
                os.unlink(self._chunk_name(chunk_hash), dir_fd=self.chunks_fd)
            except FileNotFoundError:
                pass
        return ok

    def put_in_place(self, chunk_hash: str, path: str, offset: int,
                     identity: tuple[int, int, int, int]) -> None:
        """Make a verified raw chunk readable at `offset` of a local store's object file,
        for as long as the file keeps the identity it had when it was verified."""
        with self._lock:
            self._in_place[chunk_hash] = (path, offset, identity)

    # -- size accounting -----------------------------------------------------------------
    @property
    def staging_bytes(self) -> int:
        return sum(st.extent - sum(st.holes.values()) for st in self.staging.values())

    def punch_uploaded(self, st: StagingFile, chunk_offset: int, length: int) -> bool:
        """Free a chunk of an open file's staging file that is safely in the store (its
        bytes are fetched back if read or partly overwritten). False if the cache's file
        system cannot punch holes: the chunk then stays until the file is closed."""
        try:
            punch_hole(st.fd, chunk_offset, length)
        except OSError as e:
            if not self._punch_failed:
                log.warning("cannot free uploaded chunks of open files in %s (%s): a file "
                            "larger than --cache-size may fill the cache disk", self.root, e)
                self._punch_failed = True
            return False
        st.holes[chunk_offset] = length
        self.evicted_bytes += length
        return True

    def fill_hole(self, st: StagingFile, chunk_offset: int) -> None:
        """The chunk at `chunk_offset` is being written into the staging file again."""
        st.holes.pop(chunk_offset, None)

    def over_limit(self) -> bool:
        return self.used_bytes > self.limit_bytes

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(self._cached.values())

    @property
    def used_bytes(self) -> int:
        return self.staging_bytes + self.cached_bytes

    def evict(self, keep: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Drop clean data, least recently used first, until under the size limit."""
        over = self.used_bytes - self.limit_bytes
        while over > 0:
            with self._lock:
                victim = next((h for h in self._cached if h not in keep), None)
                size = self._cached.pop(victim) if victim else 0
                self._unverified.discard(victim or "")
                fd = self._fds.pop(victim, None) if victim else None
            if victim is not None:
                if fd is not None:
                    os.close(fd)
                try:
                    os.unlink(self._chunk_name(victim), dir_fd=self.chunks_fd)
                except FileNotFoundError:
                    pass
            elif self._clean_staging:
                sid, _ = self._clean_staging.popitem(last=False)
                st = self.staging.get(sid)
                if st is None or st.unpublished:  # released again once its op is applied
                    continue
                size = st.extent - sum(st.holes.values())
                self.drop_staging(st)
            else:
                return  # only dirty data left: writers wait for uploads
            over -= size
            self.evicted_bytes += size

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for st in self.staging.values():
            try:
                os.close(st.fd)
            except OSError:
                pass
        for fd in (self.staging_fd, self.chunks_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.staging_fd = self.chunks_fd = -1
