"""Read-only walks over a store, no mount needed: list, verify, latest checkpoint, fsck."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from ckptfs.common.errors import (
    BadObjectError,
    CorruptChunkError,
    FormatError,
    InvalidKeyError,
    NoEntry,
    NotFoundError,
)
from ckptfs.format import manifests
from ckptfs.format.codec import HEADER_SIZE, MAX_OBJECT_SIZE, decode_chunk
from ckptfs.format.manifests import DirMarker, Manifest, RenameIntent, StoreInfo
from ckptfs.store.base import Store

T = TypeVar("T")
R = TypeVar("R")

#: parallel HEAD/GET requests of one walk
WORKERS = 16
#: tasks submitted ahead of the workers (bounds memory on stores with millions of chunks)
WINDOW = 4 * WORKERS
NUMBER = re.compile(r"\d+")

#: kinds of Problem (DAMAGED: a record in the store that does not parse or validate)
MISSING, CORRUPT, DAMAGED, RENAMING = "missing", "corrupt", "damaged", "renaming"


class Tiers(NamedTuple):
    """A store with a fast tier, tier by tier: the walks get its view (both tiers as one,
    pipeline/fasttier.view) and check a chunk in each tier apart from it."""

    fast: Store
    slow: Store  # the object store alone


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: int = WORKERS
                 ) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) for every item, run on `workers` threads, in completion order.

    At most WINDOW calls are queued at a time. The first exception raised by `fn` is
    raised here (the calls still queued are cancelled).
    """
    with ThreadPoolExecutor(workers, thread_name_prefix="ckptfs-inspect") as pool:
        running: dict[Future[R], T] = {}
        try:
            for item in items:
                if len(running) >= WINDOW:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for f in done:
                        yield running.pop(f), f.result()
                running[pool.submit(fn, item)] = item
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    yield running.pop(f), f.result()
        finally:
            for f in running:
                f.cancel()


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Problem:
    """One reason a file is not complete: a chunk, a manifest, or a rename in flight; or
    (fsck) a damaged directory marker, trash entry or rename intent."""

    path: str          # the file (or directory, for RENAMING), relative to the fs root;
                       # the key of a damaged trash entry or intent
    kind: str          # MISSING, CORRUPT, DAMAGED or RENAMING
    chunk: str = ""    # the chunk's hash (MISSING, CORRUPT)
    index: int = -1    # its position in the file
    writer: str = ""   # the node that wrote the manifest (or started the rename)
    detail: str = ""

    def describe(self) -> str:
        by = f", written by node {self.writer}" if self.writer else ""
        if self.kind == MISSING:
            return (f"{self.path}: chunk {self.index} ({manifests.chunk_key(self.chunk)}) "
                    f"is not in the store{by}")
        if self.kind == CORRUPT:
            return (f"{self.path}: chunk {self.index} ({manifests.chunk_key(self.chunk)}) "
                    f"is corrupt: {self.detail}{by}")
        if self.kind == RENAMING:
            return f"{self.path}: {self.detail}"
        return f"{self.path}: {self.detail}"

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "chunk": self.chunk or None,
                "index": self.index if self.index >= 0 else None,
                "writer": self.writer or None, "detail": self.detail or None}


@dataclass
class FileReport:
    """One file (or symlink) as the store has it, and whether all of its chunks are there."""

    path: str
    size: int = 0
    mode: int = 0
    mtime_ns: int = 0
    writer: str = ""
    n_chunks: int = 0
    target: str | None = None     # symlinks only
    missing: list[tuple[int, str]] = field(default_factory=list)   # (index, hash)
    corrupt: list[tuple[int, str, str]] = field(default_factory=list)  # (index, hash, why)
    error: str | None = None      # the manifest could not be read or parsed
    fast_only: bool = False       # this version is in the fast tier, not yet in the store

    @property
    def complete(self) -> bool:
        return self.error is None and not self.missing and not self.corrupt

    @property
    def durable(self) -> bool:
        """Complete, and in the object store (not only in a fast tier)."""
        return self.complete and not self.fast_only

    def problems(self) -> list[Problem]:
        if self.error is not None:
            return [Problem(self.path, DAMAGED, detail=self.error)]
        return ([Problem(self.path, MISSING, h, i, self.writer) for i, h in self.missing]
                + [Problem(self.path, CORRUPT, h, i, self.writer, why)
                   for i, h, why in self.corrupt])

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "mode": self.mode,
                "mtime_ns": self.mtime_ns, "writer": self.writer, "chunks": self.n_chunks,
                "target": self.target, "complete": self.complete,
                "missing": [h for _, h in self.missing],
                "corrupt": [h for _, h, _ in self.corrupt], "error": self.error,
                "durable": self.durable}


@dataclass
class VerifyResult:
    """verify(): the files under a path and every reason one of them is not complete."""

    path: str
    files: list[FileReport]
    problems: list[Problem]

    @property
    def complete(self) -> bool:
        return not self.problems

    fast_damaged: list[tuple[str, str]] = field(default_factory=list)  # (hash, why):
    # chunks damaged in the fast tier that the store has a good copy of (not data loss)

    @property
    def incomplete_files(self) -> list[FileReport]:
        return [f for f in self.files if not f.complete]

    @property
    def fast_only_files(self) -> list[FileReport]:
        """Complete files whose version is in the fast tier alone (fast-durable)."""
        return [f for f in self.files if f.complete and f.fast_only]

    @property
    def durable(self) -> bool:
        return self.complete and not self.fast_only_files

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "complete": self.complete, "files": len(self.files),
                "bytes": sum(f.size for f in self.files),
                "incomplete_files": [f.path for f in self.incomplete_files],
                "problems": [p.to_dict() for p in self.problems],
                "durable": self.durable,
                "fast_only_files": [f.path for f in self.fast_only_files],
                "fast_damaged_chunks": [{"chunk": h, "detail": why}
                                        for h, why in self.fast_damaged]}


@dataclass(frozen=True)
class Intent:
    """A directory rename that is running, or that a lost node left half done."""

    key: str
    src: str
    dst: str
    writer: str
    error: str | None = None  # damaged: why (the mounts leave it alone; fsck names it)

    def touches(self, path: str) -> bool:
        """Whether `path` is, contains, or lies inside the rename's source or target."""
        return any(_related(path, p) for p in (self.src, self.dst))


@dataclass
class FsckReport:
    """fsck(): the whole store checked; `clean` when nothing needs attention."""

    url: str
    info: StoreInfo | None = None
    info_error: str | None = None
    deep: bool = False
    files: int = 0
    symlinks: int = 0
    dir_markers: int = 0
    file_bytes: int = 0
    chunks_referenced: int = 0
    chunks_stored: int = 0        # in the object store (with a fast tier: apart from it)
    stored_bytes: int = 0
    garbage_chunks: int = 0       # stored but named by no manifest: not an error (gc)
    garbage_bytes: int = 0
    fossils: int = 0              # chunks set aside by gc (fossils/): not an error
    fossil_bytes: int = 0
    referenced_fossils: int = 0   # of those, named by a manifest: readable, gc restores them
    trash_files: int = 0          # manifests in the trash (their chunks are not garbage)
    problems: list[Problem] = field(default_factory=list)       # missing/corrupt/unreadable
    corrupt_garbage: list[tuple[str, str]] = field(default_factory=list)  # (hash, why)
    intents: list[Intent] = field(default_factory=list)         # warnings
    strays: list[str] = field(default_factory=list)             # keys outside the layout
    # with a fast tier (`tiers`): the store is both tiers as readers see them; these say
    # what each holds. None without one.
    fast_chunks: int | None = None    # chunk objects in the fast tier
    fast_bytes: int = 0
    pending_chunks: int = 0           # of those, not in the object store: movers copy them
    pending_bytes: int = 0
    #: (hash, why, whether the object store has a good copy: then not data loss)
    fast_damaged: list[tuple[str, str, bool]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.info_error is None and not self.problems and not self.corrupt_garbage

    def to_dict(self) -> dict[str, object]:
        return {
            "store": self.url, "clean": self.clean, "deep": self.deep,
            "format": self.info.format if self.info else None,
            "chunk_size": self.info.chunk_size if self.info else None,
            "info_error": self.info_error, "files": self.files, "symlinks": self.symlinks,
            "dir_markers": self.dir_markers, "file_bytes": self.file_bytes,
            "chunks_referenced": self.chunks_referenced, "chunks_stored": self.chunks_stored,
            "stored_bytes": self.stored_bytes, "garbage_chunks": self.garbage_chunks,
            "garbage_bytes": self.garbage_bytes, "fossils": self.fossils,
            "fossil_bytes": self.fossil_bytes, "referenced_fossils": self.referenced_fossils,
            "trash_files": self.trash_files,
            "problems": [p.to_dict() for p in self.problems],
            "corrupt_garbage": [{"chunk": h, "detail": why} for h, why in self.corrupt_garbage],
            "intents": [{"key": i.key, "src": i.src, "dst": i.dst, "writer": i.writer}
                        for i in self.intents],
            "strays": self.strays,
            "fast_tier": None if self.fast_chunks is None else {
                "chunks": self.fast_chunks, "bytes": self.fast_bytes,
                "pending_chunks": self.pending_chunks, "pending_bytes": self.pending_bytes,
                "damaged_chunks": [{"chunk": h, "detail": why, "store_has_good_copy": good}
                                   for h, why, good in self.fast_damaged]},
        }


# ---------------------------------------------------------------------------- helpers
def read_info(store: Store) -> StoreInfo:
    """ckptfs.json, checked; NoEntry when the store has none, FormatError when unusable."""
    try:
        blob = store.get_record(manifests.INFO_KEY)
    except NotFoundError:
        raise NoEntry(f"not a ckptfs store (no {manifests.INFO_KEY}): {store.url}") from None
    info = StoreInfo.from_json(blob)
    use_store_mode(store, info)
    return info


def use_store_mode(store: Store, info: StoreInfo) -> None:
    """Tell a directory store the mode ckptfs.json records for the files it writes (the
    other stores have none)."""
    set_file_mode = getattr(store, "set_file_mode", None)
    if set_file_mode is not None:
        set_file_mode(info.store_mode)


def check_is_store(store: Store) -> None:
    """NoEntry unless `store` is a ckptfs store: it has ckptfs.json or, having lost it,
    still has a store's layout (files/, chunks/, intents/ or fossils/), which fsck then
    checks."""
    try:
        read_info(store)
    except NoEntry:
        for prefix in (manifests.FILES, manifests.CHUNKS, manifests.INTENTS,
                       manifests.FOSSILS):
            listing = store.list(prefix, delimiter="/")
            if listing.objects or listing.prefixes:
                return
        raise
    except FormatError:
        return  # a store whose ckptfs.json is unusable: fsck reports it


def _related(a: str, b: str) -> bool:
    """Whether path a is b, or one of them contains the other ('' is the root)."""
    return a == b or not a or not b or a.startswith(b + "/") or b.startswith(a + "/")


def read_intents(store: Store) -> list[Intent]:
    """The directory renames recorded in the store (intents/); a damaged one (`error`
    set, no paths) touches everything, as its paths are unknown."""
    intents = []
    for key, _ in store.list(manifests.INTENTS, delimiter=None).objects:
        try:
            intent = RenameIntent.from_json(store.get_record(key))
            intents.append(Intent(key, intent.src, intent.dst, intent.writer))
        except NotFoundError:
            continue  # finished meanwhile
        except FormatError as e:
            intents.append(Intent(key, "", "", "?", str(e)))
    return intents


def damaged_intent(intent: Intent) -> str:
    """What a damaged rename intent means, for its one line."""
    return (f"{intent.error}; a directory rename may be half done, and no mount finishes "
            f"a damaged intent (repair or delete {intent.key})")


def _read_manifest(store: Store, key: str) -> tuple[str, Manifest | None, str | None] | None:
    """(path, manifest, None) or (path, None, why) for a files/ key; None if it vanished."""
    try:
        path = manifests.path_of_key(key)
    except InvalidKeyError as e:
        return key, None, str(e)
    try:
        return path, Manifest.from_json(store.get_record(key)), None
    except NotFoundError:
        return None  # deleted or renamed since the listing
    except FormatError as e:  # a BadObjectError too: not a file, or too large to be one
        return path, None, str(e)


def _read_record(store: Store, key: str) -> tuple[Manifest | None, str | None]:
    """(the manifest, None) for a manifest key, (None, None) for a marker (its key ends
    in '/') or an object gone since the listing, (None, why) for a damaged one."""
    try:
        blob = store.get_record(key)
        if key.endswith("/"):
            DirMarker.from_json(blob)
            return None, None
        return Manifest.from_json(blob), None
    except NotFoundError:
        return None, None
    except FormatError as e:  # a BadObjectError too: not a file, or too large to be one
        return None, str(e)


def _read_manifests(store: Store, keys: Iterable[str]
                    ) -> list[tuple[str, Manifest | None, str | None]]:
    found = [r for _, r in parallel_map(lambda k: _read_manifest(store, k), keys)]
    return sorted((r for r in found if r is not None), key=lambda r: r[0])


class ChunkChecker:
    """HEADs (or, deep, GETs and re-hashes) chunks once each, however many files name them.
    With `tiers`, a chunk is looked for in the fast tier, then in the object store: it is
    sound when either has a sound copy; a damaged copy in the fast tier is noted apart
    (`fast_damaged`), data loss only when the object store has no sound copy."""

    def __init__(self, store: Store, deep: bool = False, tiers: Tiers | None = None) -> None:
        self.store = store
        self.deep = deep
        self.tiers = tiers
        #: hash -> None (present and, if deep, sound), MISSING, or (CORRUPT, why)
        self.results: dict[str, str | tuple[str, str] | None] = {}
        #: the chunks of `results` found in fossils/ (set aside by gc), not in chunks/
        self.fossils: set[str] = set()
        #: with tiers: hash -> (why its fast-tier copy is damaged, whether the object
        #: store has a sound copy)
        self.fast_damaged: dict[str, tuple[str, bool]] = {}

    def check_key(self, store: Store, key: str, chunk_hash: str) -> str | tuple[str, str] | None:
        """None (present and, if deep, sound), MISSING or (CORRUPT, why): one object."""
        if not self.deep:
            size = store.head(key)
            if size is None:
                return MISSING
            if size < HEADER_SIZE:
                return CORRUPT, f"object of {size} bytes is shorter than a chunk header"
            return None
        try:
            blob = store.get(key, MAX_OBJECT_SIZE)
        except NotFoundError:
            return MISSING
        except BadObjectError as e:  # not a file, or larger than a chunk can be
            return CORRUPT, str(e)
        try:
            decode_chunk(blob, chunk_hash)
        except CorruptChunkError as e:
            return CORRUPT, str(e)
        return None

    def check_in(self, store: Store, chunk_hash: str) -> tuple[str | tuple[str, str] | None, bool]:
        """(result, whether the chunk was found in fossils/ instead of chunks/: set aside by
        gc, readable there as readers fall back to it, restored by the next gc run)."""
        result = self.check_key(store, manifests.chunk_key(chunk_hash), chunk_hash)
        if result != MISSING:
            return result, False
        fossil = self.check_key(store, manifests.fossil_key(chunk_hash), chunk_hash)
        return (MISSING, False) if fossil == MISSING else (fossil, True)

    def check_one(self, chunk_hash: str) -> tuple[str | tuple[str, str] | None, bool]:
        """check_in the store, or with tiers: in the fast tier, then in the object store."""
        if self.tiers is None:
            return self.check_in(self.store, chunk_hash)
        fast = self.check_key(self.tiers.fast, manifests.chunk_key(chunk_hash), chunk_hash)
        if fast is None:
            return None, False
        result, fossil = self.check_in(self.tiers.slow, chunk_hash)
        if fast == MISSING:
            return result, fossil
        why = fast[1]
        self.fast_damaged[chunk_hash] = (why, result is None)
        if result is None:
            return None, fossil
        if result == MISSING:
            return (CORRUPT, f"damaged in the fast tier ({why}) and not in the store"), False
        return (CORRUPT, f"damaged in the fast tier ({why}) and in the store "
                f"({result[1]})"), fossil

    def check(self, hashes: Iterable[str]) -> None:
        todo = {h for h in hashes if h not in self.results}
        for h, (result, fossil) in parallel_map(self.check_one, sorted(todo)):
            self.results[h] = result
            if fossil:
                self.fossils.add(h)

    def report(self, path: str, m: Manifest | None, error: str | None) -> FileReport:
        """A FileReport from a manifest whose chunks check() has seen."""
        if m is None:
            return FileReport(path, error=error)
        r = FileReport(path, m.size, m.mode, m.mtime_ns, m.writer, len(m.chunks), m.target)
        for i, (h, _) in enumerate(m.chunks):
            result = self.results.get(h)
            if result == MISSING:
                r.missing.append((i, h))
            elif isinstance(result, tuple):
                r.corrupt.append((i, h, result[1]))
        return r


# ---------------------------------------------------------------------------- walks
def read_tree(store: Store, path: str = "") -> list[tuple[str, Manifest | None, str | None]]:
    """(path, manifest, None) or (path, None, why it is damaged) of every file under
    directory `path` (recursively), or of the one file `path` names, sorted by path; no
    chunk is looked at. NoEntry if the store has neither a file nor a directory there."""
    path = manifests.check_path(path.strip("/"))
    if path:
        one = _read_manifest(store, manifests.file_key(path))
        if one is not None:
            return [one]
    prefix = manifests.dir_prefix(path)
    keys = [k for k, _ in store.list(prefix, delimiter=None).objects]
    if path and not keys:
        raise NoEntry(f"no such file or directory in the store: {path}")
    return _read_manifests(store, (k for k in keys if not k.endswith("/")))


def list_files(store: Store, path: str = "", deep: bool = False,
               checker: ChunkChecker | None = None, tiers: Tiers | None = None
               ) -> list[FileReport]:
    """Every file under directory `path` (recursively), or the one file `path` names.

    Each chunk is HEADed once (deep: fetched and re-hashed once). NoEntry if the store
    has neither a file nor a directory at `path`. `checker` may be shared between calls
    to reuse what it has learned. With `tiers` (`store` is then their view), each file
    says whether its version is in the fast tier alone (`fast_only`).
    """
    checker = checker or ChunkChecker(store, deep, tiers)
    found = read_tree(store, path)
    checker.check(h for _, m, _ in found if m is not None for h, _ in m.chunks)
    reports = [checker.report(p, m, err) for p, m, err in found]
    if tiers is not None:
        fast_only = fast_only_paths(tiers, path.strip("/"), [r.path for r in reports])
        for r in reports:
            r.fast_only = r.path in fast_only
    return reports


def fast_only_paths(tiers: Tiers, path: str, paths: list[str]) -> set[str]:
    """Of `paths` (files under directory `path`, or the file `path`), those whose newest
    version is in the fast tier alone: the fast tier holds a manifest there and the
    object store none, or one of a lower generation. A listing of the fast tier under
    `path`, and two GETs per file it holds there (it keeps the newest checkpoints)."""
    keys = {k for k, _ in tiers.fast.list(manifests.dir_prefix(path), delimiter=None).objects}
    if path:
        keys.add(manifests.file_key(path))
    candidates = [p for p in paths if manifests.file_key(p) in keys]

    def generation(store: Store, p: str) -> int:
        try:
            return manifests.generation(store.get_record(manifests.file_key(p)))
        except NotFoundError:
            return -1

    def only_fast(p: str) -> bool:
        fast = generation(tiers.fast, p)
        return fast >= 0 and generation(tiers.slow, p) < fast

    return {p for p, yes in parallel_map(only_fast, candidates) if yes}


def verify(store: Store, path: str = "", deep: bool = False,
           tiers: Tiers | None = None) -> VerifyResult:
    """Whether every file under `path` (or the file `path`) has all of its chunks.

    Also incomplete: a path that a directory rename in flight is moving (its files are
    then split between two names). With `tiers` (`store` is their view), a chunk in
    either tier counts, and each file says whether it is in the object store yet.
    """
    path = path.strip("/")
    checker = ChunkChecker(store, deep, tiers)
    files = list_files(store, path, deep, checker, tiers)
    problems = [p for f in files for p in f.problems()]
    for intent in read_intents(store):
        if not intent.touches(path):
            continue
        if intent.error is not None:
            problems.append(Problem(intent.key, DAMAGED, detail=damaged_intent(intent)))
            continue
        problems.append(Problem(path, RENAMING, writer=intent.writer, detail=(
                f"a directory rename {intent.src or '?'} -> {intent.dst or '?'} by node "
                f"{intent.writer} is in flight or was interrupted ({intent.key}); the next "
                f"mount finishes it")))
    return VerifyResult(path, files, problems, sorted(
        (h, why) for h, (why, good) in checker.fast_damaged.items() if good))


def checkpoint_order_key(name: str) -> tuple[int, ...]:
    """The numbers in a name, in order: checkpoint-9 < checkpoint-10, (epoch, step) pairs."""
    return tuple(int(n) for n in NUMBER.findall(name))


def checkpoint_names(store: Store, dir_path: str, pattern: str) -> tuple[str, list[str]]:
    """(`dir_path` checked, the sorted names of its subdirectories that match the fnmatch
    `pattern`): the candidates of latest() and retention.prune(). NoEntry if the store
    has no such directory."""
    dir_path = manifests.check_path(dir_path.strip("/"))
    prefix = manifests.dir_prefix(dir_path)
    listing = store.list(prefix, delimiter="/")
    names = sorted(p[len(prefix):].rstrip("/") for p in listing.prefixes)
    if not names and not listing.objects and dir_path:
        raise NoEntry(f"no such directory in the store: {dir_path}")
    return dir_path, [n for n in names if fnmatch.fnmatchcase(n, pattern)]


def latest(store: Store, dir_path: str = "", pattern: str = "*", deep: bool = False,
           damaged: Callable[[Problem], None] = lambda problem: None) -> str | None:
    """The newest complete checkpoint directory directly under `dir_path`, or None.

    Candidates are the subdirectories whose name matches the fnmatch `pattern`. When every
    candidate's name contains a number, newest = the largest numbers (compared in order,
    so checkpoint-100 > checkpoint-99 and epoch=2-step=10 > epoch=1-step=90); otherwise
    newest = the latest mtime of the files inside. A directory with no files, with a
    missing or corrupt chunk, an unreadable manifest, or in a directory rename in flight
    is skipped; `damaged` is told of each damaged manifest (and rename intent) met. The
    result is a path relative to the filesystem root.
    """
    found = latest_checkpoint(store, dir_path, pattern, deep, damaged)
    return None if found is None else found[0]


def latest_checkpoint(store: Store, dir_path: str = "", pattern: str = "*",
                      deep: bool = False,
                      damaged: Callable[[Problem], None] = lambda problem: None,
                      tiers: Tiers | None = None, durable: bool = False
                      ) -> tuple[str, list[FileReport]] | None:
    """latest(), and the files of the checkpoint it found. With `tiers` (`store` is their
    view) a checkpoint in the fast tier counts, each file saying whether it is in the
    object store yet; with `durable` too, only one all in the object store counts."""
    dir_path, names = checkpoint_names(store, dir_path, pattern)
    intents = read_intents(store)
    for i in intents:
        if i.error is not None:
            damaged(Problem(i.key, DAMAGED, detail=damaged_intent(i)))
    checker = ChunkChecker(store, deep, tiers)

    def usable(files: list[FileReport], path: str) -> bool:
        for f in files:
            if f.error is not None:
                damaged(Problem(f.path, DAMAGED, detail=f.error))
        return (bool(files) and all(f.durable if durable else f.complete for f in files)
                and not any(i.touches(path) for i in intents))

    def files_of(path: str) -> list[FileReport]:
        return list_files(store, path, checker=checker, tiers=tiers)

    if names and all(NUMBER.search(n) for n in names):
        for name in sorted(names, key=lambda n: (checkpoint_order_key(n), n), reverse=True):
            path = manifests.join(dir_path, name)
            files = files_of(path)
            if usable(files, path):
                return path, files
        return None
    newest: tuple[int, str, list[FileReport]] | None = None
    for name in names:
        path = manifests.join(dir_path, name)
        files = files_of(path)
        if usable(files, path) and (newest is None or
                                    (max(f.mtime_ns for f in files), path) > newest[:2]):
            newest = (max(f.mtime_ns for f in files), path, files)
    return None if newest is None else (newest[1], newest[2])


def _stored_chunks(store: Store, report: FsckReport) -> dict[str, int]:
    """Chunk name -> size, of a listing of chunks/; other keys there are strays."""
    stored: dict[str, int] = {}
    for key, size in store.list(manifests.CHUNKS, delimiter=None).objects:
        name = manifests.chunk_name(key)
        if name is not None:
            stored[name] = size
        else:
            report.strays.append(key)
    return stored


def _check_store_copies(tiers: Tiers, checker: ChunkChecker, both: set[str],
                        report: FsckReport) -> None:
    """fsck --deep: the object store's copy of each chunk the fast tier holds soundly
    too (readers read the fast tier's): a damaged one is a problem, the fast tier's copy
    being the only sound one until it is trimmed."""
    store_checker = ChunkChecker(tiers.slow, deep=True)
    store_checker.check(h for h in both if h not in checker.fast_damaged)
    for h, result in sorted(store_checker.results.items()):
        if isinstance(result, tuple):
            report.problems.append(Problem(
                manifests.chunk_key(h), DAMAGED, h, detail=f"damaged in the store: "
                f"{result[1]}; the fast tier's copy is sound (readers read it) until it "
                f"is trimmed"))


def fsck(store: Store, deep: bool = False, tiers: Tiers | None = None) -> FsckReport:
    """Check the whole store: ckptfs.json, every manifest, every chunk they name.

    Missing chunks are found by listing chunks/ (after the manifests were read, so a chunk
    uploaded meanwhile is seen) and confirmed with a HEAD; one that gc set aside in
    fossils/ is not missing (readers read it there). With `deep`, every stored chunk
    is fetched and re-hashed, referenced or not: an unreferenced corrupt chunk matters
    too, since a writer that deduplicates against it would trust it. With `tiers`
    (`store` is their view), a chunk in either tier counts (ChunkChecker), both tiers'
    chunks are counted, and gc's garbage is the object store's alone.
    """
    report = FsckReport(store.url, deep=deep)
    try:
        report.info = read_info(store)
    except (NoEntry, FormatError) as e:
        report.info_error = str(e)
    report.intents = read_intents(store)
    report.problems += [Problem(i.key, DAMAGED, detail=damaged_intent(i))
                        for i in report.intents if i.error is not None]

    keys = [k for k, _ in store.list(manifests.FILES, delimiter=None).objects]
    markers = [k for k in keys if k.endswith("/")]
    report.dir_markers = len(markers)
    found = _read_manifests(store, (k for k in keys if not k.endswith("/")))
    referenced: set[str] = set()
    for path, m, err in found:
        if m is None:
            report.problems.append(Problem(path, DAMAGED, detail=err or ""))
        elif m.is_symlink:
            report.symlinks += 1
        else:
            report.files += 1
            report.file_bytes += m.size
            referenced.update(h for h, _ in m.chunks)
    for key, (_, err) in parallel_map(lambda k: _read_record(store, k), markers):
        if err is not None:
            report.problems.append(Problem(key, DAMAGED, detail=err))
    report.chunks_referenced = len(referenced)
    # the trash's manifests keep their chunks (gc counts them) until they expire; a
    # damaged one stops gc, which cannot tell which chunks it keeps
    in_trash = (k for k, _ in store.list(manifests.TRASH, delimiter=None).objects)
    for key, (m, err) in parallel_map(lambda k: _read_record(store, k), in_trash):
        if err is not None:
            report.problems.append(Problem(key, DAMAGED, detail=f"in the trash: {err}"))
        elif m is not None:
            report.trash_files += 1
            referenced.update(h for h, _ in m.chunks)
    report.problems.sort(key=lambda p: p.path)

    fossils: set[str] = set()
    # chunks set aside by gc (fossils/) and its scratch objects (gc/) are part of the
    # layout, not strays: fossils are counted, and read where a manifest names them
    for key, size in store.list(manifests.FOSSILS, delimiter=None).objects:
        if (name := manifests.chunk_name(key, manifests.FOSSILS)) is not None:
            fossils.add(name)
            report.fossils += 1
            report.fossil_bytes += size
    # gc's garbage is the object store's alone: it never touches the fast tier
    slow = _stored_chunks(tiers.slow if tiers is not None else store, report)
    stored = slow
    if tiers is not None:
        fast = _stored_chunks(tiers.fast, report)
        stored = {**slow, **fast}
        pending = fast.keys() - slow.keys() - fossils
        report.fast_chunks, report.fast_bytes = len(fast), sum(fast.values())
        report.pending_chunks = len(pending)
        report.pending_bytes = sum(fast[h] for h in pending)
    report.chunks_stored = len(slow)  # the object store's: the fast tier's are apart
    report.stored_bytes = sum(slow.values())
    garbage = slow.keys() - referenced
    report.garbage_chunks = len(garbage)
    report.garbage_bytes = sum(slow[h] for h in garbage)

    checker = ChunkChecker(store, deep, tiers)
    # a chunk the listing lacks may have been uploaded since: confirm with a HEAD
    checker.check(referenced - stored.keys())
    if deep:
        checker.check(stored.keys())
        if tiers is not None:  # the store's copies of the chunks read from the fast tier
            _check_store_copies(tiers, checker, slow.keys() & fast.keys(), report)
    else:
        short = {h for h in referenced & stored.keys() if stored[h] < HEADER_SIZE}
        for h in referenced & stored.keys() - short:
            checker.results[h] = None
        checker.check(short)  # each tier's copy, with a fast tier
    report.fast_damaged = sorted((h, why, good) for h, (why, good)
                                 in checker.fast_damaged.items())
    report.referenced_fossils = len(checker.fossils & referenced)
    for path, m, err in found:
        if m is not None:
            report.problems += checker.report(path, m, err).problems()
    report.corrupt_garbage = sorted(
        (h, r[1]) for h, r in checker.results.items()
        if isinstance(r, tuple) and h not in referenced)
    report.strays += [k for k in (k for k, _ in store.list("", delimiter="/").objects)
                      if k != manifests.INFO_KEY]
    return report
